"""What only a browser shows, in headless Debian Chromium over a scripted world (no real model):
a reason typed and Reject clicked once rejects; a folded run of unchanged lines unfolds in place;
the run detail follows a batch that is running without a reload; a click on the failure map opens
that failure's trajectory; a JSONL suite uploads (a bad one is refused naming its line); a run's
results filter by outcome and text as they are chosen and typed, next to the export buttons; a
click on a results row opens its trajectory, and a choice made afterwards in the box stands; a
cluster's failing instances filter by model, failure type and text, and a row click opens one; the
demo button takes the embedded SmolLM2 through a batch and a diagnosis to the Review page; the
Evolution page shows each gate with the paired counts the engine stored and the rule with its
thresholds; typing part of a BIG-bench task's name in the Suite box finds it (with its size and
answer form) and a batch on it runs that task.

The world is `test_app_pages`'s: the scripted models "alpha" and "beta" ran the starter harness on
10 reasoning-mix instances and the heuristic roles diagnosed the batch. The app runs as
`streamlit run` on a free port over a copy of it; the live-run test executes its batch in this
process (a harness that sleeps, so it takes seconds), as a CLI run in another terminal would.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Locator, Page, expect, sync_playwright  # noqa: E402
from test_app_e2e import CHROMIUM, CHROMIUM_ARGS, app_url, settle, streamlit_app  # noqa: E402,F401
from test_app_pages import (World, open_service, register_models, second_proposal, stopped_runs,  # noqa: E402,F401
                            world, world_template)

from ecdysis.records import RunRecord  # noqa: E402
from ecdysis.service import RunRequest, Service  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
STARTER = ROOT / "ecdysis" / "starter_harness"


@pytest.fixture
def app(ecdysis_home: Path, world: World, tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "streamlit.log"
    with streamlit_app(ecdysis_home, log) as url:
        yield url
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "created with a default value but also" not in text, "a widget state warning in the server log"


@pytest.fixture
def page() -> Iterator[Page]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (scripts/setup.sh --system installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        tab = context.new_page()
        tab.set_default_timeout(30_000)
        try:
            yield tab
        finally:
            context.close()
            browser.close()


def goto(page: Page, url: str) -> None:
    page.goto(url)
    page.locator("h1").first.wait_for()
    settle(page)


def no_traceback(page: Page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, "a stack trace reached the page"


def test_reject_takes_one_click_and_says_so(app: str, page: Page, world: World) -> None:
    goto(page, f"{app}/review")
    box = page.get_by_label("Reason for rejecting")
    box.click()
    box.type("too specific to dates")  # typed, never blurred: the click below must send it
    page.get_by_role("button", name="Reject").click()
    confirmation = page.get_by_text(re.compile(r"Rejected p\w+ — too specific to dates\."))
    expect(confirmation).to_be_visible()
    no_traceback(page)
    svc = open_service()
    try:
        rejected = svc.proposals(status="rejected")
        assert len(rejected) == 1 and svc.decisions(rejected[0].id)[-1].reason == "too specific to dates"
    finally:
        svc.store.close()  # type: ignore[attr-defined]


def test_folded_unchanged_lines_unfold_in_place(app: str, page: Page, world: World) -> None:
    goto(page, f"{app}/review")
    fold = page.locator("tr.fold label").first
    fold.scroll_into_view_if_needed()
    hidden = page.locator("tbody.ecd-hidden").first
    expect(hidden).to_be_hidden()
    first_hidden_line = hidden.locator("tr").first
    fold.click()
    expect(first_hidden_line).to_be_visible()
    expect(page.locator("tbody.ecd-fold").first).to_contain_text("hide")
    fold.click()
    expect(first_hidden_line).to_be_hidden()


def _slow_harness(folder: Path, seconds: float) -> Path:
    shutil.copytree(STARTER, folder)
    code = (folder / "harness.py").read_text()
    code = code.replace("def solve(task, model, harness):",
                        f"def solve(task, model, harness):\n    __import__('time').sleep({seconds})", 1)
    (folder / "harness.py").write_text(code)
    return folder


@contextmanager
def run_outside_the_app(tmp_path: Path, limit: int,
                        seconds: float) -> Iterator[tuple[Service, RunRecord, threading.Thread]]:
    """A batch of `limit` instances, each `seconds` long, executed in this process (as a CLI run in
    another terminal would be) while the app shows it."""
    svc = open_service()
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=limit,
                                    harness=str(_slow_harness(tmp_path / "slow", seconds))))
    worker = threading.Thread(target=svc.execute_run, args=(run.id,), kwargs={"use_cache": False}, daemon=True)
    try:
        worker.start()
        yield svc, run, worker
    finally:
        worker.join(60)
        svc.store.close()  # type: ignore[attr-defined]


def test_run_detail_follows_a_running_batch(app: str, page: Page, world: World, tmp_path: Path) -> None:
    with run_outside_the_app(tmp_path, 12, 2.0) as (svc, run, worker):
        deadline = time.time() + 60
        while svc.get_run(run.id).status != "running" or not svc.results(run.id):
            assert time.time() < deadline, "the batch did not start"
            time.sleep(0.2)
        goto(page, f"{app}/runs")
        finished = page.get_by_text(re.compile(r"^\d+ of 12 instances finished"))
        expect(finished).to_be_visible()
        counts = []
        deadline = time.time() + 90
        scored = page.locator('[data-testid="stMetric"]', has_text="scored")
        while svc.get_run(run.id).status == "running" and time.time() < deadline:
            # The header and the caption come from one reading of the store. The browser paints a
            # rerun element by element, so two reads may straddle a repaint: they must agree again
            # within a couple of seconds, and never run ahead of the store.
            settle = time.time() + 3
            while True:
                text, metric = finished.inner_text(timeout=5_000), scored.inner_text()
                stored = len(svc.results(run.id))
                count = int(text.split()[0])
                if f"{count}/12" in metric or time.time() > settle:
                    break
                time.sleep(0.2)
            counts.append(count)
            assert f"{count}/12" in metric and stored - 2 <= count <= stored, (metric, text, stored)
            time.sleep(1.0)
        assert len(set(counts)) >= 3 and counts == sorted(counts), f"the page did not follow the batch: {counts}"
        worker.join(60)
        expect(page.get_by_text("12 of 12 instances finished")).to_be_visible(timeout=15_000)
        no_traceback(page)
        tokens = page.locator('[data-testid="stMetric"]', has_text="tokens").inner_text()
        assert re.search(r"\d", tokens) and not tokens.strip().endswith("\n0")


def test_the_runs_table_follows_a_run_started_elsewhere_without_a_reload(app: str, page: Page, world: World,
                                                                         tmp_path: Path) -> None:
    """A user kept the Runs page open, started a batch from the CLI and never saw it appear; the
    demo's own row read "0/12" while its progress bar said 8 of 12. The table re-reads the store:
    a run started in another process appears, its scored count moves, and it ends at 6/6."""
    goto(page, app)
    with run_outside_the_app(tmp_path, 6, 1.5) as (svc, run, worker):
        row = page.locator('[data-testid="stDataFrame"]').first.locator("tbody tr", has_text=run.id)
        expect(row).to_have_count(1, timeout=20_000)  # the grid's readable table is not painted
        seen: set[int] = set()
        deadline = time.time() + 90
        while svc.get_run(run.id).status != "done" and time.time() < deadline:
            found = re.search(r"\b(\d)/6\b", " ".join(row.locator("td").all_text_contents()))
            if found:
                seen.add(int(found.group(1)))
            time.sleep(0.5)
        worker.join(60)
        expect(row).to_contain_text("6/6", timeout=20_000)
        assert len(seen - {6}) >= 2, f"the row did not move while the run went on: {sorted(seen)}"
        no_traceback(page)


def test_a_click_on_the_failure_map_opens_that_trajectory(app: str, page: Page, world: World) -> None:
    svc = open_service()
    try:
        report = svc.get_diagnosis(world.diagnosis_id).report
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    shown_first = report["clusters"][0]["id"]
    traces = sorted({c["id"] for c in report["clusters"]}, key=lambda cid: (len(cid), cid))  # the map's order
    target = next(cid for cid in traces if cid != shown_first)
    members = next(c for c in report["clusters"] if c["id"] == target)["members"]
    goto(page, f"{app}/clusters")
    cluster_box = page.get_by_role("combobox", name="Cluster", exact=True)
    expect(cluster_box).to_have_value(re.compile(f"^{shown_first} · "))
    chart = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="Failure map")
    chart.scroll_into_view_if_needed()
    settle(page)
    point = chart.locator(".scatterlayer .trace").nth(traces.index(target)).locator(".points path").first
    expect(point).to_be_visible()
    box = point.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(cluster_box).to_have_value(re.compile(f"^{target} · "), timeout=15_000)
    settle(page)
    no_traceback(page)
    trajectory = page.get_by_role("combobox", name="Trajectory of instance").input_value()
    assert any(trajectory.startswith(m["instance_id"] + " · ") for m in members), trajectory


def test_a_jsonl_suite_uploads_and_a_bad_one_is_refused_naming_its_line(app: str, page: Page, world: World,
                                                                        tmp_path: Path) -> None:
    good = tmp_path / "parity.jsonl"
    good.write_text("".join(f'{{"input": "Is {i} even?", "target": "{"Yes" if i % 2 == 0 else "No"}"}}\n'
                            for i in range(8)))
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"input": "a", "target": "b"}\n{"input": "c"}\n')
    goto(page, app)  # Runs is the default page, served at the root
    page.get_by_text("Import a JSONL suite").click()
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(good))
    expect(page.get_by_label("Suite name")).to_have_value("parity")
    settle(page)  # the upload's own script run is over: a click during it may be folded into it (CI lost one)
    page.get_by_role("button", name="Import suite").click()
    expect(page.get_by_text(re.compile(r"Imported parity: 8 instances in 1 category, answers: yes_no"))
           ).to_be_visible(timeout=15_000)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(bad))
    expect(page.get_by_label("Suite name")).to_have_value("broken")
    settle(page)
    page.get_by_role("button", name="Import suite").click()
    expect(page.get_by_text("broken.jsonl was refused: broken.jsonl:2: missing 'target'")).to_be_visible(timeout=15_000)
    no_traceback(page)
    svc = open_service()
    try:
        assert svc.store.get_suite("parity") is not None and svc.store.get_suite("broken") is None
    finally:
        svc.store.close()  # type: ignore[attr-defined]


def shown_run(page: Page, app: str) -> tuple[str, list]:
    """The run the Runs page shows first, and its stored results."""
    goto(page, app)
    shown = page.get_by_role("combobox", name="Run", exact=True).input_value().split(" · ")[0]
    svc = open_service()
    try:
        return shown, svc.results(shown)
    finally:
        svc.store.close()  # type: ignore[attr-defined]


def test_results_filter_as_you_type_and_export_buttons_are_there(app: str, page: Page, world: World) -> None:
    shown, results = shown_run(page, app)
    assert shown in world.run_ids and results
    failed = sum(1 for r in results if not r.correct)
    page.locator('[data-testid="stButtonGroup"]').get_by_text("failed", exact=True).click()
    settle(page)
    if failed < len(results):
        expect(page.get_by_text(f"{failed} of {len(results)} instances match")).to_be_visible()
    search = page.get_by_role("textbox", name="Search")
    search.fill(results[0].instance_id)
    search.press("Enter")
    settle(page)
    expect(page.get_by_text(re.compile(r"^[01] of \d+ instances match"))).to_be_visible()
    expect(page.get_by_role("button", name="Results as CSV")).to_be_visible()
    expect(page.get_by_role("button", name="Run as JSON")).to_be_visible()
    no_traceback(page)


def click_row(grid: Locator, row: int) -> None:
    """Select row `row` (0-based) of a Streamlit dataframe: a click on its row-marker cell, the
    first column of the canvas grid, one header row above the data."""
    grid.scroll_into_view_if_needed()
    box = grid.locator("canvas").first.bounding_box()
    assert box is not None
    page = grid.page
    header = row_height = 35  # Streamlit's default row height, the header's too
    page.mouse.click(box["x"] + 16, box["y"] + header + row_height * row + row_height / 2)


def choose(page: Page, box_name: str, option_start: str) -> None:
    box = page.get_by_role("combobox", name=box_name)
    box.click()
    box.press_sequentially(option_start.strip(" ·"))  # a long list shows only what matches
    page.get_by_role("option").filter(has_text=re.compile("^" + re.escape(option_start))).first.click()


def test_a_row_click_opens_its_trajectory_and_a_later_choice_stands(app: str, page: Page, world: World) -> None:
    shown, results = shown_run(page, app)
    assert len(results) >= 4
    trajectory = page.get_by_role("combobox", name="Trajectory of instance")
    first = trajectory.input_value()
    grid = page.locator('[data-testid="stDataFrame"]').nth(1)  # the run table, then this run's results
    click_row(grid, 2)
    expect(trajectory).to_have_value(re.compile("^" + re.escape(results[2].instance_id) + " · "))
    assert not first.startswith(results[2].instance_id + " · ")
    # A choice made in the box afterwards is not undone by the row that stays selected.
    other = next(r.instance_id for r in results if r.instance_id != results[2].instance_id)
    choose(page, "Trajectory of instance", other + " · ")
    settle(page)
    page.get_by_role("textbox", name="Search").fill("")  # any rerun
    page.get_by_role("textbox", name="Search").press("Enter")
    settle(page)
    expect(trajectory).to_have_value(re.compile("^" + re.escape(other) + " · "))
    no_traceback(page)


def test_cluster_members_filter_by_model_and_failure_type_and_a_row_opens_its_trajectory(
        app: str, page: Page, world: World) -> None:
    svc = open_service()
    try:
        report = svc.get_diagnosis(world.diagnosis_id).report
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    cluster = report["clusters"][0]
    members = cluster["members"]
    models = sorted({m["model"] for m in members})
    goto(page, f"{app}/clusters")
    expect(page.get_by_role("combobox", name="Cluster", exact=True)).to_have_value(re.compile(f"^{cluster['id']} · "))
    total = len(members)
    expect(page.get_by_text(re.compile(rf"^{total} failing instances? · click a row"))).to_be_visible()
    if len(models) > 1:
        chooser = page.get_by_role("combobox", name="Models")
        chooser.click()
        chooser.press_sequentially(models[-1])
        chooser.press("Enter")
        chooser.press("Escape")
        settle(page)
        kept = sum(1 for m in members if m["model"] == models[-1])
        expect(page.get_by_text(re.compile(rf"^{kept} of {total} failing instances"))).to_be_visible()
    search = page.get_by_role("textbox", name="Search")
    search.fill("no such text anywhere")
    search.press("Enter")
    settle(page)
    expect(page.get_by_text(re.compile(rf"^0 of {total} failing instances"))).to_be_visible()
    expect(page.get_by_role("combobox", name="Trajectory of instance")).to_have_count(0)
    search.fill("")
    search.press("Enter")
    settle(page)
    rows = [m for m in members if len(models) < 2 or m["model"] == models[-1]]
    grid = page.locator('[data-testid="stDataFrame"]').last
    pick = min(1, len(rows) - 1)
    click_row(grid, pick)
    expect(page.get_by_role("combobox", name="Trajectory of instance")).to_have_value(
        re.compile("^" + re.escape(rows[pick]["instance_id"]) + " · "))
    no_traceback(page)


def test_the_demo_button_takes_the_embedded_model_to_proposals(app_url: str, page: Page) -> None:
    goto(page, app_url)  # the app on SmolLM2 alone (test_app_e2e's fixture)
    expect(page.get_by_text(re.compile("no run of these models has finished on this machine yet"))).to_be_visible()
    page.get_by_role("button", name="Run the demo").click()
    expect(page.get_by_text("Demo started: its progress is below")).to_be_visible()
    done = page.get_by_text(re.compile(r"^Last demo: run smollm2 \d+ s, diagnosis \d+ s; \d+ proposal"))
    expect(done).to_be_visible(timeout=240_000)
    no_traceback(page)
    page.get_by_text("Review the proposals").click()
    expect(page).to_have_url(re.compile("/review$"))
    settle(page)
    no_traceback(page)


def test_two_runs_compare_instance_by_instance(app: str, page: Page, world: World) -> None:
    from app import views
    svc = open_service()
    try:
        runs = svc.runs()
        a, b = views.comparable_pair(runs) or (runs[1].id, runs[0].id)
        paired = views.pair_runs(svc.results(a), svc.results(b))
        model_a, model_b = svc.get_run(a).model, svc.get_run(b).model
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    goto(page, app)
    expect(page.get_by_role("combobox", name="A (before)")).to_have_value(re.compile("^" + re.escape(a)))
    expect(page.get_by_role("combobox", name="B (after)")).to_have_value(re.compile("^" + re.escape(b)))
    for outcome in views.PAIR_ORDER:
        metric = page.locator('[data-testid="stMetric"]').filter(has_text=outcome)
        expect(metric.first).to_contain_text(str(paired.count(outcome)))
    if model_a != model_b:
        expect(page.get_by_text(re.compile(f"What differs: model {model_a} → {model_b}"))).to_be_visible()
    no_traceback(page)


def test_next_pending_goes_to_another_proposal_by_button_and_by_alt_n(app: str, page: Page, world: World) -> None:
    svc = open_service()
    try:
        second_proposal(svc, world)
        assert len(svc.proposals(status="pending")) >= 2
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    goto(page, f"{app}/review")
    box = page.get_by_role("combobox", name="Proposal", exact=True)
    first = box.input_value()
    page.get_by_role("button", name=re.compile(r"Next pending \(\d+\)")).click()
    expect(box).not_to_have_value(first)
    settle(page)
    second = box.input_value()
    page.keyboard.press("Alt+n")
    expect(box).not_to_have_value(second)
    no_traceback(page)


def _evolve(svc: "Service", strategy: str) -> str:
    from ecdysis.evolve import EvolveConfig, Evolver
    config = EvolveConfig(suite="reasoning-mix", models=["alpha", "beta"], strategy=strategy, iterations=1,
                          batch_size=10, val_limit=10, test_limit=6, auto_approve=True, gate_min_net=1,
                          gate_k=0.5, charge_cached=True, label=f"gate-{strategy}")
    evolver = Evolver(svc)  # type: ignore[arg-type]
    return evolver.run(evolver.create(config).id).id


def test_the_evolution_page_shows_each_gate_and_says_what_the_numbers_say(app: str, page: Page, world: World) -> None:
    """Two finished one-iteration evolutions (scripted models, same settings): the watched one
    reads 'done' (never 'iteration 2/1'), states the rule with the thresholds it was started
    with, and lists its gates with the paired counts the engine stored; a zero change shows no
    arrow; the comparison tab states speedup and delta without a '1.00×'."""
    from app import views
    svc = open_service()
    try:
        ecd, per = _evolve(svc, "ecdysis"), _evolve(svc, "per-instance")
        watched = svc.get_evolution(ecd)
        gates = views.gate_rows(watched, svc.harnesses())
        stats = views.strategy_stats(watched)
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    assert watched.status == "done" and gates, "the scripted evolution has at least one gate row"
    goto(page, f"{app}/evolution")
    choose(page, "Evolution", ecd)
    settle(page)
    expect(page.get_by_text(re.compile(r"status done"))).to_be_visible()
    expect(page.get_by_text("iteration 2/1")).to_have_count(0)
    expect(page.get_by_text("The gate, iteration by iteration")).to_be_visible()
    rule = page.get_by_text(re.compile(r"^A candidate is kept when"))
    expect(rule).to_contain_text("net ≥ 1 and net > 0.5·SE, where SE = √(wins+losses) with one model")
    # The canvas grid keeps a (hidden) accessible table of its cells: the gate table is the one
    # with a "paired instances" column.
    table = page.locator('[data-testid="stDataFrame"]').filter(
        has=page.locator("th", has_text=re.compile("^paired instances$")))
    expect(table).to_have_count(1)
    table.scroll_into_view_if_needed()
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(len(gates))
    for i, gate in enumerate(gates):
        texts = [c.strip() for c in rows.nth(i).locator("td").all_text_contents()]
        assert gate.outcome in texts, (texts, gate)
        if gate.wins is not None:
            assert str(gate.wins) in texts and str(gate.losses) in texts and str(gate.paired) in texts, (texts, gate)
    delta = views.points_delta(stats.test_accuracy, stats.base_test_accuracy)
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="test (sealed)")
    arrows = metric.locator('[data-testid="stMetricDelta"] svg')
    expect(arrows).to_have_count(1 if delta and delta.moved else 0)
    page.get_by_role("tab", name="Compare strategies").click()
    settle(page)
    expect(page.get_by_text("Training time: ecdysis", exact=False)).to_be_visible()
    expect(page.get_by_text("1.00×", exact=False)).to_have_count(0)
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 2
    no_traceback(page)


def test_the_suite_box_finds_a_bigbench_task_by_typing_and_runs_it(app_url: str, page: Page) -> None:
    """Every fetched BIG-bench task is in the Suite box with its size and answer form; typing
    part of a name finds it, and a batch started on it runs that task. Where the BIG-bench files
    cannot be had (the package index no longer serves them), a BIG-Bench Hard task stands in."""
    from ecdysis.suites import bbh_dir, bigbench_catalogue
    rows = {r["name"]: r for r in bigbench_catalogue() if "error" not in r}
    rows = rows or {r["name"]: r for r in bigbench_catalogue(bbh_dir(), prefix="bbh:") if "error" not in r}
    if not rows:
        pytest.skip("no BIG-bench or BIG-Bench Hard task is fetched (scripts/setup.sh fetches them)")
    name = next((n for n in ("bigbench:navigate", "bbh:navigate") if n in rows), sorted(rows)[0])
    goto(page, app_url)
    box = page.get_by_role("combobox", name="Suite")
    box.click()
    box.press_sequentially(name.split(":", 1)[1][:6])
    option = page.get_by_role("option").filter(has_text=re.compile("^" + re.escape(name) + r" \("))
    expect(option.first).to_be_visible()
    label = option.first.inner_text()
    size = rows[name]["size"]
    assert re.search(rf"\({size:,} instances?, ", label) or f"({size} instance" in label, label
    kinds = {str(f.get("kind")) for f in (rows[name].get("answer_forms") or {}).values()}
    assert kinds and all(k in label for k in kinds), (label, kinds)
    option.first.click()
    expect(box).to_have_value(re.compile("^" + re.escape(name) + " "))
    page.get_by_role("spinbutton", name="Batch size").fill("2")
    page.get_by_role("button", name="Start batch").click()
    prefix = re.compile(re.escape(name.split(":")[0] + ":"))
    expect(page.get_by_role("combobox", name="Run", exact=True)).to_have_value(prefix, timeout=60_000)
    svc = open_service()
    try:
        deadline = time.time() + 300
        while not any(r.suite == name and r.status == "done" for r in svc.runs()):
            assert time.time() < deadline, f"the {name} batch did not finish"
            time.sleep(1.0)
        run = next(r for r in svc.runs() if r.suite == name)
        assert len(svc.results(run.id)) == 2
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    no_traceback(page)


def test_an_edit_saved_in_review_is_the_patch_shown_and_the_version_applied(app: str, page: Page, world: World) -> None:
    goto(page, f"{app}/review")
    page.get_by_text("Edit the patched files").click()
    editor = page.locator("textarea").first
    editor.click()
    editor.press("Control+End")
    editor.type("\n# reviewer: keep this line\n")
    editor.press("Control+Enter")
    settle(page)
    page.get_by_role("button", name="Save edit and approve it").click()
    expect(page.get_by_text(re.compile(r"^Saved your edit of p\w+ and approved it"))).to_be_visible()
    expect(page.get_by_text(re.compile(r"^As edited by .* the files to apply"))).to_be_visible()
    # "The patch" now shows the reviewer's line, not the Proposer's diff.
    expect(page.get_by_text("# reviewer: keep this line").first).to_be_visible()
    page.get_by_role("button", name="Apply — create the next harness version").click()
    applied = page.get_by_text(re.compile(r"^Applied as harness version (\w+)"))
    expect(applied).to_be_visible()
    version = re.search(r"harness version (\w+)", applied.inner_text()).group(1)  # type: ignore[union-attr]
    svc = open_service()
    try:
        files = svc.store.get_harness(version).files  # type: ignore[union-attr]
        assert any("# reviewer: keep this line" in text for text in files.values())
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    no_traceback(page)


def test_stopped_runs_say_how_much_was_scored_and_no_cell_reads_none(app: str, page: Page, world: World) -> None:
    svc = open_service()
    try:
        nothing, half = stopped_runs(svc, world)
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    goto(page, app)
    runs = page.locator('[data-testid="stDataFrame"]').first
    cells = {row.locator("td").first.text_content(): [c.strip() for c in row.locator("td").all_text_contents()]
             for row in runs.locator("tbody tr").all()}
    assert "—" in cells[nothing.id] and "0/3" in cells[nothing.id], cells[nothing.id]
    assert "2/4" in cells[half.id] and any(c.endswith("of 2 scored") for c in cells[half.id]), cells[half.id]
    assert not [c for row in cells.values() for c in row if c in ("None", "nan", "NaN")], cells
    assert not [c for c in cells[nothing.id] if "%" in c], "nothing scored is no accuracy, not 0 %"
    choose(page, "Run", half.id)
    settle(page)
    expect(page.locator('[data-testid="stMetric"]').filter(has_text="scored")).to_contain_text("2/4")
    choose(page, "Run", nothing.id)
    settle(page)
    accuracy = page.locator('[data-testid="stMetric"]').filter(has_text="accuracy").first
    expect(accuracy).to_contain_text("—")
    no_traceback(page)


def test_a_queued_batch_stopped_in_the_browser_is_cancelled_at_once(app_url: str, page: Page) -> None:
    """Two long batches fill the app's two job slots on SmolLM2; a third waits, queued. Its Stop
    cancels it at once (never 'queued · stopping…'), and it leaves no result."""
    goto(page, app_url)
    start = page.get_by_role("button", name="Start batch")
    bars = page.locator('[data-testid="stProgress"]').filter(has_text=re.compile(r"batch \w+ · "))
    for started in range(1, 4):
        for attempt in (1, 2):
            if not start.is_visible():  # the form folds away once a run exists
                page.get_by_text("Start a batch", exact=True).click()
            page.get_by_role("spinbutton", name="Batch size").fill("60")
            start.click()
            settle(page)
            # The next batch is started only once this one shows its bar: a click while the page is
            # still redrawing from the last one can land on a form that is folding away. With two
            # batches updating their bars, such a click was lost once in a CI run (2 bars, not 3):
            # clicked again only then, so a second batch is never started by the retry.
            try:
                expect(bars).to_have_count(started, timeout=30_000)
                break
            except AssertionError:
                if attempt == 2 or bars.count() != started - 1:
                    raise
    queued = page.locator('[data-testid="stProgress"]').filter(has_text=re.compile(r"· queued"))
    expect(queued).to_have_count(1, timeout=30_000)
    job_id = re.search(r"batch (\w+) · queued", queued.inner_text()).group(1)  # type: ignore[union-attr]
    page.locator(f'[class*="st-key-runs-stop-{job_id}"] button').first.click()  # the Stop beside that bar
    expect(page.get_by_text(re.compile(rf"batch {job_id} · "))).to_have_count(0, timeout=15_000)
    expect(page.get_by_text(re.compile(rf"^Batch {job_id} was stopped"))).to_be_visible()
    svc = open_service()
    try:
        job = svc.job(job_id)
        assert job.status == "cancelled", job.status
        assert not svc.results(job.params["run_id"])
        for other in svc.recent_jobs(limit=10):
            if other.status in ("queued", "running"):
                svc.cancel_job(other.id)
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    no_traceback(page)


def test_clusters_page_while_a_first_diagnosis_runs_says_so(ecdysis_home: Path, page: Page, tmp_path: Path) -> None:
    """A finished run and a diagnosis of it running (in another process): the page says a
    diagnosis is running and where it is, never 'No diagnosis yet … press Cluster and diagnose'."""
    from ecdysis.store import JobRecord
    register_models()
    svc = open_service()
    try:
        run_id = svc.run(RunRequest(suite="reasoning-mix", model="alpha", limit=3)).run_id
        now = time.time()
        svc.store.create_job(JobRecord(id="jdiag", kind="diagnose", params={"run_ids": [run_id]}, status="running",
                                       total=1, message="clustering failures", created_at=now, updated_at=now))
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    with streamlit_app(ecdysis_home, tmp_path / "streamlit.log") as url:
        goto(page, f"{url}/clusters")
        expect(page.get_by_text("A diagnosis is running.")).to_be_visible()
        expect(page.get_by_text("clustering failures", exact=False).first).to_be_visible()
        expect(page.get_by_text("No diagnosis yet", exact=False)).to_have_count(0)
        expect(page.get_by_text("press Cluster and diagnose", exact=False)).to_have_count(0)
        no_traceback(page)


def test_cluster_charts_with_one_model_have_a_legend_whole_ticks_and_no_verdict_colour(
        app: str, page: Page, world: World) -> None:
    from app.charts import VERDICT_COLORS
    svc = open_service()
    try:
        one = svc.diagnose([world.run_ids[0]])
        model = svc.get_run(world.run_ids[0]).model
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    goto(page, f"{app}/clusters")
    choose(page, "Diagnosis", one.id)
    settle(page)
    chart = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="Cluster × model")
    chart.scroll_into_view_if_needed()
    expect(chart).to_contain_text("no cross-model evidence")
    expect(chart.locator("g.legend")).to_contain_text(model)
    fills = {p.get_attribute("style") or "" for p in chart.locator("g.point path").all()}
    assert fills and not [f for f in fills for c in VERDICT_COLORS.values() if _rgb(c) in f.replace(" ", "")], fills
    sizes = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="Cluster sizes by verdict")
    ticks = [t.strip() for t in sizes.locator("g.xtick text").all_text_contents()]
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    body = page.locator("body").inner_text()
    assert not re.findall(r"\b1 (?:failures|categories|instances|clusters|runs)\b", body)
    no_traceback(page)


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r},{g},{b})"


def test_a_diagnosis_downloads_as_csv_and_json(app: str, page: Page, world: World, tmp_path: Path) -> None:
    import csv
    import json
    goto(page, f"{app}/diagnoses")
    with page.expect_download() as got:
        page.get_by_role("button", name="Diagnosis as JSON").click()
    target = tmp_path / got.value.suggested_filename
    got.value.save_as(target)
    report = json.loads(target.read_text())
    assert report["clusters"] and all(c["members"] for c in report["clusters"])
    with page.expect_download() as got:
        page.get_by_role("button", name="Clusters as CSV").click()
    target = tmp_path / got.value.suggested_filename
    got.value.save_as(target)
    rows = list(csv.DictReader(target.open()))
    assert {r["cluster"] for r in rows} == {c["id"] for c in report["clusters"]}, rows[:2]

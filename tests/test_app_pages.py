"""The Streamlit pages under `streamlit.testing.v1.AppTest`: every page renders (empty and with data),
its key widgets work, and engine errors reach the page as one line, never a traceback.

The world is real and small: two scripted models ("alpha", "beta") ran the starter harness through
the real runner and store on 10 reasoning-mix instances, and the heuristic roles diagnosed the batch.
By construction alpha always answers "Sure! Here is my answer: 42" (prose before the answer, on
every category: a harness-level cluster), and beta does the same except that it only "thinks step
by step" on date and counting questions. Fragment reruns and dialogs are outside AppTest's reach;
the Playwright test (`test_app_e2e.py`) covers those with the real embedded model.
"""

from __future__ import annotations

import io
import re
import shutil
import time
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import pytest
from streamlit.testing.v1 import AppTest

from app import diffview, views
from app.guard import error_text, password_matches
from ecdysis.errors import InputError
from ecdysis.diagnosis import DiagnosisReport
from ecdysis.evolve import EvolveConfig
from ecdysis.models.registry import register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.service import RunRequest, Service
from ecdysis.records import RunRecord
from ecdysis.store import EvolutionRecord, HarnessVersion, ProposalRecord

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "app" / "main.py"
PAGES = ["1_runs", "2_clusters", "3_diagnoses", "4_review", "5_evolution", "6_harnesses"]
SURE = "Sure! Here is my answer: 42\nI hope this helps."
THINK = "Let me think step by step about this problem first."


def shown(markdown: str) -> str:
    """What a reader sees of Markdown made inert by `app.text.md`: escapes and word joiners gone."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u2060", "").replace("  \n", "\n")


def register_models() -> None:
    register_backend(ScriptedBackend(model_id="alpha", default=SURE))
    register_backend(ScriptedBackend([Rule(THINK, "MM/DD/YYYY"), Rule(THINK, "How many")],
                                     model_id="beta", default=SURE))


def open_service() -> Service:
    from storage import open_store
    return Service(open_store())


@dataclass(frozen=True)
class World:
    run_ids: list[str]
    diagnosis_id: str
    proposal_ids: list[str]


@pytest.fixture(scope="module")
def world_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, World]]:
    """Built once per module (runs + diagnosis take a few seconds); each test gets a copy."""
    home = tmp_path_factory.mktemp("app-world")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ECDYSIS_HOME", str(home))
        mp.delenv("ECDYSIS_DATABASE_URL", raising=False)
        register_models()
        svc = open_service()
        runs = [svc.run(RunRequest(suite="reasoning-mix", model=m, limit=10)).run_id for m in ("alpha", "beta")]
        diagnosis = svc.diagnose(runs)
        proposals = [p.id for p in svc.proposals(diagnosis_id=diagnosis.id, status="pending")]
        svc.store.close()  # type: ignore[attr-defined]
    yield home, World(runs, diagnosis.id, proposals)


@pytest.fixture
def world(world_template: tuple[Path, World], ecdysis_home: Path) -> World:
    template, built = world_template
    shutil.copytree(template, ecdysis_home)
    register_models()
    return built


@pytest.fixture
def svc(ecdysis_home: Path) -> Iterator[Service]:
    service = open_service()
    yield service
    service.store.close()  # type: ignore[attr-defined]


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.run()
    at.switch_page(f"../pages/{page}.py").run()
    assert_clean(at)
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not [e.value for e in at.error], [e.value for e in at.error]


def by_label(widgets: Any, label: str) -> Any:
    found = [w for w in widgets if w.label == label]
    assert found, f"no widget labelled {label!r} among {[w.label for w in widgets]}"
    return found[0]


def html_of(at: AppTest) -> list[str]:
    return [str(getattr(h, "value", "")) for h in at.get("html")]


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [i.value for i in at.info]
    parts += [w.value for w in at.warning] + [s.value for s in at.success]
    return shown("\n".join(str(p) for p in parts))


def wait_jobs(svc: Service, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while any(j.status in ("queued", "running") for j in svc.recent_jobs(limit=50)):
        assert time.time() < deadline, "background jobs did not finish"
        time.sleep(0.3)


# ---------------------------------------------------------------- a new user's first look

@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_its_empty_state(page: str) -> None:
    at = open_page(page)
    assert at.title, "each page has a title"
    if page == "1_runs":
        assert "No runs yet — start one with the embedded model." in texts(at)
        assert by_label(at.selectbox, "Suite").value == "reasoning-mix"
        assert by_label(at.multiselect, "Model(s)").value == ["qwen2.5-coder-0.5b", "smollm2"]
    elif page == "6_harnesses":
        assert at.get("graphviz_chart"), "the lineage tree shows the starter version"
    else:
        assert at.info, "an empty page says what to do next"


def test_password_gate_asks_first_and_compares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_APP_PASSWORD", "moult-2026")
    at = AppTest.from_file(str(MAIN), default_timeout=30).run()
    assert [t.value for t in at.title] == ["Ecdysis"] and not at.form_submit_button[0].disabled
    assert not [s for s in at.selectbox], "no page runs before the password"
    at.text_input[0].input("wrong")
    at.form_submit_button[0].click().run()
    assert "That password is not right." in [e.value for e in at.error]
    at.text_input[0].input("moult-2026")
    at.form_submit_button[0].click().run()
    assert [t.value for t in at.title] == ["Runs"]
    assert password_matches("a", "a") and not password_matches("a", "b")


# ---------------------------------------------------------------- runs

def test_runs_page_starts_a_batch_in_the_background(ecdysis_home: Path, svc: Service) -> None:
    register_models()
    at = open_page("1_runs")
    by_label(at.multiselect, "Model(s)").set_value(["alpha", "beta"])
    by_label(at.number_input, "Batch size").set_value(4)
    at.form_submit_button[0].click().run(timeout=60)
    assert_clean(at)
    jobs = [j for j in svc.recent_jobs() if j.kind == "run"]
    assert len(jobs) == 2, "one background job per chosen model"
    wait_jobs(svc)
    at.run()
    assert_clean(at)
    table = at.dataframe[0].value
    assert sorted(table["model"]) == ["alpha", "beta"] and set(table["status"]) == {"done"}
    assert list(table["scored"]) == ["4/4", "4/4"] and all(t > 0 for t in table["tokens"])
    assert "call 1" in texts(at), "the chosen run shows an instance's whole trajectory"
    assert any(m.name == "assistant" for m in at.chat_message)


def test_runs_page_shows_an_unknown_model_as_one_line() -> None:
    at = open_page("1_runs")
    by_label(at.multiselect, "Model(s)").set_value(["nosuch-model"])
    at.form_submit_button[0].click().run()
    assert not at.exception
    assert any("unknown model 'nosuch-model'" in shown(e.value) for e in at.error)


def test_unfinished_run_offers_resume(world: World, svc: Service) -> None:
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=3))
    at = open_page("1_runs")
    resume = at.button(key=f"resume:{run.id}")
    resume.click().run()
    assert_clean(at)
    wait_jobs(svc)
    assert svc.get_run(run.id).status == "done"


def _progress_texts(at: AppTest) -> list[str]:
    return [shown(str(p.proto.text)) for p in at.get("progress")]


def test_runs_page_counts_what_is_stored_while_a_run_goes_on(world: World, svc: Service) -> None:
    """Mid-run the summary is not written yet: the header, the table and the runs list count the
    stored results (they read 'tokens 0 / calls 0' and 'None' before)."""
    from dataclasses import replace
    done = svc.results(world.run_ids[0])
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=10))
    stored = [replace(r, run_id=run.id) for r in done if r.instance_id in run.instance_ids][:4]
    svc.store.save_results(stored)
    run.status = "running"
    svc.store.update_run(run)  # as the runner leaves it between two results
    at = open_page("1_runs")
    assert by_label(at.selectbox, "Run").value == run.id
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["tokens"] == str(sum(r.prompt_tokens + r.completion_tokens for r in stored)) != "0"
    assert metrics["model calls"] == str(sum(len(r.calls) for r in stored))
    assert metrics["scored"] == "4/10"
    assert "4 of 10 instances finished" in texts(at)
    assert len(next(d.value for d in at.dataframe if "outcome" in d.value.columns)) == 4
    table = at.dataframe[0].value
    row = table[table["run"] == run.id].iloc[0]
    correct = sum(r.correct for r in stored)
    assert row["scored"] == "4/10" and row["accuracy"] == f"{correct / 4:.1%} of 4 scored"
    assert not table.isna().any().any() and "None" not in table.astype(str).values, "no cell reads None"


def test_two_models_compared_instance_by_instance(world: World, svc: Service) -> None:
    at = open_page("1_runs")
    a, b = by_label(at.selectbox, "A (before)").value, by_label(at.selectbox, "B (after)").value
    assert {svc.get_run(a).model, svc.get_run(b).model} == {"alpha", "beta"}, "two models, same instances"
    before = {r.instance_id: r for r in svc.results(a)}
    after = {r.instance_id: r for r in svc.results(b)}
    fixed = sorted(i for i in before if after[i].correct and not before[i].correct)
    broken = sorted(i for i in before if before[i].correct and not after[i].correct)
    assert {m.label: int(m.value) for m in at.metric if m.label in ("fixed", "broken")} == \
        {"fixed": len(fixed), "broken": len(broken)}
    if fixed or broken:
        rows = next(d.value for d in at.dataframe if "change" in d.value.columns)
        assert sorted(rows["instance"]) == sorted(fixed + broken), "fixed and broken shown first, by default"
    else:
        assert "No instance is fixed or broken." in texts(at)
    at.get("button_group")[0].set_value(["fixed", "broken", "still wrong", "still right"]).run()
    rows = next(d.value for d in at.dataframe if "change" in d.value.columns)
    change = {i: ("fixed" if after[i].correct else "still wrong") if not before[i].correct
              else ("still right" if after[i].correct else "broken") for i in before}
    assert dict(zip(rows["instance"], rows["change"])) == change
    assert "What differs: model" in texts(at) and "harness" not in texts(at).split("What differs:")[1][:60]
    by_label(at.selectbox, "B (after)").set_value(a).run()
    assert "Pick two different runs." in texts(at)


def stopped_runs(svc: Service, world: World) -> tuple[RunRecord, RunRecord]:
    """A run stopped before its first instance, and one stopped after two of its four."""
    nothing = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=3))
    svc.execute_run(nothing.id, cancelled=lambda: True)  # stopped before its first instance
    half = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=4))
    done = {r.instance_id: r for r in svc.results(world.run_ids[0])}
    svc.store.save_results([replace(done[i], run_id=half.id) for i in half.instance_ids[:2]])
    svc.execute_run(half.id, cancelled=lambda: True)  # two done, then stopped
    return nothing, half


def test_stopped_runs_say_how_much_was_scored(world: World, svc: Service) -> None:
    nothing, half = stopped_runs(svc, world)
    assert svc.get_run(nothing.id).status == "cancelled" and len(svc.results(half.id)) == 2
    at = open_page("1_runs")
    table = at.dataframe[0].value.set_index("run")
    assert table.loc[nothing.id, "accuracy"] == "—" and table.loc[nothing.id, "scored"] == "0/3"
    assert table.loc[half.id, "accuracy"].endswith("of 2 scored") and table.loc[half.id, "scored"] == "2/4"
    by_label(at.selectbox, "Run").set_value(half.id).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["scored"] == "2/4"
    by_label(at.selectbox, "Run").set_value(nothing.id).run()
    assert {m.label: m.value for m in at.metric}["accuracy"] == "—", "nothing scored is no accuracy, not 0 %"


def test_a_queued_batch_that_is_stopped_is_cancelled_at_once(world: World, svc: Service) -> None:
    import threading
    release = threading.Event()
    blockers = [svc.jobs.submit("run", {}, lambda ctx: (release.wait(60), {})[1]) for _ in range(2)]
    try:
        job_id = svc.start_run_job(RunRequest(suite="reasoning-mix", model="alpha", limit=2))
        assert svc.job(job_id).status == "queued", "both worker slots are busy"
        at = open_page("1_runs")
        assert any("queued" in t for t in _progress_texts(at))
        at.button(key=f"runs:stop:{job_id}").click().run()
        assert not at.exception
        assert svc.job(job_id).status == "cancelled", "stopped while queued: cancelled, not 'stopping…'"
        at.run()
        assert not [t for t in _progress_texts(at) if job_id in t]
    finally:
        release.set()
    wait_jobs(svc)
    assert svc.job(job_id).status == "cancelled" and not svc.results(svc.job(job_id).params["run_id"])
    assert {svc.job(b).status for b in blockers} == {"done"}


# ---------------------------------------------------------------- clusters and diagnoses

def test_clusters_page_charts_and_drilldown(world: World, svc: Service) -> None:
    at = open_page("2_clusters")
    assert len(at.get("plotly_chart")) == 4, "sizes by verdict, x category, x model, failure map"
    report = svc.get_diagnosis(world.diagnosis_id).report
    cluster = by_label(at.selectbox, "Cluster")
    assert cluster.value == report["clusters"][0]["id"]
    last = report["clusters"][-1]
    cluster.set_value(last["id"]).run()
    assert_clean(at)
    assert f"{last['id']} · " in texts(at).replace("\\", "")
    member = by_label(at.selectbox, "Trajectory of instance")
    assert member.value.endswith(last["members"][0]["instance_id"])
    assert any(m.name == "assistant" for m in at.chat_message), "every prompt and response of the instance"


def test_clusters_page_while_a_diagnosis_runs_does_not_invite_another(ecdysis_home: Path, svc: Service) -> None:
    from ecdysis.store import JobRecord
    register_models()
    fresh = svc.run(RunRequest(suite="reasoning-mix", model="alpha", limit=3)).run_id
    now = time.time()
    svc.store.create_job(JobRecord(id="jdiag", kind="diagnose", params={"run_ids": [fresh]}, status="running",
                                   total=1, message="clustering failures", created_at=now, updated_at=now))
    at = open_page("2_clusters")
    assert "A diagnosis is running." in texts(at)
    assert "No diagnosis yet" not in texts(at) and "press Cluster and diagnose" not in texts(at)
    assert any("clustering failures" in t for t in _progress_texts(at))


def test_cluster_charts_with_one_model_count_and_colour_honestly(world: World, svc: Service) -> None:
    """One model: its bars are named in a legend and the title says there is no cross-model
    evidence; no model is painted in a verdict's colour; counts have whole ticks and words agree
    with their numbers ('1 failure', never '1 failures')."""
    import json
    from app.charts import VERDICT_COLORS
    one = svc.diagnose([world.run_ids[0]])
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.session_state["_remember:diagnosis"] = one.id
    at.run()
    at.switch_page("../pages/2_clusters.py").run()
    assert_clean(at)
    figures = {json.loads(c.proto.spec)["layout"]["title"]["text"].split(" (")[0]: json.loads(c.proto.spec)
               for c in at.get("plotly_chart")}
    by_model = figures["Cluster × model"]
    assert "no cross-model evidence" in by_model["layout"]["title"]["text"]
    assert by_model["layout"]["showlegend"] is True and [t["name"] for t in by_model["data"]] == ["alpha"]
    assert not {t["marker"]["color"] for t in by_model["data"]} & set(VERDICT_COLORS.values())
    sizes = figures["Cluster sizes by verdict"]["layout"]["xaxis"]
    assert sizes["dtick"] >= 1 and sizes["tickformat"] == "d", "no 0.2-failure ticks"
    words = texts(at) + "\n".join(str(o) for s in at.selectbox for o in s.options)
    assert not re.findall(r"\b1 (?:failures|categories|instances|clusters|runs)\b", words), \
        re.findall(r".{30}\b1 (?:failures|categories|instances|clusters|runs)\b", words)


def test_diagnoses_page_reads_like_a_chat(world: World) -> None:
    at = open_page("3_diagnoses")
    names = {m.name for m in at.chat_message}
    assert {"Investigator", "Attributor", "Proposer", "Critic", "Engine checks"} <= names
    page = texts(at)
    assert "round 1" in page and "Final modification specification" in page
    # Review passes read as such, not as the engine's numbering (a user saw "round 201").
    assert "review pass 2, round 1" in page and "round 201" not in page
    assert (views.round_label(3), views.round_label(201), views.round_label(302)) == (
        "round 3", "review pass 2, round 1", "review pass 3, round 2")
    assert any("Risk" in w.value for w in at.warning)


# ---------------------------------------------------------------- review

def test_a_proposal_of_a_change_already_applied_says_so(world: World, svc: Service) -> None:
    """A user applied a proposal, ran the demo again on the starter and found the same patch pending
    twice more, labelled alike. A later proposal of exactly the same change says which one made it
    first and what became of it, in the list and above the patch."""
    from dataclasses import replace
    first = svc.proposals(status="pending")[0]
    svc.decide(first.id, "approve", who="alice")
    made = svc.apply_proposal(first.id)
    again = replace(first, id="p-again", status="pending", created_at=first.created_at + 60, data={})
    other = replace(first, id="p-other", status="pending", created_at=first.created_at + 61, data={},
                    files={name: text + "\n# another change\n" for name, text in first.files.items()})
    svc.store.save_proposal(again)
    svc.store.save_proposal(other)
    twins = views.same_changes(svc.proposals())
    assert twins["p-again"].id == first.id and "p-other" not in twins and first.id not in twins
    at = open_page("4_review")
    box = by_label(at.selectbox, "Proposal")
    assert any(o.startswith("p-again") and o.endswith(f"same change as {first.id} (applied)") for o in box.options)
    assert not [o for o in box.options if o.startswith("p-other") and "same change" in o]
    box.set_value("p-again").run()
    assert_clean(at)
    said = " ".join(w.value for w in at.warning)
    assert (f"The same change to the same version as proposal {first.id}, already applied as version "
            f"{views.short(made.id, 12)}") in said


def test_review_approve_apply_then_evaluate(world: World, svc: Service) -> None:
    at = open_page("4_review")
    pid = by_label(at.selectbox, "Proposal").value
    assert at.get("html"), "the diff is rendered (diff-match-patch side by side)"
    assert "from a diagnosis started by hand" in texts(at)
    at.button(key=f"approve:{pid}").click().run()
    assert_clean(at)
    assert svc.get_proposal(pid).status == "approved"
    assert by_label(at.segmented_control, "Show").value == "approved", "the decided proposal stays in view"
    at.button(key=f"apply:{pid}").click().run()
    assert_clean(at)
    applied = views.applied_version(pid, svc.harnesses())
    assert applied is not None and applied.parent == svc.get_proposal(pid).harness_version
    assert by_label(at.segmented_control, "Show").value == "applied"
    assert f"Applied as harness version {applied.id}" in texts(at)
    at.button(key=f"evaluate:{pid}").click().run()
    assert_clean(at)
    evaluations = [r for r in svc.runs() if r.label.startswith("evaluate")]
    assert {(r.harness_version, r.split) for r in evaluations} >= {(applied.id, "validation"),
                                                                   (applied.parent, "validation")}
    wait_jobs(svc)
    # The two evaluation runs open side by side on Runs: instance by instance, with the diff.
    at.switch_page("../pages/1_runs.py").run()
    assert_clean(at)
    a, b = by_label(at.selectbox, "A (before)").value, by_label(at.selectbox, "B (after)").value
    assert (svc.get_run(a).harness_version, svc.get_run(b).harness_version) == (applied.parent, applied.id)
    assert svc.get_run(a).model == svc.get_run(b).model
    before = {r.instance_id: r.correct for r in svc.results(a)}
    after = {r.instance_id: r.correct for r in svc.results(b)}
    both = before.keys() & after.keys()
    expected = {"fixed": sum(after[i] and not before[i] for i in both),
                "broken": sum(before[i] and not after[i] for i in both),
                "still right": sum(before[i] and after[i] for i in both),
                "still wrong": sum(not before[i] and not after[i] for i in both)}
    metrics = {m.label: int(m.value) for m in at.metric if m.label in expected}
    assert metrics == expected and sum(expected.values()) == len(both) > 0
    assert f"{expected['fixed']} fixed, {expected['broken']} broken" in texts(at)
    assert any("<ins>" in h or "class=\"add\"" in h for h in html_of(at)), "the harness diff from A to B"
    # A reload (a new session) still finds the evaluation in the store: it says so, opens the same
    # two runs on Runs, and offers to evaluate again rather than as if nothing had been evaluated.
    again = open_page("4_review")
    by_label(again.segmented_control, "Show").set_value("applied").run()
    by_label(again.selectbox, "Proposal").set_value(pid).run()
    assert_clean(again)
    assert f"on {len(svc.get_run(b).instance_ids)} validation instances" in texts(again)
    evaluate = again.button(key=f"evaluate:{pid}")
    assert evaluate.label.startswith("Evaluate again on "), evaluate.label
    again.button(key=f"compare:{pid}").click().run()
    assert_clean(again)
    assert (by_label(again.selectbox, "A (before)").value, by_label(again.selectbox, "B (after)").value) == (a, b)


def second_proposal(svc: Service, world: World, pid: str = "p-second", files: dict[str, str] | None = None) -> str:
    """A second pending proposal beside the world's one (both of its clusters want the same
    prompt-side repair, so they share one proposal)."""
    shared = svc.get_proposal(world.proposal_ids[0])
    if files is None:
        system = svc.store.get_harness(shared.harness_version).files["system.md"]  # type: ignore[union-attr]
        files = {"system.md": system + "\nBe brief.\n"}
    svc.store.save_proposal(replace(shared, id=pid, files=files))
    return pid


def test_review_reject_needs_a_reason_and_confirms(world: World, svc: Service) -> None:
    second_proposal(svc, world)
    at = open_page("4_review")
    pid = by_label(at.selectbox, "Proposal").value
    at.button(key=f"reject:{pid}").click().run()
    assert not at.exception
    assert any("Say why you reject it" in e.value for e in at.error), "an empty reason is refused in words"
    assert svc.get_proposal(pid).status == "pending"
    at.text_input(key=f"reason:{pid}").input("too specific to dates")
    at.button(key=f"reject:{pid}").click().run()  # one click sends the typed reason with it
    assert_clean(at)
    assert svc.get_proposal(pid).status == "rejected"
    assert svc.decisions(pid)[-1].reason == "too specific to dates"
    confirmed = [shown(s.value) for s in at.success]
    assert any(f"Rejected {pid} — too specific to dates." in s and "left to review" in s for s in confirmed), confirmed
    assert by_label(at.segmented_control, "Show").value == "rejected", "the rejected proposal stays in view"
    assert by_label(at.selectbox, "Proposal").value == pid
    pending = [p.id for p in svc.proposals(status="pending")]
    at.button(key="review:next").click().run()
    assert_clean(at)
    assert by_label(at.segmented_control, "Show").value == "pending"
    assert by_label(at.selectbox, "Proposal").value in pending and pending


def test_review_edit_updates_the_diff_and_records_the_files(world: World, svc: Service) -> None:
    at = open_page("4_review")
    pid = by_label(at.selectbox, "Proposal").value
    proposal = svc.get_proposal(pid)
    at.toggle(key=f"editing:{pid}").set_value(True).run()
    path, text = next(iter(proposal.files.items()))
    marker = "# reviewed by a person\n"
    at.text_area(key=f"edit:{pid}:{path}").input(text + marker).run()
    assert_clean(at)
    assert any("reviewed by a person" in h for h in html_of(at)), "the diff follows the edit"
    at.button(key=f"save:{pid}").click().run()
    assert_clean(at)
    assert svc.get_proposal(pid).status == "edited"
    assert svc.decisions(pid)[-1].files_as_applied[path].endswith(marker)  # type: ignore[index]
    assert by_label(at.selectbox, "Proposal").value == pid
    patch = html_of(at)
    assert "reviewed by a person" in patch[0], "The patch shows the edited files, not the Proposer's diff"
    assert "As edited by reviewer" in texts(at)
    assert not any("reviewed by a person" in h for h in patch[1:]), "the Proposer's original, folded away"
    at.button(key=f"apply:{pid}").click().run()
    assert_clean(at)
    assert "reviewed by a person" in html_of(at)[0], "still the edited patch once applied"
    applied = views.applied_version(pid, svc.harnesses())
    assert applied is not None and applied.files[path].endswith(marker)


def test_deciding_logs_no_widget_state_warning(world: World, svc: Service) -> None:
    """The status filter was drawn with a default while `follow` set it through session state:
    Streamlit logged a warning on every decision."""
    import logging
    from streamlit.elements.lib import policies
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(policies.__name__)
    policies._shown_default_value_warning = False  # it warns once per process
    logger.addHandler(handler)
    try:
        at = open_page("4_review")
        pid = by_label(at.selectbox, "Proposal").value
        at.button(key=f"approve:{pid}").click().run()
        assert_clean(at)
        by_label(at.segmented_control, "Show").set_value("pending").run()
        assert_clean(at)
    finally:
        logger.removeHandler(handler)
    assert svc.get_proposal(pid).status == "approved"
    assert not [r.getMessage() for r in records if "default value" in r.getMessage()]


def test_review_edit_that_breaks_the_harness_is_refused_clearly(world: World, svc: Service) -> None:
    # A proposal that changes harness code (the world's clusters both want the prompt-side repair).
    code = svc.store.get_harness(svc.get_proposal(world.proposal_ids[0]).harness_version).files["harness.py"]  # type: ignore
    second_proposal(svc, world, "p-code-change", {"harness.py": code + "\n# clearer\n"})
    at = open_page("4_review")
    pid = next(p.id for p in svc.proposals(status="pending") if any(f.endswith(".py") for f in p.files))
    by_label(at.selectbox, "Proposal").set_value(pid).run()
    at.toggle(key=f"editing:{pid}").set_value(True).run()
    path = next(f for f in svc.get_proposal(pid).files if f.endswith(".py"))
    at.text_area(key=f"edit:{pid}:{path}").input("def solve(task, model, harness):\n    return (\n").run()
    at.button(key=f"save:{pid}").click().run()
    assert not at.exception
    assert [shown(e.value) for e in at.error] == [f"edit of {pid}/{path}:2: syntax error: '(' was never closed"]
    assert svc.get_proposal(pid).status == "pending"


# ---------------------------------------------------------------- evolution

def _evolution(strategy: str, seconds: list[float], calls: list[int], test: float) -> EvolutionRecord:
    rows = [{"iteration": i + 1, "val_accuracy": 0.4 + 0.1 * i, "train_accuracy": 0.3, "wall_seconds": s,
             "model_calls": c, "tokens": 10 * c, "proposals": 1, "applied": 1, "rolled_back": False,
             "gate": "kept", "harness_version": "h"} for i, (s, c) in enumerate(zip(seconds, calls))]
    return EvolutionRecord(id=f"e-{strategy}", strategy=strategy, suite="reasoning-mix", models=["alpha"],
                           config={"iterations": len(rows), "auto_approve": True}, status="done",
                           iterations=rows, created_at=time.time(),
                           result={"test_accuracy": test, "base_test_accuracy": 0.3,
                                   "spent": {"calls": sum(calls), "tokens": 10 * sum(calls)}})


def test_evolution_comparison_states_speedup_and_delta(svc: Service) -> None:
    svc.store.save_evolution(_evolution("ecdysis", [5.0, 5.0], [40, 40], 0.62))
    svc.store.save_evolution(_evolution("per-instance", [9.2, 9.2], [70, 70], 0.5))
    at = open_page("5_evolution")
    page = texts(at)
    assert "1.84× faster" in page and "1.75× fewer" in page
    assert "+12.0 percentage points" in page
    assert len(at.get("plotly_chart")) >= 3, "one evolution's curve, the comparison curves and cost bars"


def test_evolution_form_starts_one_job_per_strategy(ecdysis_home: Path, svc: Service) -> None:
    register_models()
    at = open_page("5_evolution")
    by_label(at.multiselect, "Model(s)").set_value(["alpha"])
    by_label(at.radio, "Strategy").set_value("both")
    by_label(at.radio, "Gate").set_value("auto")
    for label, value in (("Iterations", 1), ("Train batch", 4), ("Validation", 4), ("Test", 4),
                         ("Gate: minimum net wins", 1), ("Gate: standard errors", 0.5)):
        by_label(at.number_input, label).set_value(value)
    at.form_submit_button[0].click().run(timeout=60)
    assert_clean(at)
    assert sorted(e.strategy for e in svc.evolutions()) == ["ecdysis", "per-instance"]
    assert {(e.config["gate_min_net"], e.config["gate_k"]) for e in svc.evolutions()} == {(1, 0.5)}, \
        "the threshold set in the form is the one the gate uses"
    wait_jobs(svc, timeout=240)
    at.run()
    assert_clean(at)
    assert all(e.status == "done" and len(e.iterations) == 1 for e in svc.evolutions())
    assert "Training time: ecdysis" in texts(at)
    # The gate, visible: the watched evolution's iteration with parent and candidate accuracy,
    # paired wins and losses and the rule, as the engine measured them.
    watched = svc.get_evolution(by_label(at.selectbox, "Evolution").value)
    assert "net ≥ 1 and net > 0.5·SE, where SE = √(wins+losses) with one model" in texts(at)
    gates = next(d.value for d in at.dataframe if "wins" in d.value.columns)
    row = gates.iloc[0]
    candidate = svc.store.get_harness(watched.iterations[0]["candidate_version"] or "")
    if candidate is None:
        assert row["outcome"] == "no candidate"
    else:
        verdict = candidate.metrics["gate"]
        assert (row["parent acc"], row["candidate acc"]) == (verdict["parent_accuracy"], verdict["candidate_accuracy"])
        assert (row["wins"], row["losses"], row["paired instances"]) == (verdict["wins"], verdict["losses"],
                                                                         verdict["n"])
        assert row["outcome"] == ("kept" if verdict["passed"] else "rolled back")
        # The bound the verdict was held to, with its own standard error, so the row can be checked.
        assert row["threshold"] == f"net ≥ 1 and net > 0.5 × {verdict['se']:.2f} = {0.5 * verdict['se']:.2f}"
    assert "scoring the sealed test split" not in texts(at) and "iteration 2/1" not in texts(at)


def test_evolution_figures_say_what_the_numbers_say(svc: Service) -> None:
    """A finished run reads 'finished', a run past its last iteration reads as scoring the test
    split (not 'iteration 2/1'), no change is no change (no green arrow on +0.0, no '1.00× fewer'),
    and the cost charts keep room for their titles."""
    same = _evolution("ecdysis", [6.0], [6], 0.3)
    svc.store.save_evolution(same)
    other = _evolution("per-instance", [6.0], [6], 0.3)
    other.status, other.result["cursor"] = "running", {"iteration": 2, "phase": "test"}
    svc.store.save_evolution(other)
    at = open_page("5_evolution")
    page = texts(at)
    assert "the same number of calls, the same model time." in page, page
    assert "1.00×" not in page
    test_metric = next(m for m in at.metric if m.label == "test (sealed)")
    assert test_metric.delta == "±0.0 pts vs base"
    assert test_metric.proto.color == test_metric.proto.MetricColor.GRAY
    assert test_metric.proto.direction == test_metric.proto.MetricDirection.NONE
    by_label(at.selectbox, "Evolution").set_value(other.id).run()
    assert "all iterations done, scoring the sealed test split" in texts(at)
    assert "iteration 2/1" not in texts(at)
    import json
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    cost = next(f for f in specs if any(a.get("text") == "model calls" for a in f["layout"].get("annotations", [])))
    assert cost["layout"]["margin"]["t"] >= 60, "room above the plots for the panel titles"


def test_the_sealed_test_stars_stand_in_a_column_labelled_test() -> None:
    """With one iteration the test star sat at the tick labelled "2", as if a second iteration had
    run; with two evolutions of different lengths, the shorter one's star sat at an iteration of the
    longer. Every star now stands after the last iteration, at a tick labelled "test"."""
    from app.charts import evolution_curves
    from ecdysis.evolution_log import IterationRow
    one = [IterationRow(iteration=1, val_accuracy=0.4)]
    three = [IterationRow(iteration=i, val_accuracy=0.3 + 0.05 * i) for i in (1, 2, 3)]
    fig = evolution_curves([("A", "ecdysis", one, 0.45), ("B", "per-instance", three, 0.41)], base=0.3)
    stars = [t for t in fig.data if t.name.endswith(" test")]
    assert [list(t.x) for t in stars] == [[4], [4]]
    axis = fig.layout.xaxis
    assert list(axis.tickvals) == [0, 1, 2, 3, 4] and list(axis.ticktext) == ["base", "1", "2", "3", "test"]
    alone = evolution_curves([("A", "ecdysis", one, None)], base=0.3).layout.xaxis
    assert list(alone.ticktext) == ["base", "1"]  # no test scored: no test column


def test_evolution_page_shows_the_pairs_screened_together(svc: Service) -> None:
    """A pair screened and not validated is on the page with its figures and why, its text shown
    as it is (a dataframe cell renders no markdown or HTML)."""
    evo = _evolution("ecdysis", [6.0], [6], 0.3)
    why = "on the batch it netted -1 over **x** <b>alone</b>, which went first and was kept"
    evo.iterations[0]["pairs"] = [{"members": ["p1", "p2"], "operators": ["answer_format_instruction", ""],
                                   "passed": True, "n": 24, "wins": 5, "losses": 1, "net": 4,
                                   "over_alone": {"n": 24, "wins": 2, "losses": 3, "net": -1},
                                   "outcome": "not_validated", "why": why}]
    svc.store.save_evolution(evo)
    at = open_page("5_evolution")
    assert_clean(at)
    assert "Pairs screened together" in texts(at)
    table = next(d.value for d in at.dataframe if "over the later alone" in d.value.columns)
    row = table.iloc[0]
    assert (row["pair"], row["screened"], row["over the later alone"], row["outcome"], row["why"]) == (
        "answer_format_instruction + p2", "net +4 (5 won, 1 lost of 24)", "net -1 (2 won, 3 lost of 24)",
        "not validated", why)


def test_human_gate_waits_for_the_review_page(ecdysis_home: Path, svc: Service) -> None:
    register_models()
    svc.start_evolution_job(EvolveConfig(suite="reasoning-mix", models=["alpha"], iterations=1, batch_size=6,
                                         val_limit=4, test_limit=4, auto_approve=False))
    evo = svc.evolutions()[0]
    deadline = time.time() + 120
    while svc.get_evolution(evo.id).result.get("cursor", {}).get("phase") != "gate":
        assert time.time() < deadline, "the evolution never reached its gate"
        time.sleep(0.3)
    at = open_page("5_evolution")
    assert any("Waiting for your decision" in w.value for w in at.warning)
    review = open_page("4_review")
    assert f"This proposal belongs to evolution {evo.id}" in texts(review)
    assert f"from evolution {evo.id} (ecdysis, iteration 1)" in texts(review)
    deadline = time.time() + 240
    while svc.get_evolution(evo.id).status not in ("done", "failed"):
        # A screening round that leaves nothing diagnoses the batch again: its proposals wait too.
        assert time.time() < deadline, "the evolution did not finish once its proposals were decided"
        if not svc.proposals(status="pending"):
            time.sleep(0.3)
            continue
        review = open_page("4_review")
        for _ in svc.proposals(status="pending"):
            pid = by_label(review.selectbox, "Proposal").value
            review.button(key=f"approve:{pid}").click().run()
            assert_clean(review)
            by_label(review.segmented_control, "Show").set_value("pending").run()
    wait_jobs(svc, timeout=60)
    done = svc.get_evolution(evo.id)
    assert done.status == "done" and len(done.iterations) == 1
    row = done.iterations[0]
    # every approved proposal was acted on: screened alone, and validated if it gained there
    assert row["screened"] >= 1 and row["history"], "the approved proposals were taken up by the evolution"
    assert {h["outcome"] for h in row["history"]} <= {"kept", "rolled_back", "screened_out"}, row["history"]
    at = open_page("5_evolution")
    assert "Each change: predicted, screened alone, validated" in texts(at)
    # The caption states the rule this evolution screened by, with its own thresholds (it said "only
    # changes that gain there" above a change sent on at net +0, which the default rule allows).
    cfg = done.config
    assert (f"when it repairs at least {cfg['screen_min_wins']} of the batch's outcomes" in texts(at)
            and f"not below {cfg['screen_min_net']:+d} by more than {cfg['screen_k']:g} standard errors" in texts(at))
    assert "Only changes that gain there" not in texts(at)
    shown_rows = [df.value for df in at.dataframe if "screened" in df.value.columns]
    assert shown_rows and len(shown_rows[0]) == len(row["history"])


def test_human_gated_evolution_points_to_review(svc: Service) -> None:
    evo = _evolution("ecdysis", [5.0], [10], 0.5)
    evo.status, evo.config = "stopped", {"iterations": 3, "auto_approve": False}
    evo.result["stopped"] = "waiting for decisions on 1 proposal(s): p1"
    svc.store.save_evolution(evo)
    at = open_page("5_evolution")
    assert "waiting for decisions" in texts(at)
    assert at.button(key=f"resume:{evo.id}")


def test_an_evolution_stopped_by_its_budget_resumes_from_the_page_with_a_larger_one(ecdysis_home: Path,
                                                                                    svc: Service) -> None:
    """The page's Resume used to keep the budget, so an evolution its budget stopped stopped again
    at once; the CLI's `--resume --max-model-calls N` had no counterpart here."""
    register_models()
    evo = svc.run_evolution(EvolveConfig(suite="reasoning-mix", models=["alpha"], iterations=1, batch_size=4,
                                         val_limit=4, test_limit=4, auto_approve=True, max_model_calls=3))
    assert evo.status == "stopped" and "iteration 1 not started" in evo.result["stopped"]
    at = open_page("5_evolution")
    assert "iteration 1 not started" in texts(at)
    budget = by_label(at.number_input, "Model-call budget for the resume")
    assert budget.value == 3
    budget.set_value(500).run()
    at.button(key=f"resume:{evo.id}").click().run(timeout=60)
    assert_clean(at)
    wait_jobs(svc, timeout=240)
    done = svc.get_evolution(evo.id)
    assert done.status == "done" and len(done.iterations) == 1, done.result.get("stopped")
    assert done.config["max_model_calls"] == 500 and done.result["spent"]["calls"] > 3


def test_an_evolution_a_token_budget_stopped_says_the_page_cannot_lift_it(ecdysis_home: Path, svc: Service) -> None:
    """The page sets only a call budget: for a CLI evolution its token budget stopped, raising calls
    would stop it again at once, so the page says which CLI flag lifts the limit that stopped it."""
    register_models()
    evo = svc.run_evolution(EvolveConfig(suite="reasoning-mix", models=["alpha"], iterations=1, batch_size=4,
                                         val_limit=4, test_limit=4, auto_approve=True, max_tokens=5))
    assert evo.status == "stopped" and evo.outcome.stopped_by == "tokens", evo.result.get("stopped")
    at = open_page("5_evolution")
    assert_clean(at)
    said = " ".join(texts(at).split())
    assert "The first iteration is running" not in said and "No iteration has finished yet (status stopped)" in said
    assert f"resume it from the CLI with `ecdysis evolve --resume {evo.id}` and `--max-tokens N`" in said, said


def test_evolution_whose_job_died_says_so_and_offers_resume(svc: Service) -> None:
    from ecdysis.store import JobRecord
    evo = _evolution("ecdysis", [5.0], [10], 0.5)
    evo.status = "running"
    svc.store.save_evolution(evo)
    svc.store.create_job(JobRecord(id="jdead", kind="evolve", params={"evolution_id": evo.id}, status="failed",
                                   error="ModelError: backend went away", created_at=time.time(),
                                   updated_at=time.time()))
    at = AppTest.from_file(str(MAIN), default_timeout=60).run()
    at.switch_page("../pages/5_evolution.py").run()
    assert not at.exception
    assert "The evolution's background job failed: ModelError: backend went away" in [shown(e.value) for e in at.error]
    assert at.button(key=f"resume:{evo.id}")


# ---------------------------------------------------------------- harnesses

def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_harnesses_export_and_import(world: World, svc: Service) -> None:
    at = open_page("6_harnesses")
    assert at.get("graphviz_chart") and at.download_button
    exported = svc.export_harness(svc.harnesses()[0].id)
    assert zipfile.ZipFile(io.BytesIO(exported)).namelist()
    uploader = at.file_uploader[0]
    uploader.set_value(("evil.zip", _zip({"../../escape.py": b"print('x')"}), "application/zip")).run()
    assert not at.exception
    assert any("evil.zip was refused" in shown(e.value) for e in at.error)
    at.file_uploader[0].set_value(("garbage.zip", b"this is not a zip", "application/zip")).run()
    assert any("garbage.zip was refused" in shown(e.value) for e in at.error)
    at.file_uploader[0].set_value(("good.zip", exported, "application/zip")).run()
    assert_clean(at)
    assert any("Imported good.zip as version" in shown(s.value) for s in at.success)


def test_harness_lineage_and_diff_between_versions(world: World, svc: Service) -> None:
    pid = world.proposal_ids[0]
    svc.decide(pid, "approve", who="test")
    child = svc.apply_proposal(pid)
    svc.store.update_harness(child.id, status="rolled_back", metrics={**child.metrics, "val_accuracy": 0.25})
    at = open_page("6_harnesses")
    dot = at.get("graphviz_chart")[0].proto.spec
    assert f'"{child.parent}" -> "{child.id}" [style=dashed]' in dot and "val 25%" in dot
    assert by_label(at.selectbox, "To version").value == child.id
    assert at.get("html"), "the diff between parent and child is shown"


# ---------------------------------------------------------------- the pure helpers behind the pages

def test_failure_map_places_every_failure_deterministically(world: World, svc: Service) -> None:
    report = views.report_of(svc.get_diagnosis(world.diagnosis_id))
    points = views.failure_map(report)
    assert len(points) == sum(c.size for c in report.clusters)
    assert points == views.failure_map(report)
    assert {p.cluster_id for p in points} == {c.id for c in report.clusters}
    assert views.failure_map(DiagnosisReport.from_json({"id": "empty"})) == []


def test_comparison_numbers_and_missing_test_split() -> None:
    a, b = _evolution("ecdysis", [10.0], [50], 0.7), _evolution("per-instance", [18.4], [100], 0.5)
    result = views.compare(a, b)
    # to the baseline's final validation accuracy (0.4): 50 calls and 10 s against 100 and 18.4
    assert round(result.speedup_seconds or 0, 2) == 1.84 and result.speedup_calls == 2.0
    assert round(result.accuracy_delta or 0, 1) == 20.0
    assert "2.00× fewer calls" in result.sentences()[0] and "1.84× faster in model time" in result.sentences()[0]
    slower = views.compare(b, a).sentences()
    assert "2.00× more calls" in slower[0] and "1.84× slower" in slower[0] and "−20.0" in slower[2].replace("-", "−")
    b.result.pop("test_accuracy")
    assert views.compare(a, b).accuracy_delta is None
    assert "not available until both evolutions finish" in " ".join(views.compare(a, b).sentences())


def test_lineage_dot_tells_branches_apart() -> None:
    root = HarnessVersion(id="root", files={}, status="starter", created_at=1)
    kept = HarnessVersion(id="kept", files={}, parent="root", status="kept", created_at=2)
    back = HarnessVersion(id="back", files={}, parent="root", status="rolled_back", created_at=3)
    rejected = ProposalRecord(id="p9", diagnosis_id="d", cluster_id="c1", harness_version="kept", spec={},
                              files={}, status="rejected")
    dot = views.lineage_dot([root, kept, back], {"kept": views.ValScore(0.5, 'boolean "b" · 2 models')}, [rejected])
    assert '"root" -> "kept" [style=solid]' in dot and '"root" -> "back" [style=dashed]' in dot
    assert '"kept" -> "p9" [style=dotted' in dot and "val 50%\\nboolean 'b' · 2 models" in dot


def test_a_versions_validation_score_is_one_suites_with_its_models_pooled() -> None:
    """A user validated the starter on two models (16.7 % and 0 %) and read "val 0 %", then "val
    33 %" once an evolution on another suite had measured it. The score is the suite last validated
    on, every model's newest run of it pooled, and says so."""
    from ecdysis.records import RunRecord

    def run(version: str, suite: str, model: str, at: float, right: int, n: int, split: str = "validation",
            status: str = "done") -> RunRecord:
        return RunRecord(id=f"r{at}", suite=suite, model=model, harness_version=version, split=split,
                         instance_ids=[], concurrency=1, status=status, created_at=at,
                         summary={"n": n, "accuracy": round(right / n, 4)})
    starter = HarnessVersion(id="s", files={}, status="starter", created_at=1)
    evolved = HarnessVersion(id="e", files={}, parent="s", status="kept", created_at=2, metrics={"val_accuracy": 0.9})
    gated = HarnessVersion(id="g", files={}, parent="s", status="kept", created_at=3, metrics={"val_accuracy": 0.4})
    runs = [run("s", "reasoning-mix", "qwen", 10, 1, 6), run("s", "reasoning-mix", "smollm2", 11, 0, 6),
            run("s", "reasoning-mix", "qwen", 12, 2, 6),  # qwen's newer run of the suite replaces its first
            run("s", "reasoning-mix", "smollm2", 13, 6, 6, split="train"),  # not validation
            run("s", "reasoning-mix", "smollm2", 14, 6, 6, status="running"),  # not finished
            run("e", "reasoning-mix", "qwen", 15, 3, 12), run("e", "boolean", "qwen", 16, 5, 10),
            run("e", "boolean", "smollm2", 17, 2, 10)]
    scores = views.validation_scores([starter, evolved, gated], runs)
    assert scores["s"] == views.ValScore(round(2 / 12, 4), "reasoning-mix · 2 models")
    assert scores["e"] == views.ValScore(0.35, "boolean · 2 models")  # the runs, not the gate's 0.9
    assert scores["g"] == views.ValScore(0.4, "its evolution's gate")
    assert views.harness_row(starter, scores)["validated on"] == "reasoning-mix · 2 models"
    assert "val 17% (reasoning-mix · 2 models)" in views.harness_label(starter, scores)


def test_side_by_side_rows_pair_changes_and_fold_context() -> None:
    old = "".join(f"line {i}\n" for i in range(20))
    new = old.replace("line 10\n", "line ten\n") + "extra\n"
    rows = diffview.fold(diffview.align(old, new))
    kinds = [r.kind for r in rows]
    assert kinds.count("change") == 1 and kinds.count("insert") == 1 and "fold" in kinds
    change = next(r for r in rows if r.kind == "change")
    assert (change.old_no, change.new_no) == (11, 11)
    html = diffview.side_by_side_html(old, new)
    assert "<ins>ten</ins>" in html and "<del>10</del>" in html
    assert "&lt;b&gt;" in diffview.inline_html("", "<b>\n"), "file text is escaped"
    assert diffview.stats(old, new) == (2, 1)


def test_error_text_is_one_line_without_traceback() -> None:
    assert error_text(InputError("bad zip", path="x.zip")) == "x.zip: bad zip"
    line = error_text(RuntimeError("boom\nTraceback (most recent call last): ..."))
    assert line.startswith("Unexpected RuntimeError: boom") and "Traceback" not in line


def test_a_run_executed_elsewhere_says_so_and_offers_no_resume(world: World, svc: Service) -> None:
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=3))
    svc.store.acquire_lease(f"run:{run.id}", "pid 4242 on build-7 (run) #c0ffee", 60.0)
    at = open_page("1_runs")
    assert f"{run.id} is running elsewhere (held by pid 4242 on build-7 (run) #c0ffee)" in texts(at)
    assert not [b for b in at.button if b.key == f"resume:{run.id}"]
    with pytest.raises(Exception, match="running elsewhere"):
        svc.start_resume_job(run.id)  # a stale page's button is refused the same way


def test_the_apps_own_work_is_neither_running_elsewhere_nor_offered_for_resume(world: World, svc: Service) -> None:
    """A user ran the demo and read that its run was "running elsewhere (held by pid ...)", the
    app's own pid, and was offered to resume the demo's second run, pending its turn. A run this
    process holds (an evolution job's) and a live demo's runs are the app's own work."""
    import time
    from ecdysis.leases import owner_name
    from ecdysis.store import JobRecord
    first = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=3, label="demo"))
    second = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=4, label="demo"))
    svc.store.acquire_lease(f"run:{first.id}", owner_name("evolve"), 60.0)
    svc.store.create_job(JobRecord(id="jdemo", kind="demo", params={"run_ids": [first.id, second.id]},
                                   status="running", created_at=time.time(), updated_at=time.time()))
    at = open_page("1_runs")
    assert_clean(at)
    assert "running elsewhere" not in texts(at)
    assert not [b for b in at.button if b.key in (f"resume:{first.id}", f"resume:{second.id}")]
    svc.store.release_lease(f"run:{first.id}", svc.running_elsewhere()[f"run:{first.id}"])
    svc.store.update_job("jdemo", status="done")  # the demo ended without running the second: resumable
    at = open_page("1_runs")
    assert [b for b in at.button if b.key == f"resume:{second.id}"]


def test_a_job_waiting_for_the_cores_says_which_process_has_them(world: World, svc: Service, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's demo sat at "1 of 12" for half a minute at a time while a test run elsewhere held
    the machine's one generation turn. While a job of the page is live and another process holds
    every turn, the page names that process."""
    import os
    import subprocess
    import sys
    from ecdysis.store import JobRecord
    monkeypatch.setenv("ECDYSIS_ADMISSION_DIR", str(tmp_path / "slots"))
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="alpha", limit=3))
    svc.store.create_job(JobRecord(id="jwait", kind="run", params={"run_id": run.id}, status="running", total=3,
                                   created_at=time.time(), updated_at=time.time()))
    at = open_page("1_runs")
    assert "Waiting for a turn at the cores" not in texts(at)  # nobody holds one
    code = ("import time\nfrom ecdysis.models import admission\n"
            f"with admission.slot({os.cpu_count() or 1}):\n    print('holding', flush=True)\n    time.sleep(60)")
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "holding"
        at = open_page("1_runs")
        assert_clean(at)
        assert f"Waiting for a turn at the cores: another process is generating (pid {other.pid}" in texts(at)
    finally:
        other.kill()
        other.wait(timeout=30)
        svc.store.update_job("jwait", status="cancelled")


def test_an_evolution_executed_elsewhere_says_so_and_offers_no_resume(svc: Service) -> None:
    evo = _evolution("ecdysis", [5.0], [10], 0.5)
    evo.status = "running"
    svc.store.save_evolution(evo)
    svc.store.acquire_lease(f"evolution:{evo.id}", "pid 4242 on build-7 (evolve) #c0ffee", 60.0)
    at = open_page("5_evolution")
    assert "running elsewhere (held by pid 4242 on build-7 (evolve) #c0ffee)" in texts(at)
    assert not [b for b in at.button if b.key == f"resume:{evo.id}"]


def test_exports_are_complete_and_inert_in_a_spreadsheet(world: World, svc: Service) -> None:
    """A run's CSV has one row per instance and its JSON every model call; a diagnosis's CSV one
    row per cluster. Model text that starts like a formula is quoted so a spreadsheet shows it."""
    import csv
    import io
    import json as json_mod
    from dataclasses import replace as dc_replace
    run = svc.get_run(world.run_ids[0])
    results = svc.results(run.id)
    rows = list(csv.reader(io.StringIO(views.run_csv(results))))
    assert rows[0] == list(views.RESULT_COLUMNS) and len(rows) == len(results) + 1
    body = json_mod.loads(views.run_json(run, results))
    assert body["run"]["id"] == run.id and len(body["results"]) == len(results)
    assert sum(len(r["calls"]) for r in body["results"]) == sum(len(r.calls) for r in results)
    hostile = [dc_replace(results[0], answer="=HYPERLINK(\"http://x\")", target="-2")]
    row = list(csv.reader(io.StringIO(views.run_csv(hostile))))[1]
    assert row[4] == "'=HYPERLINK(\"http://x\")" and row[5] == "'-2"
    report = views.report_of(next(d for d in svc.diagnoses() if d.id == world.diagnosis_id))
    clusters = list(csv.reader(io.StringIO(views.diagnosis_csv(report))))
    assert clusters[0] == list(views.CLUSTER_COLUMNS) and len(clusters) == len(report.clusters) + 1


def test_results_filter_by_outcome_category_and_text(world: World, svc: Service) -> None:
    results = svc.results(world.run_ids[0])
    failed = views.filter_results(results, outcome="failed")
    assert failed and all(not r.correct for r in failed)
    assert len(failed) + len(views.filter_results(results, outcome="correct")) == len(results)
    one = results[0].category
    assert {r.category for r in views.filter_results(results, categories=[one])} == {one}
    needle = results[0].calls[0].text.split()[0] if results[0].calls else results[0].instance_id
    found = views.filter_results(results, text=needle.upper())  # case-insensitive, replies included
    assert results[0] in found
    assert views.filter_results(results, text="no reply says this \u2603") == []


def test_cluster_members_filter_by_model_failure_type_and_text(world: World, svc: Service) -> None:
    report = views.report_of(svc.get_diagnosis(world.diagnosis_id))
    cluster = max(report.clusters, key=lambda c: len(c.models))
    rows = views.member_rows(cluster)
    model = rows[0]["model"]
    assert {r["model"] for r in views.filter_members(rows, models=[model])} == {model}
    kind = rows[-1]["failure"]
    assert {r["failure"] for r in views.filter_members(rows, failures=[kind])} == {kind}
    assert rows[0] in views.filter_members(rows, text=rows[0]["instance"].upper())
    assert views.filter_members(rows, text="no evidence says this \u2603") == []
    # On the page: the filters narrow the table, its count says so, and the trajectory box offers
    # only what is shown.
    at = open_page("2_clusters")
    by_label(at.selectbox, "Cluster").set_value(cluster.id).run()
    by_label(at.multiselect, "Models").set_value([model]).run()
    assert_clean(at)
    kept = views.filter_members(rows, models=[model])
    shown = f"{len(kept)} of {len(rows)}" if len(kept) < len(rows) else str(len(rows))
    assert f"{shown} failing instance" in texts(at)
    assert len(by_label(at.selectbox, "Trajectory of instance").options) == len(kept)
    by_label(at.text_input, "Search").set_value("no evidence says this").run()
    assert f"0 of {len(rows)} failing instances" in texts(at)
    assert not [s for s in at.selectbox if s.label == "Trajectory of instance"]


def test_the_runs_page_offers_a_jsonl_import_with_a_usable_default_name(world: World) -> None:
    from app.suite_import import default_name
    at = open_page("1_runs")
    assert any(e.label == "Import a JSONL suite" for e in at.expander)
    assert default_name("My Suite (2).jsonl") == "My-Suite-2" and default_name("???.JSONL") == "my-suite"


def test_the_demo_runs_batch_then_diagnosis_and_reports_its_timings(world: World, svc: Service) -> None:
    """One click: a run per model, then the diagnosis, as one job; the estimate comes from this
    machine's earlier runs of the models, and the finished demo shows what each step took."""
    from app.demo_ui import estimate_text
    estimate = svc.demo_estimate(models=["alpha", "beta", "never-run"], limit=12)
    assert estimate["alpha"] is not None and estimate["never-run"] is None
    assert "no earlier run of never-run" in estimate_text(estimate)
    job = svc.start_demo_job(models=["alpha", "beta"], limit=6)
    wait_jobs(svc)
    done = svc.job(job)
    assert done.status == "done", done.error
    assert set(done.result["timings"]) == {"run alpha", "run beta", "diagnosis"}
    assert [svc.get_run(r).label for r in done.result["run_ids"]] == ["demo", "demo"]
    assert svc.get_diagnosis(done.result["diagnosis_id"]).run_ids == done.result["run_ids"]
    at = open_page("1_runs")
    assert any("Last demo: run alpha" in s.value for s in at.success)


@pytest.mark.slow
def test_the_demo_on_the_real_embedded_model(ecdysis_home: Path) -> None:
    svc = open_service()
    try:
        job = svc.start_demo_job(models=["smollm2"], limit=3)
        wait_jobs(svc, timeout=600)
        done = svc.job(job)
        assert done.status == "done", done.error
        assert done.result["timings"]["run smollm2"] > 0
        assert len(svc.results(done.result["run_ids"][0])) == 3
    finally:
        svc.store.close()  # type: ignore[attr-defined]


def test_a_scoring_call_shows_its_options_and_scores_not_a_reply(ecdysis_home: Path, svc: Service) -> None:
    from ecdysis.harness import ensure_starter, new_version
    from ecdysis.roles.operators import OPERATORS
    register_backend(ScriptedBackend(model_id="scorer", default="Answer: False"))
    starter = ensure_starter(svc.store)
    version = new_version(OPERATORS["option_scoring"].patched(starter.files), parent=starter.id,  # type: ignore[attr-defined]
                          note="option_scoring")
    svc.store.put_harness(version)
    run = svc.run(RunRequest(suite="boolean", model="scorer", harness=version.id, limit=2))
    at = open_page("1_runs")
    assert by_label(at.selectbox, "Run").value == run.run_id
    assert "scoring options" in texts(at) and "Scored, not generated" in texts(at)
    table = next(d.value for d in at.dataframe if "log-probability" in d.value.columns)
    assert list(table["option"]) == ["Answer: True", "Answer: False"]
    assert list(table["log-probability"]) == ["-20.000", "0.000"]


def cluster_then_review(diagnosis_id: str, cluster_id: str, proposal_id: str) -> tuple[str, list[str], AppTest]:
    """The Diagnoses page opened at one cluster (its text and its page links), then the Review page
    opened at one proposal (the app, for its widgets)."""
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.session_state["_remember:diagnosis"] = diagnosis_id
    at.session_state[f"_remember:cluster:{diagnosis_id}"] = cluster_id
    at.run()
    at.switch_page("../pages/3_diagnoses.py").run()
    assert_clean(at)
    page, links = texts(at), [e.proto.label for e in at.get("page_link")]
    at.session_state["_remember:proposal"] = proposal_id
    at.switch_page("../pages/4_review.py").run()
    assert_clean(at)
    return page, links, at


def test_the_engines_alternative_reads_as_such_on_the_diagnoses_and_review_pages(ecdysis_home: Path,
                                                                                   svc: Service) -> None:
    """A role model that names one repair by habit: the cluster's conversation shows the roles'
    specification and then the engine's alternative with why it was drafted, and the Review page
    labels the alternative and says the same above its patch."""
    import json
    register_models()
    spec = {"target_files": ["harness.py", "harness.toml"], "change": "c", "root_cause": "r", "expected_effect": "e", "risk": "k",
            "scope": "any task"}
    register_backend(ScriptedBackend([
        Rule(match="Attributor said:", text=json.dumps({"operator": "retry_unparsable", "spec": spec,
                                                        "replies": []})),
        Rule(match="Hard checks:", text=json.dumps({"decision": "accept", "objections": []})),
        Rule(match="Investigator said:", text=json.dumps({"verdict": "harness-level", "reason": "both models",
                                                          "cross_instance": "10", "cross_model": "2 of 2"})),
        Rule(match="Harness files (version", text=json.dumps({"root_cause": "r", "component": "harness.py",
                                                              "evidence": ["e"]}))], model_id="habit-app"))
    runs = [svc.run(RunRequest(suite="reasoning-mix", model=m, limit=10)).run_id for m in ("alpha", "beta")]
    record = svc.diagnose(runs, role_backend="habit-app")
    report = views.report_of(record)
    cluster = next(c for c in report.clusters if report.patch(c.id).alternative_id)
    theirs, mine = report.proposal_for(cluster.id), report.alternative_for(cluster.id)
    assert theirs.spec.operator == "retry_unparsable" and mine.spec.operator != theirs.spec.operator
    page, links, at = cluster_then_review(record.id, cluster.id, mine.id)
    assert f"**Final modification specification** — proposal `{theirs.id}`" in page
    assert f"**The engine's alternative** — proposal `{mine.id}`" in page
    assert "names retry_unparsable and was endorsed by the Critic" in page
    assert "Review these proposals" in links
    picker = by_label(at.selectbox, "Proposal")
    assert picker.value == mine.id and "the engine's alternative" in picker.format_func(mine.id)
    assert "the engine's alternative" not in picker.format_func(theirs.id)
    assert "The engine's alternative: the roles' proposal" in texts(at)


def test_another_reading_repair_reads_as_such_on_the_diagnoses_and_review_pages(ecdysis_home: Path, svc: Service,
                                                                                  tmp_path: Path) -> None:
    """A cluster whose repair only changes how replies are read also gets its other reading
    repairs: the cluster's conversation shows each after the roles' specification, with why it was
    drafted (trying it asks the model nothing new), and the Review page labels it as such."""
    from test_strategies import two_readings_world
    models = ("reads-app-a", "reads-app-b")
    _, suite = two_readings_world(tmp_path, svc.store, models)
    runs = [svc.run(RunRequest(suite=suite, model=m, split="train", limit=12)).run_id for m in models]
    record = svc.diagnose(runs)
    report = views.report_of(record)
    cluster = next(c for c in report.clusters if report.patch(c.id).reading_ids)
    theirs, (sibling,) = report.proposal_for(cluster.id), report.readings_for(cluster.id)
    page, links, at = cluster_then_review(record.id, cluster.id, sibling.id)
    assert f"**Final modification specification** — proposal `{theirs.id}`" in page
    assert f"**Another reading repair** — proposal `{sibling.id}`" in page
    assert f"beside proposal {theirs.id} ({theirs.spec.operator})" in page
    assert "Review these proposals" in links
    picker = by_label(at.selectbox, "Proposal")
    assert picker.value == sibling.id and picker.format_func(sibling.id).endswith("another reading repair")
    assert not picker.format_func(theirs.id).endswith("reading repair")

"""The strategy benchmark's quick mode end to end, on a scripted model whose every answer is right
but wrapped in a sentence (a harness-level extraction fault every strategy can repair): the JSON
has the documented shape, and the figures follow from the stored evolutions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import compare_strategies  # noqa: E402


def test_quick_benchmark_writes_the_documented_figures(tmp_path: Path, monkeypatch) -> None:
    from ecdysis.suites import load_suite
    suite = load_suite("arithmetic")
    rules = [{"match": i.input, "text": f"Let me think.\nThe answer is {i.target}."} for i in suite.instances]
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"rules": rules, "default": "I do not know."}))
    out = tmp_path / "results"
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--home", str(tmp_path / "home"), "--out", str(out)]) == 0
    result = json.loads((out / "compare_strategies.json").read_text())
    assert result["seeds"] == [1, 2]
    for name in ("ecdysis", "per-instance", "self-evolution"):
        acc = result["strategies"][name]["test_accuracy"]
        assert acc["ci95"][0] <= acc["mean"] <= acc["ci95"][1]
        assert 0 < result["strategies"][name]["model_calls"] <= 200  # the budget holds, every call charged
    ours = result["strategies"]["ecdysis"]
    assert ours["test_accuracy"]["mean"] == 1.0 > ours["base_test_accuracy"]
    for base in ("per-instance", "self-evolution"):
        cmp = result["comparison"][base]
        assert set(cmp) >= {"speedup_calls", "speedup_seconds", "test_delta_points"}
        assert set(cmp["test_delta_points"]) == {"mean", "ci95", "ci95_seeds"}
    table = (out / "compare_strategies.md").read_text()
    assert "| ecdysis |" in table
    # Per seed: what each evolution kept, in the order its gate passed it, and a row that says so.
    for seed in ("1", "2"):
        kept = ours["per_seed"][seed]["kept"]
        assert kept and all(k for k in kept)
        assert f"| {seed} | ecdysis | 1.000 | 1.000 |" in table
        assert ", ".join(f"`{k}`" for k in kept) in table
    # A results file written before the kept changes were recorded: --rerender says so, and with
    # the data folder that holds its evolutions fills them in, leaving the rest of the file alone.
    old = tmp_path / "old.json"
    stripped = json.loads(json.dumps(result))
    for st in stripped["suites"]["arithmetic"]["heuristic"]["strategies"].values():
        for entry in st["per_seed"].values():
            for key in ("kept", "calls", "seconds", "abandoned"):
                del entry[key]
    old.write_text(json.dumps(stripped))
    assert compare_strategies.main(["--rerender", str(old)]) == 0
    assert "| 1 | ecdysis | 1.000 | 1.000 |" in old.with_suffix(".md").read_text()
    assert "not recorded" in old.with_suffix(".md").read_text()
    assert compare_strategies.main(["--rerender", str(old), "--home", str(tmp_path / "home")]) == 0
    assert json.loads(old.read_text()) == result
    assert old.with_suffix(".md").read_text() == table
    # A rerun on the same data folder finds every evolution finished and runs nothing again.
    before = (out / "compare_strategies.json").read_text()
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--home", str(tmp_path / "home"), "--out", str(out)]) == 0
    again = json.loads((out / "compare_strategies.json").read_text())
    assert again["strategies"] == json.loads(before)["strategies"]
    # Rerun one suite and carry the others over from an earlier file: the rerun suite stays the
    # headline, and the carried block says when and under what load it was measured.
    earlier = json.loads(before)
    earlier["suites"] = {"other-suite": earlier["suites"]["arithmetic"], **earlier["suites"]}
    # ... and a block of LLM roles of the suite rerun here, which this (heuristic) run does not measure
    earlier["suites"]["arithmetic"] = {**earlier["suites"]["arithmetic"],
                                       "some-role-model": earlier["suites"]["arithmetic"]["heuristic"]}
    earlier["measured"], earlier["machine"]["load_before"] = "2026-01-02 03:04 UTC, 5 s in all", 9.5
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--home", str(tmp_path / "home"), "--out", str(out),
                                    "--keep-from", str(tmp_path / "earlier.json")]) == 0
    merged = json.loads((out / "compare_strategies.json").read_text())
    assert list(merged["suites"]) == ["arithmetic", "other-suite"]
    assert merged["strategies"] == again["strategies"]  # the headline is the suite measured now
    carried = merged["suites"]["other-suite"]["heuristic"]
    assert carried["carried_over"]["measured"] == "2026-01-02 03:04 UTC, 5 s in all"
    assert "carried_over" not in merged["suites"]["arithmetic"]["heuristic"]
    assert merged["suites"]["arithmetic"]["some-role-model"]["carried_over"]["measured"] == earlier["measured"]
    assert "carried over from the run of 2026-01-02 03:04 UTC, 5 s in all, load 9.5" in \
        (out / "compare_strategies.md").read_text()
    # New seeds (new train windows) under a tag: new evolutions, labelled so, the old ones untouched.
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--home", str(tmp_path / "home"), "--out", str(tmp_path / "later"),
                                    "--first-seed", "3", "--tag", "v2"]) == 0
    later = json.loads((tmp_path / "later" / "compare_strategies.json").read_text())
    assert later["seeds"] == [3, 4] and later["config"]["tag"] == "v2"
    from ecdysis.settings import Settings
    from storage import open_store
    labels = [e.config["label"] for e in open_store(Settings.from_env().database_url).list_evolutions(limit=100)]
    assert sorted(lab.split(":", 2)[2] for lab in labels if lab.endswith(":v2")) == sorted(
        f"{name}:{seed}:heuristic:v2" for name in ("ecdysis", "per-instance", "self-evolution") for seed in (3, 4))
    assert len(labels) == 12
    # A change that leaves the baselines' code alone: Ecdysis alone runs again under a new tag and is
    # compared with the baselines' finished evolutions of the earlier tag, which are not run again.
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--home", str(tmp_path / "home"), "--out", str(tmp_path / "v3"),
                                    "--first-seed", "3", "--tag", "v3", "--baselines-tag", "v2"]) == 0
    v3 = json.loads((tmp_path / "v3" / "compare_strategies.json").read_text())
    labels = [e.config["label"] for e in open_store(Settings.from_env().database_url).list_evolutions(limit=100)]
    assert len(labels) == 14 and sorted(lab.split(":", 2)[2] for lab in labels if lab.endswith(":v3")) == [
        "ecdysis:3:heuristic:v3", "ecdysis:4:heuristic:v3"]
    for base in ("per-instance", "self-evolution"):
        assert v3["strategies"][base] == later["strategies"][base]
    assert "tag `v2` in the same data folder, not run again" in (tmp_path / "v3" / "compare_strategies.md").read_text()
    with pytest.raises(SystemExit, match="no finished evolution labelled bench:arithmetic:per-instance:3"):
        compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                 "--home", str(tmp_path / "home"), "--out", str(tmp_path / "v4"),
                                 "--first-seed", "3", "--tag", "v4", "--baselines-tag", "v9"])


def test_the_proposer_picks_benchmark_reads_the_cases_a_strategy_run_left(tmp_path: Path, monkeypatch) -> None:
    """`bench/proposer_picks.py` diagnoses again the first batch of each heuristic Ecdysis
    evolution a strategy benchmark stored, and has the LLM Proposer answer every case: here a
    scripted role model that always names answer extraction, the ranking's first repair for answers
    wrapped in a sentence."""
    from bench import proposer_picks
    from ecdysis.suites import load_suite
    suite = load_suite("arithmetic")
    rules = [{"match": i.input, "text": f"Let me think.\nThe answer is {i.target}."} for i in suite.instances]
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"rules": rules, "default": "I do not know."}))
    spec = {"target_files": ["harness.py"], "change": "c", "root_cause": "r", "expected_effect": "e", "risk": "k",
            "scope": "s"}
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps({"rules": [], "default": json.dumps({"operator": "answer_extraction", "spec": spec,
                                                                      "replies": []})}))
    home, out = tmp_path / "home", tmp_path / "results"
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    monkeypatch.setenv("ECDYSIS_HOME", str(home))
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--strategy", "ecdysis", "--home", str(home), "--out", str(out)]) == 0
    assert proposer_picks.main(["--home", str(home), "--tag", "", "--roles", f"scripted:{roles}",
                                "--out", str(out)]) == 0
    result = json.loads((out / "proposer_picks.json").read_text())
    rows = result["rows"]
    assert rows and result["tally"]["cases"] == len(rows) == result["tally"]["head"]
    assert {r["evolution"] for r in rows} <= {"arithmetic · seed 1", "arithmetic · seed 2"}
    assert all(r["ranked"][0] == r["named"] == "answer_extraction" and r["ended"] == "model" for r in rows)
    assert f"named the ranking's first operator in {len(rows)}" in (out / "proposer_picks.md").read_text()
    assert proposer_picks.main(["--home", str(home), "--tag", "no-such-tag", "--out", str(out)]) == 2


def wrapped_answers(tmp_path: Path, monkeypatch) -> tuple[Any, Path, Path, Path]:
    """The arithmetic suite, a scripted model that answers every question right but wrapped in a
    sentence, and a data folder and results folder for the benchmark (no database URL from the
    environment)."""
    from ecdysis.suites import load_suite
    suite = load_suite("arithmetic")
    rules = [{"match": i.input, "text": f"Let me think.\nThe answer is {i.target}."} for i in suite.instances]
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"rules": rules, "default": "I do not know."}))
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    return suite, script, tmp_path / "home", tmp_path / "results"


def test_a_second_holdout_window_validates_and_tests_on_other_instances(tmp_path: Path, monkeypatch) -> None:
    """`--holdout-window 1`: the same train windows, the next as many validation and test
    instances. Its evolutions are its own (labels tagged `holdout1`), and their validation and
    sealed test runs hold exactly the second window of each split, none of the first."""
    from ecdysis.runner import pick_instances
    from ecdysis.service import Service
    from storage import open_store
    suite, script, home, out = wrapped_answers(tmp_path, monkeypatch)
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--strategy", "ecdysis", "--holdout-window", "1", "--home", str(home),
                                    "--out", str(out)]) == 0
    result = json.loads((out / "compare_strategies.json").read_text())
    assert result["config"]["holdout_window"] == 1
    assert "(window 1 of each split" in (out / "compare_strategies.md").read_text()
    svc = Service(open_store(compare_strategies.home_settings(str(home)).database_url))
    evos = svc.store.list_evolutions(limit=100)
    assert len(evos) == 2 and all(e.config["label"].endswith(":heuristic:holdout1") for e in evos)
    for split in ("validation", "test"):
        second = {i.id for i in pick_instances(suite, split, 6, window=1)}
        first = {i.id for i in pick_instances(suite, split, 6)}
        runs = [r for r in svc.store.list_runs(limit=1000) if r.split == split]
        assert runs and all(set(r.instance_ids) == second for r in runs), split
        assert not second & first


def test_rotated_holdout_windows_give_each_seed_its_own_held_out_sets(tmp_path: Path, monkeypatch) -> None:
    """`--rotate-holdout 2`: seed S validates and tests on window S mod 2, so seed 1 runs on the
    second window (its label tagged `holdout1`) and seed 2 on the first (untagged, the evolution
    a run without rotation makes); each window has its own starter accuracy, and the figures carry
    an interval across seeds next to the one on these seeds."""
    from ecdysis.runner import pick_instances
    from ecdysis.service import Service
    from storage import open_store
    suite, script, home, out = wrapped_answers(tmp_path, monkeypatch)
    argv = ["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}", "--strategy", "ecdysis",
            "--strategy", "per-instance", "--home", str(home), "--out", str(out)]
    with pytest.raises(SystemExit):
        compare_strategies.main([*argv, "--rotate-holdout", "2", "--holdout-window", "1"])
    assert compare_strategies.main([*argv, "--rotate-holdout", "2"]) == 0
    result = json.loads((out / "compare_strategies.json").read_text())
    block = result["suites"]["arithmetic"]["heuristic"]
    assert block["holdout_windows"] == {"1": 1, "2": 0} and set(block["base_val_by_window"]) == {"0", "1"}
    for figure in (block["strategies"]["ecdysis"]["test_accuracy"],
                   block["comparison"]["per-instance"]["test_delta_points"]):
        assert set(figure) == {"mean", "ci95", "ci95_seeds"}
    table = (out / "compare_strategies.md").read_text()
    assert "window `seed mod 2`" in table and "| 1 (window 1) | ecdysis |" in table and "across seeds" in table
    svc = Service(open_store(compare_strategies.home_settings(str(home)).database_url))
    evos = {e.config["seed"]: e for e in svc.store.list_evolutions(limit=100) if e.config["strategy"] == "ecdysis"}
    assert evos[1].config["label"].endswith(":heuristic:holdout1") and evos[2].config["label"].endswith(":heuristic")
    for seed, window in ((1, 1), (2, 0)):
        for split in ("validation", "test"):
            ids = {i.id for i in pick_instances(suite, split, 6, window=window)}
            runs = [r for r in svc.store.list_runs(limit=1000) if r.split == split
                    and r.label and r.label.startswith(evos[seed].config["label"] + ":")]
            assert runs and all(set(r.instance_ids) == ids for r in runs), (seed, split)


def test_the_interval_across_seeds_carries_what_differs_between_seeds() -> None:
    """Seeds that agree within themselves but not with each other: resampling instances within
    each seed cannot move the mean, resampling the seeds too spans from one to the other."""
    m, within = compare_strategies.bootstrap([[1.0] * 20, [0.0] * 20, [1.0] * 20, [0.0] * 20])
    _, across = compare_strategies.bootstrap([[1.0] * 20, [0.0] * 20, [1.0] * 20, [0.0] * 20], seeds_too=True)
    assert m == 0.5 and within == [0.5, 0.5]
    assert across[0] <= 0.25 and across[1] >= 0.75


def test_seeds_that_test_on_the_same_instances_count_them_once() -> None:
    """Twelve seeds on one test window are one test set, not twelve: drawn alike in every seed,
    their interval is a single seed's. Twelve seeds on instances of their own narrow it, as
    resampling the shared window apart in each seed wrongly did; and a question both models
    answered is one draw, not two."""
    import random
    rng = random.Random(3)
    one = {("qwen", f"q{k}"): float(rng.random() < 0.4) for k in range(100)}
    single = compare_strategies.bootstrap([one])
    width = single[1][1] - single[1][0]
    assert compare_strategies.bootstrap([one] * 12) == single
    assert compare_strategies.bootstrap([one] * 12, seeds_too=True)[1] == single[1]
    own = [{("qwen", f"seed{s}-{i}"): v for (_, i), v in one.items()} for s in range(12)]
    for narrower in (compare_strategies.bootstrap(own)[1], compare_strategies.bootstrap([list(one.values())] * 12)[1]):
        assert narrower[1] - narrower[0] < width / 2
    both = {**one, **{("smollm2", i): v for (_, i), v in one.items()}}
    assert compare_strategies.bootstrap([both]) == single


def test_a_results_file_gets_its_intervals_recomputed_from_its_stored_evolutions(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """`--reinterval`: a file written with intervals drawn apart in each seed is recomputed from
    its evolutions' test outcomes to what a run today writes, and says so; a file whose evolutions
    another home does not hold is left as it was, and one whose stored outcomes disagree with its
    means is refused."""
    suite, script, home, out = wrapped_answers(tmp_path, monkeypatch)
    assert compare_strategies.main(["--quick", "--suite", "arithmetic", "--model", f"scripted:{script}",
                                    "--strategy", "ecdysis", "--strategy", "per-instance", "--home", str(home),
                                    "--out", str(out)]) == 0
    path = out / "compare_strategies.json"
    fresh = json.loads(path.read_text())
    assert fresh["intervals"] == {"method": compare_strategies.INTERVALS}
    old = json.loads(path.read_text())
    del old["intervals"]
    block = old["suites"]["arithmetic"]["heuristic"]
    for figure in (block["strategies"]["ecdysis"]["test_accuracy"],
                   block["comparison"]["per-instance"]["test_delta_points"]):
        figure["ci95"] = [figure["mean"], figure["mean"]]
        figure.pop("ci95_seeds", None)
    path.write_text(json.dumps(old))
    assert "apart" in compare_strategies.rerender(path).splitlines()[0]

    other = tmp_path / "other"
    assert compare_strategies.main(["--home", str(other), "--reinterval", str(path)]) == 0
    assert json.loads(path.read_text()) == old

    assert compare_strategies.main(["--home", str(home), "--reinterval", str(path)]) == 0
    again = json.loads(path.read_text())
    assert again["intervals"]["method"] == compare_strategies.INTERVALS and again["intervals"]["recomputed"]
    ours = fresh["suites"]["arithmetic"]["heuristic"]
    assert again["suites"]["arithmetic"]["heuristic"]["strategies"] == ours["strategies"]
    assert again["suites"]["arithmetic"]["heuristic"]["comparison"] == ours["comparison"]
    assert again["comparison"] == fresh["comparison"]
    assert "(recomputed " in (out / "compare_strategies.md").read_text().splitlines()[0]

    again["suites"]["arithmetic"]["heuristic"]["strategies"]["ecdysis"]["test_accuracy"]["mean"] = 0.123
    path.write_text(json.dumps(again))
    with pytest.raises(ValueError, match="stored outcomes give a mean test accuracy"):
        compare_strategies.main(["--home", str(home), "--reinterval", str(path)])


def test_the_starting_validation_is_the_starter_the_evolutions_start_from(tmp_path: Path) -> None:
    """On a function-calling suite the evolutions start from the starter agent, so the curves'
    starting point must be that harness's validation accuracy, not the reasoning starter's (which
    never shows the model the functions: on BFCL it made the per-instance search's unchanged
    harness look like a raised target, and its speedup a number instead of None)."""
    from ecdysis.harness import ensure_starter, ensure_starter_agent
    from ecdysis.service import Service
    from ecdysis.suites.bfcl import is_fetched
    from storage import open_store
    if not is_fetched():
        pytest.skip("the BFCL data is not fetched (scripts/fetch_bfcl.py)")
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"rules": [], "default": "[]"}))
    settings = compare_strategies.home_settings(str(tmp_path / "home"))
    svc = Service(open_store(settings.database_url), settings)
    args = argparse.Namespace(val_limit=3, model=[f"scripted:{script}"])
    assert compare_strategies.base_val(svc, args, "bfcl-irrelevance", 0) == 1.0  # [] calls nothing: right
    runs = svc.store.list_runs()
    assert [r.harness_version for r in runs] == [ensure_starter_agent(svc.store).id]
    assert runs[0].harness_version != ensure_starter(svc.store).id
    # A reasoning suite keeps the reasoning starter.
    compare_strategies.base_val(svc, args, "arithmetic", 0)
    assert {r.harness_version for r in svc.store.list_runs() if r.suite == "arithmetic"} == {ensure_starter(svc.store).id}

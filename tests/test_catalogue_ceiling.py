"""The catalogue's ceiling (`bench/catalogue_ceiling.py`): greedy forward selection over repair
operators, choosing on the split it reports.

Planted world: a scripted model whose every answer is right but follows a line of prose, so the
starter's first-line extractor fails them all and only a repair of reading recovers them; an
operator that changes the prompt changes nothing (the model answers the question it is asked).
The search must keep the repair of reading, stop when nothing gains, report the paired deltas
from the outcomes, and find its runs again on a rerun instead of paying for them twice. A real
embedded model runs the quick mode end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import catalogue_ceiling  # noqa: E402

OPERATORS = ["answer_format_instruction", "answer_extraction", "output_budget"]


def _script(tmp_path: Path) -> Path:
    from ecdysis.suites import load_suite
    suite = load_suite("arithmetic")
    rules = [{"match": i.input, "text": f"Let me think.\nThe answer is {i.target}."} for i in suite.instances]
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"rules": rules, "default": "I do not know."}))
    return script


def _run(tmp_path: Path, script: Path, out: Path) -> dict:
    assert catalogue_ceiling.main(["--suite", "arithmetic", "--model", f"scripted:{script}", "--split", "test",
                                   "--limit", "6", "--train", "6", "--depth", "3", "--operators", *OPERATORS,
                                   "--reference", "answer_extraction", "--reference", "choice_matching",
                                   "--reference", "answer_format_instruction+answer_extraction",
                                   "--home", str(tmp_path / "home"), "--out", str(out)]) == 0
    return json.loads((out / "catalogue_ceiling.json").read_text())


def test_the_ceiling_keeps_the_repair_that_gains_and_stops_when_nothing_does(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    script, out = _script(tmp_path), tmp_path / "results"
    result = _run(tmp_path, script, out)
    assert result["starter"] == {**result["starter"], "accuracy": 0.0, "n": 6}
    first, second = result["rounds"]
    assert first["base"] == [] and first["kept"] == "answer_extraction"
    by_op = {c["operator"]: c for c in first["candidates"]}
    assert by_op["answer_extraction"]["accuracy"] == 1.0
    assert by_op["answer_extraction"]["wins"] == 6 and by_op["answer_extraction"]["losses"] == 0
    # A prompt change that leaves every reply as it was gains nothing and is not kept.
    assert by_op["answer_format_instruction"]["accuracy"] == 0.0
    assert by_op["answer_format_instruction"]["delta_points"]["mean"] == 0.0
    # Round two starts from the kept repair; nothing gains over 1.0, so the search stops there.
    assert second["base"] == ["answer_extraction"] and second["kept"] is None
    assert {c["operator"] for c in second["candidates"]} == {"answer_format_instruction", "output_budget"}
    ceiling = result["ceiling"]
    assert ceiling["chain"] == ["answer_extraction"]
    assert ceiling["accuracy"]["mean"] == 1.0
    assert ceiling["vs_starter"]["wins"] == 6 and ceiling["vs_starter"]["delta_points"]["mean"] == 100.0
    # The reference the ceiling equals is 0 points below it; an operator the suite cannot take says why.
    assert result["references"]["answer_extraction"]["ceiling_minus_it"]["delta_points"]["mean"] == 0.0
    assert "options" in result["references"]["choice_matching"]["unavailable"]
    # A reference of two changes applies them in the order named: here the prompt change and the repair.
    pair = result["references"]["answer_format_instruction+answer_extraction"]
    assert pair["accuracy"] == 1.0 and pair["ceiling_minus_it"]["wins"] == pair["ceiling_minus_it"]["losses"] == 0
    assert result["left_out"] == [n for n in result["left_out"] if n not in OPERATORS] and \
        "self_consistency" in result["left_out"]
    table = (out / "catalogue_ceiling.md").read_text()
    assert "**Ceiling: answer_extraction, 1.000" in table
    assert "| 1 | starter | **`answer_extraction`** | 1.000 | 6 / 0 |" in table
    # A rerun on the same data folder finds every run finished: no call is made again.
    again = _run(tmp_path, script, out)
    assert again["rounds"] == result["rounds"] and again["ceiling"] == result["ceiling"]


def test_an_unknown_operator_is_refused_with_the_catalogue(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit, match="unknown operator.*no_such_operator.*answer_extraction"):
        catalogue_ceiling.main(["--suite", "arithmetic", "--model", f"scripted:{_script(tmp_path)}",
                                "--operators", "no_such_operator", "--home", str(tmp_path / "home"),
                                "--out", str(tmp_path / "results")])


@pytest.mark.slow
def test_quick_mode_on_a_real_embedded_model(tmp_path: Path, monkeypatch) -> None:
    """SmolLM2 on six BIG-Bench Hard navigate questions: every candidate is measured on all six outcomes, the
    ceiling is at least the starter, and its accuracy is what its rounds say."""
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    out = tmp_path / "results"
    assert catalogue_ceiling.main(["--quick", "--home", str(tmp_path / "home"), "--out", str(out)]) == 0
    result = json.loads((out / "catalogue_ceiling.json").read_text())
    assert result["models"] == ["smollm2"] and result["starter"]["n"] == 6
    measured = [c for r in result["rounds"] for c in r["candidates"] if "accuracy" in c]
    assert measured and all(c["wins"] + c["losses"] <= 6 for c in measured)
    assert result["ceiling"]["accuracy"]["mean"] >= result["starter"]["accuracy"]
    kept = [r["kept"] for r in result["rounds"] if r["kept"]]
    assert result["ceiling"]["chain"] == kept
    assert result["starter"]["model_s"] > 0


def test_a_run_another_process_holds_is_waited_for_then_reused(tmp_path: Path, monkeypatch, capsys) -> None:
    """A second ceiling on the same data folder finds a run another process is executing: it waits
    for that run's lease instead of failing, and the run is made once and finished once (by
    whichever process takes it when the lease is released)."""
    import threading
    import time

    from bench.compare_strategies import home_settings
    from ecdysis.budget import CallBudget
    from ecdysis.errors import Conflict
    from ecdysis.harness import ensure_starter
    from ecdysis.leases import Held, run_key
    from ecdysis.runner import Runner
    from ecdysis.service import Service
    from ecdysis.suites import load_suite
    from storage import open_store
    monkeypatch.delenv("ECDYSIS_DATABASE_URL", raising=False)
    monkeypatch.setattr(catalogue_ceiling, "POLL_S", 0.2)
    script, home = _script(tmp_path), tmp_path / "home"
    settings = home_settings(str(home))
    svc = Service(open_store(settings.database_url), settings)
    model, suite = f"scripted:{script}", load_suite("arithmetic")
    starter = ensure_starter(svc.store)
    train = catalogue_ceiling.Split.of(suite, "train", 6)
    run = Runner(svc.store, limits=svc.limits()).create(suite, model, starter, split="train",
                                                        label=train.label(starter.id, model),
                                                        instances=list(train.instances))
    held = threading.Event()

    def other_process() -> None:  # holds the run's lease a moment, then tries to finish the run
        with Held(svc.store, run_key(run.id), ttl_s=30, role="other"):
            held.set()
            time.sleep(1.0)
        try:
            svc.execute_run(run.id, budget=CallBudget())
        except Conflict:  # the waiting ceiling took the run first
            pass

    worker = threading.Thread(target=other_process)
    worker.start()
    held.wait(5)
    result = _run(tmp_path, script, tmp_path / "results")
    worker.join()
    assert "waiting: run " + run.id in capsys.readouterr().out
    assert result["train_outcomes"] == 6 and result["ceiling"]["chain"] == ["answer_extraction"]
    labels = [r.label for r in svc.store.list_runs(limit=1000)]
    assert len(labels) == len(set(labels))  # every run made once
    assert svc.store.get_run(run.id).status == "done" and len(svc.store.get_results(run.id)) == 6

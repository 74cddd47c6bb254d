"""The typed records an evolution leaves in the store (`ecdysis.evolution_log`): what the engine
writes, read back typed, with nothing the readers need left behind in an untyped key; rows of older
versions still read; and the faces (app, pages, CLI, comparison) never re-parse the raw JSON."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from ecdysis.evolution_log import (AppliedChange, EvolutionOutcome, GateStep, IterationRow, Measured, Screening,
                                   Tried, VersionMetrics)
from ecdysis.evolve import Evolver
from tests.test_evolve import config, world  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]

# Keys of the stored JSON that only the engine reads: its resume state and bookkeeping.
ENGINE_RESULT_KEYS = {"paid_runs", "tried_instances", "failed_train", "abandoned"}
ENGINE_STEP_KEYS = {"step", "skipped"}
ENGINE_CHANGE_KEYS = {"applied"}
ENGINE_SCREEN_KEYS = {"against", "candidate", "guards", "instances", "cluster_instances"}
ENGINE_METRICS_KEYS: set[str] = set()


def names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def test_what_the_engine_stores_reads_back_typed_and_whole(world) -> None:  # noqa: F811
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite)).id)
    assert evo.status == "done"
    stored = svc.get_evolution(evo.id)
    raw, rows = stored.iterations, stored.rows
    assert [r.iteration for r in rows] == [r["iteration"] for r in raw] == [1, 2]
    for d, row in zip(raw, rows):
        assert set(d) - names(IterationRow) == set(), "a key the engine writes has no typed field"
        assert (row.val_accuracy, row.model_calls, row.gate) == (d["val_accuracy"], d["model_calls"], d["gate"])
        for sd, step in zip(d["steps"], row.steps or ()):
            assert set(sd) - names(GateStep) - ENGINE_STEP_KEYS == set()
            assert step.kept == sd["kept"] and step.verdict is not None
            assert step.verdict.wins == sd["verdict"]["wins"]
            for cd, change in zip(sd["changes"], step.changes):
                assert set(cd) - names(AppliedChange) - ENGINE_CHANGE_KEYS == set()
                assert change.proposal_id == cd["proposal_id"]
                if cd.get("screened"):
                    assert set(cd["screened"]) - names(Screening) - ENGINE_SCREEN_KEYS == set()
                    assert change.screened is not None and change.screened.net == cd["screened"]["net"]
                if cd.get("measured"):
                    extra = set(cd["measured"]) - names(Measured) - {"parent_calls", "candidate_calls"}
                    assert extra == set()
                    assert change.measured is not None and change.measured.val_delta == cd["measured"]["val_delta"]
        assert [t.proposal_id for t in row.history] == [h["proposal_id"] for h in d["history"]]
        assert {k for h in d["history"] for k in h} <= names(Tried)
    first = rows[0]
    assert first.kept >= 1 and first.steps and first.steps[0].kept  # the world's fix is kept in iteration 1

    out = stored.outcome
    assert set(stored.result) - names(EvolutionOutcome) - ENGINE_RESULT_KEYS == set()
    assert (out.test_accuracy, out.base_test_accuracy) == (stored.result["test_accuracy"],
                                                           stored.result["base_test_accuracy"])
    assert out.test_accuracy is not None and out.test_accuracy > (out.base_test_accuracy or 0.0)
    assert out.cursor.phase == "finished" and out.spent.calls == stored.result["spent"]["calls"] > 0
    assert list(out.diagnoses) == stored.result["diagnoses"]

    kept = svc.harness(first.harness_version)
    assert set(kept.metrics) - names(VersionMetrics) - ENGINE_METRICS_KEYS == set()
    m = kept.measured
    assert m.val_accuracy == kept.metrics["val_accuracy"] and m.gate is not None and m.gate.passed
    assert [a.proposal_id for a in m.applied] == [a["proposal_id"] for a in kept.metrics["applied"]]
    assert m.models == tuple(evo.models) and m.evolution == evo.id


def test_rows_written_by_older_versions_read_with_defaults() -> None:
    # An iteration row from before steps, history and charged model seconds were stored.
    row = IterationRow.parse({"iteration": 2, "val_accuracy": 0.5, "gate": "kept", "candidate_version": "abc",
                              "model_calls": "12", "an_unknown_later_key": 1})
    assert row.steps is None and row.history == () and row.model_seconds is None and row.model_calls == 12
    assert row.partial is False and row.diagnosis_ids == ()
    # A new row whose iteration validated nothing has steps, none of them with a verdict.
    assert IterationRow.parse({"iteration": 1, "steps": []}).steps == ()
    out = EvolutionOutcome.parse({"cursor": {"iteration": "3", "phase": "train"}, "spent": {"calls": 5}})
    assert out.cursor.iteration is None and out.cursor.phase == "train"  # a malformed iteration is not trusted
    assert out.spent.calls == 5 and out.spent.seconds == 0.0 and out.test_accuracy is None
    assert EvolutionOutcome.parse(None).cursor.phase is None
    m = VersionMetrics.parse({"val_accuracy": "0.7", "applied": [{"proposal_id": "p1"}, "garbage"],
                              "gate": {"accepted": True, "wins": 3}})  # the field's name before it was `passed`
    assert m.val_accuracy is None  # not a number: not shown as one
    assert [a.proposal_id for a in m.applied] == ["p1"] and m.gate is not None and m.gate.wins == 3 and m.gate.passed
    assert GateStep.parse({"kept": True, "verdict": None}).spent is None


RAW_FIELDS = {"iterations", "metrics", "report"}  # EvolutionRecord.iterations, HarnessVersion.metrics,
                                                  # DiagnosisRecord.report
FACES = [*sorted((ROOT / "app").glob("*.py")), *sorted((ROOT / "pages").glob("*.py")),
         ROOT / "ecdysis" / "cli.py", ROOT / "ecdysis" / "compare.py"]


def test_the_faces_read_evolutions_versions_and_diagnoses_only_typed() -> None:
    """No face reaches into an evolution's, a version's or a diagnosis's JSON: `views.report_of`
    (`diagnosis.report_of`) alone parses a stored diagnosis into its typed report. `.result` is allowed only
    on a job (`JobRecord.result`, a job's own output), named `job` or `last` where it is read."""
    found = []
    for path in FACES:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            receiver = node.value.id if isinstance(node.value, ast.Name) else ""
            if node.attr in RAW_FIELDS or (node.attr == "result" and receiver not in ("job", "last")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not found, "\n".join(found)

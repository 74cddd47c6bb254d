"""Diagnosis on the real embedded models: the same 10 train instances of reasoning-mix run through
the starter harness on SmolLM2-135M and on Gemma 3 270M (via the service and a real SQLite store),
then one diagnosis over both runs must produce clusters and at least one applicable proposal.
The report is written to test-artifacts/ for reading. Slow: loads and runs both models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecdysis.diagnosis import diagnose
from ecdysis.harness import validate_files
from ecdysis.roles.llm import LLMRoleBackend
from ecdysis.service import RunRequest, Service

pytestmark = pytest.mark.slow
MODELS = ("smollm2", "gemma3-270m")


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory):
    from storage import open_store
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('real') / 'real.db'}")
    svc = Service(store)
    run_ids = [svc.run(RunRequest(suite="reasoning-mix", model=m, split="train", limit=10)).run_id for m in MODELS]
    yield svc, run_ids
    store.close()


def test_diagnose_two_real_models(batch, artifacts: Path) -> None:
    svc, run_ids = batch
    report = diagnose(svc.store, run_ids, suite_loader=svc.suite, smoke_model="smollm2",
                      backend_factory=svc.backend, limits=svc.limits())
    data = report.to_json()
    (artifacts / "diagnose_real.json").write_text(json.dumps(data, indent=2))
    (artifacts / "diagnose_real.txt").write_text(report.render_text())

    failed = sum(1 for rid in run_ids for r in svc.results(rid) if not r.correct)
    assert report.clusters and sum(c.size for c in report.clusters) == failed
    assert set(report.models) == set(MODELS)
    for c in data["clusters"]:
        assert c["verdict"] in ("harness-level", "model-specific", "noise") and 0 <= c["systematicity"] <= 1
        assert c["label"] and c["reason"] and c["evidence"] and c["instances"]
        if c["verdict"] != "harness-level":
            assert c["patch"]["proposal_id"] is None and c["patch"]["no_patch_reason"]
    base = svc.harness(report.harness_version)
    applicable = [p for p in report.proposals if p.status == "endorsed" and p.apply_to(base.files).ok]
    assert applicable, report.render_text()
    patched = applicable[0].apply_to(base.files).files
    validate_files(patched)
    assert next(c for c in applicable[0].checks if c.name == "loads").ok  # it ran on SmolLM2


def test_llm_roles_on_a_real_small_model_never_break_the_diagnosis(batch, artifacts: Path) -> None:
    svc, run_ids = batch
    # Short prompts and replies: SmolLM2 reads about 50 prompt tokens/s on two cores.
    roles = LLMRoleBackend(svc.backend("smollm2"), store=svc.store, max_tokens=64, file_chars=300)
    report = diagnose(svc.store, run_ids, suite_loader=svc.suite, role_backend=roles, smoke_model="smollm2",
                      backend_factory=svc.backend, limits=svc.limits(), max_rounds=1, max_proposals=1)
    (artifacts / "diagnose_real_llm_roles.txt").write_text(report.render_text())
    assert report.role_backend == "llm:smollm2"
    data = report.to_json()
    messages = [m for p in data["proposals"] for m in p["transcript"]]
    messages += [m for c in data["clusters"] for m in c["patch"].get("transcript", [])]
    assert messages, "no harness-level cluster was refined"
    assert {m["kind"] for m in messages if m["backend"] == "llm:smollm2"} >= {"prompt", "reply"}
    # Whatever the small model wrote, every role produced a schema-valid output (its own or the fallback's).
    outputs = {(m["round"], m["role"]) for m in messages if m["kind"] == "output"}
    assert (1, "investigator") in outputs and (1, "attributor") in outputs


def test_the_engines_alternative_is_drafted_and_smoke_run_on_a_real_model(batch, artifacts: Path) -> None:
    """Roles that name one repair by habit (scripted: what a small role model does, measured in
    `bench/proposer_picks.py`) on the real batch: every harness-level cluster whose roles' repair
    is not the engine's pick also gets the engine's pick, drafted by the deterministic roles and
    smoke-run on SmolLM2 like any proposal; it applies to the harness and loads."""
    from ecdysis.models.scripted import Rule, ScriptedBackend
    svc, run_ids = batch
    spec = {"target_files": ["harness.toml"], "change": "c", "root_cause": "r", "expected_effect": "e",
            "risk": "k", "scope": "any task whose reply runs out of tokens"}
    habit = ScriptedBackend([
        Rule(match="Attributor said:", text=json.dumps({"operator": "output_budget", "spec": spec, "replies": []})),
        Rule(match="Hard checks:", text=json.dumps({"decision": "accept", "objections": []})),
        Rule(match="Investigator said:", text=json.dumps({"verdict": "harness-level", "reason": "r",
                                                          "cross_instance": "c", "cross_model": "m"})),
        Rule(match="Harness files (version", text=json.dumps({"root_cause": "r", "component": "harness.toml",
                                                              "evidence": ["e"]}))], model_id="habit-real")
    report = diagnose(svc.store, run_ids, suite_loader=svc.suite, role_backend=habit, smoke_model="smollm2",
                      backend_factory=svc.backend, limits=svc.limits(), max_rounds=1, passes=1)
    (artifacts / "diagnose_real_alternative.txt").write_text(report.render_text())
    base = svc.harness(report.harness_version)
    refined = [c for c in report.clusters if c.verdict == "harness-level"]
    assert refined, report.render_text()
    drafted = 0
    for c in refined:
        theirs, mine = report.proposal_for(c.id), report.alternative_for(c.id)
        shared = report.patch(c.id).shared_with
        if theirs is None and shared is None:
            continue  # no endorsed repair of the roles' to stand beside (nor one shared with another cluster)
        if mine is None:
            continue  # the roles' repair is the engine's pick (or the engine has none)
        drafted += 1
        assert mine.status == "endorsed" and mine.alternative.startswith("The engine's alternative")
        assert mine.spec.operator != "output_budget" and mine.apply_to(base.files).ok
        assert next(ch for ch in mine.checks if ch.name == "loads").ok  # smoke-run on SmolLM2
    assert drafted, report.render_text()

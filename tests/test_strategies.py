"""The strategies on planted worlds whose truth is known.

The world: the arithmetic suite of `test_evolve`, and a scripted model that answers even-numbered
questions correctly but wrapped in a sentence (the starter harness takes the first line, "Let me
think.", so they fail: an extraction fault) and gives an empty reply to odd-numbered ones (no
harness change can fix that). A diagnosis finds two harness-level clusters and proposes a repair
for each; a reviewer can turn one of them into a planted bad change (a prompt line that makes the
model answer "I do not know." everywhere)."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ecdysis.evolve import EvolveConfig, Evolver
from ecdysis.models.registry import register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.records import Instance
from ecdysis.service import Service
from ecdysis.strategies import STRATEGIES, EcdysisBatch, PerInstanceSearch, SelfEvolution, window
from test_evolve import write_suite

MODEL = "planted-two-faults"
BAD_LINE = "Answer in words."


@pytest.fixture
def world(tmp_path: Path, store) -> tuple[Service, str, ScriptedBackend]:
    suite = write_suite(tmp_path / "tiny.jsonl")
    rules = [Rule(text="I do not know.", match=BAD_LINE)]
    for n, line in enumerate(suite.read_text().splitlines()[1:]):
        row = json.loads(line)
        rules.append(Rule(text=f"Let me think.\nThe answer is {row['target']}." if n % 2 == 0 else "",
                          match=row["input"]))
    subject = ScriptedBackend(rules, model_id=MODEL, default="I do not know.")
    register_backend(subject)
    return Service(store), str(suite), subject


def config(suite: str, **kw) -> EvolveConfig:
    base = dict(suite=suite, models=[MODEL], iterations=1, batch_size=12, val_limit=12, test_limit=12)
    base.update(kw)
    return EvolveConfig(**base)


def plant_bad(svc: Service):
    """A reviewer who approves the extraction repair as proposed and turns every other proposal
    into the bad change."""
    def review(proposal):
        if proposal.spec.get("operator") == "answer_extraction":
            return "approve", "", None
        user = svc.harness(proposal.harness_version).files["user.md"]
        return "edit", "planted bad change", {"user.md": user.rstrip("\n") + f"\n{BAD_LINE}\n"}
    return review


def changes(row: dict) -> dict[str, dict]:
    return {c["operator"]: c for st in row["steps"] for c in st["changes"]}


def test_a_good_change_is_kept_when_a_bad_one_is_approved_beside_it(world) -> None:
    """Composed and gated together (as before screening), the bad change hid the good one and both
    were rolled back. Screened alone, the bad one goes no further and the good one is kept."""
    svc, suite, _ = world
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite)).id)
    row = evo.iterations[0]
    assert row["proposals"] == 2 and row["screened"] == 2
    screened = evo.iterations[0]["history"]
    fate = {h["operator"]: h["outcome"] for h in screened}
    assert fate == {"answer_extraction": "kept", "retry_unparsable": "screened_out"}, screened
    bad = next(h for h in screened if h["outcome"] == "screened_out")
    assert "net +0" in bad["why"] or "net -" in bad["why"], bad
    good = changes(row)["answer_extraction"]
    # its own measured effect sits next to its predicted one: screened on its cluster, then validated
    assert good["predicted"] and good["screened"]["wins"] >= 3 and good["screened"]["losses"] == 0
    assert good["measured"]["kept"] and good["measured"]["jointly_with"] == 0
    assert row["val_accuracy"] > 0 and evo.current_version != evo.base_version
    assert evo.status == "done" and evo.result["test_accuracy"] > evo.result["base_test_accuracy"]


def test_changes_are_validated_one_at_a_time_even_without_screening(world) -> None:
    """Per-instance search has no cluster to screen on; its one change is still judged alone."""
    svc, suite, _ = world
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite, strategy="per-instance", iterations=2)).id)
    for row in evo.iterations:
        assert row["screened"] == 0 and all(len(st["changes"]) <= 1 for st in row["steps"])


def voting_reviewer(svc: Service):
    """A reviewer who approves only the extraction repair, edited to draw 3 samples an instance."""
    def voting(proposal):
        if proposal.spec.get("operator") != "answer_extraction":
            return "reject", "not this one", None
        files = dict(proposal.files)
        toml = svc.harness(proposal.harness_version).files["harness.toml"]
        files["harness.toml"] = re.sub(r"(?m)^samples = 1", "samples = 3", toml)
        return "edit", "with voting", files
    return voting


TWICE = """

_planted_once = solve


def solve(task, model, harness):
    # A first answer to the question put another way, thrown away: a second call per instance
    # (the same request again would be a cache hit, which a benchmark charges once).
    _planted_once(dict(task, input=task["input"] + " Think first."), model, harness)
    return _planted_once(task, model, harness)
"""


def test_calls_a_change_makes_in_its_own_code_are_counted_before_screening_it(world) -> None:
    """A change whose harness code calls the model twice an instance draws one sample, so its
    calls cannot be read from `samples`: before, the cost of screening it was estimated at one call
    an instance (as option scoring was, at two), and a screen was paid for whose validation could
    not follow. The rate measured in an earlier run of the same version (here another seed's
    evolution; in a long one, an earlier batch's screen) is used, and the change is set aside
    before any call is spent on it."""
    svc, suite, _ = world

    def twice(proposal):
        if proposal.spec.get("operator") != "answer_extraction":
            return "reject", "not this one", None
        return "edit", "answer twice", {**proposal.files, "harness.py": proposal.files["harness.py"] + TWICE}

    first = Evolver(svc, reviewer=twice)
    done = first.run(first.create(config(suite, seed=1, label="seed 1", charge_cached=True)).id)
    assert done.current_version != done.base_version  # screened, validated and kept: measured at 2 calls
    before_screen = sum(n for phase, n in done.rows[0].calls_by_phase.items() if phase in ("train", "diagnose"))
    second = Evolver(svc, reviewer=twice)
    evo = second.run(second.create(config(suite, seed=2, label="seed 2", charge_cached=True,
                                          max_model_calls=before_screen + 42)).id)
    row = evo.rows[0]
    fate = {h.operator: h for h in row.history}
    # Screening its 12 instances (another order: no stored run) at 2 calls, then the validation
    # runs of the first evolution, charged at their recorded 12 + 24 calls less the 12 the
    # candidate's repeat of the parent's: 48 > 42 (at one call an instance, 36 would have fitted).
    assert fate["answer_extraction"].outcome == "not_validated", row.history
    assert "not screened: screening (24) and validation (24) would need about 48" in fate["answer_extraction"].why
    assert "2.00 calls each for the candidate" in fate["answer_extraction"].why
    assert not row.calls_by_phase.get("screen"), row.calls_by_phase


def test_a_change_that_adds_calls_must_pay_for_them(world) -> None:
    """The extraction repair with 3-sample voting added: it fixes its cluster either way, but
    costs 2 more calls an instance. At 0.6 accuracy a call it must gain 120 points: refused; at the
    default 5 points a call it is kept."""
    svc, suite, _ = world
    voting = voting_reviewer(svc)

    dear = Evolver(svc, reviewer=voting)
    evo = dear.run(dear.create(config(suite, min_gain_per_call=0.6)).id)
    fate = {h["operator"]: h for h in evo.iterations[0]["history"]}
    assert fate["answer_extraction"]["outcome"] == "screened_out", fate
    assert "2.00 model calls per instance" in fate["answer_extraction"]["why"]
    assert evo.current_version == evo.base_version

    cheap = Evolver(svc, reviewer=voting)
    evo = cheap.run(cheap.create(config(suite)).id)
    kept = changes(evo.iterations[0])["answer_extraction"]
    assert kept["measured"]["kept"] and kept["screened"]["extra_calls"] == pytest.approx(2.0)
    assert kept["measured"]["candidate_calls"] == pytest.approx(3.0)


def _alone(tmp_path: Path, suite: str, name: str) -> tuple[int, int]:
    """What the planted evolution spends alone in an empty database, where every repeated request
    is a free cache hit (`charge_cached` off): the calls it would pay for with a cache of its own.
    Also how many calls reached the model in training (the sealed test apart)."""
    from storage import open_store
    apart = open_store(f"sqlite:///{tmp_path / f'{name}.db'}")
    try:
        svc = Service(apart)
        subject = svc.backend(MODEL)
        made = len(subject.history)
        evolver = Evolver(svc, reviewer=plant_bad(svc))
        evo = evolver.run(evolver.create(config(suite)).id)
        return evo.result["spent"]["calls"], len(subject.history) - made - evo.result["test_spent"]["calls"]
    finally:
        apart.close()


def test_a_benchmark_charges_each_request_once_as_a_cache_of_its_own_would(world, tmp_path: Path) -> None:
    """Charging cached answers (benchmarks sharing one cache) must not charge more than the
    evolution would pay alone: there, the extraction repair's screen and validation re-ask requests
    its parent already made, and its own cache answers them free. So an evolution charges each
    request once, whether it made it, found it in the shared cache, or reused a whole run another
    evolution made."""
    svc, suite, _ = world
    alone, made = _alone(tmp_path, suite, "alone")
    assert alone == made
    first = Evolver(svc, reviewer=plant_bad(svc))
    one = first.run(first.create(config(suite, label="first", charge_cached=True)).id)
    second = Evolver(svc, reviewer=plant_bad(svc))
    two = second.run(second.create(config(suite, label="second", charge_cached=True)).id)
    assert one.current_version == two.current_version != one.base_version
    assert one.result["spent"]["calls"] == two.result["spent"]["calls"] == alone
    recorded = [c for rid in one.result["paid_runs"] for r in svc.store.get_results(rid) for c in r.calls]
    assert len(recorded) > alone  # the repeats were asked, and paid for once
    assert len(one.result["paid_keys"]) == alone


@pytest.mark.parametrize("share", [0.25, 0.5, 0.75])
def test_a_request_paid_for_before_a_kill_is_not_charged_again_after_it(world, tmp_path: Path, store, share,
                                                                         monkeypatch) -> None:
    """Killed right after one of its saves and resumed by a new engine, the evolution knows what
    it had paid for (saved with its spending): the resumed process replays those requests free,
    and the total is what it pays alone, not a second charge for everything asked twice."""
    monkeypatch.setenv("ECDYSIS_LEASE_TTL", "1.0")
    svc, suite, _ = world
    alone, _ = _alone(tmp_path, suite, "alone")
    counting = _CountingStore(store)
    probe = Evolver(Service(counting), reviewer=plant_bad(svc))  # type: ignore[arg-type]
    probe.run(probe.create(config(suite, label="probe", charge_cached=True)).id)
    from tests.test_faults import DyingStore, Killed
    dying = DyingStore(store, "save_evolution", nth=max(2, int(counting.saves * share)))
    engine = Evolver(Service(dying), reviewer=plant_bad(svc))  # type: ignore[arg-type]
    evo = engine.create(config(suite, label="killed", charge_cached=True))
    with pytest.raises(Killed):
        engine.run(evo.id)
    time.sleep(1.1)  # the dead engine's lease lapses
    done = Evolver(svc, reviewer=plant_bad(svc)).run(evo.id)
    assert done.status == "done" and done.result["spent"]["calls"] == alone


class _CountingStore:
    """A store that counts the evolution's saves (where a kill can land)."""

    def __init__(self, store: Any) -> None:
        self._store, self.saves = store, 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if name != "save_evolution":
            return target

        def save(*args: Any, **kwargs: Any) -> Any:
            self.saves += 1
            return target(*args, **kwargs)
        return save


def test_every_call_is_charged_and_counted_per_phase(world) -> None:
    """Role calls (an LLM role backend whose replies are unusable, so each role is asked twice and
    the heuristic answers) are charged with the instances', screening's and validation's calls."""
    svc, suite, subject = world
    roles = ScriptedBackend([], model_id="planted-roles", default="not json")
    register_backend(roles)
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite, role_backend="planted-roles", iterations=2)).id)
    assert evo.status == "done"
    for row in evo.iterations:
        assert sum(row["calls_by_phase"].values()) == row["model_calls"], row["calls_by_phase"]
    assert evo.iterations[0]["calls_by_phase"]["diagnose"] >= 8  # 4 roles x 2 tries, for the first cluster alone
    assert evo.result["spent"]["calls"] == sum(r["model_calls"] for r in evo.iterations)
    assert len(roles.history) <= sum(r["calls_by_phase"]["diagnose"] for r in evo.iterations)  # + smoke runs
    # Every call that reached a model was charged once: to training, or (the sealed test) apart.
    assert evo.result["test_spent"]["calls"] > 0
    assert evo.result["spent"]["calls"] + evo.result["test_spent"]["calls"] == len(roles.history) + len(subject.history)


def test_a_budget_stops_role_calls_too(world) -> None:
    svc, suite, _ = world
    register_backend(ScriptedBackend([], model_id="planted-roles-2", default="not json"))
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite, role_backend="planted-roles-2", max_model_calls=15)).id)
    assert evo.status == "stopped" and "budget" in evo.result["stopped"]
    assert evo.result["spent"]["calls"] <= 15


def test_the_critics_refusal_is_told_apart_from_a_persons_rejection(world) -> None:
    """Both proposals are stored rejected; only the person's has a decision on record. Later
    iterations' roles are told `rejected` for the person's (ruled out for good) and `not_endorsed`
    for the Critic's (ruled out on that batch only), each with its own reason."""
    from ecdysis.gate import decide
    from ecdysis.roles.base import BatchContext, CaseFile
    from ecdysis.store import ProposalRecord
    svc, _, _ = world
    for pid, op, status in (("by-critic", "option_scoring", "rejected"), ("by-person", "answer_extraction", "pending")):
        svc.store.save_proposal(ProposalRecord(
            id=pid, diagnosis_id="d", cluster_id="c1", harness_version="h", spec={"operator": op}, files={},
            status=status, data={"reason": "rejected by the Critic (hard check failed): novel"}, created_at=1.0))
    decide(svc.store, "by-person", "reject", who="reviewer", reason="I want a prompt-side fix")
    told = Evolver(svc)._outcomes_of({"proposal_ids": ["by-critic", "by-person"]}, [])
    assert [(h["operator"], h["outcome"], h["why"]) for h in told] == [
        ("option_scoring", "not_endorsed", "rejected by the Critic (hard check failed): novel"),
        ("answer_extraction", "rejected", "I want a prompt-side fix")]
    later = CaseFile(cluster=None, files={}, harness_version="h", batch=BatchContext({}, {}),  # type: ignore[arg-type]
                     history=[dict(h, iteration=1, other_batch=True) for h in told])
    assert later.ruled_out == {"answer_extraction": "rejected in iteration 1"}


def test_a_change_that_was_not_kept_is_not_proposed_again(world) -> None:
    """A rejected repair returns in the next iteration neither as new nor at all: the roles see
    what became of it and the Proposer moves to another operator."""
    svc, suite, _ = world

    def reject_extraction(proposal):
        if proposal.spec.get("operator") == "answer_extraction":
            return "reject", "I want a prompt-side fix", None
        return "reject", "no", None

    evolver = Evolver(svc, reviewer=reject_extraction)
    evo = evolver.run(evolver.create(config(suite, iterations=2)).id)
    first, second = evo.iterations
    assert {h["operator"]: h["outcome"] for h in first["history"]}["answer_extraction"] == "rejected"
    ops = [h["operator"] for h in second["history"]]
    assert ops and "answer_extraction" not in ops, second["history"]
    report = svc.get_diagnosis(second["diagnosis_id"]).report
    said = json.dumps(report["proposals"])
    assert "rejected in iteration 1" in said


def test_self_evolution_makes_one_edit_per_failing_instance_and_gates_them_together(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, strategy="self-evolution", auto_approve=True)).id)
    row = evo.iterations[0]
    batch_runs = svc.store.get_diagnosis(row["diagnosis_ids"][0]).run_ids
    failing = sorted({r.instance_id for rid in batch_runs for r in svc.store.get_results(rid) if not r.correct})
    assert len(failing) > 5  # more than the cap of 5 this baseline had until round 5
    assert len(row["diagnosis_ids"]) == len(failing)  # every failing instance, one diagnosis each
    for did in row["diagnosis_ids"]:
        report = svc.get_diagnosis(did).report
        assert len({i for c in report["clusters"] for i in c["instances"]}) == 1
    assert len(row["steps"]) <= 1 and row["screened"] == 0
    assert sorted(evo.result["tried_instances"]) == sorted(failing)
    assert SelfEvolution(max_edits=5).scopes(failing, []) == [[i] for i in failing[:5]]


def test_curated_batches_put_earlier_failures_first() -> None:
    train = [Instance(id=f"t{i:02d}", input=f"q{i}", target="1", split="train") for i in range(40)]
    plain = window(train, 10, 2)
    assert [i.id for i in plain] == [f"t{i:02d}" for i in range(10, 20)]
    assert EcdysisBatch().batch(train, 10, 1, ["t30"]) == window(train, 10, 1)
    curated = [i.id for i in EcdysisBatch().batch(train, 10, 2, ["t01", "t03", "t05"])]
    assert curated[:3] == ["t05", "t03", "t01"] and len(curated) == 10 == len(set(curated))
    assert curated[3:] == [f"t{i:02d}" for i in range(10, 17)]  # the window's own, passing ones among them
    many = [f"t{i:02d}" for i in range(10)]
    assert len([i for i in EcdysisBatch().batch(train, 10, 2, many) if i.id in many]) == 5  # at most half
    assert PerInstanceSearch().batch(train, 10, 2, many) == plain == SelfEvolution().batch(train, 10, 2, many)
    assert set(STRATEGIES) == {"ecdysis", "per-instance", "self-evolution"}


def test_the_app_states_each_change_predicted_screened_and_validated(world) -> None:
    from app import views
    svc, suite, _ = world
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite)).id)
    rows = {r["operator"]: r for r in views.change_rows(evo)}
    good, bad = rows["answer_extraction"], rows["retry_unparsable"]
    assert good["outcome"] == "kept" and good["predicted"] and good["screened"].startswith("net +")
    assert good["validated"].startswith("+") and good["calls/instance"] == "1 → 1"
    assert bad["outcome"] == "screened out" and bad["validated"] is None and "lost" in bad["why"]
    gates = views.gate_rows(evo, svc.harnesses())
    assert len(gates) == 1 and gates[0].outcome == "kept" and gates[0].reason.startswith("answer_extraction:")


def test_a_stopped_evolution_can_be_sealed_where_it_stands(world) -> None:
    """Benchmarks give every strategy one budget: one that spends it is tested as it stands (its
    unfinished iteration abandoned), and the sealed test is not charged to the spent budget."""
    svc, suite, _ = world
    first = Evolver(svc, reviewer=plant_bad(svc))
    one = first.run(first.create(config(suite, label="one iteration", charge_cached=True)).id)
    limit = one.rows[0].model_calls + 6  # out of budget in the middle of the second train batch
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite, iterations=3, max_model_calls=limit, charge_cached=True)).id)
    assert evo.status == "stopped" and evo.result["spent"]["calls"] <= limit
    assert evo.current_version == one.current_version != evo.base_version
    kept = evo.current_version
    sealed = evolver.seal(evo.id)
    assert sealed.status == "done" and sealed.result["final_version"] == kept
    abandoned = sealed.result["abandoned"]["iteration"]
    # Why it stopped stays with it: the stop line itself is cleared by the run that seals it.
    assert sealed.result["abandoned"]["why"] == evo.result["stopped"].split("; resume")[0]
    assert "budget" in sealed.result["abandoned"]["why"] and "stopped" not in sealed.result
    assert abandoned in (len(sealed.iterations), len(sealed.iterations) + 1)
    if sealed.iterations and sealed.iterations[-1].get("partial"):  # what it kept before stopping counts
        assert sealed.iterations[-1]["harness_version"] == kept
    assert sealed.result["test_spent"]["calls"] > 0 and sealed.result["spent"]["calls"] <= limit
    with pytest.raises(Exception, match="only a stopped one"):
        evolver.seal(evo.id)


def test_an_iteration_the_budget_cannot_validate_is_not_started(world) -> None:
    """With too little budget left for a batch and one validation, a later iteration used to run
    its batch, roles and screening anyway and stop in the middle, having bought nothing (with LLM
    roles on the BIG-bench mixture: three iterations and about 36 minutes of role calls after the
    one change the budget could validate). Now it is not started, nothing more is spent, and a
    resume with more budget runs it."""
    svc, suite, _ = world
    first = Evolver(svc, reviewer=plant_bad(svc))
    one = first.run(first.create(config(suite, label="one iteration", charge_cached=True)).id)
    spent = one.result["spent"]["calls"]
    # Iteration 2 needs its batch (12 calls), a diagnosis at the calls iteration 1's took (its
    # smoke runs) and a candidate's validation (12; the parent's is paid).
    row = one.iterations[0]
    per = row["calls_by_phase"]["diagnose"] / len(row["diagnosis_ids"])
    assert per == int(per) > 0
    need = 12 + int(per) + 12
    evolver = Evolver(svc, reviewer=plant_bad(svc))
    evo = evolver.run(evolver.create(config(suite, iterations=3, max_model_calls=spent + need - 1,
                                            charge_cached=True)).id)
    assert evo.status == "stopped", evo.result
    assert evo.result["stopped"].startswith(
        f"iteration 2 not started: its batch (12), a diagnosis (at least {per:.0f}) and the validation of one "
        f"change (12: 12 instances x 1 model(s) at 1.00 calls each) would need about {need} model calls, and "
        f"{need - 1} are left"), evo.result["stopped"]
    assert evo.result["spent"]["calls"] == spent and len(evo.iterations) == 1
    roomy = Evolver(svc, reviewer=plant_bad(svc)).run(evo.id, overrides={"max_model_calls": spent + 200})
    assert len(roomy.iterations) >= 2 and roomy.iterations[1]["model_calls"] > 0


def test_self_evolution_does_not_diagnose_failures_no_validation_could_follow(world) -> None:
    """Self-Evolution diagnoses every failing instance before its one validation. With LLM roles on
    the BIG-bench mixture (seed 14) its second iteration set out to diagnose 12 failures at about
    23 calls each (roles) with 328 calls left, so no validation could have followed: about two
    hours of role calls for nothing. Once its batch shows how many diagnoses it needs, an iteration
    whose diagnoses (at the fewest calls a diagnosis of this evolution took) and one validation do
    not fit stops before them; a resume with more budget diagnoses and validates."""
    svc, suite, _ = world
    first = Evolver(svc)
    one = first.run(first.create(config(suite, strategy="self-evolution", auto_approve=True, label="one",
                                        charge_cached=True)).id)
    spent, row = one.result["spent"]["calls"], one.iterations[0]
    per = row["calls_by_phase"]["diagnose"] / len(row["diagnosis_ids"])
    assert len(row["diagnosis_ids"]) > 1 and per > 0, row
    # Enough for iteration 2's batch, one diagnosis and one validation (the check before its batch),
    # not for the diagnoses its batch then asks for.
    budget = spent + 12 + math.ceil(per) + 12
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, strategy="self-evolution", auto_approve=True, iterations=2,
                                            max_model_calls=budget, charge_cached=True)).id)
    assert evo.status == "stopped" and evo.result["stopped_by"] == "calls", evo.result
    stop = evo.result["stopped"]
    scopes = evo.result["cursor"]["scopes"]
    assert len(scopes) > 1
    assert stop.startswith(f"iteration 2 stopped before diagnosis 1 of {len(scopes)}: {len(scopes)} diagnoses left "
                           f"(at least {per:.0f} model calls each, the fewest a diagnosis of this evolution took) and the "
                           f"validation of one change (12: "), stop
    # Only the batch was bought; no diagnosis of iteration 2 is stored.
    assert evo.result["spent"]["calls"] == spent + 12 and len(evo.iterations) == 1
    assert evo.result["cursor"]["phase"] == "diagnose" and not evo.result["cursor"].get("diagnosed")
    assert len(evo.result["diagnoses"]) == len(row["diagnosis_ids"])
    roomy = Evolver(svc).run(evo.id, overrides={"max_model_calls": spent + 200})
    assert roomy.status == "done" and len(roomy.iterations) == 2
    assert len(roomy.iterations[1]["diagnosis_ids"]) == len(scopes) and roomy.iterations[1]["steps"]


def test_the_first_iteration_stops_once_its_first_diagnosis_shows_the_rest_cannot_be_validated(world) -> None:
    """Before any iteration has finished there is no earlier diagnosis to cost the others by, and a
    first iteration used to diagnose every failing instance whatever the budget. Once its first
    diagnosis is made, that diagnosis's calls cost the rest: with the batch, one diagnosis and one
    validation paid for and no more, it stops before the second diagnosis. (Its roles are a model
    whose replies are unusable, asked per instance: with heuristic roles a diagnosis's smoke calls can
    all repeat requests the evolution has paid for, and cost nothing.)"""
    svc, suite, _ = world
    register_backend(ScriptedBackend([], model_id="planted-roles-first", default="not json"))
    first = Evolver(svc)
    one = first.run(first.create(config(suite, strategy="self-evolution", auto_approve=True, label="one",
                                        charge_cached=True, role_backend="planted-roles-first")).id)
    row = one.iterations[0]
    failing = len(row["diagnosis_ids"])
    assert failing > 1 and row["calls_by_phase"]["diagnose"] > 0, row
    # The batch (12), the parent's and a candidate's validation (12 each) and at most one diagnosis.
    budget = 12 + 24 + math.ceil(row["calls_by_phase"]["diagnose"] / failing)
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, strategy="self-evolution", auto_approve=True,
                                            max_model_calls=budget, charge_cached=True,
                                            role_backend="planted-roles-first")).id)
    assert evo.status == "stopped" and evo.result["stopped_by"] == "calls", evo.result
    cur = evo.result["cursor"]
    [made] = cur["diagnosis_calls"]
    assert made > 0 and len(cur["diagnosed"]) == 1 and len(cur["scopes"]) == failing
    assert evo.result["stopped"].startswith(
        f"iteration 1 stopped before diagnosis 2 of {failing}: {failing - 1} diagnos"
        f"{'is' if failing == 2 else 'es'} left (at least {made} model calls each, the fewest a diagnosis "
        f"of this evolution took) and the validation of one change (24: "), evo.result["stopped"]
    assert evo.result["spent"]["calls"] == 12 + made and not evo.iterations
    roomy = Evolver(svc).run(evo.id, overrides={"max_model_calls": 400})
    assert roomy.status == "done" and roomy.iterations[0]["diagnosis_ids"][0] == cur["diagnosed"]["0"]
    assert len(roomy.iterations[0]["diagnosis_ids"]) == failing and roomy.iterations[0]["steps"]


def test_the_same_edit_made_for_several_instances_is_applied_once(world) -> None:
    """Self-evolution repairs failing instances one by one, often with the same edit; composing
    them applies it once (applying an insertion twice would duplicate its lines)."""
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, strategy="self-evolution", auto_approve=True)).id)
    step = evo.iterations[0]["steps"][0]
    applied = [c["operator"] for c in step["changes"]]
    assert len(applied) == len(set(applied)), applied
    assert any(s["why"] == "the same change is already in the harness" for s in step["skipped"]), step["skipped"]


def test_a_change_that_completes_a_kept_one_is_screened_again_and_kept(tmp_path: Path, store) -> None:
    """Greedy forward selection: a prompt line that turns empty replies into wrapped answers gains
    nothing alone (the starter reads the first line); once the extraction repair is kept, it is
    screened again on top of it, gains, and is kept too."""
    svc, suite, review = complement_world(tmp_path, store)
    evolver = Evolver(svc, reviewer=review)
    # 12 validation instances: the second change wins 4 and loses none, which is not more than two
    # standard errors (2 x 2); this world is about composition, so the gate is the one-error gate.
    evo = evolver.run(evolver.create(config(suite, models=["planted-complement"], gate_k=1.0)).id)
    row = evo.iterations[0]
    fate = {h["operator"]: h["outcome"] for h in row["history"]}
    assert fate == {"answer_extraction": "kept", "retry_unparsable": "kept"}, row["history"]
    first, second = row["steps"]
    assert second["parent"] == first["candidate"] and second["kept"]
    assert second["changes"][0]["screened"]["against"] == first["candidate"]
    assert row["calls_by_phase"]["screen"] > 0 and row["kept"] == 2
    assert evo.result["test_accuracy"] == 1.0


def test_a_free_reading_repair_goes_first_and_the_rest_is_screened_on_top_of_it(tmp_path: Path, store) -> None:
    """The extraction repair reads only: screening it replays the batch and validating it the
    parent's validation, which the first validation pays in any case. It is screened and
    validated before the edited prompt line is screened at all, so the first kept change costs the
    batch, the roles and the parent's validation and nothing more (with the edited change screened
    first, against the parent, it cost 12 calls more); the prompt line is screened once, on top of
    it, and kept."""
    svc, suite, review = complement_world(tmp_path, store)
    evolver = Evolver(svc, reviewer=review)
    evo = evolver.run(evolver.create(config(suite, models=["planted-complement"], gate_k=1.0,
                                            charge_cached=True)).id)
    row = evo.iterations[0]
    first, second = row["steps"]
    assert [c["operator"] for c in first["changes"]] == ["answer_extraction"] and first["kept"]
    by_phase = row["calls_by_phase"]
    parent_validation = 12  # 12 validation instances, one model, one call each
    assert first["spent"]["calls"] == by_phase["train"] + by_phase.get("diagnose", 0) + parent_validation
    assert first["changes"][0]["screened"]["wins"] > 0
    assert second["changes"][0]["operator"] == "retry_unparsable" and second["kept"]
    assert second["changes"][0]["screened"]["against"] == first["candidate"]
    assert by_phase["screen"] == second["changes"][0]["screened"]["n"]  # one screen paid: the prompt line's
    assert "deferred" not in evo.result.get("cursor", {})


DEFERRED_CRASHES = {
    "free repair judged, the rest held back": lambda cur: cur.get("phase") == "rescreen" and bool(cur.get("deferred")),
    "the rest screened on top of it": lambda cur: (cur.get("phase") == "apply" and len(cur.get("steps", [])) == 1
                                                    and not cur.get("deferred")),
}


@pytest.mark.parametrize("point", sorted(DEFERRED_CRASHES))
def test_killed_while_the_rest_waits_behind_a_free_repair_resumes_to_the_clean_result(tmp_path: Path, store,
                                                                                       point: str,
                                                                                       monkeypatch) -> None:
    """Killed right after the free repair's verdict is saved with the other change held back, or
    right after that change is screened on top of it, and resumed by a new engine: the same steps,
    verdicts, kept harness and spending as without the kill."""
    monkeypatch.setenv("ECDYSIS_LEASE_TTL", "1.0")

    def facts(svc: Service, evo_id: str) -> tuple[Any, ...]:
        done = svc.store.get_evolution(evo_id)
        row = done.iterations[0]
        steps = [([c["operator"] for c in st["changes"]], st["kept"], (st["verdict"] or {}).get("wins"),
                  st["spent"]["calls"]) for st in row["steps"]]
        return (done.status, steps, done.current_version, done.result["test_accuracy"],
                done.result["spent"]["calls"], row["calls_by_phase"])

    def cfg(suite: str) -> EvolveConfig:
        return config(suite, models=["planted-complement"], gate_k=1.0, charge_cached=True)

    from storage import open_store
    apart = open_store(f"sqlite:///{tmp_path / 'clean.db'}")
    try:
        svc, suite, review = complement_world(tmp_path, apart)
        clean = Evolver(svc, reviewer=review)
        golden = facts(svc, clean.run(clean.create(cfg(suite)).id).id)
    finally:
        apart.close()
    assert [ops for ops, *_ in golden[1]] == [["answer_extraction"], ["retry_unparsable"]], golden

    from tests.test_faults import DyingStore, Killed
    dying = DyingStore(store, "save_evolution", when=lambda evo: DEFERRED_CRASHES[point](evo.result.get("cursor") or {}))
    svc, suite, review = complement_world(tmp_path, dying)  # type: ignore[arg-type]
    engine = Evolver(svc, reviewer=review)
    evo = engine.create(cfg(suite))
    with pytest.raises(Killed):
        engine.run(evo.id)
    time.sleep(1.1)  # the dead engine's lease lapses
    svc, _, review = complement_world(tmp_path, store)
    assert facts(svc, Evolver(svc, reviewer=review).run(evo.id).id) == golden


def complement_world(tmp_path: Path, store) -> tuple[Service, str, Any]:
    """The arithmetic suite with a model whose odd-numbered replies are empty unless the prompt asks
    for digits first, and a reviewer who approves the extraction repair and turns the other
    proposal into that prompt line: two changes, each kept on top of the other."""
    suite = write_suite(tmp_path / "tiny.jsonl")
    rules, odd = [], []
    for n, line in enumerate(suite.read_text().splitlines()[1:]):
        row = json.loads(line)
        wrapped = f"Let me think.\nThe answer is {row['target']}."
        if n % 2:
            rules.append(Rule(text=wrapped, match=f"Answer with digits: {row['input']}"))
            odd.append(Rule(text="", match=row["input"]))
        else:
            rules.append(Rule(text=wrapped, match=row["input"]))
    register_backend(ScriptedBackend(rules + odd, model_id="planted-complement", default="I do not know."))
    svc = Service(store)

    def review(proposal):
        if proposal.spec.get("operator") == "answer_extraction":
            return "approve", "", None
        user = svc.harness(proposal.harness_version).files["user.md"]
        return "edit", "ask for digits", {"user.md": "Answer with digits: " + user}
    return svc, str(suite), review


def test_changes_kept_before_the_budget_ran_out_are_on_the_curve(tmp_path: Path, store) -> None:
    """Stopped in the middle of an iteration after a change was kept: sealing records that
    iteration as far as it went, so the comparison sees the gain and the calls it cost."""
    from ecdysis.compare import curve
    svc, suite, review = complement_world(tmp_path, store)
    full = Evolver(svc, reviewer=review)
    done = full.run(full.create(config(suite, models=["planted-complement"], label="full", charge_cached=True)).id)
    # A token budget, which no phase estimates ahead (a call budget would not start the second
    # validation at all), runs out in the middle of the second change's validation: the first
    # change's validation ends at 25 of the 49 calls (the extraction repair, which reads only, goes
    # first, before the edited change is screened). In a database of its own, so that every call
    # is made, and checked against the budget, one at a time (a run reused whole is charged whole).
    assert [st["spent"]["calls"] for st in done.iterations[0]["steps"]] == [25, 49]
    spent = done.iterations[0]["tokens"]
    from storage import open_store
    apart = open_store(f"sqlite:///{tmp_path / 'short.db'}")
    try:
        svc2, _, review2 = complement_world(tmp_path, apart)
        evolver = Evolver(svc2, reviewer=review2)
        evo = evolver.run(evolver.create(config(suite, models=["planted-complement"], max_tokens=spent * 9 // 10,
                                                label="short", charge_cached=True)).id)
        assert evo.status == "stopped" and evo.current_version != evo.base_version, evo.result
        sealed = evolver.seal(evo.id)
    finally:
        apart.close()
    row = sealed.iterations[-1]
    assert row["partial"] and row["kept"] == 1 and row["val_accuracy"] > 0
    points = curve(sealed, 0.0)
    assert points[-1].val_accuracy == row["val_accuracy"] and points[-1].calls == sealed.result["spent"]["calls"]


def test_when_nothing_survives_screening_the_batch_is_diagnosed_again(world) -> None:
    """Round 1: the reviewer turns every proposal into the planted bad change, so screening drops
    them all. Ecdysis diagnoses the same batch again with those operators ruled out, the reviewer
    turns the first new proposal into the extraction repair, and it is kept: the batch paid for
    the lesson with screening calls, not a validation. With one round, the iteration ends bare."""
    svc, suite, _ = world
    rounds: list[str] = []      # diagnosis ids, in the order their proposals reached the reviewer
    good: dict[str, str] = {}   # the extraction repair as round 1 proposed it
    made: list[str] = []

    def review(proposal):
        if proposal.diagnosis_id not in rounds:
            rounds.append(proposal.diagnosis_id)
        if len(rounds) == 1:
            if proposal.spec.get("operator") == "answer_extraction":
                good.update(proposal.files)
            user = svc.harness(proposal.harness_version).files["user.md"]
            return "edit", "planted bad change", {"user.md": user.rstrip("\n") + f"\n{BAD_LINE}\n"}
        if made:
            return "reject", "one repair is enough", None
        made.append(proposal.id)
        return "edit", "the extraction repair", dict(good)

    evolver = Evolver(svc, reviewer=review)
    evo = evolver.run(evolver.create(config(suite)).id)
    row = evo.iterations[0]
    assert len(rounds) == 2 and row["screen_rounds"] == 2, json.dumps(row, indent=1, default=str)[:5000]
    fate = {h["proposal_id"]: (h["operator"], h["outcome"]) for h in row["history"]}
    screened_out = {op for op, outcome in fate.values() if outcome == "screened_out"}
    assert {"answer_extraction", "retry_unparsable"} <= screened_out, fate
    # round 2 proposed operators round 1 did not, and the one made into the repair was kept
    second = [p for p in svc.proposals(diagnosis_id=rounds[1])]
    assert second and not {p.spec.get("operator") for p in second} & {"answer_extraction", "retry_unparsable"}
    assert [pid for pid, (op, outcome) in fate.items() if outcome == "kept"] == made
    assert row["val_accuracy"] > 0 and evo.current_version != evo.base_version
    assert row["calls_by_phase"]["screen"] > 0 and row["diagnosis_ids"] == rounds

    single = Evolver(svc, reviewer=plant_bad_everything(svc))
    evo = single.run(single.create(config(suite, screen_rounds=1, label="one round")).id)
    assert evo.iterations[0]["screen_rounds"] == 1 and evo.current_version == evo.base_version
    assert evo.iterations[0]["gate"] == "no change survived screening"


def plant_bad_everything(svc: Service):
    def review(proposal):
        user = svc.harness(proposal.harness_version).files["user.md"]
        return "edit", "planted bad change", {"user.md": user.rstrip("\n") + f"\n{BAD_LINE}\n"}
    return review


def test_a_change_screened_out_on_one_batch_is_screened_again_on_the_next(world) -> None:
    """Screening is a batch's verdict, not the change's: iteration 1 screens the extraction repair
    out (the reviewer planted the bad line into it), and iteration 2, on a new batch of the same
    harness, proposes it again, says so, screens it and keeps it. Within one iteration the rounds
    still rule out what that batch screened out (the test above)."""
    svc, suite, _ = world
    seen: list[str] = []

    def review(proposal):
        if proposal.diagnosis_id not in seen:
            seen.append(proposal.diagnosis_id)
        if len(seen) == 1:
            user = svc.harness(proposal.harness_version).files["user.md"]
            return "edit", "planted bad change", {"user.md": user.rstrip("\n") + f"\n{BAD_LINE}\n"}
        if proposal.spec.get("operator") == "answer_extraction":
            return "approve", "", None
        return "reject", "one repair is enough", None

    evolver = Evolver(svc, reviewer=review)
    evo = evolver.run(evolver.create(config(suite, iterations=2, screen_rounds=1)).id)
    first, second = evo.iterations
    assert {h["operator"]: h["outcome"] for h in first["history"]}["answer_extraction"] == "screened_out"
    assert first["harness_version"] == second["parent_version"]  # nothing kept: the same harness
    again = next(p for p in svc.proposals(diagnosis_id=second["diagnosis_id"])
                 if p.spec.get("operator") == "answer_extraction")
    said = json.dumps(svc.get_diagnosis(second["diagnosis_id"]).report["proposals"])
    assert "Proposed again, not as new: screened out on another batch in iteration 1" in said
    assert {h["proposal_id"]: h["outcome"] for h in second["history"]}[again.id] == "kept"
    assert evo.current_version != evo.base_version


def test_a_run_borrowed_from_another_strategy_never_takes_an_evolution_past_its_budget(world) -> None:
    """Strategies of a benchmark share one database: a finished run another one made is charged
    in full. When the budget cannot pay for all of it, the evolution stops there, as it would have
    stopped in the middle of making that run itself, and the change that run would have validated
    is not kept (before, a borrowed validation of 240 calls at 588 spent of 800 was charged whole
    and its change kept). The change kept asks each instance a question of its own before the
    parent's (`TWICE`): a change that only re-asks its parent's requests costs no new calls."""
    svc, suite, _ = world

    def twice(proposal):
        if proposal.spec.get("operator") != "answer_extraction":
            return "reject", "not this one", None
        return "edit", "answer twice", {**proposal.files, "harness.py": proposal.files["harness.py"] + TWICE}

    full = Evolver(svc, reviewer=twice)
    done = full.run(full.create(config(suite, label="first", charge_cached=True)).id)
    spent = done.result["spent"]["calls"]
    at_verdict = done.rows[0].steps[0].spent.calls  # what it had spent when its gate said yes
    assert done.current_version != done.base_version and at_verdict > 12
    tight = Evolver(Service(svc.store), reviewer=twice)
    short = config(suite, label="second", charge_cached=True, max_model_calls=at_verdict - 5)
    evo = tight.run(tight.create(short).id)
    # The borrowed validation runs' recorded calls do not fit: the validation is not started.
    assert evo.result["spent"]["calls"] <= at_verdict - 5, evo.result["spent"]
    assert evo.current_version == evo.base_version  # its validation did not fit: nothing kept
    assert "not_validated" in {h.outcome for h in evo.rows[0].history}, evo.rows[0].history
    roomy = Evolver(Service(svc.store), reviewer=twice)
    same = roomy.run(roomy.create(config(suite, label="third", charge_cached=True, max_model_calls=spent)).id)
    assert same.status == "done" and same.result["spent"]["calls"] == spent
    assert same.current_version == done.current_version


LAST_NUMBER = '''

import re as _planted_re
_planted_first_line = extract_answer


def extract_answer(text, task):
    numbers = _planted_re.findall(r"-?\\d+", text)
    return numbers[-1] if numbers else _planted_first_line(text, task)
'''


REPLIES = {"bare": "{t}", "wrapped": "Let me think.\nThe answer is {t}.", "trap": "{t}\nNot {u}.", "empty": "",
           "misread": "Let me think.\nThe answer is {u}.", "steps": "Step 1 of 2.\nThe answer is {t}."}


def kinds_world(tmp_path: Path, store, model_id: str, held_out: str, first_batch: Any) -> tuple[Service, str]:
    """The arithmetic suite, answered by a scripted model in one form per instance: "bare" (the
    number), "wrapped" in a sentence, a "trap" (the number, then another on the next line) or
    "empty". Validation and test are `held_out`, the first batch's instances as
    `first_batch(batch)` says, the rest bare."""
    from ecdysis.runner import pick_instances
    suite = write_suite(tmp_path / "tiny.jsonl")
    svc = Service(store)
    loaded = svc.suite(str(suite))
    kinds = {i.id: "bare" for i in loaded.instances}
    kinds.update({i.id: held_out for i in loaded.split("validation") + loaded.split("test")})
    kinds.update(first_batch(window(pick_instances(loaded, "train", None), 12, 1)))
    rules = [Rule(text=REPLIES[kinds[i.id]].format(t=i.target, u=int(i.target) + 1), match=i.input)
             for i in loaded.instances]
    register_backend(ScriptedBackend(rules, model_id=model_id, default="I do not know."))
    return svc, str(suite)


def last_number_reviewer(svc: Service, once_per: Any = lambda proposal: ""):
    """A reviewer who turns the first proposal (of each `once_per` key) into "read the last number"
    and rejects the others."""
    made: set[str] = set()

    def review(proposal):
        if once_per(proposal) in made:
            return "reject", "one repair is enough", None
        made.add(once_per(proposal))
        code = svc.harness(proposal.harness_version).files["harness.py"]
        return "edit", "read the last number", {"harness.py": code.rstrip("\n") + "\n" + LAST_NUMBER}
    return review


def noisy_batch_world(tmp_path: Path, store) -> tuple[Service, str, Any]:
    """A change that is good on validation (+12 of 12) but measures net -1 on the first batch
    (1 won, 2 lost, of 12): the model wraps validation answers in a sentence (read the last number:
    right; the starter's first line: wrong), and on the batch answers one question wrapped, two as
    "12\\nNot 13." (the starter right, the last number wrong), five with nothing and four bare.
    The reviewer turns the first proposal into "read the last number" and rejects the others."""
    svc, suite = kinds_world(tmp_path, store, "planted-noisy-batch", "wrapped", lambda batch: {
        batch[0].id: "wrapped", batch[1].id: "trap", batch[2].id: "trap"} | {i.id: "empty" for i in batch[3:8]})
    return svc, suite, last_number_reviewer(svc)


def test_a_batch_verdict_within_its_noise_does_not_screen_a_change_out(tmp_path: Path, store) -> None:
    """Net -1 on 3 changed outcomes is within one standard error (1.73) of no change: the change
    goes on to validation and is kept there. Holding the batch's point estimate against it (the
    rule before, `screen_k=0`) screens it out, and the evolution keeps nothing."""
    svc, suite, review = noisy_batch_world(tmp_path, store)
    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=["planted-noisy-batch"])).id)
    row = done.rows[0]
    last = next(c for st in row.steps or () for c in st.changes if c.edited)
    assert last.screened is not None and (last.screened.wins, last.screened.losses) == (1, 2), last.screened
    assert last.screened.passed and last.measured is not None and last.measured.kept
    assert done.current_version != done.base_version and done.result["test_accuracy"] == 1.0

    svc, suite, review = noisy_batch_world(tmp_path, store)  # a fresh reviewer, the same world
    evo = Evolver(svc, reviewer=review)
    before = evo.run(evo.create(config(suite, models=["planted-noisy-batch"], screen_k=0.0, label="k0")).id)
    fate = [h for h in before.rows[0].history if h.outcome == "screened_out"]
    assert fate and "net -1 (1 won, 2 lost on 12 paired) is below +0" in fate[0].why, before.rows[0].history
    assert before.current_version == before.base_version


def pooled_world(tmp_path: Path, store) -> tuple[Service, str, Any]:
    """"Read the last number" is bad here (every validation question is a trap: the starter's first
    line is right, the last number wrong). The first batch shows it: one wrapped question it
    repairs, seven traps it breaks, four empty replies. The second batch (the first one's five
    failures again, then seven plain questions of the next window) shows only its good side: 1 won,
    0 lost. The reviewer turns the first proposal of each iteration into that change (the same
    files, so the same version) and rejects the others."""
    svc, suite = kinds_world(tmp_path, store, "planted-pooled", "trap", lambda batch: {
        batch[0].id: "wrapped"} | {i.id: "empty" for i in batch[1:5]} | {i.id: "trap" for i in batch[5:]})
    # one diagnosis an iteration (one screening round): the first proposal of each
    return svc, suite, last_number_reviewer(svc, once_per=lambda proposal: proposal.diagnosis_id)


def test_a_change_screened_again_is_judged_on_every_batch_it_was_screened_on(tmp_path: Path, store) -> None:
    """Screened on the second batch alone, the bad change measures 1 won, 0 lost and goes on to a
    validation that rolls it back. Pooled with its first screen (both sides paid for already), it
    is 1 won, 7 lost on 19 paired outcomes, and is screened out without a validation's calls."""
    svc, suite, review = pooled_world(tmp_path, store)
    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=["planted-pooled"], iterations=2, screen_rounds=1)).id)
    first, second = done.rows
    assert [h.outcome for h in first.history if h.outcome != "rejected"] == ["screened_out"], first.history
    again = [h for h in second.history if h.outcome != "rejected"]
    assert [h.outcome for h in again] == ["screened_out"], second.history
    assert "net -6 (1 won, 7 lost on 19 paired, 7 of them from earlier batches)" in again[0].why, again[0].why
    assert not second.calls_by_phase.get("validate") and done.current_version == done.base_version

    svc, suite, review = pooled_world(tmp_path, store)
    evo = Evolver(svc, reviewer=review)
    alone = evo.run(evo.create(config(suite, models=["planted-pooled"], iterations=2, screen_rounds=1,
                                      screen_pool=False, label="each batch alone")).id)
    second = alone.rows[1]
    assert [h.outcome for h in second.history if h.outcome != "rejected"] == ["rolled_back"], second.history
    assert second.calls_by_phase.get("validate") and alone.current_version == alone.base_version


def test_a_repair_that_reads_answers_goes_to_validation_though_it_wins_nothing_on_the_batch(tmp_path: Path,
                                                                                              store) -> None:
    """The batch's off-format failures hold a well-formed answer the starter does not read, and that
    answer is wrong (the model's fault); on validation the answers it holds are right. Screened on the batch, the repair wins nothing (0 won, 0 lost), and the screen's bar of one win
    turned it down. What it claims is that it reads those answers, and it does, breaking nothing: it
    goes on to validation, where it gains on every instance and is kept. A repair that changes the
    prompt is still held to a win on the batch."""
    model = "planted-misread"
    svc, suite = kinds_world(tmp_path, store, model, "wrapped",
                             lambda batch: {i.id: "misread" for i in batch[:4]})

    def review(proposal):
        if proposal.spec.get("operator") == "answer_extraction":
            return "approve", "", None
        return "reject", "one repair is enough", None

    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=[model])).id)
    report = svc.get_diagnosis(done.iterations[0]["diagnosis_id"]).report
    cluster = next(c for c in report["clusters"] if c["type"] == "off_format")
    assert cluster["verdict"] == "harness-level" and cluster["size"] == 4, cluster
    fate = {h["operator"]: h for h in done.iterations[0]["history"]}["answer_extraction"]
    assert fate["outcome"] == "kept", fate
    screened = changes(done.iterations[0])["answer_extraction"]["screened"]
    assert (screened["wins"], screened["losses"], screened["read"]) == (0, 0, 4), screened
    assert screened["passed"] and "it reads 4 of the 4 answers on its cluster" in screened["reason"], screened
    assert [h.outcome for h in done.rows[0].history if h.outcome != "rejected"] == ["kept"]
    assert done.current_version != done.base_version and done.result["test_accuracy"] == 1.0
    from app import views
    shown = {r["operator"]: r for r in views.change_rows(done)}["answer_extraction"]
    assert shown["screened"] == "net +0 (0 won, 0 lost of 12); reads 4 answers that went unread", shown

    # The same repair edited by the reviewer to add a prompt line: no longer a repair of reading
    # alone, it is held to the bar of one win, and wins nothing.
    svc, suite = kinds_world(tmp_path, store, model, "wrapped", lambda batch: {i.id: "misread" for i in batch[:4]})

    def edit(proposal):
        if proposal.spec.get("operator") != "answer_extraction":
            return "reject", "one repair is enough", None
        files = svc.harness(proposal.harness_version).files
        mine = svc.store.get_proposal(proposal.id).files
        return "edit", "and ask for brevity", {**mine, "user.md": files["user.md"].rstrip("\n") + "\nBe brief.\n"}

    evo = Evolver(svc, reviewer=edit)
    edited = evo.run(evo.create(config(suite, models=[model], label="edited")).id)
    fate = {h["operator"]: h for h in edited.iterations[0]["history"]}["answer_extraction"]
    assert fate["outcome"] == "screened_out" and "0 won, 0 lost" in fate["why"], fate
    assert "it repaired nothing on the batch" in fate["why"] and edited.current_version == edited.base_version


FRUITS = (("yellow banana", "green pear", "red apple"), ("orange carrot", "purple plum", "white onion"),
          ("brown walnut", "black olive", "pink grapefruit"))
CHOICE_REPLIES = {"bare": "{letter}", "wrapped": "Let me think about it.\nThe answer is ({letter}).",
                  "plural": "{target}s are the answer here."}


def two_readings_world(tmp_path: Path, store, models: tuple[str, ...],
                       batch: tuple[str, ...] = ("wrapped", "plural", "bare", "wrapped"),
                       bare: tuple[str, ...] = ()) -> tuple[Service, str]:
    """A multiple-choice suite answered by scripted models (all alike, so every cluster is shared
    across models) in one form per instance: "bare" (the option letter: right), "wrapped" (the
    letter below a first line of prose) or "plural" (the option's text in a sentence, pluralised).
    Answer extraction reads the wrapped letters; choice matching reads both, mapping the sentence
    to its closest option (and falling back to the answer the reply marks). The first batch takes
    the forms of `batch` in turn; validation and test take the three forms in turn. The models in
    `bare` answer every question with its letter instead."""
    from ecdysis.runner import pick_instances
    suite = tmp_path / "fruit.jsonl"
    lines = [json.dumps({"ecdysis_suite": {"name": "fruit", "scorer": {"kind": "multiple_choice"}}})]
    for i in range(48):
        options = FRUITS[i % 3][i % 3:] + FRUITS[i % 3][:i % 3]
        target = options[(i // 3) % 3]
        lines.append(json.dumps({"id": f"f{i:02d}", "input": f"Question {i}: which of these is {target.split()[0]}?",
                                 "choices": list(options), "target": target, "category": "abc"[i % 3]}))
    suite.write_text("\n".join(lines) + "\n")
    svc = Service(store)
    loaded = svc.suite(str(suite))
    kinds = {i.id: "bare" for i in loaded.instances}
    kinds.update({i.id: ("wrapped", "plural", "bare")[n % 3]
                  for n, i in enumerate(loaded.split("validation") + loaded.split("test"))})
    kinds.update({i.id: batch[n % len(batch)]
                  for n, i in enumerate(window(pick_instances(loaded, "train", None), 12, 1))})
    rules = [Rule(text=CHOICE_REPLIES[kinds[i.id]].format(letter="ABC"[list(i.choices).index(i.target)],
                                                         target=i.target), match=i.input)
             for i in loaded.instances]
    letters = [Rule(text="ABC"[list(i.choices).index(i.target)], match=i.input) for i in loaded.instances]
    for model in models:
        register_backend(ScriptedBackend(letters if model in bare else rules, model_id=model, default="I do not know."))
    return svc, str(suite)


def readings_only(proposal):
    """A reviewer who approves the repairs of reading only: the other clusters' prompt repairs
    would cost screening calls."""
    from ecdysis.probe import reads_only
    if reads_only(proposal.spec.get("operator")):
        return "approve", "", None
    return "reject", "reading repairs only here", None


@pytest.mark.parametrize("batch", [("wrapped", "plural", "bare", "wrapped"), ("wrapped", "bare")],
                         ids=["the batch tells them apart", "only validation does"])
def test_a_clusters_other_reading_repairs_are_tried_free_and_the_better_one_kept(tmp_path: Path, store,
                                                                                 batch) -> None:
    """The cluster of wrapped letters gets answer extraction, first in its ranking; choice matching,
    last there, was never proposed, and extraction was kept (test 0.667, checked on the code before
    this rule). Both only change how replies are read, so the cluster now also gets choice
    matching, drafted by the engine's roles. Both survive screening and are validated on their own
    against the same parent: choice matching gains more, goes first, is kept, and the test accuracy
    is 1.0. Where the batch has no sentence for choice matching to read, the two tie on it: kept
    first in the batch's order, extraction left choice matching nothing to repair on its next screen
    (test 0.667 again, checked without the validation's order). Charged as the benchmark charges,
    the readings cost nothing: the only validation calls are the parent's, and no screen calls at
    all. A per-instance search, one proposal a scope, gets no sibling."""
    from app import views
    from ecdysis.diagnosis import READING_NOTE, report_of
    models = ("planted-reads-a", "planted-reads-b")
    svc, suite = two_readings_world(tmp_path, store, models, batch)
    evo = Evolver(svc, reviewer=readings_only)
    done = evo.run(evo.create(config(suite, models=list(models), val_limit=16, test_limit=16,
                                     charge_cached=True)).id)
    row = done.iterations[0]
    report = report_of(svc.get_diagnosis(row["diagnosis_id"]))
    wrapped = next(c for c in report.clusters if report.patch(c.id).reading_ids)
    theirs, (sibling,) = report.proposal_for(wrapped.id), report.readings_for(wrapped.id)
    assert (theirs.spec.operator, sibling.spec.operator) == ("answer_extraction", "choice_matching")
    assert sibling.status == "endorsed" and sibling.alternative.startswith(READING_NOTE)
    assert f"beside proposal {theirs.id} (answer_extraction)" in sibling.alternative
    assert f"another reading repair: proposal {sibling.id}" in report.patch(wrapped.id).text()
    assert views.proposal_label(svc.store.get_proposal(sibling.id)).endswith("· another reading repair")
    fate = {h["operator"]: h["outcome"] for h in row["history"] if h["outcome"] != "rejected"}
    assert fate == {"choice_matching": "kept", "answer_extraction": "screened_out"}, row["history"]
    kept = changes(row)["choice_matching"]
    assert kept["screened"]["passed"] and kept["measured"]["wins"] > 0 == kept["measured"]["losses"], kept
    # Each validated against the starter before the gate: choice matching reads twice as many.
    contest = kept["screened"]["contest"]
    (rival,) = contest["rivals"]
    assert contest["against"] == done.base_version and rival["operator"] == "answer_extraction"
    assert contest["net"] > rival["net"] > 0 and contest["losses"] == rival["losses"] == 0, contest
    shown = {r["operator"]: r for r in views.change_rows(done)}["choice_matching"]
    assert f"ranked on validation: net {contest['net']:+d} (answer_extraction {rival['net']:+d})" in shown["screened"]
    assert done.result["base_test_accuracy"] < 0.34 and done.result["test_accuracy"] == 1.0
    # Every screen and the candidate's validation replay requests the batch and the parent's
    # validation paid for: one call per validation outcome (12 instances x 2 models) is all it cost.
    assert kept["measured"]["n"] == 24, kept["measured"]
    assert row["calls_by_phase"]["screen"] == 0 and row["calls_by_phase"]["validate"] == 24, row["calls_by_phase"]

    base = Evolver(svc, reviewer=readings_only)
    searched = base.run(base.create(config(suite, models=list(models), val_limit=16, test_limit=16,
                                           strategy="per-instance", label="pi")).id)
    made = [report_of(svc.get_diagnosis(d)) for d in searched.result["diagnoses"]]
    assert made and not any(r.patch(c.id).reading_ids for r in made for c in r.clusters)


def test_a_one_model_cluster_that_a_later_reading_repair_recovers_is_the_harnesses(tmp_path: Path, store) -> None:
    """One model writes each of its failing answers as the option's text in a sentence; the other
    answers every question with its letter, so the cluster is that model's alone and needs the
    recoverability probe. The probe's first two repairs fall short: the format instruction recovers
    none of 3 failures, option scoring 2 of 6 (1 of 3, then 3 more asked) but loses 2 of its 3
    passing guards; a repair of reading replays the batch's requests, so every one
    that applies is probed too, on all 6 failures: extraction recovers none, choice matching 4. The
    cluster becomes harness-level on that evidence, choice matching is kept (test 1.0, against 0.667
    for the starter), and the reading repairs' probes and screens cost no call. Before, the probe stopped at two
    repairs and three failures: the cluster stayed the model's, and nothing was kept. (The suite is
    named by its file's path, which holds "/": its instances' scorer is found by the longest suite
    name their key starts with; cut at the first "/", the probe scored no answer right.)"""
    from ecdysis.diagnosis import report_of
    models = ("planted-one-reader", "planted-letters")
    svc, suite = two_readings_world(tmp_path, store, models, ("plural", "bare"), bare=("planted-letters",))
    evo = Evolver(svc)
    done = evo.run(evo.create(config(suite, models=list(models), val_limit=16, test_limit=16, auto_approve=True,
                                     charge_cached=True)).id)
    row = done.iterations[0]
    [cluster] = report_of(svc.get_diagnosis(row["diagnosis_id"])).clusters
    assert cluster.verdict == "harness-level" and set(cluster.models) == {"planted-one-reader"}, cluster.reason
    assert cluster.reason.startswith("Recoverable by the harness: with choice_matching, 4 of 6 of these failures "
                                     "on planted-one-reader come back right, and 3 of the 3 passing train instances "
                                     "of planted-one-reader it was also run on stay right (probe)"), cluster.reason
    assert {k: len(v) for k, v in cluster.probe["probed"].items()} == {
        "answer_format_instruction": 3, "option_scoring": 6, "answer_extraction": 6, "choice_matching": 6}
    assert not cluster.probe["right"]["answer_extraction"]
    # Option scoring brought back one of its three, so it was asked about three more and brought
    # back two in all; but it lost two of the three passing guards, so it is not the fix.
    assert len(cluster.probe["right"]["option_scoring"]) == 2
    assert len(cluster.probe["guards"]["option_scoring"]["lost"]) == 2
    assert not cluster.probe["guards"]["choice_matching"]["lost"]
    fate = {h["operator"]: h["outcome"] for h in row["history"]}
    assert fate["choice_matching"] == "kept", row["history"]
    assert done.result["base_test_accuracy"] < 0.67 and done.result["test_accuracy"] == 1.0
    assert row["calls_by_phase"]["screen"] == 0 and row["calls_by_phase"]["validate"] == 24, row["calls_by_phase"]


CONTEST_CRASHES = {
    "one reading validated": lambda cur: any("contest" in sc and "rivals" not in sc["contest"]
                                             for sc in cur.get("screen", {}).values()),
    "readings ranked": lambda cur: cur.get("phase") == "screen" and any(
        "rivals" in sc.get("contest", {}) for sc in cur.get("screen", {}).values()),
}


@pytest.mark.parametrize("point", sorted(CONTEST_CRASHES))
def test_reading_repairs_killed_while_validated_side_by_side_resume_to_the_clean_result(tmp_path: Path, store,
                                                                                      point: str,
                                                                                      monkeypatch) -> None:
    """Killed right after a write of the readings' side-by-side validation (one validated, or all
    ranked but not yet queued) and resumed by a new engine: the same order, verdicts, kept harness
    and spending as without the kill, the runs made before the kill reused and not paid twice."""
    monkeypatch.setenv("ECDYSIS_LEASE_TTL", "1.0")
    models = ("planted-contest-a", "planted-contest-b")

    def facts(svc: Service, evo_id: str) -> tuple[Any, ...]:
        done = svc.store.get_evolution(evo_id)
        row = done.iterations[0]
        steps = [([c["operator"] for c in st["changes"]], st["kept"], (st["verdict"] or {}).get("wins"))
                 for st in row["steps"]]
        contest = {c["operator"]: (c["screened"] or {}).get("contest", {}).get("net")
                   for st in row["steps"] for c in st["changes"]}
        return (done.status, steps, contest, done.current_version, done.result["test_accuracy"],
                done.result["spent"]["calls"], row["calls_by_phase"])

    def cfg(suite: str) -> EvolveConfig:
        return config(suite, models=list(models), val_limit=16, test_limit=16, charge_cached=True)

    from storage import open_store
    apart = open_store(f"sqlite:///{tmp_path / 'clean.db'}")
    try:
        svc, suite = two_readings_world(tmp_path, apart, models, ("wrapped", "bare"))
        clean = Evolver(svc, reviewer=readings_only)
        golden = facts(svc, clean.run(clean.create(cfg(suite)).id).id)
    finally:
        apart.close()
    assert golden[1][0][:2] == (["choice_matching"], True) and golden[2]["choice_matching"] > 0, golden

    from tests.test_faults import DyingStore, Killed
    dying = DyingStore(store, "save_evolution", when=lambda evo: CONTEST_CRASHES[point](evo.result.get("cursor") or {}))
    svc, suite = two_readings_world(tmp_path, dying, models, ("wrapped", "bare"))  # type: ignore[arg-type]
    engine = Evolver(svc, reviewer=readings_only)
    evo = engine.create(cfg(suite))
    with pytest.raises(Killed):
        engine.run(evo.id)
    time.sleep(1.1)  # the dead engine's lease lapses
    svc, _ = two_readings_world(tmp_path, store, models, ("wrapped", "bare"))
    assert facts(svc, Evolver(svc, reviewer=readings_only).run(evo.id).id) == golden


FIRST_NUMBER = '''

import re as _planted_re_first
_planted_before_first = extract_answer


def extract_answer(text, task):
    numbers = _planted_re_first.findall(r"-?\\d+", text)
    return numbers[0] if numbers else _planted_before_first(text, task)
'''


def test_of_changes_the_batch_cannot_tell_apart_the_cheapest_is_validated_first(tmp_path: Path, store) -> None:
    """Two changes survive screening, neither by more than the batch's noise: "read the last number"
    at two calls an instance (4 won, 1 lost: net +3, two standard errors 4.5) and "read the first
    number" at one (1 won, 0 lost). Validation shows both right everywhere. Ranked by the batch's
    net gain, the costlier went first and was kept, and the evolution ended on a harness that makes
    twice the calls for the same accuracy. The cheaper one goes first now, is kept, and the other,
    screened again on top of it, gains nothing on validation."""
    model = "planted-order"
    svc, suite = kinds_world(tmp_path, store, model, "wrapped", lambda batch: {
        batch[0].id: "steps", batch[1].id: "steps", batch[2].id: "steps", batch[3].id: "trap",
        batch[4].id: "wrapped"} | {i.id: "empty" for i in batch[5:8]})
    made: list[str] = []

    def review(proposal):
        if len(made) == 2:
            return "reject", "two changes are enough", None
        made.append(proposal.id)
        code = svc.harness(proposal.harness_version).files["harness.py"].rstrip("\n") + "\n"
        if len(made) == 1:
            return "edit", "read the last number, asked twice", {"harness.py": code + LAST_NUMBER + TWICE}
        return "edit", "read the first number", {"harness.py": code + FIRST_NUMBER}

    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=[model], iterations=1)).id)
    row = done.iterations[0]
    twice, first = made
    fate = {h["proposal_id"]: h for h in row["history"]}
    assert fate[first]["outcome"] == "kept", row["history"]
    validated = [c["proposal_id"] for st in row["steps"] for c in st["changes"]]
    assert validated[0] == first, validated
    first_screen = next(c["screened"] for st in row["steps"] for c in st["changes"] if c["proposal_id"] == first)
    assert (first_screen["wins"], first_screen["losses"]) == (1, 0), first_screen
    assert fate[twice]["outcome"] in ("rolled_back", "screened_out"), fate[twice]
    kept = svc.harness(done.current_version)
    assert "_planted_before_first" in kept.files["harness.py"] and "_planted_once" not in kept.files["harness.py"]
    assert done.result["test_accuracy"] == 1.0

    # What the batch says of the costlier change alone: more wins than the cheaper one, within noise.
    once: list[str] = []

    def alone(proposal):
        if once:
            return "reject", "one change", None
        once.append(proposal.id)
        code = svc.harness(proposal.harness_version).files["harness.py"].rstrip("\n") + "\n"
        return "edit", "read the last number, asked twice", {"harness.py": code + LAST_NUMBER + TWICE}
    evo = Evolver(svc, reviewer=alone)
    costly = evo.run(evo.create(config(suite, models=[model], iterations=1, label="alone")).id)
    own = next(c["screened"] for st in costly.iterations[0]["steps"] for c in st["changes"])
    assert (own["wins"], own["losses"], own["extra_calls"]) == (4, 1, 1.0), own


def test_a_validation_the_budget_cannot_finish_is_not_started(world) -> None:
    """The extraction repair with 3-sample voting screens well, but validating it (12 instances at
    3 calls, one of them the parent's request, and the parent's 12) does not fit in what is left:
    it is recorded as not validated,
    with the arithmetic, and the evolution ends its iteration with the rest of the budget unspent
    instead of running out in the middle of a validation that could decide nothing."""
    svc, suite, _ = world
    voting = voting_reviewer(svc)

    # Every call charged, cached or not (a benchmark's rule), so both evolutions count alike.
    free = Evolver(svc, reviewer=voting)
    unlimited = free.run(free.create(config(suite, label="unlimited", charge_cached=True)).id)
    # The validation needs 12 + 24: each instance's first sample is the parent's request, paid for.
    assert unlimited.rows[0].calls_by_phase["validate"] == 36, unlimited.rows[0].calls_by_phase
    at_screen = unlimited.rows[0].steps[0].spent.calls - 36  # what it had spent before validating
    budget = at_screen + 30
    tight = Evolver(svc, reviewer=voting)
    evo = tight.run(tight.create(config(suite, label="tight", max_model_calls=budget, charge_cached=True)).id)
    assert evo.status == "done" and len(evo.rows) == 1, (evo.status, evo.result.get("abandoned"))
    row = evo.rows[0]
    fate = {h.operator: h for h in row.history}
    assert fate["answer_extraction"].outcome == "not_validated", row.history
    # Set aside before its screening: screening (12 at 2 new calls) and validation would need 60.
    assert "not screened: screening (24) and validation (36) would need about 60" in fate["answer_extraction"].why
    assert row.gate.startswith("not validated: not screened")
    assert not row.calls_by_phase.get("screen") and not row.calls_by_phase.get("validate"), row.calls_by_phase
    assert evo.result["spent"]["calls"] < budget - 30 and evo.current_version == evo.base_version

    # The per-instance search screens nothing: its validation is the one set aside.
    alone = Evolver(svc, reviewer=voting)
    free = alone.run(alone.create(config(suite, strategy="per-instance", label="pi", charge_cached=True)).id)
    before_val = free.rows[0].steps[0].spent.calls - 36
    short = Evolver(svc, reviewer=voting)
    evo = short.run(short.create(config(suite, strategy="per-instance", label="pi tight", charge_cached=True,
                                        max_model_calls=before_val + 30)).id)
    row = evo.rows[0]
    assert row.gate.startswith("not validated: its validation (36) would need about 36 model calls"), row.gate
    assert not row.calls_by_phase.get("validate") and evo.result["spent"]["calls"] == before_val
    assert evo.current_version == evo.base_version
    # Set aside, not rolled back: the version keeps the status the evolution that judged it gave it.
    step = row.steps[0]
    assert step.candidate and not row.rolled_back
    assert svc.store.get_harness(step.candidate).status == "kept"  # "pi" validated and kept it


def habit_roles(model_id: str, operator: str) -> ScriptedBackend:
    """A role model that finds every cluster harness-level, names `operator` for each and accepts
    every draft: a small Proposer's habit, whatever the evidence."""
    spec = {"target_files": ["harness.py", "harness.toml"], "change": "c", "root_cause": "r",
            "expected_effect": "e", "risk": "k", "scope": "any task whose reply misses the answer"}
    # Each role's prompt shows what the earlier roles said: the first match decides who is asked.
    roles = ScriptedBackend([
        Rule(match="Attributor said:", text=json.dumps({"operator": operator, "spec": spec, "replies": []})),
        Rule(match="Hard checks:", text=json.dumps({"decision": "accept", "objections": []})),
        Rule(match="Investigator said:",
             text=json.dumps({"verdict": "harness-level", "reason": "both halves", "cross_instance": "6",
                              "cross_model": "one model"})),
        Rule(match="Harness files (version",
             text=json.dumps({"root_cause": "r", "component": "harness.py", "evidence": ["e"]}))],
        model_id=model_id)
    register_backend(roles)
    return roles


def test_the_engines_pick_is_screened_beside_the_role_models_and_kept_when_it_alone_gains(world) -> None:
    """The role model names the re-ask repair for every cluster; on the cluster whose replies hold
    the answer below a first line of prose, the engine's pick is answer extraction. Ecdysis screens
    both alone: the re-ask gains nothing and goes no further, the extraction is validated and kept.
    The per-instance search, one proposal a scope and no screen, gets no alternative."""
    svc, suite, _ = world
    habit_roles("habit-roles", "retry_unparsable")
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, role_backend="habit-roles", auto_approve=True)).id)
    row = evo.iterations[0]
    fate = {h["operator"]: h["outcome"] for h in row["history"]}
    assert fate == {"answer_extraction": "kept", "retry_unparsable": "screened_out"}, row["history"]
    records = [p for d in evo.result["diagnoses"] for p in svc.store.list_proposals(diagnosis_id=d)]
    engine = [p for p in records if p.data.get("alternative")]
    assert [p.spec["operator"] for p in engine] == ["answer_extraction"]
    assert "names retry_unparsable and was endorsed" in engine[0].data["alternative"]
    theirs = [p for p in records if p.spec["operator"] == "retry_unparsable"]
    assert theirs and all(any((m["role"], m["kind"], m["backend"]) == ("proposer", "output", "llm:habit-roles")
                              for m in p.data["transcript"]) for p in theirs)
    report = svc.get_diagnosis(row["diagnosis_id"]).report
    patches = [c["patch"] for c in report["clusters"] if c["patch"].get("alternative_id")]
    assert [p["alternative_id"] for p in patches] == [engine[0].id]
    assert evo.current_version != evo.base_version

    habit_roles("habit-roles-2", "retry_unparsable")
    baseline = Evolver(svc)
    base = baseline.run(baseline.create(config(suite, role_backend="habit-roles-2", auto_approve=True,
                                               strategy="per-instance")).id)
    made = [p for d in base.result["diagnoses"] for p in svc.store.list_proposals(diagnosis_id=d)]
    assert made and not any(p.data.get("alternative") for p in made)


def test_the_critic_buys_no_evidence_for_a_costlier_change_the_budget_could_not_validate(world) -> None:
    """A role model names 5-sample voting for every cluster. Without a limit, the Critic's smoke runs
    and headroom probes of voting cost 41 calls of the diagnosis (139 when a request asked again was
    charged again; voting recovers nothing and is refused), and answer extraction is kept. With 150
    calls in all, that diagnosis once left too little: the evolution kept nothing. Now the Critic
    first asks whether screening and validating voting
    would fit in what is left, refuses it on that ground without running it, and the roles' next
    repairs are screened and validated within the budget."""
    svc, suite, _ = world
    habit_roles("habit-vote", "self_consistency")
    free = Evolver(svc)
    unlimited = free.run(free.create(config(suite, role_backend="habit-vote", auto_approve=True, charge_cached=True,
                                            label="free")).id)
    assert unlimited.iterations[0]["calls_by_phase"]["diagnose"] == 41, unlimited.iterations[0]["calls_by_phase"]

    tight = Evolver(svc)
    evo = tight.run(tight.create(config(suite, role_backend="habit-vote", auto_approve=True, charge_cached=True,
                                        label="tight", max_model_calls=150)).id)
    row = evo.iterations[0]
    refused = [p for p in svc.store.list_proposals(diagnosis_id=row["diagnosis_id"])
               if p.spec.get("operator") == "self_consistency"]
    assert len(refused) == 2 and all(p.status == "rejected" for p in refused)
    for p in refused:
        checks = {c["name"]: c for c in p.data["checks"]}
        assert not checks["affordable"]["ok"] and "headroom" not in checks and "loads" not in checks, checks
        assert "not affordable: screening (60) and validation (72) would need about 132" in checks["affordable"]["detail"]
    others = [p for p in svc.store.list_proposals(diagnosis_id=row["diagnosis_id"]) if p not in refused]
    assert others and not any(c["name"] == "affordable" for p in others for c in p.data["checks"])  # they fit
    assert row["calls_by_phase"]["diagnose"] < 50, row["calls_by_phase"]
    fate = {h["operator"]: h["outcome"] for h in row["history"]}
    assert fate["answer_extraction"] == "kept", row["history"]
    assert evo.current_version != evo.base_version and evo.result["spent"]["calls"] <= 150


DIGITS = "Answer with digits: "


HELD = (("bare", "wrapped"),) * 3 + (("empty", "bare"),) * 3 + (("empty", "wrapped"),) * 6


BATCH = (("wrapped", "wrapped"),) * 3 + (("empty", "bare"),) * 3 + (("empty", "wrapped"),)


def pair_world(tmp_path: Path, store, model_id: str, held: tuple[tuple[str, str], ...] = HELD,
               batch: tuple[tuple[str, str], ...] = BATCH) -> tuple[Service, str, Any]:
    """A model whose reply depends on whether the prompt asks for digits: each instance has a reply
    kind without that line and one with it (`REPLIES`). Validation and test hold `held`, by
    default three (bare, wrapped), three (empty, bare) and six (empty, wrapped): asking for digits
    alone wins three and loses three, reading the last number alone changes nothing, and the two
    together win nine. The first batch holds three (wrapped, wrapped), three (empty, bare), one
    (empty, wrapped), the rest bare either way: each repair has something to repair, and the pair
    beats each alone. The reviewer turns the
    extraction repair into "read the last number" and the other proposal into the digits line."""
    from ecdysis.runner import pick_instances
    suite = write_suite(tmp_path / "tiny.jsonl")
    svc = Service(store)
    loaded = svc.suite(str(suite))
    kinds = {i.id: ("bare", "bare") for i in loaded.instances}
    for split in ("validation", "test"):
        kinds.update({i.id: kind for i, kind in zip(loaded.split(split), held)})
    first = window(pick_instances(loaded, "train", None), 12, 1)
    kinds.update({i.id: kind for i, kind in zip(first, batch)})
    asked = [Rule(text=REPLIES[kinds[i.id][1]].format(t=i.target, u=0), match=DIGITS + i.input)
             for i in loaded.instances]
    plain = [Rule(text=REPLIES[kinds[i.id][0]].format(t=i.target, u=0), match=i.input) for i in loaded.instances]
    register_backend(ScriptedBackend(asked + plain, model_id=model_id, default="I do not know."))
    made: list[str] = []

    def review(proposal):
        files = svc.harness(proposal.harness_version).files
        if proposal.spec.get("operator") == "answer_extraction" and "x" not in made:
            made.append("x")
            return "edit", "read the last number", {"harness.py": files["harness.py"].rstrip("\n") + "\n" + LAST_NUMBER}
        if proposal.spec.get("operator") != "answer_extraction" and "p" not in made:
            made.append("p")
            return "edit", "ask for digits", {"user.md": DIGITS + files["user.md"]}
        return "reject", "two changes are enough", None
    return svc, str(suite), review


def test_two_changes_that_fail_alone_are_validated_and_kept_together(tmp_path: Path, store) -> None:
    """Asking for digits is refused on validation (3 won, 3 lost: a near miss, no loss the
    validation can tell). Reading the last number, still to be validated, is screened again
    composed with it; on the batch the pair beats it alone, so the pair is validated next, wins 9
    and loses none, beats the digits line's own validation by as much, and is kept. Greedy
    selection (`complements=False`) validated the last number alone, which changes nothing there,
    and kept nothing."""
    model = "planted-pair"
    svc, suite, review = pair_world(tmp_path, store, model)
    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=[model])).id)
    row = done.iterations[0]
    steps = [([c["operator"] for c in st["changes"]], st["kept"]) for st in row["steps"]]
    assert steps == [(["retry_unparsable"], False), (["retry_unparsable", "answer_extraction"], True)], row["steps"]
    alone, pair = row["steps"]
    assert (alone["changes"][0]["measured"]["wins"], alone["changes"][0]["measured"]["losses"]) == (3, 3)
    together = pair["changes"][1]["screened"]
    assert together["passed"] and together["over_alone"]["net"] > 0, together
    assert together["near_miss"]["net"] == 0 and "screened together" in together["reason"], together
    assert (pair["changes"][0]["measured"]["wins"], pair["changes"][0]["measured"]["losses"]) == (9, 0)
    assert {h["operator"]: h["outcome"] for h in row["history"]} == {
        "retry_unparsable": "kept", "answer_extraction": "kept"}, row["history"]
    kept = svc.harness(done.current_version).files
    assert kept["user.md"].startswith(DIGITS) and "_planted_first_line" in kept["harness.py"]
    assert done.result["test_accuracy"] == 1.0 and done.result["base_test_accuracy"] == 0.25
    from app import views
    shown = {r["operator"]: r for r in views.change_rows(done)}
    assert shown["answer_extraction"]["validated"] == "+75.0 pts (9 won, 0 lost); with retry_unparsable", shown
    assert shown["retry_unparsable"]["screened"].endswith("; with answer_extraction"), shown

    svc, suite, review = pair_world(tmp_path, store, model)
    evo = Evolver(svc, reviewer=review)
    greedy = evo.run(evo.create(config(suite, models=[model], complements=False, label="greedy")).id)
    row = greedy.iterations[0]
    steps = [([c["operator"] for c in st["changes"]], st["kept"]) for st in row["steps"]]
    assert steps == [(["retry_unparsable"], False), (["answer_extraction"], False)], row["steps"]
    assert greedy.current_version == greedy.base_version


def test_a_pair_is_not_kept_for_what_its_near_miss_does_alone(tmp_path: Path, store) -> None:
    """The pair's other member must add to the near miss. Here the digits line alone wins 4 and
    loses none on validation (not beyond two standard errors, 4); the pair wins one more, so it
    passes against the parent (5 > 4.47) but nets +1 against the digits line's own validation,
    below the gate's minimum of 2: refused with those figures. Reading the last number, the pair's
    later member, is then validated alone, as it would have been."""
    model = "planted-pair-little"
    svc, suite, review = pair_world(tmp_path, store, model, held=(("empty", "bare"),) * 4 + (
        ("wrapped", "wrapped"),) + (("bare", "bare"),) * 7)
    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=[model])).id)
    row = done.iterations[0]
    steps = [([c["operator"] for c in st["changes"]], st["kept"]) for st in row["steps"]]
    assert steps == [(["retry_unparsable"], False), (["retry_unparsable", "answer_extraction"], False),
                     (["answer_extraction"], False)], row["steps"]
    verdict = row["steps"][1]["verdict"]
    assert (verdict["wins"], verdict["losses"]) == (5, 0), verdict
    assert "but against retry_unparsable alone it nets +1 (1 won, 0 lost), below the minimum of 2" in verdict["reason"]
    assert done.current_version == done.base_version


def test_a_pair_the_batch_put_behind_is_validated_when_both_fail_alone(tmp_path: Path, store) -> None:
    """On this batch the pair only ties reading the last number alone: it repairs three replies
    the digits line empties of nothing (empty, bare) and loses three that line empties (wrapped,
    empty), so reading is validated alone first. It changes nothing on validation and is refused,
    a near miss like the digits line (3 won, 3 lost). Both members now fail alone, and the pair
    screened already is validated last: 9 won, none lost, against the parent and each member's own
    validation, and kept. Before, a pair the batch did not put first was never validated."""
    model = "planted-pair-behind"
    svc, suite, review = pair_world(tmp_path, store, model, batch=(("empty", "bare"),) * 3 + (
        ("wrapped", "empty"),) * 3)
    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=[model])).id)
    row = done.iterations[0]
    steps = [([c["operator"] for c in st["changes"]], st["kept"]) for st in row["steps"]]
    assert steps == [(["retry_unparsable"], False), (["answer_extraction"], False),
                     (["retry_unparsable", "answer_extraction"], True)], row["steps"]
    together = row["steps"][2]["changes"][1]["screened"]
    assert together["passed"] and together["over_alone"] == {"n": 12, "wins": 3, "losses": 3, "net": 0, "se": 2.4495}, together
    alone = row["steps"][1]["changes"][0]["measured"]
    assert (alone["wins"], alone["losses"]) == (0, 0), alone
    assert (row["steps"][2]["verdict"]["wins"], row["steps"][2]["verdict"]["losses"]) == (9, 0)
    assert done.result["test_accuracy"] == 1.0 and done.result["base_test_accuracy"] == 0.25
    from app import views
    assert views.pair_rows(done) == [{
        "iteration": 1, "pair": "retry_unparsable + answer_extraction", "screened": "net +3 (3 won, 0 lost of 12)",
        "over the later alone": "net +0 (3 won, 3 lost of 12)", "outcome": "kept",
        "why": row["steps"][2]["verdict"]["reason"]}]


def _pair_at_step(cur: dict[str, Any], phase: str) -> bool:
    queue, step = cur.get("queue") or [], cur.get("step", 0)
    return cur.get("phase") == phase and step < len(queue) and len(queue[step]) == 2


PAIR_CRASHES = {
    "pair screened": lambda cur: any("+" in key for key in cur.get("screen", {})),
    "later member refused": lambda cur: cur.get("phase") == "rescreen" and len(cur.get("steps", [])) == 2,
    "pair being validated": lambda cur: _pair_at_step(cur, "validate"),
    "pair judged, not yet kept": lambda cur: _pair_at_step(cur, "judge"),
}


@pytest.mark.parametrize("point", sorted(PAIR_CRASHES))
def test_a_pair_killed_at_each_step_resumes_to_the_clean_result(tmp_path: Path, store, point: str,
                                                                monkeypatch) -> None:
    """The pair the batch put behind, killed right after each write of its way (its screen, the
    later member's refusal, its validation under way, its verdict before it is applied) and
    resumed by a new engine: the same steps, verdicts, record and kept harness as without the kill,
    and no proposal decided twice."""
    monkeypatch.setenv("ECDYSIS_LEASE_TTL", "1.0")
    batch = (("empty", "bare"),) * 3 + (("wrapped", "empty"),) * 3

    def facts(svc: Service, evo_id: str) -> tuple[Any, ...]:
        done = svc.store.get_evolution(evo_id)
        row = done.iterations[0]
        steps = [([c["operator"] for c in st["changes"]], st["kept"], (st["verdict"] or {}).get("wins"),
                  (st["verdict"] or {}).get("losses")) for st in row["steps"]]
        decided = [len(svc.store.list_decisions(p.id))
                   for p in svc.store.list_proposals(diagnosis_id=row["diagnosis_id"])]
        return (done.status, steps, [(p["operators"], p["outcome"]) for p in row["pairs"]], done.current_version,
                done.result["test_accuracy"], sorted(set(decided)))

    from storage import open_store
    apart = open_store(f"sqlite:///{tmp_path / 'clean.db'}")  # nothing of the clean run to reuse
    try:
        svc, suite, review = pair_world(tmp_path, apart, "planted-pair-crash", batch=batch)
        clean = Evolver(svc, reviewer=review)
        golden = facts(svc, clean.run(clean.create(config(suite, models=["planted-pair-crash"])).id).id)
    finally:
        apart.close()
    assert golden[1][-1][:2] == (["retry_unparsable", "answer_extraction"], True) and golden[-1] == [1], golden

    from tests.test_faults import DyingStore, Killed
    dying = DyingStore(store, "save_evolution", when=lambda evo: PAIR_CRASHES[point](evo.result.get("cursor") or {}))
    svc, suite, review = pair_world(tmp_path, dying, "planted-pair-crash", batch=batch)  # type: ignore[arg-type]
    engine = Evolver(svc, reviewer=review)
    evo = engine.create(config(suite, models=["planted-pair-crash"]))
    with pytest.raises(Killed):
        engine.run(evo.id)
    time.sleep(1.1)  # the dead engine's lease lapses
    svc, _, review = pair_world(tmp_path, store, "planted-pair-crash", batch=batch)
    Evolver(svc, reviewer=review).run(evo.id)
    assert facts(svc, evo.id) == golden


def test_a_pair_the_batch_put_behind_is_on_record_when_not_validated(tmp_path: Path, store) -> None:
    """The same batch, but on validation reading the last number alone wins five wrapped replies
    and is kept: the pair behind it is not validated, and the iteration's record keeps its screen,
    its figures over reading alone and why it went no further, for the app to show."""
    model = "planted-pair-moot"
    svc, suite, review = pair_world(tmp_path, store, model, batch=(("empty", "bare"),) * 3 + (
        ("wrapped", "empty"),) * 3, held=(("wrapped", "wrapped"),) * 5 + (("empty", "bare"),) * 3 + (
        ("bare", "wrapped"),) * 3 + (("bare", "bare"),))
    evo = Evolver(svc, reviewer=review)
    done = evo.run(evo.create(config(suite, models=[model])).id)
    row = done.iterations[0]
    steps = [([c["operator"] for c in st["changes"]], st["kept"]) for st in row["steps"]]
    assert steps == [(["retry_unparsable"], False), (["answer_extraction"], True)], row["steps"]
    [pair] = row["pairs"]
    assert pair["operators"] == ["retry_unparsable", "answer_extraction"] and pair["passed"], pair
    assert pair["outcome"] == "not_validated" and pair["over_alone"]["net"] == 0, pair
    assert pair["why"] == "on the batch it netted +0 over answer_extraction alone, which went first and was kept"
    from app import views
    assert [(r["pair"], r["outcome"]) for r in views.pair_rows(done)] == [
        ("retry_unparsable + answer_extraction", "not validated")]


def test_a_pair_is_made_with_the_near_miss_that_won_most_on_validation(world) -> None:
    """Near misses: refused alone on the version still kept, without a loss validation can tell.
    A partner can keep only what a near miss wins, so the one with most wins comes first (the
    format instruction, 9 won 12 lost, before answer extraction, 2 won 0 lost, though that nets
    more); a significant loss, a kept change, a pair and a change refused on another version are
    not near misses."""
    from types import SimpleNamespace
    from ecdysis.store import ProposalRecord
    svc, suite, _ = world
    ops = {"few": "answer_extraction", "many": "answer_format_instruction", "lost": "few_shot",
           "kept": "option_scoring", "elsewhere": "choice_matching", "other": "retry_unparsable"}
    for pid, op in ops.items():
        svc.store.save_proposal(ProposalRecord(id=pid, diagnosis_id="d", cluster_id="c1", harness_version="h",
                                               spec={"operator": op}, files={}, status="applied", created_at=1.0))

    def step(wins: int, losses: int, *pids: str, parent: str = "h", kept: bool = False) -> dict[str, Any]:
        return {"parent": parent, "candidate": "v-" + "+".join(pids), "kept": kept,
                "changes": [{"proposal_id": pid, "operator": ops[pid]} for pid in pids],
                "verdict": {"passed": kept, "wins": wins, "losses": losses, "n": 120}}

    evo = SimpleNamespace(current_version="h", iterations=[{"steps": [step(2, 0, "few"), step(30, 2, "kept", parent="g",
                                                                                           kept=True)]}])
    cur = {"steps": [step(9, 12, "many"), step(2, 20, "lost"), step(12, 10, "elsewhere", parent="g"),
                     step(10, 12, "many", "other")]}
    misses = Evolver(svc)._near_misses(evo, config(suite), cur)  # type: ignore[arg-type]
    assert [(m["proposal_id"], m["wins"], m["net"]) for m in misses] == [("many", 9, -3), ("few", 2, 2)], misses


def twin_world(tmp_path: Path, store, models: tuple[str, ...], repaired: int) -> tuple[Service, str, Any]:
    """The arithmetic suite, and models that all reply alike: every train question and the first
    `repaired` of the 12 validation questions come back empty unless the prompt asks for digits
    first; the other validation questions are answered right either way. The reviewer turns the
    first proposal into that prompt line and rejects the rest."""
    from ecdysis.runner import pick_instances
    suite = write_suite(tmp_path / "twin.jsonl")
    svc = Service(store)
    loaded = svc.suite(str(suite))
    blank = ({i.id for i in loaded.split("train")}
             | {i.id for i in pick_instances(loaded, "validation", 12)[:repaired]})
    asked, empty, plain = [], [], []
    for line in suite.read_text().splitlines()[1:]:
        row = json.loads(line)
        if row["id"] in blank:
            asked.append(Rule(text=row["target"], match=f"Answer with digits: {row['input']}"))
            empty.append(Rule(text="", match=row["input"]))
        else:
            plain.append(Rule(text=row["target"], match=row["input"]))
    for model in models:
        register_backend(ScriptedBackend(asked + empty + plain, model_id=model, default="I do not know."))
    edited: list[str] = []

    def review(proposal):
        if edited and proposal.id not in edited:
            return "reject", "this world has one change to try", None
        edited.append(proposal.id)
        user = svc.harness(proposal.harness_version).files["user.md"]
        return "edit", "ask for digits", {"user.md": "Answer with digits: " + user}
    return svc, str(suite), review


@pytest.mark.parametrize(("twins", "repaired", "kept", "words"), [
    (False, 4, False, "net gain +4 (4 won, 0 lost) is within 2 standard errors (2 x 2.00 = 4.00)"),
    (True, 4, False, "net gain +8 (8 won, 0 lost) is within 2 standard errors (2 x 4.00 = 8.00)"),
    (False, 5, True, "net gain +5 (5 won, 0 lost) exceeds 2 standard errors (2 x 2.24 = 4.47)"),
    (True, 5, True, "net gain +10 (10 won, 0 lost) exceeds 2 standard errors (2 x 4.47 = 8.94)"),
])
def test_a_second_model_that_answers_as_the_first_adds_no_evidence_at_the_gate(
        tmp_path: Path, store, twins: bool, repaired: int, kept: bool, words: str) -> None:
    """The gate's unit is the question. A change that repairs 4 of 12 validation questions is within
    the noise for one model; a second model that answers every question as the first does doubles
    the wins but is no new evidence, and the change is refused all the same (counted as separate
    draws, +8 against 2 x sqrt(8) = 5.66 passed). Repairing 5 passes either way."""
    models = tuple(f"planted-twin{repaired}-{side}" for side in ("a", "b")[:1 + twins])
    svc, suite, review = twin_world(tmp_path, store, models, repaired)
    evolver = Evolver(svc, reviewer=review)
    evo = evolver.run(evolver.create(config(suite, models=list(models))).id)
    steps = evo.iterations[0]["steps"]
    assert len(steps) == 1, steps
    verdict = steps[0]["verdict"]
    assert (verdict["wins"], verdict["losses"], verdict["n"]) == (repaired * len(models), 0, 12 * len(models))
    assert steps[0]["kept"] is kept and words in verdict["reason"], verdict
    assert verdict["se"] == pytest.approx(math.sqrt(repaired) * len(models), abs=1e-3)
    # The screen on the batch counted by question too: every train question repaired for every model.
    screened = steps[0]["changes"][0]["screened"]
    assert screened["wins"] == 12 * len(models) and screened["se"] == pytest.approx(math.sqrt(12) * len(models), abs=1e-3)

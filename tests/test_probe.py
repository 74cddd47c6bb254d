"""The recoverability probe on the planted world (tests/diagnosis_fixtures.py). Pattern M is beta's
alone: on instances 3-4 of every category it replies with prose and no answer while alpha answers,
so aggregation calls the cluster model-specific. Here beta answers properly once the prompt asks
for the answer's form, so the harness *can* recover those failures; the probe finds that out with
a few real (scripted) calls and the cluster becomes harness-level with a reason a person can check.
A beta that ignores the instruction leaves the cluster as it was, with what the probe tried."""

from __future__ import annotations

import pytest

from diagnosis_fixtures import M_REPLY, MemoryStore, answer_form, plant, planted_reply
from ecdysis.budget import CallBudget
from ecdysis.diagnosis import diagnose
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.records import Completion, CompletionRequest
from ecdysis.roles.operators import AnswerFormatInstruction

INSTRUCTION = AnswerFormatInstruction().system_text


class Instructable:
    """beta, scripted: what the planted world has it reply (prose with no answer on instances 3-4),
    unless a message carries the answer-format instruction and it `follows` it (on every instance,
    or on the ids in the set), then the right answer in the form the task asks. With `breaks`, the
    instruction also makes it answer wrong on the instances it passes without it."""

    max_concurrency = 8
    deterministic = True
    scores_options = False

    def __init__(self, suite, follows: bool | set[str], breaks: bool | set[str] = False) -> None:
        self.model_id = "beta"
        self.suite, self.follows = suite, follows
        self.plain = ScriptedBackend([Rule(text=planted_reply("beta", i, {"H", "M", "noise"}), match=i.input)
                                      for i in suite.instances], model_id="beta", default=M_REPLY)
        failing = [i for i in suite.instances if int(i.id.rsplit("-", 1)[1]) in (3, 4)]
        self.told = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in failing]
                                    + [Rule(text="I cannot say." if breaks is True or i.id in (breaks or ())
                                            else answer_form(i), match=i.input)
                                       for i in suite.instances if i not in failing],
                                    model_id="beta", default=M_REPLY)
        self.history: list[CompletionRequest] = []

    def complete(self, request: CompletionRequest) -> Completion:
        self.history.append(request)
        text = " ".join(content for _, content in request.messages)
        told = INSTRUCTION in text and (self.follows is True or any(
            i.input in text for i in self.suite.instances if i.id in (self.follows or ())))
        return (self.told if told else self.plain).complete(request)

    def close(self) -> None:
        pass


def diagnosed(follows: bool | set[str]):
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    beta = Instructable(suite, follows)
    alpha = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in suite.instances], model_id="alpha")
    budget = CallBudget()
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                      backend_factory={"alpha": alpha, "beta": beta}.__getitem__, budget=budget)
    quirk = next(c for c in report.clusters if set(c.models) == {"beta"} and len(c.instances) >= 3)
    return report, quirk, beta, budget


def test_a_one_model_cluster_the_harness_can_recover_becomes_harness_level() -> None:
    report, quirk, beta, budget = diagnosed(follows=True)
    assert quirk.verdict == "harness-level", quirk.reason
    assert quirk.reason.startswith("Recoverable by the harness: with answer_format_instruction, 3 of 3 of these "
                                   "failures on beta come back right, and 3 of the 3 passing train instances of beta it "
                                   "was also run on stay right (probe). Before the probe: Specific to beta")
    guards = quirk.probe["guards"]["answer_format_instruction"]
    assert len(guards["kept"]) == 3 and not guards["lost"]
    assert not set(guards["kept"]) & set(quirk.probe["probed"]["answer_format_instruction"])
    assert quirk.probe["operator"] == "answer_format_instruction" and len(quirk.probe["members"]) == 3
    assert all(key.split("/")[1].endswith(("-003", "-004")) for key in quirk.probe["members"])
    assert any(e.startswith("probe: answer_format_instruction on beta") for e in quirk.evidence)
    # the probe ran beta on its own failures, with the instruction, and each call was charged
    probed = [r for r in beta.history if any(INSTRUCTION in c for _, c in r.messages)]
    assert len(probed) >= 3 and budget.calls >= len(beta.history)
    # ... and the repair it found is the one proposed for the cluster
    mine = [p for p in report.proposals if p.cluster_id == quirk.id]
    assert mine and mine[0].spec.operator == "answer_format_instruction"
    assert report.to_json()["clusters"][[c.id for c in report.clusters].index(quirk.id)]["probe"] == quirk.probe


def test_a_cluster_no_repair_recovers_stays_the_models_with_what_was_tried() -> None:
    report, quirk, beta, _ = diagnosed(follows=False)
    assert quirk.verdict == "model-specific", quirk.reason
    assert "Probe on beta's failures: answer_format_instruction 0/3" in quirk.reason
    assert quirk.probe["model"] == "beta" and "operator" not in quirk.probe
    assert not [p for p in report.proposals if p.cluster_id == quirk.id]


@pytest.mark.parametrize("right", [True, False])
def test_a_union_of_small_one_model_patterns_is_probed_and_promoted(right: bool) -> None:
    """alpha's answers sit on a second line, after an opener worded per category, on two instances
    each of two categories; beta fails the same instances with wrong answers, so no model passes
    where alpha fails. Each wording is too small for the probe; their union is kept for it
    (aggregation). The probe finds that the extraction repair, which only changes how a reply is
    read, reads alpha's answers: the union becomes harness-level and that repair is proposed for
    it, whether alpha's answers are right or (`right=False`) wrong, since what the model knows is
    not the harness's fault. (Seen on BIG-Bench Hard, seeds 13-14: the per-instance search kept
    answer extraction at 5 won 0 lost, while Ecdysis's batches had SmolLM2's off-format answers in
    parts of 2 instances, each called noise, and a probe that asked for right answers found 1 of 3.)"""
    import time

    from diagnosis_fixtures import planted_suite, result_for
    from ecdysis.harness import new_version, starter_files
    from ecdysis.records import RunRecord
    from test_aggregate import OPENERS
    store = MemoryStore()
    suite = planted_suite()
    version = store.put_harness(new_version(starter_files(), parent=None, note="planted"))
    train = [i for i in suite.instances if i.split == "train"]
    picked = {iid for category in ("arithmetic", "object-counting")
              for iid in sorted(i.id for i in train if i.category == category)[:2]}
    given = {i.id: answer_form(i) if right else str(int(i.target) + 2) for i in train if i.id in picked}
    replies = {"alpha": {i.id: f"{OPENERS[i.category]}\n{given[i.id]}" if i.id in picked else answer_form(i)
                         for i in train},
               "beta": {i.id: str(int(i.target) + 1) if i.id in picked else answer_form(i) for i in train}}
    run_ids = []
    for n, model in enumerate(("alpha", "beta")):
        run = RunRecord(id=f"run-{model}", suite=suite.name, model=model, harness_version=version.id, split="train",
                        instance_ids=[i.id for i in train], status="done", created_at=time.time() + n)
        store.create_run(run)
        for inst in train:
            store.save_result(result_for(run.id, model, inst, replies[model][inst.id]))
        run_ids.append(run.id)
    backends = {m: ScriptedBackend([Rule(text=replies[m][i.id], match=i.input) for i in train], model_id=m)
                for m in ("alpha", "beta")}
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=backends["alpha"],
                      backend_factory=backends.__getitem__, budget=CallBudget())
    [union] = [c for c in report.clusters if c.type == "off_format"]
    assert len(union.instances) == 4 and set(union.models) == {"alpha"}
    assert union.verdict == "harness-level", union.reason
    # A repair of reading replays the batch's requests: probed on all 4 of alpha's failures, not 3.
    assert union.reason.startswith("Readable by the harness: with answer_extraction, 4 of 4 of these failures on "
                                   f"alpha now give an answer of the task's form, {4 if right else 0} of them right")
    assert "merged from 2 smaller sub-patterns" in union.reason
    assert union.probe["read"]["answer_extraction"] == union.probe["probed"]["answer_extraction"]
    assert len(union.probe["members"]) == 3 and len(union.probe["probed"]["answer_extraction"]) == 4
    assert len(union.probe["right"]["answer_extraction"]) == (4 if right else 0)
    mine = [p for p in report.proposals if p.cluster_id == union.id]
    assert mine and mine[0].spec.operator == union.probe["operator"]


def test_a_probe_the_budget_cuts_short_stops_the_diagnosis_instead_of_calling_the_cluster_the_models() -> None:
    """The budget runs out during the probe: the diagnosis stops with BudgetExceeded (the evolution
    stops cleanly and its resume diagnoses again), where a probe that counted the refused calls as
    failures would leave the cluster model-specific for want of budget."""
    from ecdysis.errors import BudgetExceeded
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    beta = Instructable(suite, follows=True)
    alpha = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in suite.instances], model_id="alpha")
    budget = CallBudget(max_calls=1)
    with pytest.raises(BudgetExceeded):
        diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                 backend_factory={"alpha": alpha, "beta": beta}.__getitem__, budget=budget)
    assert len(beta.history) == 1 and budget.calls == 1  # one probe call made, the next refused


def test_the_probe_draws_its_members_across_the_clusters_categories_and_not_twice() -> None:
    """beta's cluster spans all five categories (instances 3-4 of each). The probe's three members
    come from three categories, not from the two whose names sort first; a later iteration's probe,
    told what the earlier one asked, runs the repair on other failures (a cached, deterministic
    model would only answer the same again)."""
    from ecdysis.probe import asked_before
    report, quirk, _, _ = diagnosed(follows=False)
    first = quirk.probe["probed"]["answer_format_instruction"]
    assert len(first) == 3 and len({key.split("/")[1].rsplit("-", 1)[0] for key in first}) == 3
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    beta = Instructable(suite, follows=False)
    alpha = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in suite.instances], model_id="alpha")
    again = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                     backend_factory={"alpha": alpha, "beta": beta}.__getitem__, budget=CallBudget(),
                     previous_clusters=[report.clusters])
    later = next(c for c in again.clusters if set(c.models) == {"beta"} and len(c.instances) >= 3)
    second = later.probe["probed"]["answer_format_instruction"]
    assert len(second) == 3 and not set(second) & set(first)
    assert set(first) <= asked_before(report.clusters)["answer_format_instruction"]


def test_spread_takes_categories_in_turn_and_what_was_asked_last() -> None:
    from ecdysis.records import Instance
    from ecdysis.refine import spread
    failures = [(f"s/{c}-{i}", Instance(id=f"{c}-{i}", input="x", target="y", category=c))
                for c in ("alpha", "beta", "gamma") for i in range(4)]
    picked = spread(failures, 3)
    assert sorted(inst.category for _, inst in picked) == ["alpha", "beta", "gamma"]
    assert spread(list(reversed(failures)), 3) == picked  # the order given does not matter
    asked = {key for key, _ in failures if not key.endswith("-3")}
    assert {key for key, _ in spread(failures, 3, asked)} == {"s/alpha-3", "s/beta-3", "s/gamma-3"}
    assert len(spread(failures, 5, asked)) == 5 and spread(failures[:1], 3) == failures[:1]


def probed_twice(follows: set[str], *, files: dict[str, str] | None = None):
    """Two diagnoses of the planted world, the second told of the first's clusters (a later
    iteration's batch): beta follows the instruction on the ids in `follows` only. `files`: the
    harness the second diagnosis patches (default: the same one)."""
    first_store = MemoryStore()
    run_ids, suite, version = plant(first_store)
    beta = Instructable(suite, follows)
    alpha = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in suite.instances], model_id="alpha")
    backends = {"alpha": alpha, "beta": beta}.__getitem__
    first = diagnose(first_store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                     backend_factory=backends, budget=CallBudget())
    second = diagnose(first_store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                      backend_factory=backends, budget=CallBudget(), previous_clusters=[first.clusters],
                      current_files=files)
    pick = lambda report: next(c for c in report.clusters if set(c.models) == {"beta"} and len(c.instances) >= 3)
    return pick(first), pick(second), version


def test_a_repair_that_brings_back_one_failure_a_probe_is_promoted_once_two_probes_of_it_agree() -> None:
    """The instruction brings back one failure of the first probe's three and none of the three more
    it then asks: the first probe alone is not evidence; the second brings back one more, and pooled
    with the first (the same patched harness, the same model, other failures), that is. With the
    harness changed in between, the first probe's result is not pooled."""
    name = "answer_format_instruction"
    # Which failures the probes draw depends on the hashed order and on whether one came back.
    a, _, _ = probed_twice(set())
    one = a.probe["probed"][name][0]
    _, b, _ = probed_twice({one.split("/")[1]})
    two = b.probe["probed"][name][0]
    follows = {one.split("/")[1], two.split("/")[1]}
    first, second, version = probed_twice(follows)
    assert first.verdict != "harness-level" and first.probe["right"][name] == [one], first.reason
    assert f"{name} 1/6;" in first.reason and "came back right: not the harness's on that evidence" in first.reason
    assert two not in first.probe["probed"][name]
    assert "guards" not in first.probe  # too little brought back to pay for guards
    assert second.verdict == "harness-level", second.reason
    assert second.probe["right"][name] == [two] and second.probe["recovered"] == sorted({one, two})
    assert (f"with {name}, 1 of 3 of these failures on beta come back right, and 1 more in earlier probes of "
            f"the same patched harness ({one})") in second.reason
    assert second.probe["guards"][name]["kept"] and not second.probe["guards"][name]["lost"]
    changed = {**version.files, "harness.py": version.files["harness.py"] + "\n# changed\n"}
    _, alone, _ = probed_twice(follows, files=changed)
    assert alone.verdict != "harness-level" and alone.probe["right"][name] == [two], alone.reason


def test_a_repair_that_loses_passing_instances_is_not_the_harness_fix() -> None:
    """With the instruction beta gets every one of its failures right, and the instances it passed
    wrong. By the failures alone the probe would promote the cluster; the passing train instances
    it is also run on are lost, so the cluster stays the model's and the reason names them."""
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    beta = Instructable(suite, True, breaks=True)
    alpha = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in suite.instances], model_id="alpha")
    budget = CallBudget()
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                      backend_factory={"alpha": alpha, "beta": beta}.__getitem__, budget=budget)
    quirk = next(c for c in report.clusters if set(c.models) == {"beta"} and len(c.instances) >= 3)
    name = "answer_format_instruction"
    assert quirk.verdict != "harness-level", quirk.reason
    assert len(quirk.probe["right"][name]) == 3
    lost = quirk.probe["guards"][name]["lost"]
    assert len(lost) == 3 and not quirk.probe["guards"][name]["kept"]
    assert f"{name} 3/3, but it lost 3 of 3 passing instances ({', '.join(lost)})" in quirk.reason
    passed = {f"planted/{r.instance_id}" for r in store.get_results(run_ids[1]) if r.correct}
    assert set(lost) <= passed and not set(lost) & set(quirk.probe["right"][name])
    assert not [p for p in report.proposals if p.cluster_id == quirk.id]
    assert budget.calls >= len(beta.history)  # the guards' calls were charged too


@pytest.mark.parametrize("broken", [1, 2])
def test_a_repair_must_bring_back_more_than_twice_what_it_loses(broken: int) -> None:
    """The instruction brings back 3 of 3 failures and loses `broken` of the 3 passing instances the
    probe also runs it on: one loss is outweighed (3 > 2), two are not (3 <= 4), the gate's rule."""
    name = "answer_format_instruction"
    _, clean, _, _ = diagnosed(follows=True)
    guards = clean.probe["guards"][name]["kept"]
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    beta = Instructable(suite, True, breaks={key.split("/")[1] for key in guards[:broken]})
    alpha = ScriptedBackend([Rule(text=answer_form(i), match=i.input) for i in suite.instances], model_id="alpha")
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=alpha,
                      backend_factory={"alpha": alpha, "beta": beta}.__getitem__, budget=CallBudget())
    quirk = next(c for c in report.clusters if set(c.models) == {"beta"} and len(c.instances) >= 3)
    assert quirk.probe["guards"][name]["lost"] == sorted(guards[:broken])
    if broken == 1:
        assert quirk.verdict == "harness-level", quirk.reason
        assert "come back right, and 2 of the 3 passing train instances of beta it was also run on stay right" \
            in quirk.reason
    else:
        assert quirk.verdict != "harness-level", quirk.reason
        assert f"{name} 3/3, but it lost 2 of 3 passing instances" in quirk.reason


def test_guards_an_earlier_probe_ran_are_counted_not_run_again() -> None:
    """Pooled guards: what earlier probes of the same patched harness kept and lost both count, and
    when they add up to `GUARDS` no call is made (no runner is needed)."""
    from ecdysis.probe import GUARDS, Pooled, _guard
    before = Pooled(kept={"s/a", "s/b"}, lost={"s/c"})
    assert GUARDS == 3 and _guard(None, {}, [], before) == (["s/a", "s/b"], ["s/c"])


def test_a_repair_that_brings_back_one_failure_is_asked_about_more_of_the_batch_at_once() -> None:
    """One failure of three back is a signal short of evidence: the probe runs the repair on up to
    `PROBE_MORE` further failures of the cluster, and a second one back there promotes the cluster
    in the same batch. No failure back, no further call."""
    from ecdysis.probe import PROBE_MORE, PROBE_SIZE
    name = "answer_format_instruction"
    report, quiet, beta, _ = diagnosed(follows=False)
    assert len(quiet.probe["probed"][name]) == PROBE_SIZE  # nothing came back: three asked, no more
    one = quiet.probe["probed"][name][0]
    _, single, beta_one, _ = diagnosed(follows={one.split("/")[1]})
    asked = single.probe["probed"][name]
    assert len(asked) == PROBE_SIZE + PROBE_MORE and len(set(asked)) == len(asked), single.reason
    assert asked[:PROBE_SIZE] == quiet.probe["probed"][name] and f"{name} 1/6;" in single.reason
    told = [r for r in beta_one.history if any(INSTRUCTION in c for _, c in r.messages)]
    assert len(told) == PROBE_SIZE + PROBE_MORE  # each further failure asked once, no guards yet
    two = asked[PROBE_SIZE]
    _, quirk, _, _ = diagnosed(follows={one.split("/")[1], two.split("/")[1]})
    assert quirk.verdict == "harness-level", quirk.reason
    assert quirk.probe["recovered"] == sorted({one, two}) and quirk.probe["probed"][name] == asked
    assert quirk.reason.startswith(f"Recoverable by the harness: with {name}, 2 of 6 of these failures on beta "
                                   "come back right, and 3 of the 3 passing train instances of beta it was also run "
                                   "on stay right (probe).")

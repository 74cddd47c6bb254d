"""Failure-Driven Collaborative Refinement end to end on the planted world (tests/diagnosis_fixtures.py):
the harness-level cluster gets an endorsed patch that really fixes its failures, the model-specific
and noise clusters get none, a patch that hard-codes an answer is rejected for that reason, an
operator already in the harness draws an objection answered next round, and malformed LLM role
output never breaks the diagnosis."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from diagnosis_fixtures import H_PREFIX, MemoryStore, answer_form, plant
from ecdysis.aggregate import Cluster
from ecdysis.diagnosis import DiagnosisReport, diagnose, sanctioned_exemplars
from ecdysis.diffs import diff_files
from ecdysis.errors import NotFound
from ecdysis.harness import starter_files
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.refine import DataIndex, LeakageCheck
from ecdysis.roles.base import ModificationSpec
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.repairs import RepairInput
from ecdysis.sandbox import SandboxLimits, WorkerPool
from ecdysis.suites.scorers import score

SPEC = {"target_files": ["harness.py"], "change": "c", "root_cause": "r", "expected_effect": "e",
        "risk": "k", "scope": "general"}


def empty_cluster() -> Cluster:
    return Cluster("c0", "off_format", "label", [], [], 1.0, {}, "harness-level", "", [])


def smoke() -> ScriptedBackend:
    return ScriptedBackend(default=f"{H_PREFIX} 34")


def run_diagnosis(store: MemoryStore, **kwargs) -> DiagnosisReport:
    run_ids, suite, _ = plant(store, files=kwargs.pop("files", None))
    kwargs.setdefault("smoke_model", smoke())
    return diagnose(store, run_ids, suite_loader=lambda name: suite, **kwargs)


def test_harness_level_cluster_gets_a_patch_that_fixes_it() -> None:
    store = MemoryStore()
    report = run_diagnosis(store)
    data = report.to_json()
    assert [c["verdict"] for c in data["clusters"]] == ["harness-level", "model-specific", "noise"]
    shared, quirk, slip = data["clusters"]
    assert shared["patch"]["status"] == "endorsed"
    assert quirk["patch"]["proposal_id"] is None and "one model's quirk" in quirk["patch"]["no_patch_reason"]
    assert slip["patch"]["proposal_id"] is None and "too small" in slip["patch"]["no_patch_reason"]
    # The roles' proposal, then the cluster's other reading repair (`_reading_siblings`).
    assert len(data["proposals"]) == 2 and shared["patch"]["reading_ids"] == [data["proposals"][1]["id"]]
    proposal, sibling = report.proposals
    assert proposal.cluster_id == "c1" and proposal.spec.operator == "answer_extraction"
    assert (sibling.cluster_id, sibling.spec.operator, sibling.status) == ("c1", "choice_matching", "endorsed")
    assert report.proposal_for("c1") is proposal and report.readings_for("c1") == [sibling]
    assert all(c.ok for c in proposal.checks)
    assert [(m["round"], m["role"]) for m in data["proposals"][0]["transcript"] if m["kind"] == "output"] == [
        (1, "investigator"), (1, "attributor"), (1, "proposer"), (1, "critic")]
    for key in ("target_files", "change", "root_cause", "expected_effect", "risk", "scope"):
        assert data["proposals"][0]["spec"][key]
    assert data["proposals"][0]["diffs"][0]["unified"].startswith("--- a/harness.py")
    # The patch really repairs the planted failures: run the replies of pattern H through it.
    files = proposal.apply_to(starter_files()).files
    suite = plant(MemoryStore())[1]
    pool = WorkerPool(files, SandboxLimits(timeout_s=10.0))
    try:
        for inst in [i for i in suite.instances if i.id.endswith("-000")]:
            reply = f"{H_PREFIX} {answer_form(inst)}\nI hope this helps."
            out = pool.solve(inst.task_view(), lambda req, r=reply: {"op": "completion", "text": r,
                                                                      "finish_reason": "stop"})
            assert score(out.answer or "", inst, suite.scorer), (inst.id, out.answer)
    finally:
        pool.close()


def test_report_json_round_trips_and_renders() -> None:
    report = run_diagnosis(MemoryStore())
    data = json.loads(json.dumps(report.to_json()))
    assert DiagnosisReport.from_json(data).to_json() == data
    text = report.render_text()
    assert text.index("CLUSTERS (by priority)") < text.index("PROPOSALS")
    assert "[model-specific]" in text and "no patch: the pattern is one model's quirk" in text
    assert "+++ b/harness.py" in text and "[round 1] critic" in text
    record = report.to_record()
    assert record.run_ids == report.run_ids and record.report["clusters"]
    assert report.proposals[0].to_record(report.id).files["harness.py"].count("ecdysis operator") == 1


def scripted_roles(proposer_output: dict, critic: str = '{"decision": "accept", "objections": []}') -> ScriptedBackend:
    investigation = {"root_cause": "first-line extraction keeps prose", "component": "harness.py:extract_answer",
                     "evidence": ["30 failures"]}
    attribution = {"verdict": "harness-level", "reason": "both models, all categories",
                   "cross_instance": "15 instances", "cross_model": "alpha 15/15, beta 15/15"}
    return ScriptedBackend(model_id="scripted-roles", queue=[
        json.dumps(investigation), json.dumps(attribution), json.dumps(proposer_output), critic])


def test_a_patch_that_hard_codes_an_answer_is_rejected() -> None:
    store = MemoryStore()
    question = "Maria has 11 marbles and wins 23 more"  # arithmetic-000, a failing instance; target 34
    cheat = {"spec": SPEC, "edits": [{"path": "harness.py", "find": "def solve(task, model, harness):\n",
                                      "replace": "def solve(task, model, harness):\n"
                                                 f"    if {question!r} in task['input']:\n"
                                                 "        return '34'\n"}]}
    report = run_diagnosis(store, role_backend=scripted_roles(cheat), max_rounds=1)
    proposal = report.proposals[0]
    assert proposal.status == "rejected"
    leakage = next(c for c in proposal.checks if c.name == "leakage")
    assert not leakage.ok
    assert "hard-codes the answer '34' of instance arithmetic-000 (quotes its question" in leakage.detail
    assert "hard-codes" in proposal.reason
    kinds = [(m.role, m.kind) for m in proposal.transcript]
    assert ("critic", "check") in kinds and kinds[-1] == ("critic", "check")  # acceptance overruled
    assert report.to_json()["clusters"][0]["patch"]["status"] == "rejected"


def test_leakage_rules_allow_sanctioned_exemplars_only() -> None:
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    results = [("planted", r) for rid in run_ids for r in store.get_results(rid)]
    exemplars = sanctioned_exemplars(results, {"planted": suite}, [])  # failing ones never qualify
    assert {e.instance_id for e in exemplars} == {"dates-005", "word-sorting-005", "object-counting-005",
                                                   "boolean-005"}
    index = DataIndex.build({f"planted/{i.id}": i for i in suite.instances}, exemplars)
    check = LeakageCheck()
    result = OPERATORS["few_shot"].apply(RepairInput(starter_files(), empty_cluster(), exemplars))
    diffs = diff_files(starter_files(), result.files)
    assert check.check(diffs, result.spec, index).ok  # quoting sanctioned exemplars is allowed
    undeclared = replace(result.spec, exemplars=())
    # (The one passing boolean instance is not quoted: a single True/False example teaches its label.)
    assert "hard-codes the answer 'falcon meadow quartz thistle' of instance word-sorting-005" in check.check(
        diffs, undeclared, index).detail

    def patch(line: str, path: str = "harness.py") -> list:
        files = starter_files()
        return diff_files(files, dict(files, **{path: files.get(path, "") + line + "\n"}))

    no_exemplars = ModificationSpec(("harness.py",), "c", "r", "e", "k", "s")
    cheating = ModificationSpec(("harness.py",), "c", "r", "e", "k", "s", exemplars=("planted/arithmetic-000",))
    assert "names instance id dates-003" in check.check(patch("# see dates-003"), no_exemplars, index).detail
    assert "hard-codes the target answer '04/07/2021'" in check.check(
        patch("FIX = '04/07/2021'"), no_exemplars, index).detail
    assert "contains the target answer" in check.check(
        patch("Remember: falcon lantern meadow quartz", "system.md"), no_exemplars, index).detail
    assert "not a passing train instance" in check.check(patch("# x"), cheating, index).detail
    # Template text shared by many instances, generic answers and numbers in code are not leaks.
    assert check.check(patch("# How many marbles does the question ask for? True or False"),
                       no_exemplars, index).ok
    assert check.check(patch("LIMIT = 34"), no_exemplars, index).ok


def test_a_class_label_many_instances_share_is_no_leak_but_an_instance_answer_still_is() -> None:
    """Found on BIG-bench's movie_dialog_same_or_different (a task nobody here wrote): its answers
    are "same" and "different", and option scoring's helper code says "several different options"
    in a comment, so the long-target rule refused option scoring there as leaking an answer. A word
    hundreds of instances answer is the task's vocabulary; an answer one instance owns is not."""
    from ecdysis.records import Instance
    questions = ["Did the two lines come from one speaker in the diner scene with the red umbrella?",
                 "Was the harbour pilot who shouts at dawn the same voice as the quiet lighthouse keeper?",
                 "Do the whispered vows and the angry retort at the wedding belong to one character?",
                 "Are the chess coach's praise and the final insult at the tournament spoken by one person?"]
    instances = {f"m/dialog-{n:03d}": Instance(f"dialog-{n:03d}", q, "different" if n % 2 else "same",
                                               category="dialog", choices=("same", "different"))
                 for n, q in enumerate(questions)}
    instances["m/sorting-000"] = Instance("sorting-000", "Sort: quartz falcon", "differentiated quartz",
                                          category="sorting")
    index = DataIndex.build(instances, [])
    assert "different" not in index.labels  # two instances answer it: not yet a label
    instances.update({f"m/dialog-{n:03d}": Instance(f"dialog-{n:03d}", f"Scene {n}: who speaks the toast?",
                                                    "different", category="dialog", choices=("same", "different"))
                      for n in range(4, 7)})
    index = DataIndex.build(instances, [])
    assert "different" in index.labels and "differentiated quartz" not in index.labels
    check = LeakageCheck()
    files = starter_files()
    scored = OPERATORS["option_scoring"].apply(RepairInput(files, empty_cluster())).files
    assert any("different" in line for line in "\n".join(scored.values()).lower().splitlines())
    assert check.check(diff_files(files, scored), ModificationSpec(("harness.py",), "c", "r", "e", "k", "s"),
                       index).ok

    def patch(line: str, path: str = "system.md") -> list:
        return diff_files(files, dict(files, **{path: files.get(path, "") + line + "\n"}))

    spec = ModificationSpec(("system.md",), "c", "r", "e", "k", "s")
    assert check.check(patch("Say whether the two lines are the same or different."), spec, index).ok
    assert "contains the target answer 'differentiated quartz'" in check.check(
        patch("Remember: differentiated quartz"), spec, index).detail
    # A label next to text only one instance has is still a hard-coded answer.
    assert "hard-codes the answer 'different' of instance dialog-001" in check.check(
        patch("If the harbour pilot who shouts at dawn is asked, say different."), spec, index).detail


def test_an_operator_already_present_draws_an_objection_answered_next_round() -> None:
    store = MemoryStore()
    files = OPERATORS["answer_extraction"].apply(RepairInput(starter_files(), empty_cluster())).files
    report = run_diagnosis(store, files=files, max_rounds=3)
    proposal = report.proposals[0]
    assert proposal.status == "endorsed" and proposal.rounds == 2
    assert proposal.spec.operator == "answer_format_instruction"
    critic_round_1 = [m for m in proposal.transcript if m.role == "critic" and m.round == 1 and m.kind == "output"][0]
    assert "operator answer_extraction is already present" in critic_round_1.text
    proposer_round_2 = [m for m in proposal.transcript if m.role == "proposer" and m.round == 2][0]
    assert "already present" in proposer_round_2.data["replies"][0]

    one_round = run_diagnosis(MemoryStore(), files=files, max_rounds=1)
    assert one_round.proposals[0].status == "rejected"
    assert "already present" in one_round.proposals[0].reason


def test_a_patch_that_breaks_the_harness_fails_its_checks() -> None:
    broken = {"spec": SPEC, "edits": [{"path": "harness.py", "find": "def solve(task, model, harness):",
                                       "replace": "def solve(task, model, harness)"}]}
    report = run_diagnosis(MemoryStore(), role_backend=scripted_roles(broken), max_rounds=1)
    loads = next(c for c in report.proposals[0].checks if c.name == "loads")
    assert report.proposals[0].status == "rejected" and not loads.ok and "syntax error" in loads.detail

    raising = {"spec": SPEC, "edits": [{"path": "harness.py", "find": "    p = harness.params\n",
                                        "replace": "    p = harness.params\n    raise RuntimeError('nope')\n"}]}
    report = run_diagnosis(MemoryStore(), role_backend=scripted_roles(raising), max_rounds=1)
    loads = next(c for c in report.proposals[0].checks if c.name == "loads")
    assert not loads.ok and "RuntimeError: nope" in loads.detail and "smoke run" in loads.detail

    # A template named wrongly (as Qwen 1.5B did on BIG-Bench Hard) fails the smoke run, so it never
    # reaches validation as a harness that asks every question with empty messages.
    misnamed = {"spec": SPEC, "edits": [{"path": "harness.py", "find": 'harness.render("user.md"',
                                         "replace": 'harness.render("Ask for a final Answer: line."'}]}
    report = run_diagnosis(MemoryStore(), role_backend=scripted_roles(misnamed), max_rounds=1)
    loads = next(c for c in report.proposals[0].checks if c.name == "loads")
    assert report.proposals[0].status == "rejected" and not loads.ok
    assert "no template 'Ask for a final Answer: line.'" in loads.detail and "smoke run" in loads.detail


def test_a_patch_must_apply_to_the_current_harness() -> None:
    current = starter_files()
    current["harness.py"] = current["harness.py"].replace("    return Counter(answers).most_common(1)[0][0]\n",
                                                          "    return sorted(answers)[0]  # edited meanwhile\n")
    report = run_diagnosis(MemoryStore(), current_files=current, max_rounds=1)
    applies = next(c for c in report.proposals[0].checks if c.name == "applies")
    assert not applies.ok and "does not apply cleanly" in applies.detail
    assert report.proposals[0].status == "rejected"


def test_malformed_llm_role_output_is_survived() -> None:
    garbage = ScriptedBackend(model_id="scripted-garbage", queue=[
        "The root cause is obvious.", "{'single': 'quotes'}",         # investigator: repair, then fallback
        '{"verdict": "harness-level"}',                                # attributor: missing fields
        '```json\n{"verdict": "harness-level", "reason": "r", "cross_instance": "i", "cross_model": "m"}\n```',
        '{"operator": "magic_fix", "spec": ' + json.dumps(SPEC) + "}",  # proposer: unknown operator
        '{"operator": "answer_extraction", "spec": ' + json.dumps(SPEC) + "}",
        "I accept.",                                                   # critic: no JSON, then queue runs dry
    ])
    report = run_diagnosis(MemoryStore(), role_backend=garbage, max_rounds=2)
    assert report.role_backend == "llm:scripted-garbage"
    proposal = report.proposals[0]
    assert proposal.status == "endorsed" and proposal.spec.operator == "answer_extraction"
    kinds = [(m.role, m.kind) for m in proposal.transcript]
    assert ("investigator", "fallback") in kinds and ("attributor", "repair") in kinds
    assert ("proposer", "repair") in kinds and ("critic", "fallback") in kinds
    repair = next(m for m in proposal.transcript if m.role == "proposer" and m.kind == "repair")
    assert "unknown operator 'magic_fix'" in repair.text
    assert proposal.spec.scope == "general"  # the model's own spec text was kept


def test_unknown_runs_are_a_clear_error() -> None:
    with pytest.raises(NotFound, match="no run 'nope'"):
        diagnose(MemoryStore(), ["nope"], suite_loader=lambda name: None)  # type: ignore[arg-type,return-value]


def test_per_instance_mode_refines_one_instance_whatever_its_verdict() -> None:
    report = run_diagnosis(MemoryStore(), only_instances=["arithmetic-005"])
    assert [c.verdict for c in report.clusters] == ["noise"]  # alpha's single slip
    assert report.proposals and report.proposals[0].cluster_id == "c1"
    assert any("per-instance mode" in n for n in report.notes)


def test_previous_iterations_may_be_given_as_stored_json() -> None:
    first = run_diagnosis(MemoryStore())
    again = run_diagnosis(MemoryStore(), previous_clusters=[first.to_json()["clusters"]])
    assert again.clusters[0].components["prior"] == 1.0


@pytest.mark.parametrize("kind", ["memory", "sql"])
def test_store_report_persists_the_diagnosis_and_its_proposals(kind: str, request: pytest.FixtureRequest) -> None:
    from ecdysis.diagnosis import store_report
    store = MemoryStore() if kind == "memory" else request.getfixturevalue("store")
    if not hasattr(store, "save_diagnosis"):
        pytest.skip("storage.SQLStore does not implement save_diagnosis yet")
    run_ids, suite, _ = plant(store)
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=smoke())
    record = store_report(store, report)
    assert store.get_diagnosis(record.id).report["clusters"][0]["verdict"] == "harness-level"
    stored = store.list_proposals(diagnosis_id=record.id)
    # The cluster's repair and its other reading repair (`_reading_siblings`), both for the gate.
    assert [(p.cluster_id, p.status) for p in stored] == [("c1", "pending")] * 2
    operators = {p.spec["operator"]: p for p in stored}
    assert set(operators) == {"answer_extraction", "choice_matching"}
    assert "ecdysis operator: answer_extraction" in operators["answer_extraction"].files["harness.py"]


class _FirstDraftProposer:
    """The heuristic roles, except that the Proposer's first draft is `first(case)`'s output."""

    name = "first-draft"

    def __init__(self) -> None:
        from ecdysis.roles.heuristic import HeuristicRoleBackend
        self.inner = HeuristicRoleBackend()
        self.proposed = 0

    def first(self, case) -> tuple[dict, str]:
        raise NotImplementedError

    def run(self, role, case, round):
        if role == "proposer" and self.proposed == 0:
            self.proposed += 1
            from ecdysis.roles.base import RoleMessage, RoleTurn
            output, text = self.first(case)
            return RoleTurn(output, [RoleMessage(round, "proposer", "output", self.name, text, output)])
        return self.inner.run(role, case, round)


class _BadFirstProposer(_FirstDraftProposer):
    """The first draft is a planted bad change: a harness that answers "0" to everything. It loads,
    applies and quotes no data, so every hard check passes and the Critic accepts it in pass 1."""

    name = "bad-first"

    def first(self, case) -> tuple[dict, str]:
        code = case.files["harness.py"] + "\n\n_solve = solve\n\ndef solve(task, model, harness):\n    " \
                                          "_solve(task, model, harness)\n    return '0'\n"
        return {"operator": "", "spec": SPEC, "files": {"harness.py": code}, "replies": []}, "always 0"


def test_a_review_pass_revises_an_endorsed_spec_that_breaks_passing_instances() -> None:
    """Pass 2 runs the endorsed draft on passing train instances of other categories, paired
    against the current harness on the same smoke model: the planted bad change breaks them, the
    Critic objects though every hard check passed, and the revision (the extraction repair) is the
    consolidated specification, with what was agreed recorded."""
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    rules = [Rule(text=answer_form(i), match=i.input) for i in suite.instances]
    smoke_model = ScriptedBackend(rules, model_id="bare", default=f"{H_PREFIX} 34")
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=smoke_model,
                      role_backend=_BadFirstProposer(), passes=2)
    proposal = report.proposals[0]
    assert proposal.status == "endorsed" and proposal.spec.operator == "answer_extraction"
    assert proposal.spec.passes == 2 and not proposal.spec.disputed
    assert any(a.startswith("revised to answer: regression") for a in proposal.spec.agreed), proposal.spec.agreed
    said = [m.text for m in proposal.transcript if m.role == "critic" and m.kind == "check"]
    assert any("Review pass 2" in t and "regression" in t for t in said), said
    # With one pass, the bad change would have been the proposal.
    fresh = MemoryStore()
    one = diagnose(fresh, plant(fresh)[0], suite_loader=lambda name: suite, smoke_model=smoke_model,
                   role_backend=_BadFirstProposer(), passes=1)
    assert one.proposals[0].spec.operator in ("", None) and one.proposals[0].status == "endorsed"


class _VotingFirstProposer(_FirstDraftProposer):
    """Proposes 5-sample voting first, then whatever the heuristic Proposer would."""

    name = "voting-first"

    def first(self, case) -> tuple[dict, str]:
        return {"operator": "self_consistency", "spec": {}, "replies": []}, "vote"


def test_a_draft_that_multiplies_calls_must_first_recover_one_of_its_clusters_failures() -> None:
    """5-sample voting on the planted cluster: a smoke model that always answers in the form the
    starter cannot read gives voting nothing to recover, so the headroom check fails before any
    screening is paid for and the next round proposes the extraction repair. A smoke model whose
    samples are right lets the same draft through, with the instances it recovered named."""
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    report = diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=smoke(),
                      role_backend=_VotingFirstProposer(), passes=1)
    proposal = report.proposals[0]
    assert proposal.status == "endorsed" and proposal.spec.operator == "answer_extraction"
    said = [m.text for m in proposal.transcript if m.role == "critic" and m.kind == "check"]
    assert any("headroom: FAILED" in t and "recovers none of 3" in t for t in said), said

    fresh = MemoryStore()
    rules = [Rule(text=answer_form(i), match=i.input) for i in suite.instances]
    right = ScriptedBackend(rules, model_id="bare", default=f"{H_PREFIX} 34")
    report = diagnose(fresh, plant(fresh)[0], suite_loader=lambda name: suite, smoke_model=right,
                      role_backend=_VotingFirstProposer(), passes=1)
    voting = report.proposals[0]
    assert voting.spec.operator == "self_consistency" and voting.status == "endorsed"
    headroom = next(c for c in voting.checks if c.name == "headroom")
    assert headroom.ok and headroom.detail.startswith("recovers 3 of 3"), headroom


def test_a_smoke_run_scores_options_the_way_a_run_does() -> None:
    """Option scoring asks the model for scores, not text. The smoke run passes those requests on
    as the runner does: one scoring call answers the task, with no fallback to generation."""
    from ecdysis.models.gateway import ModelGateway
    from ecdysis.refine import SmokeRunner
    files = OPERATORS["option_scoring"].patched(starter_files(), calibrate=False)
    backend = ScriptedBackend([Rule(text="Answer: False", match="not True")], model_id="scorer", default="True")
    inst = next(i for i in plant(MemoryStore())[1].instances if i.split == "train")
    task = replace(inst, input="not True is", target="False", choices=None, category="boolean")
    result = SmokeRunner(ModelGateway(backend, MemoryStore())).run(files, task)
    assert result.ok and "with 'False' in 1 model call(s)" in result.detail, result.detail
    assert [bool(req.options) for req in backend.history] == [True]


def test_a_patch_that_repeats_a_present_repair_is_not_smoke_run() -> None:
    """Applying option scoring to a harness that has it would wrap solve around itself: the novelty
    check fails, and the smoke run (which would call the model until the recursion limit) is not made."""
    from ecdysis.models.gateway import ModelGateway
    from ecdysis.refine import CriticChecks, SmokeRunner
    from ecdysis.roles.base import Draft
    store = MemoryStore()
    _, suite, _ = plant(store)
    case_cluster = run_diagnosis(MemoryStore()).clusters[0]
    once = OPERATORS["option_scoring"].patched(starter_files())
    twice = OPERATORS["option_scoring"].patched(once)
    backend = ScriptedBackend(default="True", model_id="counted")
    instances = {f"{suite.name}/{i.id}": i for i in suite.instances}
    checks = CriticChecks(DataIndex.build(instances, []), SmokeRunner(ModelGateway(backend, store)), once)
    from ecdysis.aggregate import BatchContext
    from ecdysis.roles.base import CaseFile
    case = CaseFile(cluster=case_cluster, files=once, harness_version="h", batch=BatchContext({}, {}))
    draft = Draft(spec=ModificationSpec.from_json({**SPEC, "operator": "option_scoring"}), files=twice)
    results, _ = checks.run(case, draft)
    assert [(r.name, r.ok) for r in results][:2] == [("novel", False), ("applies", True)]
    assert "loads" not in [r.name for r in results] and backend.history == []


def test_a_draft_of_an_operator_ruled_out_on_this_harness_fails_its_novelty_check() -> None:
    """An LLM Proposer is told what screening ruled out and proposed it again anyway (answer
    extraction, twice in one iteration on BIG-bench, a 24-call screen each time). The novelty check
    now fails such a draft before it costs anything, while a change screened out on an earlier
    batch may still be proposed and screened on the new one, and one rejected by a person never."""
    from ecdysis.aggregate import BatchContext
    from ecdysis.models.gateway import ModelGateway
    from ecdysis.refine import CriticChecks, SmokeRunner
    from ecdysis.roles.base import CaseFile, Draft
    store = MemoryStore()
    _, suite, _ = plant(store)
    cluster = run_diagnosis(MemoryStore()).clusters[0]
    files = starter_files()
    instances = {f"{suite.name}/{i.id}": i for i in suite.instances}
    checks = CriticChecks(DataIndex.build(instances, []), SmokeRunner(ModelGateway(ScriptedBackend(default="True"), store)),
                          files)
    draft = Draft(spec=ModificationSpec.from_json({**SPEC, "operator": "option_scoring"}),
                  files=OPERATORS["option_scoring"].patched(files))

    def novel(*history: dict) -> tuple[bool, str]:
        case = CaseFile(cluster=cluster, files=files, harness_version="h", batch=BatchContext({}, {}),
                        history=list(history))
        result = next(r for r in checks.run(case, draft)[0] if r.name == "novel")
        return result.ok, result.detail

    screened = {"operator": "option_scoring", "outcome": "screened_out", "harness_version": "h", "iteration": 2}
    assert novel() == (True, "changes harness.py, harness.toml")
    assert novel(screened) == (False, "operator option_scoring was screened out in iteration 2 on this harness; "
                                      "propose a different repair")
    assert novel(dict(screened, other_batch=True))[0]  # another batch: screened again, on this one
    assert novel(dict(screened, harness_version="other"))[0]  # a changed harness: it may complete a kept change
    ok, why = novel(dict(screened, outcome="rejected", other_batch=True, harness_version="other"))
    assert not ok and "rejected in iteration 2" in why
    # The Critic's "no" (a re-draft of a repair the budget set aside fails this very check) holds
    # on this batch only; a person's rejection, above, holds on every batch and harness.
    critic = dict(screened, outcome="not_endorsed")
    assert novel(critic) == (False, "operator option_scoring was not endorsed in iteration 2 on this harness; "
                                    "propose a different repair")
    assert novel(dict(critic, other_batch=True))[0]


class _NaysayingCritic(_FirstDraftProposer):
    """The heuristic roles, except that the Critic turns every draft down with an opinion that
    names no check and no measurement, as the small LLM Critic did on BIG-bench."""

    name = "naysayer"
    OPINION = "introduces new functionality that is not currently supported by the existing codebase"

    def __init__(self, first_draft: bool = False) -> None:
        super().__init__()
        self.proposed = 0 if first_draft else 1

    def first(self, case) -> tuple[dict, str]:
        return _BadFirstProposer.first(self, case)  # type: ignore[arg-type]

    def run(self, role, case, round):
        if role == "critic":
            from ecdysis.roles.base import RoleMessage, RoleTurn
            output = {"decision": "reject", "objections": [self.OPINION]}
            return RoleTurn(output, [RoleMessage(round, "critic", "output", self.name, self.OPINION, output)])
        return super().run(role, case, round)


def test_an_objection_that_names_no_failed_check_is_recorded_as_disputed_not_a_veto() -> None:
    """A draft that passes every hard check and regresses nothing goes on when the Critic only
    objects: the objection is kept in the spec as disputed, for the human and for screening."""
    report = run_diagnosis(MemoryStore(), role_backend=_NaysayingCritic(), max_rounds=2)
    proposal = report.proposals[0]
    assert proposal.status == "endorsed" and proposal.spec.operator == "answer_extraction"
    assert all(c.ok for c in proposal.checks)
    assert f"the Critic: {_NaysayingCritic.OPINION}" in proposal.spec.disputed
    said = [m.text for m in proposal.transcript if m.role == "critic" and m.kind == "check"]
    assert any("recorded as disputed" in t for t in said), said


def _naysaid(**kw):
    """The naysaying Critic on the planted batch, whose first draft (answer "0" to everything)
    breaks passing train instances of the smoke model: a diagnosis report."""
    store = MemoryStore()
    run_ids, suite, _ = plant(store)
    rules = [Rule(text=answer_form(i), match=i.input) for i in suite.instances]
    smoke_model = ScriptedBackend(rules, model_id="bare", default=f"{H_PREFIX} 34")
    return diagnose(store, run_ids, suite_loader=lambda name: suite, smoke_model=smoke_model,
                    role_backend=_NaysayingCritic(first_draft=True), passes=1, max_rounds=1, **kw)


def test_an_objection_backed_by_a_measured_regression_still_vetoes() -> None:
    """The same Critic on a draft that breaks passing train instances (measured on the smoke
    model, paired against the current harness): the objection stands, with the regression named."""
    proposal = _naysaid().proposals[0]
    assert proposal.status == "rejected" and all(c.ok for c in proposal.checks)
    assert any(o.startswith("regression: the patched harness gets passing train instance") for o in proposal.objections)
    assert _NaysayingCritic.OPINION in proposal.reason


def test_a_proposal_the_critic_refused_does_not_use_up_a_scopes_limit() -> None:
    """A per-instance scope may make one proposal. When the Critic refuses the first cluster's
    draft (a measured regression), the next cluster of the same failures is still refined: the
    refused proposal repairs nothing, and counting it left the instance's other cluster
    unrefined iteration after iteration (the per-instance search with LLM roles, seed 13)."""
    two = sorted({i for c in _naysaid().clusters[:2] for i in c.instances})
    report = _naysaid(max_proposals=1, only_instances=two)
    refused, endorsed = report.proposals
    assert refused.status == "rejected" and refused.cluster_id == report.clusters[0].id
    assert endorsed.status == "endorsed" and endorsed.cluster_id == report.clusters[1].id
    assert len(report.clusters) == 2


def test_the_engine_drafts_its_own_pick_beside_a_role_models_other_repair() -> None:
    """A small role model names a repair by habit (Qwen 1.5B named the answer-format instruction on
    every cluster of closed answers, `bench/proposer_picks.py`). When the roles end on another
    repair than the engine's pick, the engine drafts its pick too, as a second proposal for the
    same cluster, marked as the engine's with the reason; both go to the human gate. The same pick,
    heuristic roles, a per-instance scope or a proposal limit draft none."""
    store = MemoryStore()
    other = {"operator": "answer_format_instruction", "replies": [],
             "spec": {**SPEC, "target_files": ["system.md"]}}
    report = run_diagnosis(store, role_backend=scripted_roles(other), passes=1)
    c1 = report.clusters[0]
    # The engine's pick only changes how replies are read: its other reading repair comes with it.
    theirs, mine, sibling = report.proposals
    assert report.readings_for(c1.id) == [sibling] and sibling.spec.operator == "choice_matching"
    assert theirs.spec.operator == "answer_format_instruction" and theirs.status == "endorsed"
    assert mine.spec.operator == "answer_extraction" and mine.status == "endorsed" and mine.cluster_id == c1.id
    assert report.proposal_for(c1.id) is theirs and report.alternative_for(c1.id) is mine
    assert report.patch(c1.id).alternative_id == mine.id and not theirs.alternative
    assert f"the roles' proposal {theirs.id} names answer_format_instruction and was endorsed" in mine.alternative
    assert "best-ranked repair still open for this cluster is answer_extraction" in mine.alternative
    first = mine.transcript[0]
    assert (first.role, first.kind, first.backend, first.text) == ("proposer", "check", "engine", mine.alternative)
    assert [m.backend for m in mine.transcript if m.kind == "output"] == ["heuristic"] * 4
    assert all(m.backend != "heuristic" for m in theirs.transcript if m.kind == "output")
    # Stored, reloaded and rendered: the reviewer sees both, and which one is the engine's.
    data = json.loads(json.dumps(report.to_json()))
    again = DiagnosisReport.from_json(data)
    assert again.to_json() == data and again.alternative_for(c1.id).alternative == mine.alternative
    assert f"proposal {theirs.id} (endorsed); the engine's alternative: proposal {mine.id}" in report.render_text()
    records = {p.id: p for p in (theirs.to_record(report.id), mine.to_record(report.id))}
    assert records[mine.id].status == records[theirs.id].status == "pending"
    assert records[mine.id].data["alternative"] == mine.alternative and "alternative" not in records[theirs.id].data

    assert len(run_diagnosis(MemoryStore(), role_backend=scripted_roles(other), passes=1,
                             alternatives=False).proposals) == 1
    same = {"operator": "answer_extraction", "replies": [], "spec": SPEC}
    agreed = run_diagnosis(MemoryStore(), role_backend=scripted_roles(same), passes=1)
    assert [p.spec.operator for p in agreed.proposals] == ["answer_extraction", "choice_matching"]
    assert agreed.patch(c1.id).alternative_id is None
    heuristic = run_diagnosis(MemoryStore(), passes=1)  # heuristic roles: the pick is the engine's
    assert [p.alternative.split(" for")[0] for p in heuristic.proposals] == ["", "Another reading repair"]
    limited = run_diagnosis(MemoryStore(), role_backend=scripted_roles(other), passes=1, max_proposals=1)
    assert [p.spec.operator for p in limited.proposals] == ["answer_format_instruction"]


def test_the_engine_alternative_does_not_overrule_the_role_models_veto_but_stands_in_for_a_refusal() -> None:
    """The model's Attributor may judge a cluster model-specific: no patch, and no engine pick
    either. A Critic that refuses the roles' draft for a failed check leaves the engine's pick as
    the cluster's one endorsed repair."""
    veto = ScriptedBackend(model_id="scripted-roles", queue=[
        json.dumps({"root_cause": "r", "component": "harness.py", "evidence": ["e"]}),
        json.dumps({"verdict": "model-specific", "reason": "alpha's habit", "cross_instance": "15",
                    "cross_model": "alpha only"})])
    report = run_diagnosis(MemoryStore(), role_backend=veto, passes=1)
    assert report.proposals == [] and "the Attributor judged it model-specific" in report.patch("c1").text()
    question = "Maria has 11 marbles and wins 23 more"
    cheat = {"spec": SPEC, "edits": [{"path": "harness.py", "find": "def solve(task, model, harness):\n",
                                      "replace": "def solve(task, model, harness):\n"
                                                 f"    if {question!r} in task['input']:\n"
                                                 "        return '34'\n"}]}
    report = run_diagnosis(MemoryStore(), role_backend=scripted_roles(cheat), max_rounds=1, passes=1)
    refused, mine, sibling = report.proposals  # the third: choice matching, the pick's other reading repair
    assert refused.status == "rejected" and mine.status == "endorsed"
    assert mine.spec.operator == "answer_extraction"
    assert f"the roles' proposal {refused.id} names a hand-written change and was rejected" in mine.alternative
    assert report.patch("c1").text() == (f"proposal {refused.id} (rejected); the engine's alternative: proposal "
                                         f"{mine.id}; another reading repair: proposal {sibling.id}")
    gave_up = run_diagnosis(MemoryStore(), role_backend=scripted_roles({"give_up": "no repair fits this cluster"}),
                            passes=1)
    mine, _ = gave_up.proposals
    assert gave_up.proposal_for("c1") is None and gave_up.alternative_for("c1") is mine
    assert mine.alternative.startswith("The engine's alternative: the roles made no proposal (")
    assert "no repair fits this cluster" in mine.alternative and mine.spec.operator == "answer_extraction"

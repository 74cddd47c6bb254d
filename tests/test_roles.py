"""The roles and their parts without the refinement loop: heuristic outputs are schema-valid, every
repair operator really works inside the sandbox on the starter harness (and they compose), diffs
apply all-or-nothing, and the LLM backend survives malformed output (repair, then fallback)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from diagnosis_fixtures import MemoryStore, planted_batch, solve_in_sandbox
from ecdysis.aggregate import aggregate
from ecdysis.diffs import apply_diffs, diff_files, render_html
from ecdysis.errors import ModelError
from ecdysis.harness import starter_files, validate_files
from ecdysis.models.scripted import ScriptedBackend
from ecdysis.records import Completion, CompletionRequest
from ecdysis.roles import HeuristicRoleBackend, make_role_backend
from ecdysis.roles.agent_operators import AGENT_OPERATORS
from ecdysis.roles.base import ROLES, CaseFile, Exemplar, schema_errors
from ecdysis.roles.llm import LLMRoleBackend, extract_json, generation_schema
from ecdysis.roles.drafting import closed_operators, materialize
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.repairs import RepairInput, set_param
from ecdysis.sandbox import SandboxLimits

FAST = SandboxLimits(timeout_s=10.0, memory_mb=512)
EXEMPLARS = [Exemplar("s/a", "a", "arithmetic", "Tom has 2 pens and buys 3 more. How many pens?", None, "5"),
             Exemplar("s/b", "b", "boolean", "not False and True is", None, "True"),
             Exemplar("s/c", "c", "dates", "Today is 01/01/2020. What is the date tomorrow?",
                      ("01/03/2020", "01/02/2020"), "B"),
             Exemplar("s/d", "d", "boolean", "not True or False is", None, "False"),
             Exemplar("s/e", "e", "dates", "Today is 03/01/2020. What was the date yesterday?",
                      ("02/29/2020", "02/28/2020"), "A")]
NUMBER = {"input": "Maria has 5 pens and buys 3. How many pens does she have?", "choices": None,
          "category": "x", "fields": {}}
BOOLEAN = {"input": "not True and False is", "choices": None, "category": "x", "fields": {}}
WORDS = {"input": "Alphabetize: pear, apple, fig. Give the result as space-separated words.", "choices": None,
         "category": "x", "fields": {}}
CHOICE = {"input": "Today is 01/01/2020. What is the date tomorrow in MM/DD/YYYY?",
          "choices": ["01/03/2020", "01/02/2020", "12/31/2019"], "category": "x", "fields": {}}


@pytest.fixture
def case() -> CaseFile:
    store = MemoryStore()
    failures, batch = planted_batch(store)
    version = store.list_harnesses()[0]  # the one harness the planted runs used
    cluster = aggregate(failures, batch)[0]
    return CaseFile(cluster=cluster, files=dict(version.files), harness_version=version.id, batch=batch,
                    exemplars=EXEMPLARS)


def solve(files: dict[str, str], task: dict, replies: list[str]) -> tuple[str | None, list[dict]]:
    return solve_in_sandbox(files, task, replies, FAST)


def patched(*names: str, case: CaseFile) -> dict[str, str]:
    files = starter_files()
    for name in names:
        files = OPERATORS[name].apply(RepairInput(files, case.cluster, EXEMPLARS)).files
    validate_files(files)
    return files


def test_heuristic_roles_give_schema_valid_outputs(case: CaseFile) -> None:
    backend = HeuristicRoleBackend()
    outputs = {}
    for role in ROLES:
        turn = backend.run(role, case, 1)
        assert schema_errors(role, turn.output) == []
        assert [(m.round, m.role, m.kind) for m in turn.messages] == [(1, role, "output")]
        outputs[role] = turn.output
        if role == "investigator":
            case.investigation = turn.output
        if role == "proposer":
            case.draft = materialize(turn.output, case)  # unchecked: the Critic sees no failed check
    assert "first non-empty line" in outputs["investigator"]["root_cause"]
    assert outputs["investigator"]["component"] == "harness.py:extract_answer"
    assert outputs["attributor"]["verdict"] == "harness-level"
    assert "alpha: 15 of 15" in outputs["attributor"]["cross_model"]
    assert outputs["proposer"]["operator"] == "answer_extraction"
    assert outputs["critic"]["decision"] == "accept"


def test_a_repair_the_critic_refused_on_another_batch_comes_after_every_untried_one(case: CaseFile) -> None:
    """The Critic's refusal holds on its own batch only, yet re-proposed first it took every round
    of later iterations (reasoning-mix, round 6: voting refused on three batches running, the
    next-ranked repairs never drafted). It now comes after the untried ones, and back when none is
    left."""
    from ecdysis.roles.heuristic import propose
    from ecdysis.roles.ranking import Ranking
    first, second = Ranking.for_cluster(case.cluster).names[:2]
    refused = {"operator": first, "outcome": "not_endorsed", "harness_version": case.harness_version,
               "iteration": 1, "other_batch": True}
    assert propose(case)["operator"] == first
    later = dataclasses.replace(case, history=[refused])
    out = propose(later)
    assert out["operator"] == second, out
    on_this_batch = dataclasses.replace(case, history=[dict(refused, other_batch=False)])
    assert propose(on_this_batch)["operator"] == second  # ruled out here, as before
    rest = Ranking.for_cluster(case.cluster).names[1:]
    tried_all = dataclasses.replace(later, tried_operators=rest)
    again = propose(tried_all)
    assert again["operator"] == first, again
    assert any("after every untried repair: not endorsed by the Critic on another batch in iteration 1" in r
               for r in again["replies"]), again["replies"]


@pytest.mark.parametrize("task, reply, expected", [
    (NUMBER, "To solve this, we add 5 and 3 to get 8.", "8"),
    (NUMBER, "Sure! Here is my answer: 8\nI hope it helps.", "8"),
    (BOOLEAN, "The expression evaluates to False because True and False is False.", "False"),
    (WORDS, "The sorted words are: apple, fig, pear.", "apple fig pear"),
    (WORDS, "1. apple\n2. fig\n3. pear", "apple fig pear"),
    (CHOICE, "The date tomorrow is 01/02/2020.", "B"),
    (CHOICE, "I think the answer is (B).", "B"),
])
def test_answer_extraction_finds_the_answer_by_the_tasks_form(case: CaseFile, task, reply, expected) -> None:
    starter_answer, _ = solve(starter_files(), task, [reply])
    answer, _ = solve(patched("answer_extraction", case=case), task, [reply])
    assert answer == expected
    assert starter_answer != expected  # the starter harness really had the defect


def test_choice_matching_maps_free_text_onto_an_option(case: CaseFile) -> None:
    answer, _ = solve(patched("choice_matching", case=case), CHOICE, ["01/02/2020 probably"])
    assert answer == "B"
    answer, _ = solve(patched("choice_matching", case=case), NUMBER, ["8 pens"])
    assert answer == "8 pens"  # tasks without options are left alone


def test_retry_on_unparsable_reasks_for_the_bare_answer(case: CaseFile) -> None:
    answer, requests = solve(patched("retry_unparsable", case=case), NUMBER, ["Let me think about it.", "8"])
    assert answer == "8" and len(requests) == 2
    follow_up = requests[1]["messages"]
    assert follow_up[-2] == {"role": "assistant", "content": "Let me think about it."}
    assert "only the final number" in follow_up[-1]["content"]
    _, once = solve(patched("retry_unparsable", case=case), NUMBER, ["8"])
    assert len(once) == 1  # a bare answer is not re-asked


def test_few_shot_puts_exemplars_of_the_same_form_first(case: CaseFile) -> None:
    files = patched("few_shot", case=case)
    assert {json.loads(line)["answer"] for line in files["fewshot.jsonl"].splitlines()} == {"5", "True", "False",
                                                                                             "A", "B"}
    _, requests = solve(files, NUMBER, ["8"])
    roles = [m["role"] for m in requests[0]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert requests[0]["messages"][1]["content"].startswith("Tom has 2 pens")
    _, requests = solve(files, CHOICE, ["B"])
    assert "Options:" in requests[0]["messages"][1]["content"]  # rendered with the user template


def test_few_shot_balances_the_answers_and_never_quotes_the_task_itself(case: CaseFile) -> None:
    """Exemplars take turns among a category's answers (one of each label before a second of any),
    and the question being asked is never among its own examples."""
    yes = [Exemplar(f"s/y{i}", f"y{i}", "yn", f"Is {i} odd?{' ' * i}", None, "Yes") for i in range(4)]
    no = [Exemplar(f"s/n{i}", f"n{i}", "yn", f"Is {i} even, really?{' ' * i}", None, "No") for i in range(4)]
    picked = OPERATORS["few_shot"].pick(yes + no)
    assert sorted(e.answer for e in picked) == ["No", "Yes"]
    files = OPERATORS["few_shot"].apply(RepairInput(starter_files(), case.cluster, EXEMPLARS)).files
    same_task = dict(NUMBER, input=EXEMPLARS[0].input)
    _, requests = solve(files, same_task, ["5"])
    assert all(m["content"] != "5" for m in requests[0]["messages"] if m["role"] == "assistant")
    assert sum(EXEMPLARS[0].input in m["content"] for m in requests[0]["messages"]) == 1


def test_few_shot_never_teaches_one_label(case: CaseFile) -> None:
    """Worked examples of a closed answer set show each answer equally often, in the file and in
    every prompt; passing instances that all give one answer are not quoted at all."""
    def choice(i: int, answer: str) -> Exemplar:
        return Exemplar(f"s/q{i}", f"q{i}", f"task{i % 2}", f"Question {i}?", ("yes", "no", "maybe"), answer)

    op = OPERATORS["few_shot"]
    only_b = [choice(i, "B") for i in range(4)]
    assert op.pick(only_b) == []
    reason = op.unavailable(RepairInput(starter_files(), case.cluster, only_b))
    assert reason is not None and "teach the model that answer" in reason
    picked = op.pick(only_b + [choice(9, "A")])
    assert sorted(e.answer for e in picked) == ["A", "B"]

    # The harness balances at run time too, whatever the file holds: two A's and a B show one of each.
    files = op.apply(RepairInput(starter_files(), case.cluster, only_b + [choice(9, "A")])).files
    files["fewshot.jsonl"] = "".join(json.dumps({"input": f"Q{i}?", "choices": ["x", "y"], "answer": a}) + "\n"
                                     for i, a in enumerate("AAB"))
    _, requests = solve(files, CHOICE, ["B"])
    shown = [m["content"] for m in requests[0]["messages"][1:-1] if m["role"] == "assistant"]
    assert sorted(shown) == ["A", "B"]
    files["fewshot.jsonl"] = "".join(json.dumps({"input": f"Q{i}?", "choices": ["x", "y"], "answer": "A"}) + "\n"
                                     for i in range(3))
    _, requests = solve(files, CHOICE, ["B"])
    assert [m["role"] for m in requests[0]["messages"]] == ["system", "user"]


def test_param_operators_change_the_calls(case: CaseFile) -> None:
    _, voting = solve(patched("self_consistency", case=case), NUMBER, ["8"])
    assert len(voting) == 5 and voting[0]["temperature"] == 0.7
    _, budget = solve(patched("output_budget", case=case), NUMBER, ["8"])
    assert budget[0]["max_tokens"] == 192
    _, told = solve(patched("answer_format_instruction", case=case), CHOICE, ["B"])
    assert "alone on the first line" in told[0]["messages"][0]["content"]
    assert "letter of the correct option (A, B, C)" in told[0]["messages"][1]["content"]


TEXT_OPERATORS = [name for name in OPERATORS if name not in {op.name for op in AGENT_OPERATORS}]


def test_all_operators_compose_and_report_presence(case: CaseFile) -> None:
    """The written-answer catalogue on the text starter (the agent repairs have their own test,
    tests/test_agent_taxonomy.py, on the starter agent)."""
    files = patched(*TEXT_OPERATORS, case=case)
    assert all(OPERATORS[name].present(files) for name in TEXT_OPERATORS)
    # The starter already asks the whole task (instruction, options, answer form); nothing else is in it.
    assert [name for name in TEXT_OPERATORS if OPERATORS[name].present(starter_files())] == ["whole_task_in_prompt"]
    answer, _ = solve(files, NUMBER, ["Here is my answer: 8"])
    assert answer == "8"


def test_set_param_keeps_the_toml_valid() -> None:
    text = starter_files()["harness.toml"]
    out = set_param(set_param(text, "samples", "3", "why"), "new_key", "1", "why")
    assert "samples = 3  # why" in out and "new_key = 1  # why" in out and "[harness]" in out


def test_diffs_apply_all_or_nothing() -> None:
    old = starter_files()
    new = dict(old, **{"system.md": old["system.md"] + "\nBe brief.\n", "extra.md": "hello\n"})
    diffs = diff_files(old, new)
    assert [d.path for d in diffs] == ["extra.md", "system.md"] and diffs[0].change == "added"
    assert diffs[1].unified.startswith("--- a/system.md\n+++ b/system.md\n")
    assert diffs[1].added_lines() == ["", "Be brief."]
    assert apply_diffs(old, diffs).files == new
    moved = dict(old, **{"system.md": "Something else entirely, rewritten by hand.\n"})
    result = apply_diffs(moved, diffs)
    assert not result.ok and result.files is None
    assert result.hunk_flags["system.md"] == [False] and "do not apply" in result.failures[0]
    assert "<ins" in render_html(diffs[1])


@pytest.mark.parametrize("text, expected", [
    ('{"a": 1}', {"a": 1}),
    ('Sure! ```json\n{"a": {"b": "}"}}\n``` done', {"a": {"b": "}"}}),
    ('noise {broken {"a": 2} {"a": 3}', {"a": 2}),
    ("no json at all", None),
    ("[1, 2]", None),
])
def test_extract_json_is_tolerant(text: str, expected) -> None:
    assert extract_json(text) == expected


class FailingBackend:
    model_id = "broken"
    max_concurrency = 1
    deterministic = True

    def complete(self, request: CompletionRequest) -> Completion:
        raise ModelError("connection refused", retryable=True)

    def close(self) -> None:
        pass


def test_role_schemas_reach_the_backend_in_sorted_key_order(case: CaseFile) -> None:
    """The roles were measured with their schemas' keys sorted (the engine sorted every schema until
    harness schemas needed their own order, a call's name before its arguments): a role's request
    keeps that order, at every level, so its grammar is the one it was measured with."""
    from ecdysis.records import keys_sorted
    seen: list[dict] = []

    class Recording(ScriptedBackend):
        def complete(self, request):  # type: ignore[no-untyped-def]
            seen.append(request.schema())
            return super().complete(request)

    good = {"root_cause": "first-line extraction", "component": "harness.py:extract_answer", "evidence": ["x"]}
    LLMRoleBackend(Recording(queue=[json.dumps(good)])).run("investigator", case, 1)
    assert seen and seen[0] == generation_schema("investigator", case)
    assert json.dumps(seen[0]) == json.dumps(keys_sorted(seen[0]))
    assert json.dumps(generation_schema("investigator", case)) != json.dumps(seen[0])  # it was not sorted


def test_llm_role_repairs_then_falls_back(case: CaseFile) -> None:
    good = {"root_cause": "first-line extraction", "component": "harness.py:extract_answer", "evidence": ["x"]}
    model = ScriptedBackend(queue=["I think it is the extractor.", "```json\n" + json.dumps(good) + "\n```"])
    turn = LLMRoleBackend(model, store=MemoryStore()).run("investigator", case, 1)
    assert turn.output == good
    assert [m.kind for m in turn.messages] == ["prompt", "reply", "repair", "reply", "output"]
    assert "no JSON object" in turn.messages[2].text

    model = ScriptedBackend(queue=['{"verdict": "maybe"}', "{still not json"])
    turn = LLMRoleBackend(model).run("attributor", case, 1)
    assert [m.kind for m in turn.messages] == ["prompt", "reply", "repair", "reply", "fallback", "output"]
    assert turn.output["verdict"] == "harness-level"  # the heuristic answered for the role
    assert turn.messages[-1].backend == "heuristic (fallback)"
    assert "verdict" in turn.messages[2].text  # the repair request quoted the schema error

    turn = LLMRoleBackend(FailingBackend()).run("critic", case, 2)
    assert [m.kind for m in turn.messages] == ["prompt", "fallback", "output"]
    assert "connection refused" in turn.messages[1].text and turn.messages[1].round == 2


def test_llm_proposer_edits_must_apply(case: CaseFile) -> None:
    spec = {"target_files": ["system.md"], "change": "c", "root_cause": "r", "expected_effect": "e",
            "risk": "k", "scope": "s"}
    missing = {"spec": spec, "edits": [{"path": "system.md", "find": "no such text", "replace": "x"}]}
    fixed = {"spec": spec, "edits": [{"path": "system.md", "find": "helpful assistant",
                                      "replace": "careful assistant"}]}
    model = ScriptedBackend(queue=[json.dumps(missing), json.dumps(fixed)])
    turn = LLMRoleBackend(model).run("proposer", case, 1)
    assert "occurs 0 times" in turn.messages[2].text
    draft = materialize(turn.output, case)
    assert "careful assistant" in draft.files["system.md"]


def test_an_operator_named_with_edits_that_never_apply_is_kept_without_them(case: CaseFile) -> None:
    """Qwen 1.5B, on real BIG-bench clusters, named a catalogue operator and added edits whose text
    to find was a file's name; asked again, it wrote the same reply, and the heuristic answered
    instead of the model. The repair request now says the edits may be left out, and on the second
    failure the named operator is kept as the catalogue writes it; the transcript says so. An
    operator that is not open to the case still falls back."""
    from ecdysis.roles.ranking import Ranking
    spec = {"target_files": ["harness.toml"], "change": "c", "root_cause": "r", "expected_effect": "e",
            "risk": "k", "scope": "s"}
    name = Ranking.for_cluster(case.cluster).names[0]
    reply = json.dumps({"operator": name, "spec": spec, "replies": [],
                        "edits": [{"path": "harness.toml", "find": "system.md", "replace": "Ask for the answer."}]})
    model = ScriptedBackend(queue=[reply, reply])
    turn = LLMRoleBackend(model).run("proposer", case, 1)
    assert [m.kind for m in turn.messages] == ["prompt", "reply", "repair", "reply", "check", "output"]
    assert f"leave `edits` out to apply {name}" in turn.messages[2].text
    assert "the text to find occurs 0 times" in turn.messages[4].text and turn.messages[4].backend == "llm:scripted"
    assert turn.output["operator"] == name and "edits" not in turn.output
    assert materialize(turn.output, case).files == materialize({"operator": name, "spec": spec}, case).files
    present = dataclasses.replace(case, files=materialize({"operator": name, "spec": spec}, case).files)
    again = LLMRoleBackend(ScriptedBackend(queue=[reply, reply])).run("proposer", present, 1)
    assert [m.kind for m in again.messages][:5] == ["prompt", "reply", "repair", "reply", "fallback"]


def test_the_llm_proposer_is_not_offered_an_operator_the_novelty_check_would_refuse(case: CaseFile) -> None:
    """A repair rolled back on this harness, or already in it, used to stay in the Proposer's
    enum: a small model drafted it again on instance after instance, and each draft cost a Critic's
    turn and a revision round before the novelty check refused it. Now the grammar leaves it out,
    the prompt says why, and a backend that ignores the grammar gets one repair request."""
    from ecdysis.roles.ranking import Ranking
    first, second = Ranking.for_cluster(case.cluster).names[:2]
    history = [{"operator": first, "outcome": "rolled_back", "harness_version": case.harness_version,
                "iteration": 1, "why": "net gain +0"}]
    later = dataclasses.replace(case, history=history)
    assert first not in closed_operators(case)
    assert closed_operators(later)[first] == "rolled back in iteration 1 on this harness"
    spec = {"target_files": ["harness.py"], "change": "c", "root_cause": "r", "expected_effect": "e",
            "risk": "k", "scope": "s"}
    model = ScriptedBackend(queue=[json.dumps({"operator": first, "spec": spec, "replies": []}),
                                   json.dumps({"operator": second, "spec": spec, "replies": []})])
    turn = LLMRoleBackend(model).run("proposer", later, 1)
    assert turn.output["operator"] == second
    asked = model.history[0]
    enum = asked.schema()["properties"]["operator"]["enum"]
    assert first not in enum and second in enum and "" in enum
    prompt = asked.messages[-1][1]
    closed = prompt.split("Not available here (do not name them): ", 1)[1].split("\n", 1)[0]
    assert f"{first} (rolled back in iteration 1 on this harness)" in closed
    assert f"operator {first} is not available" in turn.messages[2].text  # the repair request
    present = dataclasses.replace(case, files=materialize({"operator": second, "spec": spec}, case).files)
    assert closed_operators(present)[second] == "already present in the harness"
    assert {first, second, ""} <= set(generation_schema("proposer", case)["properties"]["operator"]["enum"])


def test_the_llm_proposer_sees_the_clusters_ranking_first_with_its_reasons() -> None:
    """A small Proposer names whichever operator it reads first: given the catalogue in declaration
    order, taking a closed operator out of the list moved its pick off the repair the engine ranked
    first. The prompt now lists the open operators the cluster's ranking names in that order, each
    with the ranking's reason (a count from the cluster's own failures, or the probe's result), the
    other open ones after them, and the grammar's enum in the same order."""
    from ecdysis.roles.llm import PROMPTS
    from ecdysis.roles.ranking import Ranking
    store = MemoryStore()
    failures, batch = planted_batch(store)
    version = store.list_harnesses()[0]
    clusters = {c.label: c for c in aggregate(failures, batch)}
    rambling = next(c for label, c in clusters.items() if "step by step" in label)
    case = CaseFile(cluster=rambling, files=dict(version.files), harness_version=version.id, batch=batch,
                    exemplars=EXEMPLARS)
    ranked = Ranking.for_cluster(rambling)
    # No reply holds a number, so the form is asked for before extraction: not declaration order.
    assert ranked.names[:2] == ["answer_format_instruction", "answer_extraction"]
    assert list(OPERATORS).index("answer_extraction") < list(OPERATORS).index("answer_format_instruction")

    def listed(case: CaseFile) -> tuple[list[str], str]:
        prompt = PROMPTS["proposer"].user(case)
        block = prompt.split("Catalogue operators suggested for this cluster", 1)[1].split("\nOther", 1)[0]
        lines = [line for line in block.splitlines() if re.match(r"\d+\. ", line)]
        return [line.split(". ", 1)[1].split(" ", 1)[0] for line in lines], block

    names, block = listed(case)
    assert names == [n for n in ranked.names if n in OPERATORS and n not in closed_operators(case)]
    assert f"only 0 of {len(rambling.failures)} replies hold an answer of the expected form" in block
    enum = generation_schema("proposer", case)["properties"]["operator"]["enum"]
    assert enum[:len(names)] == names and set(enum) == {*OPERATORS, ""} - set(closed_operators(case))

    # The recoverability probe's pick comes first, with what the probe saw.
    members = [f.instance_id for f in rambling.failures][:3]
    probed = dataclasses.replace(rambling, probe={"model": "m-small", "members": members, "operator": "few_shot",
                                                  "right": {"few_shot": members[:2]}})
    names, block = listed(dataclasses.replace(case, cluster=probed))
    assert names[0] == "few_shot" and names[1:3] == ["answer_format_instruction", "answer_extraction"]
    assert "brought 2 of 3 of these failures back right with it on m-small" in block


def test_make_role_backend_resolves_names() -> None:
    assert make_role_backend("heuristic").name == "heuristic"
    scripted = ScriptedBackend(model_id="scripted-roles", default="{}")
    backend = make_role_backend("scripted-roles", backend_factory=lambda name: scripted)
    assert backend.name == "llm:scripted-roles"


def test_a_long_harness_reaches_the_llm_roles_as_an_outline_with_the_code_in_force(case: CaseFile) -> None:
    """After several code operators, harness.py is longer than a role prompt's share; the roles see
    every definition's line and the whole of the definitions in force (never a file cut mid-way),
    quoted exactly, so a find/replace edit on them applies; the Proposer's reply budget grows with
    the file so a whole-file rewrite fits."""
    from ecdysis.roles.llm import REPLY_CEILING, _files_text
    from ecdysis.roles.drafting import materialize
    files = patched("answer_extraction", "retry_unparsable", "choice_matching", case=case)
    code = files["harness.py"]
    assert len(code) > 6000
    shown = _files_text({"harness.py": code}, 6000).split("=== harness.py ===\n", 1)[1]
    assert "(outline" in shown and "…(clipped)" not in shown
    last_solve = code[code.rindex("def solve("):].split("\n\n\n")[0]
    assert last_solve in shown  # the solve in force, whole
    outline = shown.split("(in force", 1)[0]
    assert code.count("\ndef extract_answer(") == outline.count(": def extract_answer(")  # every definition listed
    edit = {"edits": [{"path": "harness.py", "find": last_solve, "replace": last_solve + "\n# reviewed"}],
            "spec": {"target_files": ["harness.py"], "change": "c", "root_cause": "r", "expected_effect": "e",
                     "risk": "k", "scope": "s"}}
    assert "# reviewed" in materialize(edit, dataclasses.replace(case, files=files)).files["harness.py"]
    roles = LLMRoleBackend(ScriptedBackend([], model_id="roles-budget"), max_tokens=1024)
    assert roles._budget("critic", dataclasses.replace(case, files=files)) == 1024
    assert 1024 < roles._budget("proposer", dataclasses.replace(case, files=files)) <= REPLY_CEILING

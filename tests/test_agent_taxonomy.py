"""Agent failures: how an agent's function calls go wrong is typed from the checker's verdict
(`failures.agent_failure`), clustered across instances by mechanism rather than by function name,
and repaired by the agent catalogue (`roles.agent_operators`), each repair really run in the
sandbox on the starter agent harness. The instances are written here in BFCL's shape, so nothing
needs the fetched data except the real-model test at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnosis_fixtures import solve_in_sandbox
from ecdysis.aggregate import BatchContext, aggregate
from ecdysis.failures import AGENT_TYPES, FAILURE_TITLES, extract_failures, to_failure
from ecdysis.harness import STARTER_AGENT_DIR, read_dir, validate_files
from ecdysis.records import Instance, InstanceResult, ModelCall
from ecdysis.roles import HeuristicRoleBackend
from ecdysis.roles.agent_operators import AGENT_OPERATORS
from ecdysis.roles.base import ROLES, CaseFile, schema_errors
from ecdysis.roles.drafting import materialize
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.ranking import Ranking
from ecdysis.roles.repairs import RepairInput
from ecdysis.sandbox import SandboxLimits

FAST = SandboxLimits(timeout_s=10.0, memory_mb=512)


def doc(name: str, **properties: str) -> dict:
    return {"name": name, "description": f"{name} does its job.",
            "parameters": {"type": "dict", "properties": {p: {"type": t} for p, t in properties.items()},
                           "required": list(properties)}}


AREA = doc("triangle_area", base="integer", height="integer")
ROUTE = doc("plan_route", start="string", stops="array")
FLAG = doc("set_flag", enabled="boolean", level="float")


def instance(iid: str, functions: list[dict], target: list[dict], category: str = "simple") -> Instance:
    return Instance(id=iid, input=f"Question {iid}: please do it.", target=json.dumps(target), category=category,
                    split="train", fields={"functions": functions})


def result(inst: Instance, answer: str, *, model: str = "m", finish: str = "stop", raw: str | None = None) -> InstanceResult:
    call = ModelCall(seq=0, model=model, request={"messages": [{"role": "user", "content": inst.input}],
                                                  "max_tokens": 64},
                     text=answer if raw is None else raw, prompt_tokens=10, completion_tokens=5, latency_s=0.1,
                     finish_reason=finish, cache_hit=False)
    return InstanceResult(run_id=f"run-{model}", instance_id=inst.id, category=inst.category, model=model,
                          answer=answer, target=inst.target, correct=False, score=0.0, calls=[call])


ONE_AREA = instance("a1", [AREA], [{"triangle_area": {"base": [10], "height": [5]}}])
TWO_AREAS = instance("a2", [AREA], [{"triangle_area": {"base": [10], "height": [5]}},
                                    {"triangle_area": {"base": [4], "height": [2]}}], "parallel")
IRRELEVANT = instance("i1", [AREA], [], "irrelevance")


@pytest.mark.parametrize("inst, answer, kind, mechanism", [
    (ONE_AREA, "The area is half the base times the height.", "unparsable_call", "prose without an answer"),
    (ONE_AREA, "triangle_area(base=10, height=", "unparsable_call", "broken call syntax"),
    (ONE_AREA, '[{"name": "triangle_area", "arguments": {"base": 10, "hei', "unparsable_call", "cut at the token limit"),
    (ONE_AREA, '[{"name": "area_of_triangle", "arguments": {"base": 10, "height": 5}}]', "wrong_function",
     "an invented function"),
    (ONE_AREA, "[]", "call_count", "no call"),
    (TWO_AREAS, '[{"name": "triangle_area", "arguments": {"base": 10, "height": 5}}]', "call_count", "missing call"),
    (ONE_AREA, '[{"name": "triangle_area", "arguments": {"base": "10", "height": 5}}]', "wrong_argument", "wrong type"),
    (ONE_AREA, '[{"name": "triangle_area", "arguments": {"base": 12, "height": 5}}]', "wrong_argument", "wrong value"),
    (ONE_AREA, '[{"name": "triangle_area", "arguments": {"base": 10}}]', "wrong_argument", "missing required"),
    (IRRELEVANT, '[{"name": "triangle_area", "arguments": {"base": 1, "height": 1}}]', "irrelevant_call",
     "a listed function"),
    (IRRELEVANT, '[{"name": "weather", "arguments": {}}]', "irrelevant_call", "an invented function"),
])
def test_each_way_a_call_goes_wrong_has_its_type_and_mechanism(inst: Instance, answer: str, kind: str,
                                                               mechanism: str) -> None:
    finish = "length" if mechanism == "cut at the token limit" else "stop"
    f = to_failure(result(inst, answer, finish=finish), inst, suite="s", harness_version="h")
    assert (f.type, f.detail["mechanism"], f.shape) == (kind, mechanism, "calls")
    assert kind in AGENT_TYPES and FAILURE_TITLES[kind]
    # The signature names the mechanism, never the function: the same slip on other tools clusters.
    assert "triangle" not in f.signature and mechanism in f.signature


def test_a_calls_reply_inside_prose_is_told_apart_from_prose() -> None:
    reply = 'Sure! I will call it like this:\n```json\n[{"name": "triangle_area", "arguments": {"base": 10}}]\n```'
    f = to_failure(result(ONE_AREA, reply), ONE_AREA, suite="s", harness_version="h")
    assert (f.type, f.detail["mechanism"], f.detail["shape_in_reply"]) == ("unparsable_call",
                                                                           "calls inside other text", True)


def test_a_wrong_type_signature_says_which_type_for_which() -> None:
    f = to_failure(result(ONE_AREA, '[{"name": "triangle_area", "arguments": {"base": "10", "height": 5}}]'),
                   ONE_AREA, suite="s", harness_version="h")
    assert f.signature == "wrong type str given for integer"
    assert "base" in f.detail["check"] and f.detail["called"] == ["triangle_area"]


def _string_typed_batch() -> tuple[list, BatchContext, dict[str, Instance]]:
    """Three tools, six instances, in three categories; models `weak` and `weaker` both pass numbers
    as text on all six: the same slip across instances, categories and models."""
    insts = {}
    for n, (fn, arg) in enumerate([(AREA, ("base", "integer")), (FLAG, ("level", "float")),
                                   (doc("count_words", limit="integer"), ("limit", "integer"))] * 2):
        params = {p: [1] for p in fn["parameters"]["properties"]}
        inst = instance(f"x{n}", [fn], [{fn["name"]: params}], category=f"cat{n % 3}")
        insts[inst.id] = inst
    results = []
    for inst in insts.values():
        fn = inst.fields["functions"][0]
        args = {p: "1" for p in fn["parameters"]["properties"]}
        results += [result(inst, json.dumps([{"name": fn["name"], "arguments": args}]), model=m)
                    for m in ("weak", "weaker")]
    failures = extract_failures(results, insts, suite="s", harness_version="h")
    batch = BatchContext.build([("s", r) for r in results], failures)
    return failures, batch, insts


def test_the_same_slip_on_different_tools_is_one_cluster_and_the_heuristic_roles_repair_it() -> None:
    failures, batch, _ = _string_typed_batch()
    assert {f.type for f in failures} == {"wrong_argument"} and len(failures) == 12
    clusters = aggregate(failures, batch)
    assert len(clusters) == 1 and clusters[0].size == 12 and clusters[0].verdict == "harness-level"
    assert Ranking.for_cluster(clusters[0]).names[0] == "argument_coercion"
    files = read_dir(STARTER_AGENT_DIR)
    case = CaseFile(cluster=clusters[0], files=files, harness_version="h", batch=batch, exemplars=[])
    backend = HeuristicRoleBackend()
    outputs = {}
    for role in ROLES:
        turn = backend.run(role, case, 1)
        assert schema_errors(role, turn.output) == []
        outputs[role] = turn.output
        if role == "investigator":
            case.investigation = turn.output
        if role == "proposer":
            case.draft = materialize(turn.output, case)
    assert "wrong type in 12 of 12" in outputs["investigator"]["root_cause"]
    assert outputs["proposer"]["operator"] == "argument_coercion"
    validate_files(case.draft.files)


def solve(files: dict[str, str], task: dict, replies: list[str]) -> tuple[str | None, list[dict]]:
    return solve_in_sandbox(files, task, replies, FAST)


def agent_files(*names: str) -> dict[str, str]:
    failures, batch, _ = _string_typed_batch()
    cluster = aggregate(failures, batch)[0]
    files = read_dir(STARTER_AGENT_DIR)
    for name in names:
        inp = RepairInput(files, cluster)
        assert OPERATORS[name].unavailable(inp) is None
        files = OPERATORS[name].apply(inp).files
    validate_files(files)
    return files


TASK = {"input": "Set the flag on at level 2, and plan a route from Oslo to Bergen.", "choices": None,
        "category": "x", "fields": {"functions": [FLAG, ROUTE]}}


def test_the_agent_repairs_compose_and_report_presence() -> None:
    starter = read_dir(STARTER_AGENT_DIR)
    assert not any(op.present(starter) for op in AGENT_OPERATORS)
    every = agent_files(*(op.name for op in AGENT_OPERATORS))
    assert all(op.present(every) for op in AGENT_OPERATORS)
    reply = json.dumps([{"name": "set_flag", "arguments": {"enabled": "true", "level": "2"}},
                        {"name": "plan_route", "arguments": {"start": "Oslo", "stops": "Bergen"}},
                        {"name": "made_up", "arguments": {}}])
    prose = "Let me think about which function to use."
    fixed = [{"name": "set_flag", "arguments": {"enabled": True, "level": 2.0}},
             {"name": "plan_route", "arguments": {"start": "Oslo", "stops": ["Bergen"]}}]
    # With call_schema, applied last, the prose reply is judged first: its score request reaches the
    # model through the other repairs' wrappers, and a model that gives no scores leaves the
    # decision to the schema. The reply is asked for again under it (the same messages), and the
    # retry finds that reply readable.
    answer, requests = solve(every, TASK, [prose, reply])
    assert json.loads(answer) == fixed and len(requests) == 3
    assert requests[1]["options"][0] == "[]" and requests[1]["messages"] == requests[0]["messages"]
    assert "json_schema" in requests[2] and requests[2]["messages"] == requests[0]["messages"]
    files = agent_files(*(op.name for op in AGENT_OPERATORS if op.name != "call_schema"))
    answer, requests = solve(files, TASK, [prose, reply])
    assert json.loads(answer) == fixed
    assert len(requests) == 2  # the prose reply was re-asked once
    last = requests[1]["messages"]
    assert last[-2] == {"role": "assistant", "content": "Let me think about which function to use."}
    assert "cannot be read as function calls" in last[-1]["content"]
    assert "example_function" in requests[0]["messages"][1]["content"]  # the format, in the user message
    assert "do not invent a function" in requests[0]["messages"][0]["content"]


def test_coercion_keeps_what_it_cannot_convert_losslessly() -> None:
    files = agent_files("argument_coercion")
    reply = json.dumps([{"name": "set_flag", "arguments": {"enabled": "maybe", "level": "high"}},
                        {"name": "plan_route", "arguments": {"start": 7, "stops": '["A", "B"]'}}])
    answer, _ = solve(files, TASK, [reply])
    assert json.loads(answer) == [{"name": "set_flag", "arguments": {"enabled": "maybe", "level": "high"}},
                                  {"name": "plan_route", "arguments": {"start": "7", "stops": ["A", "B"]}}]


def test_no_tool_path_turns_an_invented_call_into_no_call_and_leaves_prose_alone() -> None:
    files = agent_files("no_tool_path")
    assert solve(files, TASK, ['[{"name": "weather_now", "arguments": {"city": "Oslo"}}]'])[0] == "[]"
    assert solve(files, TASK, ["I cannot help with that."])[0] == "I cannot help with that."


def test_written_answer_repairs_refuse_a_cluster_of_calls() -> None:
    failures, batch, _ = _string_typed_batch()
    inp = RepairInput(read_dir(STARTER_AGENT_DIR), aggregate(failures, batch)[0])
    assert "function calls" in OPERATORS["answer_format_instruction"].unavailable(inp)
    assert OPERATORS["answer_extraction"].unavailable(inp)  # the starter agent has no extract_answer


@pytest.mark.slow
def test_a_real_model_on_bfcl_fails_in_agent_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 on six BFCL entries through the engine: every failure gets an agent type, with the
    checker's reason, and none falls back to the written-answer types."""
    from ecdysis.service import RunRequest, Service
    from ecdysis.suites.bfcl import is_fetched
    from storage import open_store
    if not is_fetched():
        pytest.skip("the BFCL data is not fetched (scripts/fetch_bfcl.py)")
    monkeypatch.setenv("ECDYSIS_HOME", str(tmp_path))
    svc = Service(open_store())
    seen = []
    for suite in ("bfcl-simple", "bfcl-parallel", "bfcl-irrelevance"):
        run = svc.run(RunRequest(suite=suite, model="smollm2", split="train", limit=2))
        results = svc.results(run.run_id)
        instances = {i.id: i for i in svc.suite(suite).instances}
        failures = extract_failures(results, instances, suite=suite)
        assert len(failures) == sum(1 for r in results if not r.correct)
        for f in failures:
            assert f.type in AGENT_TYPES + ("exception", "timeout", "crash", "model_error"), f
            assert f.shape == "calls" and f.detail.get("mechanism")
        seen += failures
    assert seen, "SmolLM2 answered all six BFCL entries right; the test learns nothing"


def test_abstain_check_takes_a_second_look_only_when_nothing_is_called() -> None:
    files = agent_files("abstain_check")
    call = '[{"name": "set_flag", "arguments": {"enabled": true, "level": 2.0}}]'
    answer, requests = solve(files, TASK, ["[]", call])
    assert json.loads(answer) == json.loads(call) and len(requests) == 2
    assert requests[1]["messages"][-1]["content"].startswith("You called no function.")
    assert solve(files, TASK, ["[]", "[]"])[0] == "[]"          # still nothing: no call it is
    assert len(solve(files, TASK, [call])[1]) == 1              # a call is never second-guessed


def test_a_cluster_of_calls_never_made_ranks_the_second_look_first() -> None:
    insts = {i.id: i for i in (ONE_AREA, TWO_AREAS, instance("a3", [AREA], json.loads(ONE_AREA.target), "other"))}
    results = [result(i, "[]", model=m) for i in insts.values() for m in ("weak", "weaker")]
    failures = extract_failures(results, insts, suite="s", harness_version="h")
    assert {(f.type, f.detail["mechanism"]) for f in failures} == {("call_count", "no call")}
    cluster = aggregate(failures, BatchContext.build([("s", r) for r in results], failures))[0]
    assert Ranking.for_cluster(cluster).names == ["abstain_check", "call_format"]


def test_unreadable_replies_worded_every_which_way_are_judged_as_one_union() -> None:
    """Twelve replies that are prose, not calls, each worded its own way, over six instances in
    three categories and two models: by wording each is a part too small to act on; their union,
    keyed by mechanism, is one harness-level cluster."""
    prose = ["Okay, so you want the area computed quickly.", "Certainly, I would be glad to help here.",
             "Hmm, interesting geometry question indeed.", "Let us reason about shapes first.",
             "As a helpful assistant, I note triangles have three sides.", "Please provide more details.",
             "Alright! Happy to assist today.", "This requires multiplication and division.",
             "Great question, thanks for asking it.", "Geometry is fun, isn't it?",
             "Well, there are many formulas.", "I believe the request is clear enough."]
    insts, results = {}, []
    for n in range(6):
        inst = instance(f"u{n}", [AREA], [{"triangle_area": {"base": [n + 1], "height": [5]}}], category=f"cat{n % 3}")
        insts[inst.id] = inst
        results += [result(inst, prose[2 * n], model="weak"), result(inst, prose[2 * n + 1], model="weaker")]
    failures = extract_failures(results, insts, suite="s", harness_version="h")
    assert {(f.type, f.detail["mechanism"]) for f in failures} == {("unparsable_call", "prose without an answer")}
    clusters = aggregate(failures, BatchContext.build([("s", r) for r in results], failures))
    assert [(c.size, c.verdict) for c in clusters] == [(12, "harness-level")]
    assert clusters[0].label.startswith("unparsable call: prose without an answer")


def test_turns_cut_off_at_the_step_limit_get_more_steps_from_the_heuristic_roles() -> None:
    """A multi-turn cluster (two models, six instances, three categories, every turn cut off while
    calling): the roles read it as the step limit and propose doubling max_steps."""
    from ecdysis.failures import Failure
    failures = [Failure(run_id=f"run-{m}", suite="s", instance_id=f"t{n}", category=f"cat{n % 3}", split="train",
                        model=m, harness_version="h", type="step_limit", excerpt="turn 1 cut off",
                        signature="calls until the step limit", answer="{}", target="[]", shape="calls",
                        detail={"mechanism": "calls until the step limit", "check": "turn 1 ran 8 steps"})
                for n in range(6) for m in ("weak", "weaker")]
    batch = BatchContext.from_failures(failures)
    cluster = aggregate(failures, batch)[0]
    assert (cluster.size, cluster.verdict) == (12, "harness-level")
    assert Ranking.for_cluster(cluster).names[0] == "step_budget"
    case = CaseFile(cluster=cluster, files=read_dir(STARTER_AGENT_DIR), harness_version="h", batch=batch, exemplars=[])
    backend = HeuristicRoleBackend()
    case.investigation = backend.run("investigator", case, 1).output
    assert "max_steps=8" in case.investigation["root_cause"]
    proposal = backend.run("proposer", case, 1).output
    assert proposal["operator"] == "step_budget"
    assert "max_steps = 16  # room for the calls a turn needs (step_budget)" in proposal["files"]["harness.toml"]
    assert OPERATORS["step_budget"].present(materialize(proposal, case).files)


def test_an_llm_proposer_can_edit_the_agents_loop_and_the_edit_runs() -> None:
    """LLM roles are not held to the catalogue: a Proposer may rewrite the agent's own loop. Here
    (a scripted LLM, the parsing and drafting real) it makes a reply with no readable calls go back
    to the model with a correction, on one more attempt; the edited harness runs in the sandbox and
    reads the call the second reply holds, where the starter returns the first reply's prose."""
    import json as json_mod

    from ecdysis.models.scripted import ScriptedBackend
    from ecdysis.roles.llm import LLMRoleBackend
    failures, batch, _ = _string_typed_batch()
    starter = read_dir(STARTER_AGENT_DIR)
    case = CaseFile(cluster=aggregate(failures, batch)[0], files=starter, harness_version="h", batch=batch,
                    exemplars=[])
    loop_before = ("        text = reply.text\n        found = read_calls(text, calls)\n"
                   "        if found is not None:\n            return calls.calls_to_json(found)\n")
    loop_after = loop_before + (
        "        messages = messages + [{\"role\": \"assistant\", \"content\": text},\n"
        "                               {\"role\": \"user\", \"content\": \"Reply with the JSON list of calls only.\"}]\n")
    assert starter["harness.py"].count(loop_before) == 1
    output = {"spec": {"target_files": ["harness.py", "harness.toml"],
                       "change": "A reply with no readable calls goes back with a correction, once.",
                       "root_cause": "The loop retries with the same messages.", "expected_effect": "e",
                       "risk": "one more call when a reply holds no calls", "scope": "every task"},
              "edits": [{"path": "harness.py", "find": loop_before, "replace": loop_after},
                        {"path": "harness.toml", "find": "retries = 0 ", "replace": "retries = 1 "}]}
    turn = LLMRoleBackend(ScriptedBackend(queue=[json_mod.dumps(output)], model_id="roles")).run("proposer", case, 1)
    draft = materialize(turn.output, case)
    validate_files(draft.files)
    assert set(draft.spec.target_files) == {"harness.py", "harness.toml"}
    task = {"input": "What is the area of a triangle of base 10 and height 5?", "choices": None,
            "category": "simple", "fields": {"functions": [AREA]}}
    call = '[{"name": "triangle_area", "arguments": {"base": 10, "height": 5}}]'
    replies = ["I would use triangle_area for that.", call]
    answer, requests = solve(draft.files, task, replies)
    assert json_mod.loads(answer or "[]") == json_mod.loads(call) and len(requests) == 2
    assert requests[1]["messages"][-1]["content"] == "Reply with the JSON list of calls only."
    before, _ = solve(starter, task, replies)
    assert before == "I would use triangle_area for that."


@pytest.mark.slow
def test_llm_roles_on_a_real_model_diagnose_an_agent_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM role backend on the embedded SmolLM2 (short prompts and replies), on a BFCL failure
    of SmolLM2 itself, refined whatever its verdict (the per-instance mode): the roles read an agent
    cluster, the model really answers, and every role ends with a schema-valid output (its own or
    the heuristic fallback's, which the transcript names)."""
    from ecdysis.diagnosis import diagnose
    from ecdysis.roles.llm import LLMRoleBackend
    from ecdysis.service import RunRequest, Service
    from ecdysis.suites.bfcl import is_fetched
    from storage import open_store
    if not is_fetched():
        pytest.skip("the BFCL data is not fetched (scripts/fetch_bfcl.py)")
    monkeypatch.setenv("ECDYSIS_HOME", str(tmp_path))
    svc = Service(open_store())
    run = svc.run(RunRequest(suite="bfcl-simple", model="smollm2", split="train", limit=3))
    failing = [r.instance_id for r in svc.results(run.run_id) if not r.correct]
    assert failing, "SmolLM2 answered every entry right; the test learns nothing"
    roles = LLMRoleBackend(svc.backend("smollm2"), store=svc.store, max_tokens=64, file_chars=300)
    report = diagnose(svc.store, [run.run_id], suite_loader=svc.suite, role_backend=roles, smoke_model="smollm2",
                      backend_factory=svc.backend, limits=svc.limits(), max_rounds=1, max_proposals=1, passes=1,
                      only_instances=failing[:1], probe=False)
    (cluster,) = report.clusters
    assert cluster.type in AGENT_TYPES and all(f.shape == "calls" for f in cluster.failures)
    messages = report.transcript(cluster.id)
    assert {m.kind for m in messages if m.backend == "llm:smollm2"} >= {"prompt", "reply"}
    outputs = {m.role for m in messages if m.kind == "output"}
    assert {"investigator", "attributor", "proposer"} <= outputs
    for m in messages:
        if m.kind == "output" and m.role in ROLES:
            assert schema_errors(m.role, m.data or {}) == [], (m.role, m.backend, m.data)

"""`call_schema`: an agent's reply decoded under a JSON schema made from the task's own function
docs. The harness asks with `model.generate(..., schema=...)`; the engine checks the schema (a
bounded JSON object), the embedded models turn it into a sampling grammar, and a schema the
converter refuses is the harness's error, which the repair answers by generating freely."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ecdysis.errors import ModelError
from ecdysis.harness import STARTER_AGENT_DIR, read_dir, validate_files
from ecdysis.models.gateway import MAX_SCHEMA_CHARS, harness_request
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.repairs import RepairInput
from ecdysis.sandbox import SandboxLimits
from diagnosis_fixtures import solve_responding
from test_agent_taxonomy import FLAG, ROUTE, TASK, _string_typed_batch

FAST = SandboxLimits(timeout_s=10.0, memory_mb=512)
WORDS = {"name": "pick_word", "description": "Pick a word.",
         "parameters": {"type": "dict", "properties": {
             "word": {"type": "string", "enum": ["alpha", "beta"]},
             "options": {"type": "dict", "properties": {"upper": {"type": "boolean"}}, "required": []},
             "anything": {"type": "any"}}, "required": ["word"]}}


def schema_files(judge: bool = False) -> dict[str, str]:
    """The starter agent with call_schema applied; its judge (on as the repair writes it) turned
    off unless `judge`, for the tests of the schema itself."""
    from ecdysis.aggregate import aggregate
    from ecdysis.harness import params
    from ecdysis.roles.repairs import set_param
    failures, batch, _ = _string_typed_batch()
    inp = RepairInput(read_dir(STARTER_AGENT_DIR), aggregate(failures, batch)[0])
    assert OPERATORS["call_schema"].unavailable(inp) is None
    files = OPERATORS["call_schema"].apply(inp).files
    validate_files(files)
    assert OPERATORS["call_schema"].present(files)
    assert params(files)["call_schema_judge"] is True
    if not judge:
        files["harness.toml"] = set_param(files["harness.toml"], "call_schema_judge", "false", "test")
    return files


def solve(files: dict[str, str], task: dict, answer: Any) -> tuple[str | None, list[dict]]:
    """The harness on `task` in the real sandbox; `answer(request)` is the engine's reply."""
    return solve_responding(files, task, answer, FAST)


def text(reply: str) -> Any:
    return lambda request: {"op": "completion", "text": reply, "finish_reason": "stop",
                            "prompt_tokens": 1, "completion_tokens": 1}


def two_replies(free: str, constrained: str) -> Any:
    """The model: `free` when asked without a schema, `constrained` under one."""
    return lambda request: text(constrained if "json_schema" in request else free)(request)


FITS = '[{"name": "set_flag", "arguments": {"enabled": true, "level": 2.5}}]'


def test_a_reply_that_fits_the_functions_is_kept_as_written_with_no_second_call() -> None:
    answer, requests = solve(schema_files(), TASK, two_replies(FITS, "[]"))
    assert json.loads(answer) == json.loads(FITS) and len(requests) == 1 and "json_schema" not in requests[0]
    plain, plain_requests = solve(read_dir(STARTER_AGENT_DIR), TASK, text(FITS))
    assert plain == answer and plain_requests == requests
    # Calling nothing fits too: [] is a list of calls.
    assert solve(schema_files(), TASK, two_replies("[]", FITS))[0] == "[]"


@pytest.mark.parametrize("free, why", [
    ("Set the flag, then plan the route.", "prose"),
    ('[{"name": "set_flags", "arguments": {"enabled": true, "level": 2}}]', "an unlisted function"),
    ('[{"name": "set_flag", "arguments": {"enabled": true}}]', "a required parameter missing"),
    ('[{"name": "set_flag", "arguments": {"enabled": true, "level": 2, "colour": "red"}}]', "an undeclared one"),
])
def test_a_reply_that_does_not_fit_is_asked_for_again_under_the_schema(free: str, why: str) -> None:
    answer, requests = solve(schema_files(), TASK, two_replies(free, FITS))
    assert json.loads(answer) == json.loads(FITS), why
    assert ["json_schema" in r for r in requests] == [False, True]
    assert requests[1]["messages"] == requests[0]["messages"]  # the same question, under the schema
    schema = requests[1]["json_schema"]
    assert schema["type"] == "array"
    kinds = schema["items"]["anyOf"]
    assert [k["properties"]["name"] for k in kinds] == [{"const": "set_flag"}, {"const": "plan_route"}]
    flag = kinds[0]["properties"]["arguments"]
    # BFCL's "float" and "dict" are JSON schema's "number" and "object"; declared parameters only.
    assert flag["properties"] == {"enabled": {"type": "boolean"}, "level": {"type": "number"}}
    assert flag["required"] == ["enabled", "level"] and flag["additionalProperties"] is False
    assert kinds[1]["properties"]["arguments"]["properties"]["stops"] == {"type": "array"}
    # A call's name comes before its arguments, and the parameters keep the functions' order: the
    # grammar asks for them in the order given, so the engine must not sort them (it did, and Qwen
    # 0.5B, made to write the arguments first, answered [] where it had called the right function).
    engine = harness_request(requests[1]).schema()
    assert list(engine["items"]["anyOf"][0]["properties"]) == ["name", "arguments"]
    assert list(engine["items"]["anyOf"][1]["properties"]["arguments"]["properties"]) == ["start", "stops"]
    swapped = {**requests[1], "json_schema": {**schema, "items": {"anyOf": [
        {**k, "properties": {"arguments": k["properties"]["arguments"], "name": k["properties"]["name"]}}
        for k in kinds]}}}
    assert harness_request(swapped).cache_key("m") != harness_request(requests[1]).cache_key("m")
    # A recorded call's key is recomputed from its stored request (the budget's `paid_for`): the
    # stored JSON keeps the order, so the key comes out the same.
    from ecdysis.records import request_key
    made = harness_request(requests[1])
    assert request_key("m", json.loads(json.dumps(made.to_json()))) == made.cache_key("m")


def test_enums_nested_objects_and_untyped_parameters_keep_their_meaning() -> None:
    task = {**TASK, "fields": {"functions": [WORDS]}}
    _, requests = solve(schema_files(), task, two_replies("no idea", "[]"))
    schema = requests[1]["json_schema"]
    one = schema["items"]  # a single function needs no anyOf
    args = one["properties"]["arguments"]
    assert args["properties"]["word"] == {"type": "string", "enum": ["alpha", "beta"]}
    assert args["properties"]["options"] == {"type": "object", "properties": {"upper": {"type": "boolean"}},
                                             "required": []}
    assert args["properties"]["anything"] == {}  # "any": any value
    assert args["required"] == ["word"]
    # The engine takes it as a request of its own (a different cache key from free text).
    request = harness_request(requests[1])
    assert request.schema() == schema
    assert request.cache_key("m") != harness_request(requests[0]).cache_key("m")


def test_a_refused_schema_leaves_the_first_reply_and_tasks_without_functions_are_untouched() -> None:
    def refuse_schemas(request: dict) -> dict:
        if "json_schema" in request:
            return {"op": "model_error", "message": "the reply's JSON schema cannot be made a grammar"}
        return text("I would plan the route.")(request)

    answer, requests = solve(schema_files(), TASK, refuse_schemas)
    assert answer == "I would plan the route."
    assert ["json_schema" in r for r in requests] == [False, True]
    no_functions = {**TASK, "fields": {}}
    _, requests = solve(schema_files(), no_functions, text("prose"))
    assert len(requests) == 1 and "json_schema" not in requests[0]


def judging(free: str, asked: list[float], prior: list[float], constrained: str = FITS) -> Any:
    """The model: `free` when asked freely, `constrained` under a schema; asked to score "[]" and the
    start of a call to each listed function, these log-probabilities on the task (`asked`) and on
    the same prompt with the request replaced by "N/A" (`prior`: no user message holds the task's
    input)."""
    def answer(request: dict) -> dict:
        if "options" in request:
            blank = not any(TASK["input"] in m["content"] for m in request["messages"] if m["role"] == "user")
            return {"op": "completion", "text": "", "option_logprobs": prior if blank else asked,
                    "option_tokens": [1] * len(asked)}
        return two_replies(free, constrained)(request)
    return answer


def test_the_judge_asks_whether_the_request_raises_a_call_against_calling_nothing() -> None:
    # The request raises "[]" (by 1) more than any call's start (by 0.5 at most): the reply is [],
    # and nothing is generated again, although a call's start is likelier in absolute terms.
    answer, requests = solve(schema_files(judge=True), TASK, judging("No function here can do that.", [-3.0, -2.0, -1.5],
                                                           [-4.0, -2.5, -2.0]))
    assert answer == "[]"
    assert ["options" in r for r in requests] == [False, True, True]
    assert not any("json_schema" in r for r in requests)
    asked, blank = requests[1], requests[2]
    assert asked["options"] == blank["options"] == ["[]", '[{"name": "set_flag"', '[{"name": "plan_route"']
    assert asked["messages"] == requests[0]["messages"]  # the same question, scored
    assert blank["messages"][:-1] == asked["messages"][:-1] and blank["messages"][-1] == {"role": "user",
                                                                                          "content": "N/A"}
    # The request raises a call more than calling nothing: asked again under the schema.
    answer, requests = solve(schema_files(judge=True), TASK, judging("Set the flag, then plan.", [-1.0, -2.0, -3.0],
                                                           [-1.5, -5.0, -3.0]))
    assert json.loads(answer) == json.loads(FITS)
    assert ["options" in r for r in requests] == [False, True, True, False] and "json_schema" in requests[3]
    # A call that does not fit is judged too: [] replaces a call to an unlisted function.
    unlisted = '[{"name": "set_flags", "arguments": {"enabled": true, "level": 2}}]'
    assert solve(schema_files(judge=True), TASK, judging(unlisted, [-0.5, -4.0, -4.0], [-2.0, -4.0, -4.0]))[0] == "[]"


def test_the_judge_leaves_fitting_replies_alone_and_steps_aside_where_the_backend_cannot_score() -> None:
    answer, requests = solve(schema_files(judge=True), TASK, judging(FITS, [0.0, -9.0, -9.0], [-9.0, 0.0, 0.0],
                                                           constrained="[]"))
    assert json.loads(answer) == json.loads(FITS) and len(requests) == 1  # no score, no second call

    def no_scores(request: dict) -> dict:
        if "options" in request:
            return {"op": "model_error", "message": "this backend gives no log-probabilities"}
        return two_replies("prose", FITS)(request)

    answer, requests = solve(schema_files(judge=True), TASK, no_scores)
    assert json.loads(answer) == json.loads(FITS)
    assert "json_schema" in requests[-1] and sum("options" in r for r in requests) == 1
    # Off: no score is asked for.
    answer, requests = solve(schema_files(judge=False), TASK, judging("prose", [0.0, -9.0, -9.0], [-9.0, 0.0, 0.0]))
    assert json.loads(answer) == json.loads(FITS) and not any("options" in r for r in requests)


@pytest.mark.parametrize("schema, message", [
    ("[1, 2]", "must be a JSON schema object"),
    (["array"], "must be a JSON schema object"),
    ({"enum": ["x" * (MAX_SCHEMA_CHARS + 1)]}, "more than"),
    ({"const": float("nan")}, "not JSON"),
])
def test_the_engine_refuses_a_schema_that_is_not_a_bounded_json_object(schema: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        harness_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": schema})


def test_a_harness_sending_a_bad_schema_gets_model_call_error_not_a_crash() -> None:
    """Hostile harness code: what llama.cpp's converter asserts on becomes the harness's ModelCallError
    (the real converter, no model loaded)."""
    pytest.importorskip("llama_cpp")
    from ecdysis.models.llamacpp import _grammar_of
    for bad in ({"type": "weird"}, {"$ref": "#/nowhere"}):
        with pytest.raises(ModelError) as caught:
            _grammar_of(json.dumps(bad), "m")
        assert caught.value.kind == "bad_request" and "cannot be made a grammar" in str(caught.value)
    assert "root" in _grammar_of(json.dumps({"type": "array", "items": {"type": "integer"}}), "m")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "qwen2.5-coder-0.5b"])
def test_a_real_model_under_the_schema_answers_with_calls_to_listed_functions(model: str) -> None:
    """The real embedded model through the gateway, asked under the schema (the harness's second
    request): its reply is a list of calls, each to a listed function with its required parameters
    and only declared ones."""
    from ecdysis.models.gateway import ModelGateway, harness_reply
    from ecdysis.models.registry import get_backend
    gateway = ModelGateway(get_backend(model), store=None, use_cache=False)

    def real(request: dict) -> dict:
        if "json_schema" not in request:
            return text("Sure! I will plan that route for you.")(request)  # a reply that does not fit
        try:
            return harness_reply(gateway.complete(harness_request(request)))
        except ModelError as exc:
            return {"op": "model_error", "message": str(exc)}

    task = {"input": "Plan a route from Oslo to Bergen with a stop in Voss.", "choices": None,
            "category": "x", "fields": {"functions": [FLAG, ROUTE]}}
    answer, requests = solve(schema_files(), task, real)
    assert len(requests) == 2 and "json_schema" in requests[1]
    calls = json.loads(answer)
    assert isinstance(calls, list)
    declared = {"set_flag": {"enabled", "level"}, "plan_route": {"start", "stops"}}
    for call in calls:
        assert set(call["arguments"]) == declared[call["name"]], call  # all required, none other


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "qwen2.5-coder-0.5b"])
def test_a_real_model_judges_and_the_harness_follows_its_scores(model: str) -> None:
    """The real embedded model scores "[]" against the start of each listed call, on the prompt its
    free reply came from and with the request replaced by "N/A", and the harness does what the
    scores say: [] with no further request when the request raises "[]" more than any call, else
    the question again under the schema."""
    from ecdysis.models.gateway import ModelGateway, harness_reply
    from ecdysis.models.registry import get_backend
    gateway = ModelGateway(get_backend(model), store=None, use_cache=False)
    scores: list[list[float]] = []

    def real(request: dict) -> dict:
        if "json_schema" not in request and "options" not in request:
            return text("I am not sure what to do here.")(request)  # a reply that does not fit
        reply = harness_reply(gateway.complete(harness_request(request)))
        if "options" in request:
            scores.append(reply["option_logprobs"])
        return reply

    for ask in ("Plan a route from Oslo to Bergen with a stop in Voss.", "Who wrote the novel Hunger?"):
        scores.clear()
        task = {"input": ask, "choices": None, "category": "x", "fields": {"functions": [FLAG, ROUTE]}}
        answer, requests = solve(schema_files(judge=True), task, real)
        assert requests[1]["options"] == ["[]", '[{"name": "set_flag"', '[{"name": "plan_route"']
        assert requests[2]["messages"][-1]["content"] == "N/A"
        asked, prior = scores
        assert all(lp < 0 for lp in asked + prior)  # log-probabilities of real text
        assert asked != prior  # the request changes what the model expects
        shift = [a - b for a, b in zip(asked, prior)]
        if shift[0] > max(shift[1:]):
            assert answer == "[]" and len(requests) == 3
        else:
            assert len(requests) == 4 and "json_schema" in requests[3]
            assert all(call["name"] in ("set_flag", "plan_route") for call in json.loads(answer))


def test_the_judge_blanks_only_the_request_so_what_a_harness_adds_around_it_stays_on_both_sides() -> None:
    # call_format puts its format text (an example call, "reply [] when none applies") after the
    # request in the user message: blanking that message whole would measure the instruction too.
    from test_agent_taxonomy import agent_files
    files = agent_files("call_format", "call_schema")
    answer, requests = solve(files, TASK, judging("prose", [-3.0, -2.0, -1.5], [-4.0, -2.5, -2.0]))
    assert answer == "[]"
    asked, blank = requests[1]["messages"], requests[2]["messages"]
    assert TASK["input"] in asked[-1]["content"] and "example_function" in asked[-1]["content"]
    assert blank[-1]["content"] == asked[-1]["content"].replace(TASK["input"], "N/A")
    assert blank[:-1] == asked[:-1]


@pytest.mark.parametrize("asked, prior, why", [
    ([-1.0, -2.0, -2.0], [-2.0, -3.0, -3.0], "a tie: the request raises [] and the likeliest call alike"),
    ([float("nan"), -9.0, -9.0], [-9.0, -9.0, -9.0], "a score that is not a number"),
    ([0.0, -9.0, -9.0], [float("-inf"), -9.0, -9.0], "an impossible prior for []"),
    ([0.0, -9.0], [-9.0, -9.0], "fewer scores than options"),
])
def test_a_tie_or_a_score_that_is_no_finite_number_leaves_the_decision_to_the_schema(
        asked: list[float], prior: list[float], why: str) -> None:
    answer, requests = solve(schema_files(judge=True), TASK, judging("prose", asked, prior))
    assert json.loads(answer) == json.loads(FITS), why
    # (the engine refuses a score reply of the wrong length at once, so the prior is not asked for)
    assert "options" in requests[1] and not any("json_schema" in r for r in requests[:-1])
    assert "json_schema" in requests[-1] and len(requests) in (3, 4)


def test_the_judge_scores_each_function_once_and_steps_aside_when_there_are_too_many_to_score() -> None:
    twice = {**TASK, "fields": {"functions": [FLAG, ROUTE, FLAG]}}
    answer, requests = solve(schema_files(judge=True), twice, judging("prose", [-3.0, -2.0, -1.5],
                                                                      [-4.0, -2.5, -2.0]))
    assert answer == "[]" and requests[1]["options"] == ["[]", '[{"name": "set_flag"', '[{"name": "plan_route"']
    many = [{**FLAG, "name": f"set_flag_{i}"} for i in range(64)]
    crowded = {**TASK, "fields": {"functions": many}}
    answer, requests = solve(schema_files(judge=True), crowded, two_replies("prose", "[]"))
    assert answer == "[]" and not any("options" in r for r in requests) and "json_schema" in requests[-1]


@pytest.mark.parametrize("written, on", [('"true"', True), ('"yes"', True), ('"false"', False), ("0", False)])
def test_the_judge_switch_reads_a_string_as_an_edit_may_write_it(written: str, on: bool) -> None:
    from ecdysis.roles.repairs import set_param
    files = schema_files(judge=True)
    files["harness.toml"] = set_param(files["harness.toml"], "call_schema_judge", written, "test")
    _, requests = solve(files, TASK, judging("prose", [-3.0, -2.0, -1.5], [-4.0, -2.5, -2.0]))
    assert any("options" in r for r in requests) is on


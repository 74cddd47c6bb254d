"""Option scoring: a request with options is scored, not generated; it enters the cache key, the
budget and the trajectory; a backend that cannot score is refused before anything is spent, and
the `option_scoring` operator's harness then generates as before. Scripted model and a loopback
OpenAI-compatible server here; the embedded models' scores are checked against a full evaluation
in `test_models_local.py`."""

from __future__ import annotations

import pytest

from ecdysis.errors import ModelError
from ecdysis.harness import ensure_starter, new_version
from ecdysis.models.gateway import ModelGateway
from ecdysis.models.openai_backend import OpenAIBackend
from ecdysis.models.registry import forget_backends, register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.records import CompletionRequest, checked_options
from ecdysis.roles.operators import OPERATORS
from ecdysis.service import RunRequest, Service
from servers.openai_stub import MisbehavingOpenAI

ASK = [{"role": "user", "content": "Is the sky blue? Answer True or False."}]


def test_options_enter_the_request_and_its_cache_key_only_when_given() -> None:
    plain = CompletionRequest.make(ASK)
    scored = CompletionRequest.make(ASK, options=["Answer: True", "Answer: False"])
    assert "options" not in plain.to_json() and scored.to_json()["options"] == ["Answer: True", "Answer: False"]
    assert plain.cache_key("m") == CompletionRequest.make(ASK, options=[]).cache_key("m")
    assert plain.cache_key("m") != scored.cache_key("m")
    assert scored.cache_key("m") != CompletionRequest.make(ASK, options=["Answer: False", "Answer: True"]).cache_key("m")


@pytest.mark.parametrize("options, message", [
    ("True", "a list of strings"), ([1, 2], "a list of strings"), (["a", " "], "empty"),
    (["a", "a"], "not distinct"), (["x" * 2001, "b"], "longer than"), ([str(i) for i in range(65)], "at most 64")])
def test_bad_options_are_refused_in_one_line(options: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        checked_options(options)  # type: ignore[arg-type]


def test_a_backend_that_cannot_score_is_refused_before_the_cache_and_the_budget(store) -> None:
    from ecdysis.budget import CallBudget
    budget = CallBudget(max_calls=5)
    # Never contacted: the refusal comes first (nothing listens on port 9).
    gateway = ModelGateway(OpenAIBackend("gpt-x", base_url="http://127.0.0.1:9/v1", api_key="k"), store,
                           budget=budget)
    request = CompletionRequest.make(ASK, options=["Answer: True", "Answer: False"])
    with pytest.raises(ModelError) as refused:
        gateway.complete(request)
    assert refused.value.kind == "unsupported" and "cannot score options" in str(refused.value)
    assert budget.calls == 0 and store.cache_get(request.cache_key("openai:gpt-x")) is None


def _scoring_harness(svc: Service) -> str:
    starter = ensure_starter(svc.store)
    files = OPERATORS["option_scoring"].patched(starter.files)  # type: ignore[attr-defined]
    version = new_version(files, parent=starter.id, note="option_scoring")
    return (svc.store.get_harness(version.id) or svc.store.put_harness(version)).id


def test_the_operator_scores_each_option_and_the_trajectory_keeps_the_scores(store) -> None:
    # With the input blanked the script prefers True: calibration takes that preference away.
    register_backend(ScriptedBackend([Rule(text="Answer: True", match="N/A")], model_id="scorer",
                                     default="Answer: False"))
    svc = Service(store)
    run = svc.run(RunRequest(suite="boolean", model="scorer", harness=_scoring_harness(svc), limit=6))
    results = svc.results(run.run_id)  # read back from the database
    assert len(results) == 6
    for r in results:
        # The task scored, then (calibration, on by default) the same prompt with its input blanked.
        assert r.answer == "False" and len(r.calls) == 2, r
        scored, blank = r.calls
        assert scored.request["options"] == blank.request["options"] == ["Answer: True", "Answer: False"]
        assert scored.option_logprobs == [-20.0, 0.0] and scored.text == "Answer: False"
        assert "N/A" in blank.request["messages"][-1]["content"] and blank.option_logprobs == [0.0, -20.0]
    assert sum(r.correct for r in results) == sum(r.target == "False" for r in results)
    blanks = {tuple(m["content"] for m in r.calls[1].request["messages"]) for r in results}
    assert len(blanks) == 1, "every task of a category shares one blanked prompt: one real call, then the cache"
    again = svc.run(RunRequest(suite="boolean", model="scorer", harness=_scoring_harness(svc), limit=6))
    cached = [c for r in svc.results(again.run_id) for c in r.calls]
    assert all(c.cache_hit for c in cached) and [c.option_logprobs for c in cached[:2]] == [[-20.0, 0.0], [0.0, -20.0]]


def test_on_a_backend_that_cannot_score_the_operator_generates_instead(store, monkeypatch: pytest.MonkeyPatch) -> None:
    with MisbehavingOpenAI(answer="Let me see.\nAnswer: False") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("ECDYSIS_MAX_RETRIES", "0")
        forget_backends()
        try:
            svc = Service(store)
            run = svc.run(RunRequest(suite="boolean", model="openai:stub", harness=_scoring_harness(svc), limit=3))
            results = svc.results(run.run_id)
        finally:
            forget_backends()
        assert len(server.snapshot()) == 3, "one generation per instance reached the server, no scoring call"
    for r in results:
        assert r.answer == "False" and r.error_type is None, r
        refused, generated = r.calls
        assert refused.error and "cannot score options" in refused.error and refused.request.get("options")
        assert generated.error is None and "options" not in generated.request and generated.option_logprobs is None


@pytest.mark.slow
def test_the_operator_scores_options_with_an_embedded_model(store) -> None:
    """SmolLM2 in the sandboxed engine: every closed-answer instance is answered by one scoring
    call whose scores are stored, and every answer is one of the task's answers."""
    svc = Service(store)
    harness = _scoring_harness(svc)
    run = svc.run(RunRequest(suite="boolean", model="smollm2", harness=harness, limit=4))
    results = svc.results(run.run_id)
    assert len(results) == 4
    for r in results:
        assert r.error_type is None and r.answer in ("True", "False"), r
        call, blank = r.calls
        assert call.request["options"] == ["Answer: True", "Answer: False"] and not call.cache_hit
        assert len(call.option_logprobs or []) == 2 and all(lp < 0 for lp in call.option_logprobs or [])
        assert call.text in call.request["options"] and call.completion_tokens > 0
        assert blank.request["options"] == call.request["options"] and len(blank.option_logprobs or []) == 2
    assert sum(not r.calls[1].cache_hit for r in results) == 1, "the blanked prompt is scored once"


@pytest.mark.parametrize("type_, shape, place", [
    ("truncated", "choice", 0), ("empty_output", "boolean", 0), ("off_format", "choice", 1),
    ("invalid_choice", "choice", 1), ("wrong_answer", "choice", 1), ("truncated", "number", None),
    ("wrong_answer", "number", None)])
def test_option_scoring_is_ranked_for_closed_answers(type_: str, shape: str, place: int | None) -> None:
    """Cut off or empty on options or yes/no: scoring first (it needs no reply). Off-format or an
    invalid choice: second, after the cheaper fix that keeps the model's own answer. A wrong option:
    after worked examples, before voting. An open answer form: not at all."""
    from ecdysis.aggregate import Cluster
    from ecdysis.failures import Failure
    from ecdysis.roles.ranking import Ranking
    failures = [Failure(run_id="r", suite="s", instance_id=f"i{n}", category="c", split="train", model="m",
                        harness_version="h", type=type_, excerpt="", signature="x", answer="", target="A",
                        shape=shape) for n in range(4)]  # type: ignore[arg-type]
    cluster = Cluster(id="c1", type=type_, label="", failures=failures, terms=[], systematicity=1.0,
                      components={}, verdict="harness-level", reason="", evidence=[])
    names = Ranking.for_cluster(cluster).names
    if place is None:
        assert "option_scoring" not in names
    else:
        assert names.index("option_scoring") == place, names

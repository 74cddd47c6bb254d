"""The embedded backends really generate (no key, no network): SmolLM2, Gemma 3 270M from its
optional extra, and the Qwen2.5-Coder 0.5B and 1.5B assembled at set-up; the same request gives
the same text (the cache relies on it); JSON-schema requests come back in the schema's shape, and
the fast grammar path writes exactly what llama-cpp-python's own grammar path writes."""

from __future__ import annotations

import pytest

import json
import re

from ecdysis.models.llamacpp import LlamaCppBackend, gguf_path
from ecdysis.models.registry import LOCAL_NAMES, get_backend
from ecdysis.records import CompletionRequest, keys_sorted
from ecdysis.roles.base import schema_errors
from ecdysis.roles.llm import generation_schema

pytestmark = pytest.mark.slow

REQ = CompletionRequest.make([{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "What is 3 + 4? Answer with a number."}],
                             max_tokens=24)


@pytest.mark.parametrize("name", LOCAL_NAMES)
def test_local_model_generates_deterministically(name: str) -> None:
    assert gguf_path(name).stat().st_size > 50_000_000
    backend = get_backend(name)
    first = backend.complete(REQ)
    second = backend.complete(REQ)
    assert first.text.strip()
    assert first.completion_tokens > 0 and first.prompt_tokens > 5
    assert first.latency_s > 0
    assert first.finish_reason in ("stop", "length")
    assert first.text == second.text


def test_max_tokens_truncation_is_reported() -> None:
    backend = get_backend("smollm2")
    req = CompletionRequest.make([{"role": "user", "content": "Write a long story about a dragon."}],
                                 max_tokens=5)
    out = backend.complete(req)
    assert out.finish_reason == "length"
    assert out.completion_tokens == 5


def test_backend_is_loaded_lazily() -> None:
    backend = LlamaCppBackend("smollm2")
    assert backend._llm is None
    backend.close()


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_prefix_reuse_gives_the_text_of_a_full_evaluation(name: str) -> None:
    """Requests that share a long system prompt and an instruction paragraph, one after another on
    one backend (which keeps the cached prefix up to a batch start both prompts share), give
    exactly the text a fresh backend gives each of them alone; a multi-turn request that quotes
    the previous reply does too."""
    system = {"role": "system", "content": "You solve reasoning problems carefully. " * 30 + "End with Answer: X."}
    lead = "Read the question below, think it through in one or two sentences, then answer.\n\n"
    questions = [lead + q for q in (
        "A shelf holds 17 red books and 25 blue books. How many books are on the shelf in all?",
        "Is 91 a prime number, or can it be written as the product of two smaller whole numbers?",
        "Sort these words in alphabetical order and list them with commas: pear, apple, fig, kiwi.",
        "A shelf holds 17 red books and 26 blue books. How many books are on the shelf in all?")]
    shared = LlamaCppBackend(name)
    try:
        texts, reused = [], []
        for q in questions:
            texts.append(shared.complete(CompletionRequest.make([system, {"role": "user", "content": q}],
                                                                max_tokens=48)).text)
            reused.append(shared._llm.reused)
        # The system turn, the user's role line and the instruction paragraph came from the cache
        # after the first call.
        assert reused[0] == 0 and min(reused[1:]) > 200, reused
        follow = [system, {"role": "user", "content": questions[0]}, {"role": "assistant", "content": texts[0]},
                  {"role": "user", "content": "Reply with the number only."}]
        texts.append(shared.complete(CompletionRequest.make(follow, max_tokens=16)).text)
    finally:
        shared.close()
    requests = [[system, {"role": "user", "content": q}] for q in questions] + [follow]
    for messages, text in zip(requests[1:], texts[1:]):
        fresh = LlamaCppBackend(name)
        try:
            alone = fresh.complete(CompletionRequest.make(messages, max_tokens=16 if messages is follow else 48)).text
        finally:
            fresh.close()
        assert alone == text


def test_qwen_0_5b_reasons_to_an_answer_smollm2_misses() -> None:
    """The headroom the subject model brings: a two-step word problem, asked for its reasoning
    and a final line, which SmolLM2 gets wrong and Qwen2.5-Coder 0.5B gets right."""
    req = CompletionRequest.make([
        {"role": "system", "content": "Think step by step, briefly. End with a line: Answer: <number>"},
        {"role": "user", "content": "A shop sells pens at 3 dollars each. Tom buys 4 pens and pays with "
                                    "a 20 dollar bill. How much change does he get, in dollars?"}], max_tokens=256)
    final = {}
    for name in ("qwen2.5-coder-0.5b", "smollm2"):
        text = get_backend(name).complete(req).text
        numbers = re.findall(r"\d+", text.rsplit("\n", 2)[-1] if "Answer:" not in text else text.rsplit("Answer:", 1)[1])
        final[name] = numbers[-1] if numbers else text[-80:]
    assert final["qwen2.5-coder-0.5b"] == "8", final
    assert final["smollm2"] != "8", final


ROLE_CASE = [{"role": "system", "content": "You diagnose failures of an LLM harness. Reply with JSON."},
             {"role": "user", "content": "Cluster c1: 15 replies cut off at max_tokens=96 on 10 instances, "
                                         "5 categories, both models. Which harness component is at fault?"}]


@pytest.mark.parametrize("name, role", [("smollm2", "investigator"), ("qwen2.5-coder-0.5b", "proposer"),
                                        ("qwen2.5-coder-1.5b", "attributor")])
def test_json_schema_requests_come_back_in_the_roles_shape(name: str, role: str) -> None:
    backend = get_backend(name)
    # As the roles send it: keys sorted (`roles/llm.py`). Sent in the order declared (the CI run of
    # 2026-12-07), SmolLM2's investigator reply was cut off inside a string.
    out = backend.complete(CompletionRequest.make(ROLE_CASE, max_tokens=700,
                                                  json_schema=keys_sorted(generation_schema(role))))
    value = json.loads(out.text)
    assert out.finish_reason == "stop", out.text
    if role == "proposer":  # the generation shape is stricter than the role's own schema
        assert value["operator"] in ("", *generation_schema(role)["properties"]["operator"]["enum"])
        value = {k: v for k, v in value.items() if k != "operator" or v}
    assert schema_errors(role, value) == [], out.text


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_the_fast_grammar_path_writes_what_llama_cpp_python_writes(name: str) -> None:
    from llama_cpp import Llama

    from ecdysis.models.grammar import fast_grammar_llama_class
    fast = fast_grammar_llama_class()
    texts = []
    for cls in (Llama, fast):
        llm = cls(model_path=str(gguf_path(name)), n_ctx=2048, n_threads=2, verbose=False, seed=0,
                  use_extra_bufts=False)
        try:
            out = llm.create_chat_completion(messages=ROLE_CASE, max_tokens=120, temperature=0.0,
                                             response_format={"type": "json_object",
                                                              "schema": generation_schema("critic")})
            texts.append(out["choices"][0]["message"]["content"])
        finally:
            llm.close()
    assert texts[0] == texts[1]
    assert texts[0].startswith("{")


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_option_scores_are_the_log_probabilities_of_a_full_evaluation(name: str) -> None:
    """Each option's score is its log-probability as the reply: what a separate llama.cpp model
    that keeps the logits of every position gives for the prompt and the option evaluated in one
    pass. Scores do not depend on what the backend did before, and a generation after scoring
    gives the text a fresh backend gives."""
    import numpy as np
    from llama_cpp import Llama
    from ecdysis.models.llamacpp import chat_prompt_tokens
    messages = [{"role": "system", "content": "Answer the question. End with a line 'Answer: X'."},
                {"role": "user", "content": "Which is a fruit?\nA. carrot\nB. apple\nC. potato"}]
    options = ["Answer: B", "Answer: A", "Answer: apple", "Answer: potato, a root vegetable"]
    backend = LlamaCppBackend(name)
    try:
        scored = backend.complete(CompletionRequest.make(messages, options=options))
        prompt = chat_prompt_tokens(backend._llm, messages)
        tokens = [backend._llm.tokenize(o.encode(), add_bos=False, special=False) for o in options]
        backend.complete(REQ)  # something else in between
        again = backend.complete(CompletionRequest.make(messages, options=options))
        after = backend.complete(REQ).text
    finally:
        backend.close()
    assert again.option_logprobs == scored.option_logprobs
    assert scored.option_tokens == [len(t) for t in tokens]
    fresh = LlamaCppBackend(name)
    try:
        assert fresh.complete(REQ).text == after
    finally:
        fresh.close()
    reference = Llama(model_path=str(gguf_path(name)), n_ctx=2048, n_threads=2, logits_all=True, verbose=False, seed=0)
    try:
        expected = []
        for seq in tokens:
            reference.reset()
            reference.eval(prompt + seq)
            rows = np.asarray(reference.scores[len(prompt) - 1:len(prompt) + len(seq) - 1], dtype=np.float64)
            logz = rows.max(axis=1) + np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1))
            expected.append(float(sum(rows[j, t] - logz[j] for j, t in enumerate(seq))))
    finally:
        reference.close()
    # Quantised kernels round differently for a batch than for one token at a time, and the error
    # adds up over an option's tokens (about 1 % on a 36-nat option): the same quantity, not the
    # same float. An off-by-one position or a missed token would be off by whole nats.
    assert scored.option_logprobs == pytest.approx(expected, rel=0.03, abs=0.1), (scored.option_logprobs, expected)
    assert int(np.argmax(scored.option_logprobs)) == int(np.argmax(expected))
    means = [lp / n for lp, n in zip(scored.option_logprobs, scored.option_tokens)]
    assert scored.text == options[int(np.argmax(means))]


def test_the_proposer_on_qwen_reads_the_ranked_catalogue_and_names_an_open_operator() -> None:
    """Qwen 1.5B, the documented role model, plays the Proposer on a planted cluster whose replies
    hold no answer (the ranking asks for the answer's form before extraction). Its prompt lists the
    ranked operators with their reasons; its turn ends in a proposal that applies, named by the
    model itself (or kept without edits that did not apply), never by the heuristic fallback."""
    from diagnosis_fixtures import MemoryStore, planted_batch
    from ecdysis.aggregate import aggregate
    from ecdysis.roles import make_role_backend
    from ecdysis.roles.base import CaseFile
    from ecdysis.roles.drafting import materialize
    store = MemoryStore()
    failures, batch = planted_batch(store)
    version = store.list_harnesses()[0]
    cluster = next(c for c in aggregate(failures, batch) if "step by step" in c.label)
    case = CaseFile(cluster=cluster, files=dict(version.files), harness_version=version.id, batch=batch)
    turn = make_role_backend("qwen2.5-coder-1.5b").run("proposer", case, 1)
    prompt = turn.messages[0].text
    assert "1. answer_format_instruction (Answer-format instruction): only 0 of" in prompt
    assert "fallback" not in [m.kind for m in turn.messages], [m.text[:300] for m in turn.messages]
    enum = generation_schema("proposer", case)["properties"]["operator"]["enum"]
    assert turn.output.get("operator", "") in enum
    assert materialize(turn.output, case).files != case.files

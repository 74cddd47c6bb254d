"""The embedded backends really generate (no key, no network): SmolLM2 by default and Gemma 3
270M from its optional extra; the same request gives the same text (the cache relies on it)."""

from __future__ import annotations

import pytest

from ecdysis.models.llamacpp import LlamaCppBackend, gguf_path
from ecdysis.models.registry import get_backend
from ecdysis.records import CompletionRequest

pytestmark = pytest.mark.slow

REQ = CompletionRequest.make([{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "What is 3 + 4? Answer with a number."}],
                             max_tokens=24)


@pytest.mark.parametrize("name", ["smollm2", "gemma3-270m"])
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

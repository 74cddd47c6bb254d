"""The model seam: one protocol for every backend (embedded llama.cpp, OpenAI-compatible,
Anthropic, scripted). Callers reach a backend through `ModelGateway` (cache, budget, recording);
remote backends are wrapped in `with_retries`."""

from __future__ import annotations

from typing import Protocol

from ecdysis.records import Completion, CompletionRequest


class ModelBackend(Protocol):
    """Contract:

    - `model_id` names the exact model and backend ("smollm2", "openai:gpt-4o-mini", ...); it is
      part of every cache key, so two backends never share cached text.
    - `max_concurrency` is how many `complete` calls may run at once in one process (1 for an
      embedded model that is not thread-safe).
    - `complete` returns a `Completion` with token usage and latency filled in, or raises
      `ecdysis.errors.ModelError` (with `retryable=True` for rate limits and transient faults,
      `retry_after` when the server said so). It never returns an error as text.
    - `deterministic` is True when temperature 0 always gives the same text, so caching is exact.
    - A backend that sets `scores_options = True` answers a request with `options` by scoring
      each option as the reply (`Completion.option_logprobs`); the gateway refuses such a request,
      with a `ModelError` of kind "unsupported", for every other backend.
    """

    model_id: str
    max_concurrency: int
    deterministic: bool

    def complete(self, request: CompletionRequest) -> Completion: ...

    def close(self) -> None: ...

"""Between harness code and a backend: the persistent response cache and the per-backend
concurrency limit. Every call the runner records goes through here."""

from __future__ import annotations

import json

import threading
import time
from typing import TYPE_CHECKING, Any

from ecdysis.errors import ModelError
from ecdysis.models.base import ModelBackend
from ecdysis.records import Completion, CompletionRequest
from ecdysis.store import Store

if TYPE_CHECKING:
    from ecdysis.budget import CallBudget


class ModelGateway:
    """Cache first (an identical request is free and reproducible), then the backend, at most
    `backend.max_concurrency` calls at once. Errors are never cached."""

    def __init__(self, backend: ModelBackend, store: Store | None, *, use_cache: bool = True,
                 budget: "CallBudget | None" = None) -> None:
        self.backend = backend
        self.store = store
        # Role and smoke-run calls are charged here; the runner charges its instances' calls itself
        # (it also records each one in the trajectory), so it passes no budget.
        self.budget = budget
        self.use_cache = use_cache and store is not None
        self._slots = threading.BoundedSemaphore(max(1, backend.max_concurrency))

    @property
    def model_id(self) -> str:
        return self.backend.model_id

    def complete(self, request: CompletionRequest) -> Completion:
        if request.options and not getattr(self.backend, "scores_options", False):
            # Refused before the cache and the budget: nothing is charged or stored for it.
            raise ModelError(f"{self.backend.model_id} cannot score options: its API gives no "
                             "log-probabilities of a given reply", kind="unsupported",
                             hint="generate a reply instead (an embedded model scores options)")
        key = request.cache_key(self.backend.model_id)
        if self.use_cache:
            start = time.perf_counter()
            hit = self.store.cache_get(key)  # type: ignore[union-attr]
            if hit is not None:
                if self.budget is not None and self.budget.charge_cached and not self.budget.paid_for(key):
                    self.budget.check()  # a hit it charges is a call it must be able to pay for
                hit.cache_hit = True
                hit.recorded_latency_s = hit.latency_s
                hit.latency_s = time.perf_counter() - start
                self._charge(hit, key)
                return hit
        if self.budget is not None:
            self.budget.check()
        with self._slots:
            completion = self.backend.complete(request)
        completion.cache_hit = False
        completion.recorded_latency_s = completion.latency_s
        if self.use_cache:
            self.store.cache_put(key, self.backend.model_id, request.to_json(), completion)  # type: ignore[union-attr]
        self._charge(completion, key)
        return completion

    def _charge(self, completion: Completion, key: str) -> None:
        if self.budget is not None:
            self.budget.charge_completion(completion, key)


# The most model calls one solve() may make: a harness that loops (a wrapper applied twice that
# calls itself, a retry that never stops) is cut off here instead of spending a budget.
MAX_CALLS_PER_SOLVE = 64
CALL_LIMIT_MESSAGE = (f"the harness made {MAX_CALLS_PER_SOLVE} model calls on one instance, the most one "
                      "solve() may make")


def harness_request(req: dict[str, Any]) -> CompletionRequest:
    """The request a harness sent over its pipe, as the engine's request (raises KeyError,
    TypeError or ValueError for a malformed one). The runner and the Critic's smoke runs read
    harness requests alike, so a harness behaves the same in both."""
    return CompletionRequest.make(list(req.get("messages") or []), temperature=req.get("temperature", 0.0),
                                  max_tokens=min(int(req.get("max_tokens", 256)), 4096), stop=req.get("stop"),
                                  seed=req.get("seed", 0), options=req.get("options"),
                                  json_schema=checked_schema(req.get("json_schema")))


# The largest JSON schema a harness may ask its reply to follow, as canonical JSON text: a call
# list's schema for BFCL's longest function docs is about 6,000 characters.
MAX_SCHEMA_CHARS = 32_000


def checked_schema(schema: Any) -> dict[str, Any] | None:
    """A harness's `schema=` for a reply, or None for free text; raises TypeError or ValueError for
    one that is not a JSON object of bounded size (harness code is untrusted: the schema becomes a
    sampling grammar in the engine)."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise TypeError("schema must be a JSON schema object (a dict) or None")
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"schema is not JSON: {exc}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"schema is {len(text):,} characters as JSON, more than {MAX_SCHEMA_CHARS:,}")
    return schema


def harness_reply(completion: Completion) -> dict[str, Any]:
    """What the harness gets back for a completion (or for scored options)."""
    return {"op": "completion", "text": completion.text, "finish_reason": completion.finish_reason,
            "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "option_logprobs": completion.option_logprobs, "option_tokens": completion.option_tokens}

"""Between harness code and a backend: the persistent response cache and the per-backend
concurrency limit. Every call the runner records goes through here."""

from __future__ import annotations

import threading
import time

from ecdysis.models.base import ModelBackend
from ecdysis.records import Completion, CompletionRequest
from ecdysis.store import Store


class ModelGateway:
    """Cache first (an identical request is free and reproducible), then the backend, at most
    `backend.max_concurrency` calls at once. Errors are never cached."""

    def __init__(self, backend: ModelBackend, store: Store | None, *, use_cache: bool = True) -> None:
        self.backend = backend
        self.store = store
        self.use_cache = use_cache and store is not None
        self._slots = threading.BoundedSemaphore(max(1, backend.max_concurrency))

    @property
    def model_id(self) -> str:
        return self.backend.model_id

    def complete(self, request: CompletionRequest) -> Completion:
        key = request.cache_key(self.backend.model_id)
        if self.use_cache:
            start = time.perf_counter()
            hit = self.store.cache_get(key)  # type: ignore[union-attr]
            if hit is not None:
                hit.cache_hit = True
                hit.latency_s = time.perf_counter() - start
                return hit
        with self._slots:
            completion = self.backend.complete(request)
        completion.cache_hit = False
        if self.use_cache:
            self.store.cache_put(key, self.backend.model_id, request.to_json(), completion)  # type: ignore[union-attr]
        return completion

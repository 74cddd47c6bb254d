"""What a job may spend on models, and what it has spent: calls, tokens and model seconds.

Two ways to count a cached answer:
- `charge_cached=False` (the default for users): a cache hit is free, as it costs nothing here.
- `charge_cached=True` (strategy benchmarks that share one cache): a hit is charged as the call
  it replays, with the latency recorded when it was made, so no strategy rides for free on the
  calls another one paid for."""

from __future__ import annotations

import threading
import time

from ecdysis.errors import BudgetExceeded
from ecdysis.records import Completion


class CallBudget:
    """Shared limits on model calls and tokens across everything one job runs (thread-safe).
    `None` means unlimited."""

    def __init__(self, max_calls: int | None = None, max_tokens: int | None = None,
                 deadline: float | None = None, *, charge_cached: bool = False) -> None:
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.deadline = deadline
        self.charge_cached = charge_cached
        self.calls = 0
        self.tokens = 0
        self.seconds = 0.0  # model seconds charged: each call's (recorded) latency
        self._lock = threading.Lock()

    def check(self) -> None:
        if (limit := self.spent_limit()) is not None:
            raise BudgetExceeded({"calls": f"model-call budget of {self.max_calls} spent",
                                  "tokens": f"token budget of {self.max_tokens} spent",
                                  "wall": "wall-time budget spent"}[limit], limit=limit)

    def spent_limit(self) -> str | None:
        """Which limit is used up ("calls", "tokens", "wall"), or None while there is room."""
        with self._lock:
            if self.max_calls is not None and self.calls >= self.max_calls:
                return "calls"
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                return "tokens"
            if self.deadline is not None and time.time() >= self.deadline:
                return "wall"
            return None

    def charge(self, calls: int, tokens: int, seconds: float = 0.0) -> None:
        with self._lock:
            self.calls += calls
            self.tokens += tokens
            self.seconds += seconds

    def charge_block(self, calls: int, tokens: int, seconds: float) -> None:
        """Calls made elsewhere and reused whole (a finished run another strategy of a benchmark
        made), charged as if they were made here one by one: when the call budget runs out inside
        the block, only what fits is charged (tokens and seconds in proportion) and BudgetExceeded
        is raised, because a run cut off in the middle has no result to use."""
        self.check()
        with self._lock:
            room = calls if self.max_calls is None else min(calls, self.max_calls - self.calls)
            whole = room == calls
            self.calls += room
            self.tokens += tokens if whole else round(tokens * room / calls)
            self.seconds += seconds if whole else seconds * room / calls
        if not whole:
            raise BudgetExceeded(f"model-call budget of {self.max_calls} spent: a reused run of {calls} calls "
                                 f"does not fit in the {room} left")

    def charge_completion(self, completion: Completion) -> None:
        """One call, by this budget's rule for cached answers."""
        if completion.cache_hit and not self.charge_cached:
            return
        latency = completion.recorded_latency_s if completion.cache_hit else completion.latency_s
        self.charge(1, completion.prompt_tokens + completion.completion_tokens, latency)

    @property
    def exhausted(self) -> bool:
        return self.spent_limit() is not None

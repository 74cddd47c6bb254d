"""What a job may spend on models, and what it has spent: calls, tokens and model seconds.

Two ways to count a cached answer:
- `charge_cached=False` (the default for users): a cache hit is free, as it costs nothing here.
- `charge_cached=True` (strategy benchmarks that share one cache): a hit is charged as the call
  it replays, with the latency recorded when it was made, so no strategy rides for free on the
  calls another one paid for. A hit on a request this budget has already paid for is free: a
  strategy with a cache of its own would find it there. So each strategy pays what it would pay
  alone with an empty cache, no more (a change that only reads replies differently re-asks its
  parent's requests, and pays for none of them)."""

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
        # The requests charged (charge_cached only), by `_short` key: saved with every save of a
        # long job, where whole keys made up most of a benchmark evolution's stored record.
        self._paid: set[str] = set()
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

    def charge_block(self, calls: int, tokens: int, seconds: float, keys: "set[str] | None" = None) -> None:
        """Calls made elsewhere and reused whole (a finished run another strategy of a benchmark
        made), charged as if they were made here one by one: when the call budget runs out inside
        the block, only what fits is charged (tokens and seconds in proportion) and BudgetExceeded
        is raised, because a run cut off in the middle has no result to use. `keys`, the requests of
        a block charged whole, are paid for from then on (`charge_cached`). A block of no calls (all
        paid for already) costs nothing, so a spent budget does not refuse it."""
        if calls:
            self.check()
        with self._lock:
            room = calls if self.max_calls is None else min(calls, self.max_calls - self.calls)
            whole = room == calls
            self.calls += room
            self.tokens += tokens if whole else round(tokens * room / calls)
            self.seconds += seconds if whole else seconds * room / calls
            if whole and keys and self.charge_cached:
                self._paid.update(map(_short, keys))
        if not whole:
            raise BudgetExceeded(f"model-call budget of {self.max_calls} spent: a reused run of {calls} calls "
                                 f"does not fit in the {room} left")

    def charge_completion(self, completion: Completion, key: str | None = None) -> None:
        """One call, by this budget's rule for cached answers; `key` is its request's cache key."""
        if completion.cache_hit and not self.charge_cached:
            return
        latency = completion.recorded_latency_s if completion.cache_hit else completion.latency_s
        with self._lock:  # the key and its charge together, so a snapshot never holds one alone
            if self.charge_cached and key is not None:
                if completion.cache_hit and _short(key) in self._paid:
                    return
                self._paid.add(_short(key))
            self.calls += 1
            self.tokens += completion.prompt_tokens + completion.completion_tokens
            self.seconds += latency

    def paid_for(self, key: str) -> bool:
        """Whether a cached answer to this request would be free (`charge_cached` only: without
        it every cached answer is)."""
        with self._lock:
            return _short(key) in self._paid

    def mark_paid(self, keys: "set[str] | list[str]") -> None:
        """Requests paid for on this budget's account outside `charge_completion`: a reused run it
        was charged for as a block, or what an earlier process of the same job paid for."""
        if self.charge_cached:
            with self._lock:
                self._paid.update(map(_short, keys))

    def snapshot(self) -> tuple[int, int, float, list[str]]:
        """Calls, tokens, model seconds and the paid requests' (`_short`) keys, sorted, read together."""
        with self._lock:
            return self.calls, self.tokens, self.seconds, sorted(self._paid)

    @property
    def exhausted(self) -> bool:
        return self.spent_limit() is not None


def _short(key: str) -> str:
    """The first 64 bits of a cache key (a SHA-256 in hex): among the thousands of requests one
    job makes, two share them with a chance of about one in 10^11."""
    return key[:16]

"""Engine-owned retries for remote backends: exponential backoff with full jitter that honours the
server's Retry-After. The registry wraps every remote backend in `with_retries`; the SDKs retry 0 times."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping

from ecdysis.errors import ModelError
from ecdysis.models.base import ModelBackend
from ecdysis.records import Completion, CompletionRequest

# Request timeout, lock conflict and rate limit are worth another try; so is every 5xx, which
# includes Anthropic's 529 "overloaded".
_RETRYABLE_4XX = frozenset({408, 409, 429})

_STATUS_KINDS: dict[int, str] = {401: "auth", 403: "auth", 404: "not_found", 408: "timeout",
                                 409: "conflict", 429: "rate_limit", 529: "overloaded"}


def is_retryable_status(status: int) -> bool:
    return status in _RETRYABLE_4XX or status >= 500


def status_kind(status: int) -> str:
    """The `ModelError.kind` for an HTTP error status."""
    if status in _STATUS_KINDS:
        return _STATUS_KINDS[status]
    return "server_error" if status >= 500 else "bad_request"


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, `retry-after` in seconds, or
    `retry-after` as an HTTP date. None when absent or unreadable (then backoff alone decides)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = _as_float(lowered.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _as_float(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _as_float(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    # A negative, infinite or NaN wait is a broken header, not an instruction.
    return value if value is not None and 0.0 <= value < float("inf") else None


class RetryingBackend:
    """A `ModelBackend` that retries only retryable `ModelError`s of the backend it wraps.

    Attempt n (1-based) that fails waits `uniform(0, min(max_delay, base_delay * 2**(n-1)))`
    ("full jitter", so parallel workers hit by the same outage do not retry in lockstep), and at
    least the server's `retry_after`, itself capped by `max_delay` so one header cannot stall a run.
    After `max_retries + 1` attempts the last error is raised again with the attempt count."""

    def __init__(self, backend: ModelBackend, *, max_retries: int, base_delay: float = 0.5,
                 max_delay: float = 20.0, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.backend = backend
        self.model_id = backend.model_id
        self.max_concurrency = backend.max_concurrency
        self.deterministic = backend.deterministic
        self.scores_options = bool(getattr(backend, "scores_options", False))
        self.max_retries = max_retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._sleep = sleep
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"with_retries({self.backend!r}, max_retries={self.max_retries})"

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        wait = self._rng.uniform(0.0, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_delay))
        return wait

    def complete(self, request: CompletionRequest) -> Completion:
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return self.backend.complete(request)
            except ModelError as exc:
                if not exc.retryable:
                    raise
                if attempt == attempts:
                    raise _exhausted(exc, attempts) from exc
                self._sleep(self.delay(attempt, exc.retry_after))
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def close(self) -> None:
        self.backend.close()


def _exhausted(last: ModelError, attempts: int) -> ModelError:
    # Same kind and flags as the last failure, so callers can still tell a rate limit from an
    # outage; the message says that retrying already happened.
    return ModelError(f"{last.message} (gave up after {attempts} attempts)", kind=last.kind,
                      retryable=last.retryable, retry_after=last.retry_after, hint=last.hint)


def with_retries(backend: ModelBackend, *, max_retries: int, base_delay: float = 0.5,
                 max_delay: float = 20.0, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> ModelBackend:
    """Wrap `backend` so transient faults are retried; see `RetryingBackend`."""
    return RetryingBackend(backend, max_retries=max_retries, base_delay=base_delay,
                           max_delay=max_delay, sleep=sleep, rng=rng)

"""Typed errors for systemic faults. A failed instance is data (see `records.InstanceResult`),
never one of these; the CLI and the pages turn these into one clear message."""

from __future__ import annotations


class EcdysisError(Exception):
    """Base for every error the engine raises on purpose. `hint` says how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(EcdysisError):
    """A setting, model name or key is missing or wrong."""


class InputError(EcdysisError):
    """A user-supplied file (suite, harness, archive) is malformed; names file and line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        where = path if path else ""
        if path and line is not None:
            where = f"{path}:{line}"
        super().__init__(f"{where}: {message}" if where else message, hint)
        self.path = path
        self.line = line


class NotFound(EcdysisError):
    """A run, suite, harness version or other stored object does not exist."""


class ModelError(EcdysisError):
    """A model backend failed after its retries (rate limit, transient error, timeout)."""

    def __init__(self, message: str, *, kind: str = "model_error", retryable: bool = False,
                 retry_after: float | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after


class ExecutorError(EcdysisError):
    """The executor could not run the batch: a cluster that cannot be reached, a worker that died.
    What finished is stored; resuming the run does the rest."""


class BudgetExceeded(EcdysisError):
    """A call, token or wall-time budget ran out; the work stopped cleanly and can resume.
    `limit` names which one ("calls", "tokens" or "wall"), so a face can say what to raise."""

    # Each limit: how a message names its budget, and the CLI flag that raises it.
    NAMES = {"calls": "model-call", "tokens": "token", "wall": "wall-time"}
    FLAGS = {"calls": "--max-model-calls N", "tokens": "--max-tokens N", "wall": "--max-wall SECONDS"}

    def __init__(self, message: str, *, limit: str = "calls", hint: str | None = None) -> None:
        if limit not in self.NAMES:
            raise ValueError(f"unknown budget limit {limit!r}")
        super().__init__(message, hint)
        self.limit = limit


class Cancelled(EcdysisError):
    """The job was cancelled through its flag in the store."""


class Conflict(EcdysisError):
    """Another process got there first: the proposal was decided meanwhile, or the run, evolution
    or diagnosis is being executed elsewhere (its lease is held). Nothing was changed."""

"""The executor seam: where the instances of a batch run — threads of this process (`local`, the
default) or workers of a Ray cluster (`ray`). The runner keeps the bookkeeping (what is left, the
events, the summary); an executor only runs instances and stores their results.

Adding an executor is one module and one line in `_FACTORIES`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ecdysis.errors import ConfigError
from ecdysis.models.base import ModelBackend
from ecdysis.records import Instance, InstanceResult, RunRecord, ScorerSpec
from ecdysis.sandbox import SandboxLimits
from ecdysis.settings import Settings
from ecdysis.store import HarnessVersion, Store

if TYPE_CHECKING:
    from ecdysis.budget import CallBudget

OnResult = Callable[[InstanceResult], None]
ShouldStop = Callable[[], "str | None"]


@dataclass
class Batch:
    """One run's work, both as live objects (the store, the backend) for an executor that runs
    instances in this process and as plain data (the run's model name, the harness files, the
    scorer, the limits) for one that rebuilds them in other processes."""

    run: RunRecord
    scorer: ScorerSpec
    harness: HarnessVersion
    backend: ModelBackend
    store: Store
    limits: SandboxLimits
    use_cache: bool = True
    budget: "CallBudget | None" = None

    @property
    def concurrency(self) -> int:
        return max(1, self.run.concurrency)


class Executor(Protocol):
    """Contract:

    - `run(batch, todo, on_result=, should_stop=)` runs each instance of `todo` once, at most
      `batch.concurrency` at a time, with `ecdysis.runner.InstanceRunner` (harness sandbox, model
      calls through the cache, scoring) in whichever process it picks.
    - Each result is stored in `batch.store`'s database before `on_result(result)` is called for
      it, always in the thread that called `run`, so progress never runs ahead of what is stored.
    - `should_stop()` is asked before each instance starts. Once it returns a reason
      ("cancelled", "budget") no further instance starts, the running ones finish, and `run`
      returns that reason; after a complete batch it returns None.
    - `batch.budget` is charged for every call that was not a cache hit, wherever it ran.
    - A failing instance is data (an `InstanceResult` with `error_type`), never an exception.
      `run` raises only for systemic faults: `ConfigError` when the executor cannot start,
      `ExecutorError` when it loses its workers, a store error when results cannot be written.
    """

    name: str

    def run(self, batch: Batch, todo: list[Instance], *, on_result: OnResult,
            should_stop: ShouldStop) -> str | None: ...


def _local(settings: Settings, database_url: str | None) -> Executor:
    from ecdysis.executors.local import LocalExecutor
    return LocalExecutor()


def _ray(settings: Settings, database_url: str | None) -> Executor:
    from ecdysis.executors.ray_executor import RayExecutor
    return RayExecutor(settings, database_url=database_url or settings.database_url)


_FACTORIES: dict[str, Callable[[Settings, "str | None"], Executor]] = {
    "local": _local,
    "ray": _ray,
}


def executor_names() -> list[str]:
    return list(_FACTORIES)


def create_executor(name: str | None, settings: Settings, *, database_url: str | None = None) -> Executor:
    """The executor called `name` (None: the `executor` setting). `database_url` is where
    workers in other processes open the store (default: the `database_url` setting)."""
    chosen = (name or settings.executor or "local").strip().lower()
    factory = _FACTORIES.get(chosen)
    if factory is None:
        raise ConfigError(f"unknown executor {chosen!r}",
                          hint=f"use {' or '.join(_FACTORIES)} (--executor or ECDYSIS_EXECUTOR)")
    return factory(settings, database_url)

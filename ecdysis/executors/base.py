"""What an executor is: the `Batch` it is given and the `Executor` contract it keeps (see
`ecdysis.executors` for the ones there are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ecdysis.models.base import ModelBackend
from ecdysis.records import Instance, InstanceResult, RunRecord, ScorerSpec
from ecdysis.sandbox import SandboxLimits
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
      `batch.concurrency` at a time, with `ecdysis.executors.instance.InstanceRunner` (harness sandbox, model
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

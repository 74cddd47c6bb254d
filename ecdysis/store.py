"""The persistence seam. The engine talks to storage only through `Store`; `storage/` implements it
(SQLModel over SQLite or PostgreSQL). Every write is durable when the method returns, so a process
killed mid-batch loses nothing that was reported finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ecdysis.records import Completion, InstanceResult, RunRecord, Suite


@dataclass
class HarnessVersion:
    """A content-addressed harness: `id` is derived from the files, so equal files share an id."""

    id: str
    files: dict[str, str]
    parent: str | None = None
    note: str = ""
    created_at: float = 0.0
    status: str = "candidate"  # candidate | accepted | rolled_back | rejected | imported | starter
    metrics: dict[str, Any] = field(default_factory=dict)


class Store(Protocol):
    """Contract for every storage backend.

    - Methods are safe to call from several threads and several processes at once.
    - `save_result` is idempotent per (run_id, instance_id): a second save replaces the first,
      so a resumed run never duplicates rows.
    - The model-call cache never holds an error: only `Completion`s are put.
    - Getters return None (or an empty list) for unknown ids; they never raise for absence.
    """

    # suites imported by users (built-in suites are generated, not stored)
    def save_suite(self, suite: Suite) -> None: ...
    def get_suite(self, name: str) -> Suite | None: ...
    def list_suites(self) -> list[Suite]: ...

    # harness versions
    def put_harness(self, version: HarnessVersion) -> HarnessVersion: ...
    def get_harness(self, version_id: str) -> HarnessVersion | None: ...
    def list_harnesses(self) -> list[HarnessVersion]: ...
    def update_harness(self, version_id: str, *, status: str | None = None,
                       metrics: dict[str, Any] | None = None) -> None: ...

    # runs and their per-instance results (trajectories)
    def create_run(self, run: RunRecord) -> None: ...
    def update_run(self, run: RunRecord) -> None: ...
    def get_run(self, run_id: str) -> RunRecord | None: ...
    def list_runs(self, limit: int = 100) -> list[RunRecord]: ...
    def save_result(self, result: InstanceResult) -> None: ...
    def get_results(self, run_id: str) -> list[InstanceResult]: ...
    def done_instance_ids(self, run_id: str) -> set[str]: ...

    # persistent response cache
    def cache_get(self, key: str) -> Completion | None: ...
    def cache_put(self, key: str, model: str, request: dict[str, Any],
                  completion: Completion) -> None: ...

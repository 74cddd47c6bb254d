"""The persistence seam. The engine talks to storage only through `Store`; `storage/` implements it
(SQLModel over SQLite or PostgreSQL). Every write is durable when the method returns, so a process
killed mid-batch loses nothing that was reported finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ecdysis.evolution_log import EvolutionOutcome, IterationRow, VersionMetrics
from ecdysis.records import Completion, InstanceResult, RunRecord, Suite


@dataclass
class HarnessVersion:
    """A content-addressed harness: `id` is derived from the files, so equal files share an id."""

    id: str
    files: dict[str, str]
    parent: str | None = None
    note: str = ""
    created_at: float = 0.0
    status: str = "candidate"  # candidate | kept | rolled_back | rejected | imported | starter
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> VersionMetrics:
        """`metrics` as a typed record (what readers use; the engine writes `metrics`)."""
        return VersionMetrics.parse(self.metrics)


JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
DecisionKind = Literal["approve", "edit", "reject"]


@dataclass
class JobRecord:
    """Background work (a batch, a diagnosis, an evolution) whose state lives in the store, so a
    page refresh or a second process sees it and a Stop button works through `cancel_requested`."""

    id: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    status: JobStatus = "queued"
    done: int = 0
    total: int = 0
    message: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    cancel_requested: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass
class DiagnosisRecord:
    """One stored `ecdysis diagnose` report (clusters + proposals) over the runs it read."""

    id: str
    run_ids: list[str]
    harness_version: str
    report: dict[str, Any]
    created_at: float = 0.0


@dataclass
class ProposalRecord:
    """A proposed harness modification awaiting (or past) the human gate."""

    id: str
    diagnosis_id: str
    cluster_id: str
    harness_version: str          # the version the patch applies to
    spec: dict[str, Any]
    files: dict[str, str]         # the full patched files (only those that change)
    status: str = "pending"       # see ecdysis.lifecycle: pending | approved | edited | rejected | applied | superseded
    data: dict[str, Any] = field(default_factory=dict)  # diffs, transcript, critic verdict
    created_at: float = 0.0


@dataclass
class DecisionRecord:
    """Who decided what about a proposal, when, and the files exactly as applied."""

    proposal_id: str
    decision: DecisionKind
    who: str
    reason: str = ""
    files_as_applied: dict[str, str] | None = None
    at: float = 0.0
    id: int | None = None


@dataclass
class EvolutionRecord:
    """An evolution run: its configuration, a row per finished iteration, and the outcome."""

    id: str
    strategy: str
    suite: str
    models: list[str]
    config: dict[str, Any]
    status: str = "running"       # running | waiting | done | failed | stopped
    base_version: str = ""
    current_version: str = ""
    iterations: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0

    # The engine keeps `iterations` and `result` as JSON it can resume from; readers take them
    # typed (`ecdysis.evolution_log`).
    @property
    def rows(self) -> list[IterationRow]:
        return [IterationRow.parse(r) for r in self.iterations]

    @property
    def outcome(self) -> EvolutionOutcome:
        return EvolutionOutcome.parse(self.result)


@dataclass
class Lease:
    """Who executes a run, evolution or diagnosis (`key`) right now, until `expires_at` unless the
    holder renews it (`ecdysis.leases`)."""

    key: str
    owner: str
    acquired_at: float = 0.0
    heartbeat_at: float = 0.0
    expires_at: float = 0.0

    def live(self, now: float) -> bool:
        return self.expires_at > now


class Store(Protocol):
    """Contract for every storage backend.

    - Methods are safe to call from several threads and several processes at once.
    - `save_result` is idempotent per (run_id, instance_id): a second save replaces the first,
      so a resumed run never duplicates rows. `save_results` saves several in one transaction
      (all or none): the runner's writer commits whatever finished meanwhile as one group.
    - The model-call cache never holds an error: only `Completion`s are put.
    - Getters return None (or an empty list) for unknown ids; they never raise for absence.
    - `save_report` stores a diagnosis with its proposals in one transaction (all or none).
    - `decide_proposal` moves a pending proposal to its decided status and appends the decision
      in one transaction; if the proposal is no longer pending it changes nothing and raises
      `Conflict`, so two reviewers deciding at once get one decision stored, not two.
    - `acquire_lease` takes `key` for `owner` when it is free, expired or already the owner's,
      in one statement, else raises `Conflict` naming the holder; `renew_lease` extends it and
      says False when the owner lost it; `release_lease` gives it up.
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
    def save_results(self, results: list[InstanceResult]) -> None: ...
    def get_results(self, run_id: str) -> list[InstanceResult]: ...
    def done_instance_ids(self, run_id: str) -> set[str]: ...

    # persistent response cache
    def cache_get(self, key: str) -> Completion | None: ...
    def cache_put(self, key: str, model: str, request: dict[str, Any],
                  completion: Completion) -> None: ...

    # background jobs
    def create_job(self, job: JobRecord) -> None: ...
    def update_job(self, job_id: str, **changes: Any) -> None: ...
    def get_job(self, job_id: str) -> JobRecord | None: ...
    def list_jobs(self, limit: int = 50) -> list[JobRecord]: ...

    # diagnoses, proposals and the human decisions on them
    def save_diagnosis(self, diagnosis: DiagnosisRecord) -> None: ...
    def get_diagnosis(self, diagnosis_id: str) -> DiagnosisRecord | None: ...
    def list_diagnoses(self, limit: int = 50) -> list[DiagnosisRecord]: ...
    def save_proposal(self, proposal: ProposalRecord) -> None: ...
    def save_report(self, diagnosis: DiagnosisRecord, proposals: list[ProposalRecord]) -> None: ...
    def get_proposal(self, proposal_id: str) -> ProposalRecord | None: ...
    def list_proposals(self, *, diagnosis_id: str | None = None,
                       status: str | None = None) -> list[ProposalRecord]: ...
    def set_proposal_status(self, proposal_id: str, status: str) -> None: ...
    def save_decision(self, decision: DecisionRecord) -> DecisionRecord: ...
    def decide_proposal(self, decision: DecisionRecord, status: str) -> DecisionRecord: ...
    def list_decisions(self, proposal_id: str | None = None) -> list[DecisionRecord]: ...

    # evolutions
    def save_evolution(self, evolution: EvolutionRecord) -> None: ...
    def get_evolution(self, evolution_id: str) -> EvolutionRecord | None: ...
    def list_evolutions(self, limit: int = 50) -> list[EvolutionRecord]: ...

    # leases: one executor per run, evolution and diagnosis
    def acquire_lease(self, key: str, owner: str, ttl_s: float) -> Lease: ...
    def renew_lease(self, key: str, owner: str, ttl_s: float) -> bool: ...
    def release_lease(self, key: str, owner: str) -> None: ...
    def list_leases(self) -> list[Lease]: ...

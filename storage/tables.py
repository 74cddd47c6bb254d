"""The stored shape of the engine's records: one SQLModel table per purpose, created and changed
only by `storage.migrations`; `storage.sql_store` converts rows to and from `ecdysis` dataclasses.

Model calls live in a child table `model_call` keyed by (run_id, instance_id, seq), not in a JSON
column of `instance_result`: later stages (failures, budgets, reports) count calls, cache hits,
errors and tokens per model in plain SQL and can point at one call of a trajectory, the same way on
SQLite and PostgreSQL. The price is that `save_result` replaces the calls with the row, in one
transaction, and `get_results` reads a run's calls with one extra query.

Structured values are JSON columns (never pickle). Timestamps are Unix seconds, as in the records.
A diagnosis keeps its failures, clusters and role messages inside its JSON report, as the engine
hands it over; a stage that needs to query them gets its own table here, created by a new
migration, referencing `run.id`, `harness_version.id` or (`instance_result.run_id`,
`instance_result.instance_id`)."""

from typing import Any

from sqlalchemy import JSON, ForeignKeyConstraint
from sqlmodel import Field, SQLModel


class SuiteRow(SQLModel, table=True):
    """A user-imported suite; instances and scorer as JSON (a suite is read whole, never queried)."""

    __tablename__ = "suite"

    name: str = Field(primary_key=True)
    instances: list[dict[str, Any]] = Field(default_factory=list, sa_type=JSON)
    scorer: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    description: str = ""
    source: str = "builtin"


class HarnessVersionRow(SQLModel, table=True):
    """A content-addressed harness version; `parent` links the lineage tree."""

    __tablename__ = "harness_version"

    id: str = Field(primary_key=True)
    parent: str | None = Field(default=None, foreign_key="harness_version.id", index=True)
    files: dict[str, str] = Field(default_factory=dict, sa_type=JSON)
    note: str = ""
    status: str = Field(default="candidate", index=True)
    metrics: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: float = Field(default=0.0, index=True)


class RunRow(SQLModel, table=True):
    """One batch of one harness on one model over chosen instances of a suite.

    `suite` and `harness_version` are plain columns, not foreign keys: built-in suites are generated,
    never stored, and the runner accepts any `HarnessVersion` object, stored or not."""

    __tablename__ = "run"

    id: str = Field(primary_key=True)
    suite: str = Field(index=True)
    model: str = Field(index=True)
    harness_version: str = Field(index=True)
    split: str
    instance_ids: list[str] = Field(default_factory=list, sa_type=JSON)
    concurrency: int = 1
    status: str = Field(default="pending", index=True)
    created_at: float = Field(default=0.0, index=True)
    finished_at: float | None = None
    summary: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    error: str | None = None
    label: str = ""


class InstanceResultRow(SQLModel, table=True):
    """The scored outcome of one instance in one run (its trajectory is its `model_call` rows).

    Token and call totals are copied from the calls so aggregates need no join."""

    __tablename__ = "instance_result"

    run_id: str = Field(primary_key=True, foreign_key="run.id", ondelete="CASCADE")
    instance_id: str = Field(primary_key=True)
    category: str = Field(index=True)
    model: str = Field(index=True)
    answer: str | None = None
    target: str = ""
    correct: bool = Field(default=False, index=True)
    score: float = 0.0
    error_type: str | None = Field(default=None, index=True)
    error_message: str | None = None
    stdout_tail: str = ""
    wall_seconds: float = 0.0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    saved_at: float = 0.0


class ModelCallRow(SQLModel, table=True):
    """One model call of a trajectory, in harness order (`seq`)."""

    __tablename__ = "model_call"
    __table_args__ = (
        ForeignKeyConstraint(["run_id", "instance_id"],
                             ["instance_result.run_id", "instance_result.instance_id"],
                             ondelete="CASCADE"),
    )

    run_id: str = Field(primary_key=True)
    instance_id: str = Field(primary_key=True)
    seq: int = Field(primary_key=True)
    model: str = Field(index=True)
    request: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str = "stop"
    cache_hit: bool = False
    error: str | None = None
    option_logprobs: list[float] | None = Field(default=None, sa_type=JSON)  # a scoring call's scores


class CacheEntryRow(SQLModel, table=True):
    """A successful completion keyed by `CompletionRequest.cache_key`; errors are never stored."""

    __tablename__ = "cache_entry"

    key: str = Field(primary_key=True)
    model: str = Field(index=True)
    request: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    response: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: float = 0.0


class SchemaMigrationRow(SQLModel, table=True):
    """The ledger of `storage.migrations`: one row per migration applied to this database."""

    __tablename__ = "schema_migrations"

    name: str = Field(primary_key=True)
    applied_at: float = 0.0


class JobRow(SQLModel, table=True):
    """Background work whose progress and cancel flag other processes read (`ecdysis.jobs`)."""

    __tablename__ = "job"

    id: str = Field(primary_key=True)
    kind: str = Field(index=True)
    params: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    status: str = Field(default="queued", index=True)
    done: int = 0
    total: int = 0
    message: str = ""
    result: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    error: str | None = None
    cancel_requested: bool = False
    created_at: float = Field(default=0.0, index=True)
    updated_at: float = 0.0


class DiagnosisRow(SQLModel, table=True):
    """One diagnosis report over some runs: failures, clusters and role transcripts, as JSON."""

    __tablename__ = "diagnosis"

    id: str = Field(primary_key=True)
    run_ids: list[str] = Field(default_factory=list, sa_type=JSON)
    harness_version: str = Field(index=True)
    report: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: float = Field(default=0.0, index=True)


class ProposalRow(SQLModel, table=True):
    """A proposed harness change and where it stands at the human gate.

    `seq` numbers proposals in the order they were first saved, which is the priority order the
    evolution applies them in (a report's proposals share one `created_at`). `diagnosis_id` is not a
    foreign key: a diagnosis and its proposals are saved by separate calls, in no promised order."""

    __tablename__ = "proposal"

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True, index=True)
    diagnosis_id: str = Field(index=True)
    cluster_id: str = ""
    harness_version: str = Field(index=True)
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    files: dict[str, str] = Field(default_factory=dict, sa_type=JSON)
    status: str = Field(default="pending", index=True)
    data: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: float = 0.0


class DecisionRow(SQLModel, table=True):
    """One human (or auto) decision on a proposal; append-only, so the history of a proposal stays."""

    __tablename__ = "decision"

    id: int | None = Field(default=None, primary_key=True)
    proposal_id: str = Field(index=True)
    decision: str
    who: str
    reason: str = ""
    files_as_applied: dict[str, str] | None = Field(default=None, sa_type=JSON)
    at: float = Field(default=0.0, index=True)


class EvolutionRow(SQLModel, table=True):
    """An evolution: configuration, one JSON entry per finished iteration, cursor and outcome."""

    __tablename__ = "evolution"

    id: str = Field(primary_key=True)
    strategy: str = Field(index=True)
    suite: str
    models: list[str] = Field(default_factory=list, sa_type=JSON)
    config: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    status: str = Field(default="running", index=True)
    base_version: str = ""
    current_version: str = ""
    iterations: list[dict[str, Any]] = Field(default_factory=list, sa_type=JSON)
    result: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: float = Field(default=0.0, index=True)
    updated_at: float = 0.0


class LeaseRow(SQLModel, table=True):
    """Who is executing a run, an evolution or a diagnosis right now (`ecdysis.leases`): the holder
    renews `expires_at` while it works; a holder that died stops renewing and its lease lapses."""

    __tablename__ = "lease"

    key: str = Field(primary_key=True)          # "run:ID", "evolution:ID", "diagnosis:RUN,RUN"
    owner: str
    acquired_at: float = 0.0
    heartbeat_at: float = 0.0
    expires_at: float = Field(default=0.0, index=True)

"""`SQLStore`, the `ecdysis.store.Store` of every face: each method opens one session and calls a
data function below, which converts `storage.tables` rows to and from the `ecdysis` records.

Data functions are keyword-only and take the session, so a later module can combine several in
one transaction (`with store.writing() as session: ...`)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import fields
from typing import Any, cast

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, CursorResult, Engine
from sqlalchemy.sql.dml import Insert
from sqlalchemy.orm import Mapped
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, SQLModel, col

from ecdysis.errors import ConfigError, Conflict, EcdysisError, NotFound
from ecdysis.records import (Completion, ErrorType, Instance, InstanceResult, ModelCall, RunRecord,
                             RunStatus, ScorerSpec, Split, Suite)
from ecdysis.settings import redact_credentials
from ecdysis.store import (DecisionKind, DecisionRecord, DiagnosisRecord, EvolutionRecord, HarnessVersion,
                           JobRecord, JobStatus, Lease, ProposalRecord)
from storage.db import read_only
from storage.migrations import table_of
from storage.tables import (CacheEntryRow, DecisionRow, DiagnosisRow, EvolutionRow, HarnessVersionRow,
                            InstanceResultRow, JobRow, LeaseRow, ModelCallRow, ProposalRow, RunRow, SuiteRow)

# Upserts need INSERT ... ON CONFLICT, which these two speak alike.
SUPPORTED_DIALECTS = ("sqlite", "postgresql")


class SQLStore:
    """`Store` over one SQLAlchemy engine: one session per call, so threads may share an instance
    and processes may each open their own on the same database."""

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigError(f"the store supports SQLite and PostgreSQL, not {engine.dialect.name}",
                              hint="set ECDYSIS_DATABASE_URL to sqlite:///PATH or "
                                   "postgresql+psycopg2://USER@HOST/DB")
        self.engine = engine
        self._reader = read_only(engine)
        # An in-memory database is one shared connection: sessions must take turns on it.
        self._turns: AbstractContextManager[Any] = (
            threading.RLock() if isinstance(engine.pool, StaticPool) else nullcontext())
        # SQLite has one writer at a time, and its busy handler makes a waiting writer sleep in
        # growing steps (up to 100 ms) while the lock may already be free: with dozens of runner
        # threads saving results that multiplied each save's time. Threads of this process queue
        # here instead; the busy timeout is left to arbitrate between processes.
        self._write_turns: AbstractContextManager[Any] = (
            threading.RLock() if engine.dialect.name == "sqlite" else nullcontext())

    @property
    def url(self) -> str:
        """The database URL, password included: what another process (a Ray worker) opens to
        reach this same database."""
        return self.engine.url.render_as_string(hide_password=False)

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A session in one write transaction, committed on exit (SQLite: BEGIN IMMEDIATE)."""
        with self._turns, self._write_turns, Session(self.engine, expire_on_commit=False) as session, \
                session.begin():
            yield session

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A Core connection in one write transaction, for the hot write path (saving results):
        half the CPU of an ORM session, which the runner pays once per group of results."""
        with self._turns, self._write_turns, self.engine.begin() as conn:
            yield conn

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A session that only reads; on SQLite it neither waits for nor blocks writers."""
        with self._turns, Session(self._reader) as session:
            yield session

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # suites
    def save_suite(self, suite: Suite) -> None:
        with self.writing() as session:
            upsert_suite(session=session, suite=suite)

    def get_suite(self, name: str) -> Suite | None:
        with self.reading() as session:
            return read_suite(session=session, name=name)

    def list_suites(self) -> list[Suite]:
        with self.reading() as session:
            return read_suites(session=session)

    # harness versions
    def put_harness(self, version: HarnessVersion) -> HarnessVersion:
        with self.writing() as session:
            return insert_harness(session=session, version=version)

    def get_harness(self, version_id: str) -> HarnessVersion | None:
        with self.reading() as session:
            return read_harness(session=session, version_id=version_id)

    def list_harnesses(self) -> list[HarnessVersion]:
        with self.reading() as session:
            return read_harnesses(session=session)

    def update_harness(self, version_id: str, *, status: str | None = None,
                       metrics: dict[str, Any] | None = None) -> None:
        with self.writing() as session:
            change_harness(session=session, version_id=version_id, status=status, metrics=metrics)

    # runs and results
    def create_run(self, run: RunRecord) -> None:
        with self.writing() as session:
            insert_run(session=session, run=run)

    def update_run(self, run: RunRecord) -> None:
        with self.writing() as session:
            replace_run(session=session, run=run)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self.reading() as session:
            return read_run(session=session, run_id=run_id)

    def list_runs(self, limit: int = 100) -> list[RunRecord]:
        with self.reading() as session:
            return read_runs(session=session, limit=limit)

    def save_result(self, result: InstanceResult) -> None:
        self.save_results([result])

    def save_results(self, results: list[InstanceResult]) -> None:
        with self.connection() as conn:
            upsert_results(session=conn, results=results)

    def get_results(self, run_id: str) -> list[InstanceResult]:
        with self.reading() as session:
            return read_results(session=session, run_id=run_id)

    def done_instance_ids(self, run_id: str) -> set[str]:
        with self.reading() as session:
            return read_done_instance_ids(session=session, run_id=run_id)

    # response cache
    def cache_get(self, key: str) -> Completion | None:
        with self.reading() as session:
            return read_cache(session=session, key=key)

    def cache_put(self, key: str, model: str, request: dict[str, Any], completion: Completion) -> None:
        with self.writing() as session:
            insert_cache(session=session, key=key, model=model, request=request, completion=completion)

    # background jobs
    def create_job(self, job: JobRecord) -> None:
        with self.writing() as session:
            insert_job(session=session, job=job)

    def update_job(self, job_id: str, **changes: Any) -> None:
        with self.writing() as session:
            change_job(session=session, job_id=job_id, changes=changes)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self.reading() as session:
            return read_job(session=session, job_id=job_id)

    def list_jobs(self, limit: int = 50) -> list[JobRecord]:
        with self.reading() as session:
            return read_jobs(session=session, limit=limit)

    # diagnoses, proposals and decisions
    def save_diagnosis(self, diagnosis: DiagnosisRecord) -> None:
        with self.writing() as session:
            upsert_diagnosis(session=session, diagnosis=diagnosis)

    def get_diagnosis(self, diagnosis_id: str) -> DiagnosisRecord | None:
        with self.reading() as session:
            return read_diagnosis(session=session, diagnosis_id=diagnosis_id)

    def list_diagnoses(self, limit: int = 50) -> list[DiagnosisRecord]:
        with self.reading() as session:
            return read_diagnoses(session=session, limit=limit)

    def save_proposal(self, proposal: ProposalRecord) -> None:
        with self.writing() as session:
            upsert_proposal(session=session, proposal=proposal)

    def save_report(self, diagnosis: DiagnosisRecord, proposals: list[ProposalRecord]) -> None:
        with self.writing() as session:
            upsert_diagnosis(session=session, diagnosis=diagnosis)
            for proposal in proposals:
                upsert_proposal(session=session, proposal=proposal)

    def get_proposal(self, proposal_id: str) -> ProposalRecord | None:
        with self.reading() as session:
            return read_proposal(session=session, proposal_id=proposal_id)

    def list_proposals(self, *, diagnosis_id: str | None = None,
                       status: str | None = None) -> list[ProposalRecord]:
        with self.reading() as session:
            return read_proposals(session=session, diagnosis_id=diagnosis_id, status=status)

    def set_proposal_status(self, proposal_id: str, status: str) -> None:
        with self.writing() as session:
            change_proposal_status(session=session, proposal_id=proposal_id, status=status)

    def save_decision(self, decision: DecisionRecord) -> DecisionRecord:
        with self.writing() as session:
            return insert_decision(session=session, decision=decision)

    def decide_proposal(self, decision: DecisionRecord, status: str) -> DecisionRecord:
        with self.writing() as session:
            return record_decision(session=session, decision=decision, status=status)

    def list_decisions(self, proposal_id: str | None = None) -> list[DecisionRecord]:
        with self.reading() as session:
            return read_decisions(session=session, proposal_id=proposal_id)

    # evolutions
    def save_evolution(self, evolution: EvolutionRecord) -> None:
        with self.writing() as session:
            upsert_evolution(session=session, evolution=evolution)

    def get_evolution(self, evolution_id: str) -> EvolutionRecord | None:
        with self.reading() as session:
            return read_evolution(session=session, evolution_id=evolution_id)

    def list_evolutions(self, limit: int = 50) -> list[EvolutionRecord]:
        with self.reading() as session:
            return read_evolutions(session=session, limit=limit)

    # leases
    def acquire_lease(self, key: str, owner: str, ttl_s: float) -> Lease:
        with self.writing() as session:
            return take_lease(session=session, key=key, owner=owner, ttl_s=ttl_s)

    def renew_lease(self, key: str, owner: str, ttl_s: float) -> bool:
        with self.writing() as session:
            return extend_lease(session=session, key=key, owner=owner, ttl_s=ttl_s)

    def release_lease(self, key: str, owner: str) -> None:
        with self.writing() as session:
            drop_lease(session=session, key=key, owner=owner)

    def list_leases(self) -> list[Lease]:
        with self.reading() as session:
            return read_leases(session=session)


# ---- data functions: suites

def upsert_suite(*, session: Session, suite: Suite) -> None:
    """Store `suite`, replacing a stored suite of the same name."""
    _upsert(session, SuiteRow, suite_to_row(suite), keys=("name",))


def read_suite(*, session: Session, name: str) -> Suite | None:
    row = session.get(SuiteRow, name)
    return row_to_suite(row) if row else None


def read_suites(*, session: Session) -> list[Suite]:
    rows = session.scalars(select(SuiteRow).order_by(col(SuiteRow.name))).all()
    return [row_to_suite(r) for r in rows]


# ---- data functions: harness versions

def insert_harness(*, session: Session, version: HarnessVersion) -> HarnessVersion:
    """Store `version` unless its id is stored already; return what is stored (the first wins)."""
    if version.parent is not None and _missing(session, col(HarnessVersionRow.id), version.parent):
        raise NotFound(f"parent harness version {version.parent} is not stored",
                       hint="store the parent first (put_harness), or give parent=None")
    insert = _insert(session, HarnessVersionRow).values(**harness_to_row(version).model_dump())
    session.execute(insert.on_conflict_do_nothing(index_elements=["id"]))
    stored = session.get(HarnessVersionRow, version.id)
    assert stored is not None  # inserted just now or before, inside this transaction
    return row_to_harness(stored)


def read_harness(*, session: Session, version_id: str) -> HarnessVersion | None:
    row = session.get(HarnessVersionRow, version_id)
    return row_to_harness(row) if row else None


def read_harnesses(*, session: Session) -> list[HarnessVersion]:
    """Oldest first, so a lineage reads top-down."""
    query = select(HarnessVersionRow).order_by(col(HarnessVersionRow.created_at), col(HarnessVersionRow.id))
    return [row_to_harness(r) for r in session.scalars(query).all()]


def change_harness(*, session: Session, version_id: str, status: str | None,
                   metrics: dict[str, Any] | None) -> None:
    """Set the status and/or replace the metrics of a stored version; None leaves a field as is."""
    row = session.get(HarnessVersionRow, version_id)
    if row is None:
        raise NotFound(f"no harness version {version_id!r}", hint="`ecdysis harnesses` lists them")
    if status is not None:
        row.status = status
    if metrics is not None:
        row.metrics = dict(metrics)


# ---- data functions: runs and results

def insert_run(*, session: Session, run: RunRecord) -> None:
    if not _missing(session, col(RunRow.id), run.id):
        # Silently replacing would erase the progress of a live run; resuming uses update_run.
        raise EcdysisError(f"run {run.id} already exists", hint="update_run changes a stored run")
    session.add(run_to_row(run))


def replace_run(*, session: Session, run: RunRecord) -> None:
    """Write every field of `run` over the stored run of the same id."""
    row = session.get(RunRow, run.id)
    if row is None:
        raise NotFound(f"no run {run.id!r}", hint="create_run stores a new run")
    for name, value in run_to_row(run).model_dump().items():
        setattr(row, name, value)


def read_run(*, session: Session, run_id: str) -> RunRecord | None:
    row = session.get(RunRow, run_id)
    return row_to_run(row) if row else None


def read_runs(*, session: Session, limit: int = 100) -> list[RunRecord]:
    """Newest first."""
    query = select(RunRow).order_by(col(RunRow.created_at).desc(), col(RunRow.id).desc()).limit(limit)
    return [row_to_run(r) for r in session.scalars(query).all()]


def upsert_result(*, session: Session, result: InstanceResult) -> None:
    """Store `result` and its calls, replacing an earlier result of the same (run, instance)."""
    upsert_results(session=session, results=[result])


def upsert_results(*, session: Session | Connection, results: list[InstanceResult]) -> None:
    """`upsert_result` for each of `results` (the last one wins for a repeated instance), with
    one statement per table for the whole list; `session` may be a Core connection."""
    latest = {(r.run_id, r.instance_id): r for r in results}
    for run_id in dict.fromkeys(run_id for run_id, _ in latest):
        if _missing(session, col(RunRow.id), run_id):
            first = next(iid for rid, iid in latest if rid == run_id)
            raise NotFound(f"no run {run_id!r} for the result of {first!r}",
                           hint="create_run before saving its results")
    if not latest:
        return
    rows = [result_values(r) for r in latest.values()]
    dialect = session.dialect.name if isinstance(session, Connection) else session.get_bind().dialect.name
    statement = _upsert_statement(dialect, InstanceResultRow, ("run_id", "instance_id"), tuple(rows[0]))
    session.execute(statement, rows)
    # The calls of an earlier attempt go: a trajectory is replaced whole, never merged.
    by_run: dict[str, list[str]] = {}
    for run_id, instance_id in latest:
        by_run.setdefault(run_id, []).append(instance_id)
    for run_id, instance_ids in by_run.items():
        session.execute(delete(ModelCallRow).where(col(ModelCallRow.run_id) == run_id,
                                                   col(ModelCallRow.instance_id).in_(instance_ids)))
    calls = [call_values(r, c) for r in latest.values() for c in r.calls]
    if calls:
        session.execute(table_of(ModelCallRow).insert(), calls)


def read_results(*, session: Session, run_id: str) -> list[InstanceResult]:
    """Every stored result of a run with its calls, in the run's instance order."""
    run = session.get(RunRow, run_id)
    if run is None:
        return []
    rows = session.scalars(select(InstanceResultRow).where(col(InstanceResultRow.run_id) == run_id)).all()
    calls: dict[str, list[ModelCall]] = {}
    call_rows = session.scalars(select(ModelCallRow).where(col(ModelCallRow.run_id) == run_id)
                                .order_by(col(ModelCallRow.instance_id), col(ModelCallRow.seq))).all()
    for call in call_rows:
        calls.setdefault(call.instance_id, []).append(row_to_call(call))
    position = {iid: i for i, iid in enumerate(run.instance_ids)}
    rows = sorted(rows, key=lambda r: (position.get(r.instance_id, len(position)), r.instance_id))
    return [row_to_result(r, calls.get(r.instance_id, [])) for r in rows]


def read_done_instance_ids(*, session: Session, run_id: str) -> set[str]:
    query = select(col(InstanceResultRow.instance_id)).where(col(InstanceResultRow.run_id) == run_id)
    return set(session.scalars(query).all())


# ---- data functions: response cache

def read_cache(*, session: Session, key: str) -> Completion | None:
    row = session.get(CacheEntryRow, key)
    return completion_from_json(row.response) if row else None


def insert_cache(*, session: Session, key: str, model: str, request: dict[str, Any],
                 completion: Completion) -> None:
    """Store a completion under `key`; an existing key keeps its first answer (no error)."""
    row = CacheEntryRow(key=key, model=model, request=dict(request), response=completion.to_json(),
                        created_at=time.time())
    insert = _insert(session, CacheEntryRow).values(**row.model_dump())
    session.execute(insert.on_conflict_do_nothing(index_elements=["key"]))


# ---- data functions: background jobs

_JOB_FIELDS = frozenset(f.name for f in fields(JobRecord)) - {"id"}


def insert_job(*, session: Session, job: JobRecord) -> None:
    if not _missing(session, col(JobRow.id), job.id):
        raise EcdysisError(f"job {job.id} already exists", hint="update_job changes a stored job")
    session.add(job_to_row(job))


def change_job(*, session: Session, job_id: str, changes: dict[str, Any]) -> None:
    """Set only the named fields, in one UPDATE: a progress write from the worker and a Stop from
    another process touch different columns and must not undo each other."""
    unknown = set(changes) - _JOB_FIELDS
    if unknown:
        raise TypeError(f"update_job got fields a job does not have: {sorted(unknown)}")
    if not changes:
        return
    values = {k: _storable(v) if k in ("error", "message") else v for k, v in changes.items()}
    _update_one(session, JobRow, job_id, values, missing=NotFound(f"no job {job_id!r}"))


def read_job(*, session: Session, job_id: str) -> JobRecord | None:
    row = session.get(JobRow, job_id)
    return row_to_job(row) if row else None


def read_jobs(*, session: Session, limit: int = 50) -> list[JobRecord]:
    """Newest first."""
    query = select(JobRow).order_by(col(JobRow.created_at).desc(), col(JobRow.id).desc()).limit(limit)
    return [row_to_job(r) for r in session.scalars(query).all()]


# ---- data functions: diagnoses, proposals, decisions

def upsert_diagnosis(*, session: Session, diagnosis: DiagnosisRecord) -> None:
    _upsert(session, DiagnosisRow, diagnosis_to_row(diagnosis), keys=("id",))


def read_diagnosis(*, session: Session, diagnosis_id: str) -> DiagnosisRecord | None:
    row = session.get(DiagnosisRow, diagnosis_id)
    return row_to_diagnosis(row) if row else None


def read_diagnoses(*, session: Session, limit: int = 50) -> list[DiagnosisRecord]:
    """Newest first."""
    query = (select(DiagnosisRow).order_by(col(DiagnosisRow.created_at).desc(), col(DiagnosisRow.id).desc())
             .limit(limit))
    return [row_to_diagnosis(r) for r in session.scalars(query).all()]


def upsert_proposal(*, session: Session, proposal: ProposalRecord) -> None:
    """Store or replace a proposal; a replaced one keeps its place in the order (`seq`)."""
    _upsert(session, ProposalRow, proposal_to_row(proposal), keys=("id",), generated=("seq",))


def read_proposal(*, session: Session, proposal_id: str) -> ProposalRecord | None:
    row = session.scalar(select(ProposalRow).where(col(ProposalRow.id) == proposal_id))
    return row_to_proposal(row) if row else None


def read_proposals(*, session: Session, diagnosis_id: str | None = None,
                   status: str | None = None) -> list[ProposalRecord]:
    """In the order first saved (a diagnosis saves them in priority order)."""
    query = select(ProposalRow).order_by(col(ProposalRow.seq))
    if diagnosis_id is not None:
        query = query.where(col(ProposalRow.diagnosis_id) == diagnosis_id)
    if status is not None:
        query = query.where(col(ProposalRow.status) == status)
    return [row_to_proposal(r) for r in session.scalars(query).all()]


def change_proposal_status(*, session: Session, proposal_id: str, status: str) -> None:
    _update_one(session, ProposalRow, proposal_id, {"status": status},
                missing=NotFound(f"no proposal {proposal_id!r}", hint="`ecdysis proposals` lists them"))


def insert_decision(*, session: Session, decision: DecisionRecord) -> DecisionRecord:
    """Append a decision; returns it with the id the database gave it."""
    if decision.id is not None and session.get(DecisionRow, decision.id) is not None:
        # Decisions are history: one is never overwritten, even by the same id.
        raise EcdysisError(f"decision {decision.id} already exists", hint="save it with id=None")
    row = decision_to_row(decision)
    session.add(row)
    session.flush()  # assigns the id
    return row_to_decision(row)


def record_decision(*, session: Session, decision: DecisionRecord, status: str) -> DecisionRecord:
    """Move the proposal from pending to `status` and append `decision`, or change nothing and
    raise Conflict when it is no longer pending. The conditional UPDATE is what two deciders race
    on: SQLite's write lock and PostgreSQL's row lock let exactly one of them match the row."""
    table = table_of(ProposalRow)
    changed = session.execute(table.update()
                              .where(table.c.id == decision.proposal_id, table.c.status == "pending")
                              .values(status=status))
    if cast(CursorResult[Any], changed).rowcount == 0:
        current = session.scalar(select(col(ProposalRow.status)).where(col(ProposalRow.id) == decision.proposal_id))
        if current is None:
            raise NotFound(f"no proposal {decision.proposal_id!r}", hint="`ecdysis proposals` lists them")
        last = read_decisions(session=session, proposal_id=decision.proposal_id)
        by = f" by {last[-1].who}" if last else ""
        raise Conflict(f"proposal {decision.proposal_id} was already decided ({current}{by}); nothing was recorded",
                       hint=f"`ecdysis proposals --status {current}` shows it")
    return insert_decision(session=session, decision=decision)


def read_decisions(*, session: Session, proposal_id: str | None = None) -> list[DecisionRecord]:
    """Oldest first, so the last one is the decision in force."""
    query = select(DecisionRow).order_by(col(DecisionRow.at), col(DecisionRow.id))
    if proposal_id is not None:
        query = query.where(col(DecisionRow.proposal_id) == proposal_id)
    return [row_to_decision(r) for r in session.scalars(query).all()]


# ---- data functions: evolutions

def upsert_evolution(*, session: Session, evolution: EvolutionRecord) -> None:
    _upsert(session, EvolutionRow, evolution_to_row(evolution), keys=("id",))


def read_evolution(*, session: Session, evolution_id: str) -> EvolutionRecord | None:
    row = session.get(EvolutionRow, evolution_id)
    return row_to_evolution(row) if row else None


def read_evolutions(*, session: Session, limit: int = 50) -> list[EvolutionRecord]:
    """Newest first."""
    query = (select(EvolutionRow).order_by(col(EvolutionRow.created_at).desc(), col(EvolutionRow.id).desc())
             .limit(limit))
    return [row_to_evolution(r) for r in session.scalars(query).all()]


# ---- data functions: leases

def take_lease(*, session: Session, key: str, owner: str, ttl_s: float) -> Lease:
    """Give `key` to `owner` if it is free, expired or the owner's already, in one INSERT ... ON
    CONFLICT DO UPDATE ... WHERE: two takers cannot both win. Raise Conflict naming the holder."""
    now = time.time()
    table = table_of(LeaseRow)
    insert = _insert(session, LeaseRow).values(key=key, owner=owner, acquired_at=now, heartbeat_at=now,
                                               expires_at=now + ttl_s)
    session.execute(insert.on_conflict_do_update(
        index_elements=["key"],
        set_={"owner": insert.excluded.owner, "acquired_at": insert.excluded.acquired_at,
              "heartbeat_at": insert.excluded.heartbeat_at, "expires_at": insert.excluded.expires_at},
        where=(table.c.expires_at <= now) | (table.c.owner == owner)))
    row = session.get(LeaseRow, key)
    assert row is not None  # inserted, updated or held by another: it exists in this transaction
    lease = row_to_lease(row)
    if lease.owner != owner:
        what = key.replace(":", " ", 1)
        raise Conflict(f"{what} is running elsewhere: held by {lease.owner}, last heartbeat "
                       f"{max(0.0, now - lease.heartbeat_at):.0f} s ago",
                       hint=f"wait for it to finish or stop it there; if that process is gone, its lease "
                            f"lapses in {max(0.0, lease.expires_at - now):.0f} s and a resume then works")
    return lease


def extend_lease(*, session: Session, key: str, owner: str, ttl_s: float) -> bool:
    """Renew `owner`'s lease on `key`; False when it is no longer the owner's (it lapsed and was
    taken, or was never taken)."""
    now = time.time()
    table = table_of(LeaseRow)
    changed = session.execute(table.update().where(table.c.key == key, table.c.owner == owner)
                              .values(heartbeat_at=now, expires_at=now + ttl_s))
    return cast(CursorResult[Any], changed).rowcount == 1


def drop_lease(*, session: Session, key: str, owner: str) -> None:
    table = table_of(LeaseRow)
    session.execute(table.delete().where(table.c.key == key, table.c.owner == owner))


def read_leases(*, session: Session) -> list[Lease]:
    return [row_to_lease(r) for r in session.scalars(select(LeaseRow).order_by(col(LeaseRow.key))).all()]


def row_to_lease(row: LeaseRow) -> Lease:
    return Lease(key=row.key, owner=row.owner, acquired_at=row.acquired_at, heartbeat_at=row.heartbeat_at,
                 expires_at=row.expires_at)


# ---- rows <-> records

def suite_to_row(suite: Suite) -> SuiteRow:
    return SuiteRow(name=suite.name, instances=[_instance_to_json(i) for i in suite.instances],
                    scorer={"kind": suite.scorer.kind, "options": dict(suite.scorer.options)},
                    description=suite.description, source=suite.source)


def row_to_suite(row: SuiteRow) -> Suite:
    scorer = ScorerSpec(kind=str(row.scorer.get("kind", "exact")),
                        options=dict(row.scorer.get("options") or {}))
    return Suite(name=row.name, instances=[_instance_from_json(d) for d in row.instances], scorer=scorer,
                 description=row.description, source=row.source)


def _instance_to_json(inst: Instance) -> dict[str, Any]:
    return {"id": inst.id, "input": inst.input, "target": inst.target, "category": inst.category,
            "choices": list(inst.choices) if inst.choices is not None else None, "split": inst.split,
            "fields": dict(inst.fields)}


def _instance_from_json(data: dict[str, Any]) -> Instance:
    choices = data.get("choices")
    return Instance(id=str(data["id"]), input=str(data["input"]), target=str(data["target"]),
                    category=str(data.get("category", "default")),
                    choices=tuple(str(c) for c in choices) if choices is not None else None,
                    split=cast(Split | None, data.get("split")), fields=dict(data.get("fields") or {}))


def harness_to_row(version: HarnessVersion) -> HarnessVersionRow:
    return HarnessVersionRow(id=version.id, parent=version.parent, files=dict(version.files),
                             note=version.note, status=version.status, metrics=dict(version.metrics),
                             created_at=version.created_at)


def row_to_harness(row: HarnessVersionRow) -> HarnessVersion:
    return HarnessVersion(id=row.id, files=dict(row.files), parent=row.parent, note=row.note,
                          created_at=row.created_at, status=row.status, metrics=dict(row.metrics))


def run_to_row(run: RunRecord) -> RunRow:
    return RunRow(id=run.id, suite=run.suite, model=run.model, harness_version=run.harness_version,
                  split=run.split, instance_ids=list(run.instance_ids), concurrency=run.concurrency,
                  status=run.status, created_at=run.created_at, finished_at=run.finished_at,
                  summary=dict(run.summary), error=_storable(run.error), label=run.label)


def row_to_run(row: RunRow) -> RunRecord:
    return RunRecord(id=row.id, suite=row.suite, model=row.model, harness_version=row.harness_version,
                     split=row.split, instance_ids=list(row.instance_ids), concurrency=row.concurrency,
                     status=cast(RunStatus, row.status), created_at=row.created_at,
                     finished_at=row.finished_at, summary=dict(row.summary), error=row.error,
                     label=row.label)


def result_to_row(result: InstanceResult) -> InstanceResultRow:
    return InstanceResultRow(**result_values(result))


def result_values(result: InstanceResult) -> dict[str, Any]:
    """The columns of `result`'s row as a plain dict: what a Core insert takes, built without a
    model object (constructing and dumping one per row was a third of the cost of saving)."""
    return dict(
        run_id=result.run_id, instance_id=result.instance_id, category=result.category,
        model=result.model, answer=_storable(result.answer), target=result.target,
        correct=result.correct, score=result.score, error_type=result.error_type,
        error_message=_storable(result.error_message), stdout_tail=_storable(result.stdout_tail) or "",
        wall_seconds=result.wall_seconds, model_calls=len(result.calls),
        prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
        saved_at=time.time())


def row_to_result(row: InstanceResultRow, calls: list[ModelCall]) -> InstanceResult:
    return InstanceResult(
        run_id=row.run_id, instance_id=row.instance_id, category=row.category, model=row.model,
        answer=row.answer, target=row.target, correct=row.correct, score=row.score,
        error_type=cast(ErrorType | None, row.error_type), error_message=row.error_message,
        stdout_tail=row.stdout_tail, calls=calls, wall_seconds=row.wall_seconds)


def call_to_row(result: InstanceResult, call: ModelCall) -> ModelCallRow:
    return ModelCallRow(**call_values(result, call))


def call_values(result: InstanceResult, call: ModelCall) -> dict[str, Any]:
    """The columns of one call's row, as `result_values`."""
    return dict(run_id=result.run_id, instance_id=result.instance_id, seq=call.seq,
                model=call.model, request=dict(call.request), text=_storable(call.text) or "",
                prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens,
                latency_s=call.latency_s, finish_reason=call.finish_reason,
                cache_hit=call.cache_hit, error=_storable(call.error),
                option_logprobs=list(call.option_logprobs) if call.option_logprobs is not None else None)


def row_to_call(row: ModelCallRow) -> ModelCall:
    return ModelCall(seq=row.seq, model=row.model, request=dict(row.request), text=row.text,
                     prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens,
                     latency_s=row.latency_s, finish_reason=row.finish_reason, cache_hit=row.cache_hit,
                     error=row.error, option_logprobs=row.option_logprobs)


_COMPLETION_FIELDS = frozenset(f.name for f in fields(Completion))


def completion_from_json(data: dict[str, Any]) -> Completion:
    # Unknown keys are ignored so an entry written by a newer version still reads.
    return Completion(**{k: v for k, v in data.items() if k in _COMPLETION_FIELDS})


def job_to_row(job: JobRecord) -> JobRow:
    return JobRow(id=job.id, kind=job.kind, params=dict(job.params), status=job.status, done=job.done,
                  total=job.total, message=_storable(job.message) or "", result=dict(job.result),
                  error=_storable(job.error), cancel_requested=job.cancel_requested,
                  created_at=job.created_at, updated_at=job.updated_at)


def row_to_job(row: JobRow) -> JobRecord:
    return JobRecord(id=row.id, kind=row.kind, params=dict(row.params), status=cast(JobStatus, row.status),
                     done=row.done, total=row.total, message=row.message, result=dict(row.result),
                     error=row.error, cancel_requested=row.cancel_requested, created_at=row.created_at,
                     updated_at=row.updated_at)


def diagnosis_to_row(diagnosis: DiagnosisRecord) -> DiagnosisRow:
    return DiagnosisRow(id=diagnosis.id, run_ids=list(diagnosis.run_ids),
                        harness_version=diagnosis.harness_version, report=dict(diagnosis.report),
                        created_at=diagnosis.created_at)


def row_to_diagnosis(row: DiagnosisRow) -> DiagnosisRecord:
    return DiagnosisRecord(id=row.id, run_ids=list(row.run_ids), harness_version=row.harness_version,
                           report=dict(row.report), created_at=row.created_at)


def proposal_to_row(proposal: ProposalRecord) -> ProposalRow:
    return ProposalRow(id=proposal.id, diagnosis_id=proposal.diagnosis_id, cluster_id=proposal.cluster_id,
                       harness_version=proposal.harness_version, spec=dict(proposal.spec),
                       files=dict(proposal.files), status=proposal.status, data=dict(proposal.data),
                       created_at=proposal.created_at)


def row_to_proposal(row: ProposalRow) -> ProposalRecord:
    return ProposalRecord(id=row.id, diagnosis_id=row.diagnosis_id, cluster_id=row.cluster_id,
                          harness_version=row.harness_version, spec=dict(row.spec), files=dict(row.files),
                          status=row.status, data=dict(row.data), created_at=row.created_at)


def decision_to_row(decision: DecisionRecord) -> DecisionRow:
    applied = dict(decision.files_as_applied) if decision.files_as_applied is not None else None
    return DecisionRow(id=decision.id, proposal_id=decision.proposal_id, decision=decision.decision,
                       who=decision.who, reason=decision.reason, files_as_applied=applied, at=decision.at)


def row_to_decision(row: DecisionRow) -> DecisionRecord:
    applied = dict(row.files_as_applied) if row.files_as_applied is not None else None
    return DecisionRecord(proposal_id=row.proposal_id, decision=cast(DecisionKind, row.decision),
                          who=row.who, reason=row.reason, files_as_applied=applied, at=row.at, id=row.id)


def evolution_to_row(evolution: EvolutionRecord) -> EvolutionRow:
    return EvolutionRow(id=evolution.id, strategy=evolution.strategy, suite=evolution.suite,
                        models=list(evolution.models), config=dict(evolution.config), status=evolution.status,
                        base_version=evolution.base_version, current_version=evolution.current_version,
                        iterations=list(evolution.iterations), result=dict(evolution.result),
                        created_at=evolution.created_at, updated_at=evolution.updated_at)


def row_to_evolution(row: EvolutionRow) -> EvolutionRecord:
    return EvolutionRecord(id=row.id, strategy=row.strategy, suite=row.suite, models=list(row.models),
                           config=dict(row.config), status=row.status, base_version=row.base_version,
                           current_version=row.current_version, iterations=list(row.iterations),
                           result=dict(row.result), created_at=row.created_at, updated_at=row.updated_at)


# ---- helpers

def _storable(value: str | None) -> str | None:
    """Text safe for every backend: PostgreSQL text cannot hold NUL, which harness output may
    contain; it becomes U+FFFD everywhere so SQLite and PostgreSQL return the same string. The
    credentials of a URL (a base URL in a connection error) are never stored."""
    return redact_credentials(value.replace("\x00", "\ufffd")) if value else value


def _insert(session: Session, model: type[SQLModel]) -> SqliteInsert | PgInsert:
    table = table_of(model)
    return pg_insert(table) if session.get_bind().dialect.name == "postgresql" else sqlite_insert(table)


def _upsert(session: Session, model: type[SQLModel], row: SQLModel, *, keys: tuple[str, ...],
            generated: tuple[str, ...] = ()) -> None:
    """INSERT, or UPDATE every non-key column when a row with the same `keys` exists; a single
    statement, so two writers of one key cannot both insert. `generated` columns (a surrogate
    key) are left to the database on insert and kept on update."""
    values = row.model_dump(exclude=set(generated))
    statement = _upsert_statement(session.get_bind().dialect.name, model, keys, tuple(values))
    session.execute(statement, values)


@functools.lru_cache(maxsize=64)
def _upsert_statement(dialect: str, model: type[SQLModel], keys: tuple[str, ...],
                      columns: tuple[str, ...]) -> Insert:
    """The upsert of `_upsert`, built once per table and column set and executed with the row as
    parameters: building `excluded` anew for every row cost milliseconds per saved result."""
    table = table_of(model)
    insert = pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)
    updates = {name: insert.excluded[name] for name in columns if name not in keys}
    return insert.on_conflict_do_update(index_elements=list(keys), set_=updates)


def _update_one(session: Session, model: type[SQLModel], key: str, values: dict[str, Any], *,
                missing: EcdysisError) -> None:
    """UPDATE the row whose `id` is `key`, setting only `values`; raise `missing` if there is none."""
    table = table_of(model)
    result = session.execute(table.update().where(table.c.id == key).values(**values))
    if cast(CursorResult[Any], result).rowcount == 0:
        raise missing


def _missing(session: Session | Connection, column: Mapped[str], value: str) -> bool:
    return session.scalar(select(column).where(column == value)) is None

"""Schema changes, applied once each and in order when a store opens (`open_store` -> `migrate`);
each is a named function, recorded by name in the `schema_migrations` table.

How to add one:
1. Add or change the SQLModel class in `storage/tables.py`.
2. Write `def m00N_what(conn: Connection) -> None` below and append it to `MIGRATIONS`. Never edit,
   rename or reorder a migration that has shipped: databases remember them by name.
   - a new table: `create_tables(conn, FailureRow, ClusterRow)`
   - a new column on an existing table: `add_column(conn, InstanceResultRow, "attempt")`
3. Use only these helpers or DDL that SQLite and PostgreSQL both accept; each migration runs in the
   same transaction as its ledger row, so it applies completely or not at all.

`create_tables` builds a table from its current class, so on a fresh database a column added later
already exists when its own migration runs: that is why the helpers skip what exists, and why
`tests/test_storage.py` checks that the migrated schema has every declared table and column.
Two processes opening one fresh database at once are safe: the first takes the write lock
(SQLite `BEGIN IMMEDIATE`, PostgreSQL an advisory lock) and the second waits, then finds the
migrations recorded and applies nothing."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import cast

from sqlalchemy import Table, inspect, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateColumn
from sqlmodel import SQLModel

from storage.tables import (CacheEntryRow, DecisionRow, DiagnosisRow, EvolutionRow, HarnessVersionRow,
                            InstanceResultRow, JobRow, LeaseRow, ModelCallRow, ProposalRow, RunRow, SchemaMigrationRow,
                            SuiteRow)

Migration = Callable[[Connection], None]

# Any fixed 64-bit number works; derived from a name so that it is unlikely to clash with others.
_PG_LOCK_KEY = zlib.crc32(b"ecdysis.storage.migrations")


def table_of(model: type[SQLModel]) -> Table:
    """The SQLAlchemy table behind a `table=True` class."""
    return cast(Table, getattr(model, "__table__"))


def create_tables(conn: Connection, *models: type[SQLModel]) -> None:
    """Create the tables of `models` with their indexes; tables that exist are left alone."""
    for model in models:
        table_of(model).create(conn, checkfirst=True)


def add_column(conn: Connection, model: type[SQLModel], name: str) -> None:
    """Add the column `name`, as the class declares it, to an existing table; skip it if present.

    A column added to a table that has rows must be nullable or have a server default (SQLite
    and PostgreSQL both insist): declare it `| None` or give it `sa_column_kwargs={"server_default": ...}`."""
    table = table_of(model)
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    if name not in present:
        # CreateColumn renders the column exactly as CREATE TABLE would, in this dialect.
        spec = CreateColumn(table.c[name]).compile(dialect=conn.dialect)
        table_name = conn.dialect.identifier_preparer.format_table(table)
        conn.execute(text(f"ALTER TABLE {table_name} ADD COLUMN {spec}"))
    for index in table.indexes:
        if name in index.columns:
            index.create(conn, checkfirst=True)


def m001_initial(conn: Connection) -> None:
    """Suites, harness versions, runs, per-instance results with their model calls, and the cache."""
    create_tables(conn, SuiteRow, HarnessVersionRow, RunRow, InstanceResultRow, ModelCallRow,
                  CacheEntryRow)


def m002_jobs_and_the_review_trail(conn: Connection) -> None:
    """Background jobs, diagnoses, proposals, the human decisions on them, and evolutions."""
    create_tables(conn, JobRow, DiagnosisRow, ProposalRow, DecisionRow, EvolutionRow)


def m003_leases(conn: Connection) -> None:
    """Leases: one executor at a time per run, evolution and diagnosis, across processes."""
    create_tables(conn, LeaseRow)


def m004_option_scores(conn: Connection) -> None:
    """A model call that scored options instead of generating keeps the scores in its trajectory."""
    add_column(conn, ModelCallRow, "option_logprobs")


def m005_kept_versions(conn: Connection) -> None:
    """A version the validation gate kept is `kept`; it was `accepted`, a word the Critic and the
    gate's verdict also used."""
    versions = table_of(HarnessVersionRow)
    conn.execute(versions.update().where(versions.c.status == "accepted").values(status="kept"))


MIGRATIONS: list[Migration] = [
    m001_initial,
    m002_jobs_and_the_review_trail,
    m003_leases,
    m004_option_scores,
    m005_kept_versions,
]


def migrate(engine: Engine, migrations: Sequence[Migration] | None = None) -> list[str]:
    """Apply the migrations this database has not recorded, in order; return the names applied
    by this call (empty when another process, or an earlier start, already did it)."""
    applied_now: list[str] = []
    # One transaction for the whole check-and-apply, so the lock covers both.
    with engine.begin() as conn:
        _lock_for_migrations(conn)
        create_tables(conn, SchemaMigrationRow)
        ledger = table_of(SchemaMigrationRow)
        done = set(conn.scalars(select(ledger.c.name)))
        for migration in (MIGRATIONS if migrations is None else migrations):
            if migration.__name__ in done:
                continue
            migration(conn)
            conn.execute(ledger.insert().values(name=migration.__name__, applied_at=time.time()))
            applied_now.append(migration.__name__)
    return applied_now


def applied_migrations(engine: Engine) -> list[str]:
    """Names recorded in the ledger, oldest first."""
    ledger = table_of(SchemaMigrationRow)
    with engine.connect() as conn:
        if not inspect(conn).has_table(ledger.name):
            return []
        return list(conn.scalars(select(ledger.c.name).order_by(ledger.c.applied_at, ledger.c.name)))


def _lock_for_migrations(conn: Connection) -> None:
    # SQLite needs nothing more: the write engine's transaction began with BEGIN IMMEDIATE, which
    # is already the database-wide write lock. PostgreSQL would let two CREATE TABLEs race.
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})

"""Engine set-up: the first step of `open_store`, before migrations and queries. SQLite gets the
pragmas and `BEGIN IMMEDIATE` that let threads and processes write one file at once."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlmodel import create_engine

# A writer waits this long for another writer's lock before "database is locked" is raised.
BUSY_TIMEOUT_MS = 30_000

# Execution option that marks an engine as read-only, so its transactions start DEFERRED.
READ_ONLY_OPTION = "ecdysis_read_only"


def make_engine(url: str | URL) -> Engine:
    """An engine for any SQLAlchemy URL; `sqlite://` (no file) is one shared in-memory database."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    # pre_ping: a PostgreSQL restart or an idle timeout must not surface as an error on the next call.
    return create_engine(parsed, pool_pre_ping=True)


def sqlite_path(url: str | URL) -> Path | None:
    """The file behind a SQLite URL, or None for in-memory and non-SQLite URLs."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or _is_memory(parsed):
        return None
    return Path(str(parsed.database)).expanduser()


def read_only(engine: Engine) -> Engine:
    """The same engine and pool, but SQLite transactions start DEFERRED: reads never queue behind
    writers (WAL gives them a snapshot). Use it only for sessions that never write."""
    return engine.execution_options(**{READ_ONLY_OPTION: True})


def _is_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def _sqlite_engine(url: URL) -> Engine:
    if _is_memory(url):
        # StaticPool: every session must see the one in-memory database, not a fresh empty one each.
        engine = create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
    else:
        # Pooled connections move between threads, one thread at a time: safe for sqlite3.
        engine = create_engine(url, connect_args={"check_same_thread": False})
    event.listen(engine, "connect", _on_sqlite_connect)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _on_sqlite_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    # Turn off pysqlite's own lazy, always-DEFERRED BEGIN so that `_on_sqlite_begin` decides.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: switching to WAL takes a lock that another process may hold right now.
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _switch_to_wal(cursor)
        # In WAL mode NORMAL loses nothing when a process dies, only on power loss: fine for us.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _switch_to_wal(cursor: sqlite3.Cursor) -> None:
    """Put the file in WAL mode (a no-op once it is). busy_timeout does not cover the switch itself:
    when two processes open a fresh file at once, SQLite fails one of them at once rather than risk
    a deadlock between their shared locks, so that one retries until the deadline."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))  # jitter, so two waiters do not collide again


def _on_sqlite_begin(connection: Connection) -> None:
    # A DEFERRED transaction that later upgrades to a write fails at once with "database is locked"
    # (busy_timeout does not apply to the upgrade); IMMEDIATE takes the write lock up front and waits.
    options: dict[str, Any] = dict(connection.get_execution_options())
    mode = "DEFERRED" if options.get(READ_ONLY_OPTION) else "IMMEDIATE"
    connection.exec_driver_sql(f"BEGIN {mode}")

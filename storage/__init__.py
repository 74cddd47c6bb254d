"""The persistence layer behind `ecdysis.store.Store`: SQLModel tables over SQLite (default, WAL)
or PostgreSQL. The composition root (CLI, app) calls `open_store`; the engine never imports this."""

from __future__ import annotations

from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError

from ecdysis.errors import ConfigError
from ecdysis.settings import Settings
from storage.db import make_engine, sqlite_path
from storage.migrations import MIGRATIONS, migrate
from storage.sql_store import SQLStore

__all__ = ["MIGRATIONS", "SQLStore", "make_engine", "migrate", "open_store"]

_URL_HINT = "set ECDYSIS_DATABASE_URL to sqlite:///PATH or postgresql+psycopg2://USER@HOST:PORT/DB"


def open_store(url: str | None = None) -> SQLStore:
    """A migrated store at `url` (default: the `database_url` setting, a SQLite file in the data
    folder, whose folder is created). Raises ConfigError when the database cannot be opened."""
    parsed = _parse(Settings.from_env().database_url if url is None else url)
    store = SQLStore(_engine(parsed))
    try:
        migrate(store.engine)
    except DatabaseError as exc:  # OperationalError (unreachable, locked) or a file that is not a database
        store.close()
        raise ConfigError(f"cannot open the database {_shown(parsed)}: {str(exc.orig).strip()}",
                          hint="check the URL, that the server runs and that the folder is writable; a corrupt "
                               "SQLite file must be moved aside (or ECDYSIS_HOME pointed elsewhere)") from exc
    return store


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError as exc:
        # Not echoed: an unparsable URL may still hold a password.
        raise ConfigError("the database URL cannot be parsed", hint=_URL_HINT) from exc


def _engine(url: URL) -> Engine:
    path = sqlite_path(url)
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        return make_engine(url)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder of {path}: {exc}", hint="set ECDYSIS_HOME") from exc
    except (ArgumentError, ImportError) as exc:  # unknown dialect, or its driver is not installed
        raise ConfigError(f"cannot open the database {_shown(url)}: {exc}", hint=_URL_HINT) from exc


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)

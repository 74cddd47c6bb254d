"""The one `Service` per server process (a `st.cache_resource`), shared by every session and page;
its job manager runs batches, diagnoses and evolutions in worker threads, never in a script run."""

from __future__ import annotations

import streamlit as st

from ecdysis.service import Service, load_workflows
from ecdysis.settings import Settings


def _preload_engine() -> None:
    """The service imports these lazily inside job functions; importing them once here, in the
    script thread, keeps two worker threads from importing the same module at the same moment
    (seen to fail: 'NoneType' object has no attribute '__dict__' in dataclass set-up)."""
    import ecdysis.diffs  # noqa: F401
    import ecdysis.export  # noqa: F401
    import ecdysis.gate  # noqa: F401
    import ecdysis.jobs  # noqa: F401
    load_workflows()


@st.cache_resource(show_spinner=False)
def _service_for(database_url: str) -> Service:
    """Keyed by database URL so a changed ECDYSIS_HOME (tests) gets its own store and workers."""
    from storage import open_store  # the composition root: the engine never imports storage
    _preload_engine()
    return Service(open_store(database_url), Settings.from_env())


def service() -> Service:
    """The process-wide service for the configured database (opened, migrated, on first use)."""
    return _service_for(Settings.from_env().database_url)


def remember(key: str, value: str | None) -> None:
    """Keep a choice (a run, a diagnosis, a proposal) across pages for this browser session."""
    st.session_state[f"_remember:{key}"] = value


def remembered(key: str) -> str | None:
    value = st.session_state.get(f"_remember:{key}")
    return value if isinstance(value, str) else None

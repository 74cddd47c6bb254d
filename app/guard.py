"""The page boundary: engine errors become one clear `st.error` line (never a traceback), and the
optional demo password (env ECDYSIS_APP_PASSWORD) is asked for before any page runs."""

from __future__ import annotations

import hmac
import logging
import os
import time
from contextlib import contextmanager
from typing import Iterator

import streamlit as st

from app.text import md
from ecdysis.errors import EcdysisError
from ecdysis.settings import redact_credentials

PASSWORD_ENV = "ECDYSIS_APP_PASSWORD"
_AUTH_KEY = "_ecdysis_authenticated"
_log = logging.getLogger("ecdysis.app")


def error_text(exc: BaseException) -> str:
    """One line for the page: an engine error's own message (with its hint), or the type and first
    line of an unexpected one; the traceback goes to the server log only."""
    if isinstance(exc, EcdysisError):
        return redact_credentials(str(exc))
    first = redact_credentials((str(exc).strip().splitlines() or [""])[0][:300])
    return f"Unexpected {type(exc).__name__}{': ' + first if first else ''} (details are in the server log)"


@contextmanager
def shown_errors() -> Iterator[None]:
    """Run a block; if the engine raises, show its message and carry on rendering the page.

    Streamlit's own rerun/stop signals derive from BaseException and pass through untouched."""
    try:
        yield
    except EcdysisError as exc:
        st.error(md(error_text(exc)), icon=":material/error:")
    except Exception as exc:  # a bug must still be one readable line, not a stack trace
        _log.exception("page error")
        st.error(md(error_text(exc)), icon=":material/error:")


def password_matches(given: str, expected: str) -> bool:
    """Constant-time comparison, so the answer time says nothing about the password."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def require_password() -> bool:
    """True when no password is configured or this session gave it; otherwise show the form."""
    expected = os.environ.get(PASSWORD_ENV, "")
    if not expected or st.session_state.get(_AUTH_KEY) is True:
        return True
    st.title("Ecdysis")
    with st.form("login", border=True, width=420):
        given = st.text_input("Password", type="password", help="This demo is shared; ask its host.")
        entered = st.form_submit_button("Enter", type="primary")
    if entered:
        if password_matches(given, expected):
            st.session_state[_AUTH_KEY] = True
            st.rerun()
        time.sleep(1.0)  # slows guessing down; the comparison itself is constant-time
        st.error("That password is not right.")
    return False

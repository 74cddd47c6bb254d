"""Import of a user suite from an uploaded JSONL file: checked line by line first, stored under a
name, then offered in every suite list; a bad file is refused in one line naming the line."""

from __future__ import annotations

import re

import streamlit as st

from app import components as ui
from app import views
from app.guard import error_text
from ecdysis.errors import EcdysisError
from ecdysis.service import Service
from ecdysis.suites.forms import suite_forms
from ecdysis.suites.jsonl import MAX_FILE_BYTES

FORMAT_HELP = ('One JSON object per line: {"input": ..., "target": ...}, optional "id", "category", "split", '
               '"choices", "fields"; an optional first line {"ecdysis_suite": {"name", "scorer", "description", '
               '"answer_form"}}. At most ' + f"{MAX_FILE_BYTES // 2**20} MB, 256 KiB a line.")


def default_name(filename: str) -> str:
    """A storable suite name from an upload's file name: 'My Suite (2).jsonl' -> 'My-Suite-2'."""
    stem = re.sub(r"\.jsonl?$", "", filename, flags=re.IGNORECASE)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")
    return name or "my-suite"


def upload(svc: Service) -> None:
    """Upload, name, import; the outcome stays on screen until the next import."""
    file = st.file_uploader("JSONL file", type=["jsonl"], key="suite:file", help=FORMAT_HELP)
    if file is not None:
        if st.session_state.get("_suite:file") != file.file_id:  # a new file: offer its own name
            st.session_state["_suite:file"] = file.file_id
            st.session_state["suite:name"] = default_name(file.name)
        name = st.text_input("Suite name", key="suite:name")
        replace = st.checkbox("Replace a stored suite of this name", key="suite:replace",
                              help="runs keep their results; they refer to the old instances by id")
        if st.button("Import suite", key="suite:import", icon=":material/upload_file:", type="primary"):
            try:
                suite = svc.import_suite(file.getvalue(), name=name, filename=file.name, replace=replace)
                kinds = sorted({f.kind for f in suite_forms(svc.suite(suite.name).instances).values()})
                st.session_state["_suite:outcome"] = (
                    "ok", f"Imported {ui.md(suite.name)}: {views.count(len(suite.instances), 'instance')} in "
                          f"{views.count(len(suite.categories), 'category', 'categories')}, "
                          f"answers: {ui.md(', '.join(kinds))}. "
                          f"It is now in the suite lists.")
            except EcdysisError as exc:
                st.session_state["_suite:outcome"] = ("error", f"{ui.md(file.name)} was refused: "
                                                               f"{ui.md(error_text(exc))}")
    outcome = st.session_state.get("_suite:outcome")
    if outcome:
        (st.success if outcome[0] == "ok" else st.error)(outcome[1])

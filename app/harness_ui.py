"""The harness page's sections: the lineage tree, a diff between any two versions, export of a
version as its zip, and import of an uploaded zip (refused with a clear message when malformed)."""

from __future__ import annotations

import streamlit as st

from app import components as ui
from app import views
from app.guard import error_text
from ecdysis.errors import EcdysisError
from ecdysis.service import Service
from ecdysis.store import HarnessVersion

LEGEND = ("starter: grey · kept: green · candidate: blue · rolled back: orange, dashed edge · "
          "rejected: red, dashed · imported: violet · a red dotted note is a proposal a reviewer rejected")


def lineage(svc: Service, versions: list[HarnessVersion], scores: dict[str, views.ValScore]) -> None:
    rejected = [p for p in svc.proposals(status="rejected") if p.data.get("status") != "rejected"]
    st.graphviz_chart(views.lineage_dot(versions, scores, rejected))
    st.caption(LEGEND)


def diff_between(svc: Service, versions: list[HarnessVersion], labels: dict[str, str]) -> None:
    if len(versions) < 2:
        st.caption("Only the starter version exists so far; approving and applying a proposal makes the next one.")
        return
    newest = max(versions, key=lambda h: h.created_at)
    ids = [h.id for h in sorted(versions, key=lambda h: h.created_at)]
    left, right = st.columns(2)
    with left:
        old = ui.pick("From version", ids, labels, key="hdiff:old", default=newest.parent or ids[0])
    with right:
        new = ui.pick("To version", ids, labels, key="hdiff:new", default=newest.id)
    if old and new:
        ui.diff_view(svc.harness_diff(old, new), key="hdiff")


def download(svc: Service, versions: list[HarnessVersion], labels: dict[str, str]) -> None:
    ids = [h.id for h in sorted(versions, key=lambda h: h.created_at, reverse=True)]
    chosen = ui.pick("Version to export", ids, labels, key="export:pick", memory="harness")
    if chosen:
        st.download_button("Download zip", data=svc.export_harness(chosen), file_name=f"ecdysis-harness-{chosen}.zip",
                           mime="application/zip", icon=":material/download:", on_click="ignore", key="export:zip")
        st.caption("The zip holds the harness, its lineage and specs (manifest.json) and a standalone run.py.")


def upload(svc: Service) -> None:
    """Import once per uploaded file; the outcome stays on screen until the next upload."""
    file = st.file_uploader("Import a harness zip", type=["zip"], key="import:file",
                            help="exported by Ecdysis; links, path traversal, oversized or malformed "
                                 "archives are refused")
    if file is not None and st.session_state.get("_import:last") != file.file_id:
        st.session_state["_import:last"] = file.file_id
        try:
            version = svc.import_harness(file.getvalue(), name=file.name)
            st.session_state["_import:outcome"] = ("ok", f"Imported {ui.md(file.name)} as version {version.id}.")
        except EcdysisError as exc:
            st.session_state["_import:outcome"] = ("error", f"{ui.md(file.name)} was refused: {ui.md(error_text(exc))}")
        except Exception as exc:  # a malformed archive must read as a refusal, not a crash
            st.session_state["_import:outcome"] = ("error", f"{ui.md(file.name)} was refused: {ui.md(error_text(exc))}")
    outcome = st.session_state.get("_import:outcome")
    if outcome:
        (st.success if outcome[0] == "ok" else st.error)(outcome[1])

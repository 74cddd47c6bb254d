"""Harnesses: every version in its lineage tree (kept, rolled back, rejected told apart, with
validation scores), a diff between any two versions, export as a zip and import of a zip."""

import streamlit as st

from app import harness_ui as hv
from app import views
from app.guard import shown_errors
from app.state import service

svc = service()
st.title("Harnesses")
st.caption("A harness version is content-addressed: its id comes from its files. Every change is a new version "
           "with a parent link.")

with shown_errors():
    versions = svc.harnesses()
    scores = views.validation_scores(versions, svc.runs())
    labels = {h.id: views.harness_label(h, scores) for h in versions}
    st.subheader("Lineage")
    hv.lineage(svc, versions, scores)
    st.dataframe([views.harness_row(h, scores) for h in sorted(versions, key=lambda h: h.created_at, reverse=True)],
                 hide_index=True, width="stretch",
                 column_config={"validation": st.column_config.NumberColumn("validation", format="percent")})
    st.subheader("Compare two versions")
    hv.diff_between(svc, versions, labels)
    export_col, import_col = st.columns(2, gap="large")
    with export_col:
        st.subheader("Export")
        hv.download(svc, versions, labels)
    with import_col:
        st.subheader("Import")
        hv.upload(svc)

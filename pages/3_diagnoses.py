"""Diagnoses: for each cluster of a diagnosis, the Investigator, Attributor, Proposer and Critic
conversation round by round, with the verdict and the final modification specification."""

import json

import streamlit as st

from app import clusters_ui as cv
from app import views
from app import components as ui
from app.guard import shown_errors
from app.state import service

svc = service()
st.title("Diagnoses")
st.caption("Each harness-level cluster is refined by four roles until the Critic accepts a specification "
           "(or the rounds run out); model-specific and noise clusters get no patch, and say why.")

with shown_errors():
    ui.job_panel(svc, ["diagnose"], key="diagnose")
    diagnoses = svc.diagnoses()
    if not diagnoses:
        ui.empty_state("No diagnosis yet — cluster a batch's failures first.",
                       "Start one on the Failure clusters page (or from a run on the Runs page).")
        ui.page_link("clusters", "Go to Failure clusters", ":material/bubble_chart:")
    else:
        diagnosis = cv.pick_diagnosis(diagnoses, key="diagnoses:diagnosis")
        if diagnosis is not None:
            report = views.report_of(diagnosis)
            st.caption(ui.md(f"roles: {cv.role_backend_text(report.role_backend)}"))
            down_csv, down_json, _ = st.columns([1, 1, 3])
            down_csv.download_button("Clusters as CSV", views.diagnosis_csv(report),
                                     file_name=f"ecdysis-diagnosis-{diagnosis.id}.csv", mime="text/csv",
                                     icon=":material/table:")
            down_json.download_button("Diagnosis as JSON", json.dumps(report.to_json(), ensure_ascii=False, indent=1),
                                      file_name=f"ecdysis-diagnosis-{diagnosis.id}.json", mime="application/json",
                                      icon=":material/data_object:",
                                      help="every cluster with its failures, verdict, role transcript and proposal")
            if not report.clusters:
                ui.empty_state("No failures, so nothing to diagnose.", icon=":material/celebration:")
            cv.conversation(report)

"""Failure clusters: diagnose a batch (one or several runs) in the background, then see its clusters
as charts (size by verdict, x category, x model, a 2-D map) and drill down to every trajectory."""

import streamlit as st

from app import clusters_ui as cv
from app import components as ui
from app import forms, views
from app.guard import shown_errors
from app.state import remember, service

svc = service()
st.title("Failure clusters")
st.caption("Failures of a batch are clustered across instances, categories and models; a pattern that recurs "
           "everywhere points at the harness, one model's pattern at that model.")

running: list = []
with shown_errors():
    running = ui.job_panel(svc, ["diagnose"], key="diagnose",
                           on_done=lambda job: remember("diagnosis", job.result.get("diagnosis_id")))
    ui.recent_failures(svc, ["diagnose"])

with shown_errors():
    runs, diagnoses = svc.runs(), svc.diagnoses()
    with st.expander("Diagnose a batch", expanded=not diagnoses and not running, icon=":material/hub:"):
        request = forms.diagnosis_form(runs, cv.remembered_runs())
        if request:
            svc.start_diagnosis_job(request.run_ids, role_backend=request.role_backend)
            st.rerun()
    if not runs:
        ui.empty_state("No runs yet — start one with the embedded model.", "Batches are started on the Runs page.")
        ui.page_link("runs", "Go to Runs", ":material/play_circle:")
    elif not diagnoses and running:
        ui.empty_state("A diagnosis is running.", "Its clusters appear here when it finishes; the bar above shows "
                       "where it is.", icon=":material/hourglass_top:")
    elif not diagnoses:
        ui.empty_state("No diagnosis yet.", "Pick a finished run above and press Cluster and diagnose.")
    else:
        diagnosis = cv.pick_diagnosis(diagnoses, key="clusters:diagnosis")
        if diagnosis is not None:
            report = views.report_of(diagnosis)
            cv.overview(report)
            if not report.clusters:
                ui.empty_state("This batch has no failures to cluster.", icon=":material/celebration:")
            cv.cluster_charts(report)
            st.subheader("Drill down")
            cv.drilldown(svc, report)

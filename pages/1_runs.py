"""Runs: start a batch (suite, models, harness version, size, concurrency) in the engine's
background worker, watch it, resume unfinished runs, and browse results down to every model call."""

import streamlit as st

from app import components as ui
from app import compare_ui, demo_ui, forms, suite_import, views
from app.guard import shown_errors
from app.state import service

svc = service()
st.title("Runs")
st.caption("A batch runs one harness version on a suite's instances with each chosen model. It runs in the "
           "background: leave the page or refresh, it keeps going.")

with shown_errors():
    with st.expander("Demo: batch → clusters → diagnosis → review in one click", icon=":material/rocket_launch:",
                     expanded=not svc.runs(limit=1) or demo_ui.started_here()):
        demo_ui.demo(svc)

with shown_errors():
    with st.expander("Start a batch", expanded=not svc.runs(limit=1), icon=":material/play_arrow:"):
        requests = forms.batch_form(svc.suites(), svc.harnesses(), svc.settings.default_models)
        if requests:
            with st.spinner("Checking the model and creating the run…"):
                started = [svc.start_run_job(r) for r in requests]
            st.toast(f"Started {len(started)} batch(es)", icon=":material/play_arrow:")

with shown_errors():
    with st.expander("Import a JSONL suite", icon=":material/upload_file:"):
        suite_import.upload(svc)

with shown_errors():
    ui.job_panel(svc, ["run", "demo"], key="runs")
    ui.recent_failures(svc, ["run", "demo"])

with shown_errors():
    runs = svc.runs()
    if not runs:
        ui.empty_state("No runs yet — start one with the embedded model.",
                       "Keep suite reasoning-mix, the two embedded models and a batch of 12 (about a minute), "
                       "then press Start batch.")
    else:
        st.subheader("Finished and running batches")
        ui.live_run_table(svc, key="runs:table")
        jobs, leased = svc.recent_jobs(limit=100), svc.running_elsewhere()
        for run, holder in views.running_elsewhere(runs, jobs, leased):
            st.info(f"{run.id} is running elsewhere (held by {ui.md(holder)}); it can be resumed here once "
                    f"that process stops and its lease lapses.", icon=":material/sync:")
        for run in views.resumable(runs, jobs, leased):
            if st.button(f"Resume {run.id} ({run.status}, {len(svc.results(run.id))}/{len(run.instance_ids)} done)",
                         key=f"resume:{run.id}", icon=":material/resume:"):
                svc.start_resume_job(run.id)  # refused (one line) if another process took it meanwhile
                st.rerun()
        st.subheader("Compare two runs, instance by instance")
        compare_ui.compare_runs(svc, runs)
        st.subheader("Inspect a run")
        run_id = ui.pick("Run", [r.id for r in runs], {r.id: views.run_label(r) for r in runs},
                         key="runs:pick", memory="run")
        if run_id:
            ui.run_detail(svc, svc.get_run(run_id))

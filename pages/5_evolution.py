"""Evolution: start an evolution (ecdysis or per-instance, auto-approve or human gate) in the
background, watch it iteration by iteration, and compare the strategies in numbers."""

import streamlit as st

from app import components as ui
from app import evolution_ui as ev
from app import forms, views
from app.guard import shown_errors
from app.state import service

svc = service()
st.title("Evolution")
st.caption("Each iteration: a train batch, its diagnosis, the gate, the patched version validated against its "
           "parent on the same instances (kept or rolled back). The test split is scored once, at the end.")

with shown_errors():
    with st.expander("Start an evolution", expanded=not svc.evolutions(), icon=":material/rocket_launch:"):
        configs = forms.evolution_form(svc.suites(), svc.harnesses(), svc.settings.default_models)
        if configs:
            for config in configs:
                svc.start_evolution_job(config)
            st.rerun()

with shown_errors():
    ui.job_panel(svc, ["evolve"], key="evolve")
    ui.recent_failures(svc, ["evolve"])
    evolutions = svc.evolutions()
    if not evolutions:
        ui.empty_state("No evolution yet.", "Start one above; the embedded models (Qwen2.5-Coder 0.5B and SmolLM2) need no key.")
    else:
        watch_tab, compare_tab = st.tabs(["Watch", "Compare strategies"])
        with watch_tab:
            chosen = ui.pick("Evolution", [e.id for e in evolutions],
                             {e.id: views.evolution_label(e) for e in evolutions}, key="evo:pick", memory="evolution")
            if chosen:
                ev.watch(svc, svc.get_evolution(chosen))
        with compare_tab:
            ev.compare(svc, evolutions)

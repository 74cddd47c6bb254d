"""The evolution page's sections: watching one evolution iteration by iteration (polled while it
runs or waits for decisions) and comparing the two strategies with the numbers stated."""

from __future__ import annotations

import streamlit as st

from app import charts, views
from app import components as ui
from app.guard import shown_errors
from ecdysis.errors import BudgetExceeded
from ecdysis.service import Service
from ecdysis.store import EvolutionRecord

LIVE = ("running", "waiting")


def worker_state(svc: Service, evo: EvolutionRecord) -> tuple[bool, str | None]:
    """(a job is working on it, the error of its last job if that failed). An evolution whose
    job died keeps status 'running' in its record; the job says what really happened."""
    mine = [j for j in svc.recent_jobs(limit=100) if j.kind == "evolve" and j.params.get("evolution_id") == evo.id]
    if any(j.status in views.ACTIVE_JOB for j in mine):
        return True, None
    last = max(mine, key=lambda j: j.updated_at, default=None)
    return False, (last.error or "failed") if last is not None and last.status == "failed" else None


def _status(svc: Service, evo: EvolutionRecord) -> None:
    gate = "auto-approve" if evo.config.get("auto_approve") else "human gate"
    st.markdown(f"**{evo.strategy}** on **{ui.md(evo.suite)}** with {ui.md(', '.join(evo.models))} · {gate} · "
                f"status **{evo.status}** · {views.evolution_where(evo)}")
    outcome = evo.outcome
    cursor = outcome.cursor
    if evo.status == "waiting" or cursor.phase == "gate":
        pending = [p for p in svc.proposals(status="pending") if p.diagnosis_id == cursor.diagnosis_id]
        if pending and not evo.config.get("auto_approve"):
            st.warning(f"Waiting for your decision on {views.plural(len(pending), 'proposal')}.", icon=":material/pending_actions:")
            ui.page_link("review", "Decide on the Review page", ":material/rate_review:")
    if outcome.stopped:
        st.caption(ui.md(outcome.stopped))


def _body(svc: Service, evo: EvolutionRecord) -> None:
    _status(svc, evo)
    stats = views.strategy_stats(evo)
    cols = st.columns(5)
    rows = evo.rows
    cols[0].metric("iterations done", len(rows))
    cols[1].metric("final validation", views.pct(stats.final_val))
    delta = views.points_delta(stats.test_accuracy, stats.base_test_accuracy)
    cols[2].metric("test (sealed)", views.pct(stats.test_accuracy), delta=delta.text if delta else None,
                   delta_color="normal" if delta and delta.moved else "off",
                   delta_arrow="auto" if delta and delta.moved else "off")
    cols[3].metric("training time", f"{stats.train_seconds:.0f} s")
    cols[4].metric("model calls", stats.model_calls)
    if rows:
        gates = views.gate_rows(evo, svc.harnesses())
        st.plotly_chart(charts.evolution_curves([(evo.id, evo.strategy, rows, stats.test_accuracy)],
                                                base=_base_accuracy(gates)),
                        key=f"curve:{evo.id}", config={"displayModeBar": False})
        st.dataframe(views.iteration_rows(evo), hide_index=True, width="stretch")
        gate_table(evo, gates)
        changes = views.change_rows(evo)
        if changes:
            st.markdown("**Each change: predicted, screened alone, validated**")
            st.caption(views.screening_rule(evo))
            st.dataframe(changes, hide_index=True, width="stretch", key=f"changes:{evo.id}",
                         column_config={"predicted": st.column_config.TextColumn("predicted", width="large"),
                                        "why": st.column_config.TextColumn("why", width="large")})
        pairs = views.pair_rows(evo)
        if pairs:
            st.markdown("**Pairs screened together**")
            st.caption("A change refused alone on validation without a clear loss (a near miss), composed with a "
                       "change screened after it: against the parent, and over the later change alone, on the same "
                       "batch. A pair the batch puts ahead is validated before the later change; one it puts behind "
                       "is validated once the later change fails alone too.")
            st.dataframe(pairs, hide_index=True, width="stretch", key=f"pairs:{evo.id}",
                         column_config={"why": st.column_config.TextColumn("why", width="large")})
    elif evo.status in LIVE:
        st.caption("The first iteration is running: train batch, then diagnosis, gate and validation.")
    else:
        st.caption(f"No iteration has finished yet (status {evo.status}).")


def _base_accuracy(gates: list[views.GateRow]) -> float | None:
    return gates[0].parent if gates else None


def gate_table(evo: EvolutionRecord, gates: list[views.GateRow]) -> None:
    """The validation gate of every iteration: parent against candidate on the same instances,
    paired wins and losses, and the rule they were held to."""
    st.markdown("**The gate, iteration by iteration**")
    st.caption(ui.md(f"A candidate is kept when, on the same validation instances, {views.gate_threshold(evo.config)} "
                     f"(wins: instances the candidate gets right and its parent wrong; losses: the reverse)."))
    st.dataframe([g.to_row() for g in gates], hide_index=True, width="stretch", key=f"gates:{evo.id}",
                 column_config={"parent acc": st.column_config.NumberColumn("parent acc", format="percent"),
                                "candidate acc": st.column_config.NumberColumn("candidate acc", format="percent"),
                                "why": st.column_config.TextColumn("why", width="large")})


def holder_elsewhere(svc: Service, evo: EvolutionRecord) -> str | None:
    """Who executes this evolution when no job of this app does (a CLI process, another app)."""
    working, _ = worker_state(svc, evo)
    return None if working else svc.running_elsewhere().get(f"evolution:{evo.id}")


def is_live(svc: Service, evo: EvolutionRecord) -> bool:
    working, _ = worker_state(svc, evo)
    return evo.status in LIVE and (working or holder_elsewhere(svc, evo) is not None)


@st.fragment(run_every=ui.POLL_SECONDS)
def _live(svc: Service, evolution_id: str) -> None:
    """Re-read the evolution from the store every few seconds; rerun the page once it settles."""
    evo = svc.get_evolution(evolution_id)
    _body(svc, evo)
    holder = holder_elsewhere(svc, evo)
    if holder is not None:
        st.info(f"This evolution is running elsewhere (held by {ui.md(holder)}).", icon=":material/sync:")
    if not is_live(svc, evo):
        st.rerun(scope="app")


def watch(svc: Service, evo: EvolutionRecord) -> None:
    if is_live(svc, evo):
        _live(svc, evo.id)
        return
    _body(svc, evo)
    holder = holder_elsewhere(svc, evo)
    if holder is not None:
        st.info(f"This evolution is running elsewhere (held by {ui.md(holder)}); it can be resumed here once "
                f"that process stops and its lease lapses.", icon=":material/sync:")
        return
    _, error = worker_state(svc, evo)
    if error and evo.status in LIVE:
        st.error(f"The evolution's background job failed: {ui.md(error)}", icon=":material/error:")
    if not (evo.status in ("stopped", "failed") or error):
        return
    budget = _resume_budget(evo)
    if st.button("Resume this evolution", key=f"resume:{evo.id}", icon=":material/resume:"):
        with shown_errors():
            svc.resume_evolution_job(evo.id, max_model_calls=budget)
            st.rerun()


def _resume_budget(evo: EvolutionRecord) -> int | None:
    """The model-call budget a resume runs with, for an evolution that has one: one stopped by its
    budget stops again at once unless it is raised. None keeps the budget as it is."""
    limit = evo.outcome.stopped_by
    if evo.status == "stopped" and limit in ("tokens", "wall"):  # the page sets only a call budget
        st.caption(f"This evolution was stopped by a budget the page does not set: resume it from the CLI with "
                   f"`ecdysis evolve --resume {ui.md(evo.id)}` and `{BudgetExceeded.FLAGS[limit]}`.")
    now = int(evo.config.get("max_model_calls") or 0)
    if not now:
        return None
    spent = evo.outcome.spent.calls
    value = int(st.number_input("Model-call budget for the resume", min_value=1, value=now, step=100,
                                key=f"resume-budget:{evo.id}",
                                help=f"{spent} of {now} calls spent: a resume within the same budget stops again "
                                     f"at once; the budget counts every call, roles included"))
    return value if value != now else None


def _latest(evos: list[EvolutionRecord], strategy: str) -> str | None:
    mine = [e for e in evos if e.strategy == strategy]
    done = [e for e in mine if e.status == "done"]
    return (done or mine)[0].id if (done or mine) else None


def compare(svc: Service, evos: list[EvolutionRecord]) -> None:
    """Ecdysis against per-instance search: curves, cost bars, and the speedup and delta in numbers."""
    by_id = {e.id: e for e in evos}
    labels = {e.id: views.evolution_label(e) for e in evos}
    ecd_ids = [e.id for e in evos if e.strategy == "ecdysis"]
    per_ids = [e.id for e in evos if e.strategy != "ecdysis"]
    if not ecd_ids or not per_ids:
        ui.empty_state("A comparison needs an Ecdysis evolution and a baseline (per-instance or self-evolution).",
                       "Start one with strategy 'both, side by side' (same suite, models and budget for each).")
        return
    left, right = st.columns(2)
    with left:
        a = ui.pick("Ecdysis evolution", ecd_ids, labels, key="cmp:ecdysis", default=_latest(evos, "ecdysis"))
    with right:
        b = ui.pick("Baseline evolution", per_ids, labels, key="cmp:per",
                    default=_latest(evos, "per-instance") or _latest(evos, "self-evolution"))
    if not a or not b:
        return
    ea, eb = by_id[a], by_id[b]
    result = views.compare(ea, eb)
    for sentence in result.sentences():
        st.markdown(f"- {sentence}")
    st.caption("Speedup is the benchmark's: the model calls (and charged model seconds) each evolution spent before "
               "its validation accuracy first reached the baseline's final one. Every call counts — roles, smoke runs, "
               "screening, validation — and time waiting for a human never does. Evolutions started together with "
               "'side by side' are charged for cached answers too, so neither rides on the other's calls.")
    if (ea.suite, sorted(ea.models)) != (eb.suite, sorted(eb.models)):
        st.warning("These evolutions ran on different suites or models; the numbers are not a fair comparison.")
    series = [(f"ecdysis {ea.id[:6]}", "ecdysis", ea.rows, result.ecdysis.test_accuracy),
              (f"{eb.strategy} {eb.id[:6]}", eb.strategy, eb.rows, result.baseline.test_accuracy)]
    harnesses = svc.harnesses()
    base = _base_accuracy(views.gate_rows(ea, harnesses)) or _base_accuracy(views.gate_rows(eb, harnesses))
    st.plotly_chart(charts.evolution_curves(series, base=base), key="cmp:curves", config={"displayModeBar": False})
    st.plotly_chart(charts.cost_bars([result.ecdysis, result.baseline]), key="cmp:cost",
                    config={"displayModeBar": False})

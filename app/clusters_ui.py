"""The sections of the cluster and diagnosis pages: a diagnosis's overview, its four charts, the
drill-down cluster -> instances -> trajectory, and the per-cluster role conversation."""

from __future__ import annotations

import streamlit as st

from app import charts, views
from app import components as ui
from app.state import remember, remembered
from ecdysis.aggregate import Cluster
from ecdysis.diagnosis import DiagnosisReport
from ecdysis.failures import FAILURE_TITLES
from ecdysis.refine import Proposal
from ecdysis.service import Service
from ecdysis.store import DiagnosisRecord


def pick_diagnosis(diagnoses: list[DiagnosisRecord], key: str) -> DiagnosisRecord | None:
    by_id = {d.id: d for d in diagnoses}
    chosen = ui.pick("Diagnosis", list(by_id), {d.id: views.diagnosis_label(d) for d in diagnoses},
                     key=key, memory="diagnosis")
    return by_id.get(chosen or "")


def overview(report: DiagnosisReport) -> None:
    stats = report.stats
    cols = st.columns(5)
    cols[0].metric("results", stats.get("results", 0))
    cols[1].metric("failures", stats.get("failures", 0))
    cols[2].metric("clusters", len(report.clusters))
    cols[3].metric("harness-level", stats.get("harness_level", 0))
    cols[4].metric("proposals", len(report.proposals))
    backends = views.output_backends(report)
    st.caption(ui.md(f"runs {', '.join(report.run_ids)} · models {', '.join(report.models)} · "
                     f"suites {', '.join(report.suites)} · harness {views.short(report.harness_version)} · "
                     f"roles: {role_backend_text(report.role_backend)}"
                     + (f" · role outputs: {backends}" if backends else "")))
    for note in report.notes:
        st.info(ui.md(note), icon=":material/info:")


def role_backend_text(name: str) -> str:
    return "heuristic (deterministic, offline — no LLM)" if name == "heuristic" else f"LLM ({name})"


def _cluster_memory(report: DiagnosisReport) -> str:
    return f"cluster:{report.id}"


def _select_from_chart(chart_key: str, memory: str) -> None:
    """Clicking a bar in the size chart selects that cluster below."""
    state = st.session_state.get(chart_key)
    points = getattr(getattr(state, "selection", None), "points", None) or []
    if points and points[0].get("customdata"):
        remember(memory, str(points[0]["customdata"][0]))


def _member_memory(report: DiagnosisReport) -> str:
    return f"member:{report.id}"


def _select_from_map(chart_key: str, report: DiagnosisReport) -> None:
    """Clicking a failure on the map opens it below: its cluster, and its trajectory."""
    state = st.session_state.get(chart_key)
    points = getattr(getattr(state, "selection", None), "points", None) or []
    data = points[0].get("customdata") if points else None
    if data and len(data) >= 6:
        remember(_cluster_memory(report), str(data[4]))
        remember(_member_memory(report), str(data[5]))


def cluster_charts(report: DiagnosisReport) -> None:
    """Sizes by verdict | cluster x category, then cluster x model | the 2-D failure map."""
    if not report.clusters:
        return
    memory = _cluster_memory(report)
    top_left, top_right = st.columns(2)
    with top_left:
        key = f"sizes:{report.id}"
        st.plotly_chart(charts.cluster_sizes(report), key=key, on_select=lambda: _select_from_chart(key, memory),
                        selection_mode="points", config={"displayModeBar": False})
    with top_right:
        st.plotly_chart(charts.category_heatmap(report), config={"displayModeBar": False})
    low_left, low_right = st.columns(2)
    with low_left:
        st.plotly_chart(charts.model_comparison(report), config={"displayModeBar": False})
    with low_right:
        map_key = f"map:{report.id}"
        st.plotly_chart(charts.failure_map_figure(views.failure_map(report)), key=map_key,
                        on_select=lambda: _select_from_map(map_key, report), selection_mode="points",
                        config={"displayModeBar": False})
        st.caption("Click a failure to open its trajectory below.")


def pick_cluster(report: DiagnosisReport, key: str) -> Cluster | None:
    by_id = {c.id: c for c in report.clusters}
    labels = {c.id: f"{views.cluster_title(c, 70)} · {c.verdict} · {views.count(c.size, 'failure')}"
              for c in report.clusters}
    chosen = ui.pick("Cluster", list(by_id), labels, key=key, memory=_cluster_memory(report))
    return by_id.get(chosen or "")


def drilldown(svc: Service, report: DiagnosisReport) -> None:
    """Cluster -> its failing instances -> one instance's whole trajectory."""
    cluster = pick_cluster(report, key=f"drill:{report.id}")
    if cluster is None:
        return
    ui.cluster_card(cluster, report.patch(cluster.id))
    every = views.member_rows(cluster)
    scope = f"{report.id}:{cluster.id}"
    model_col, type_col, search_col = st.columns([2, 2, 2])
    models = model_col.multiselect("Models", sorted({r["model"] for r in every}), key=f"members:{scope}:models",
                                   placeholder="all models")
    failures = type_col.multiselect("Failure types", sorted({r["failure"] for r in every}),
                                    key=f"members:{scope}:types", placeholder="all failure types",
                                    format_func=lambda t: FAILURE_TITLES.get(t, t))
    text = search_col.text_input("Search", key=f"members:{scope}:search",
                                 placeholder="id, answer, target, evidence or checker detail")
    rows = views.filter_members(every, models=models, failures=failures, text=text)
    shown = f"{len(rows)} of {len(every)}" if len(rows) < len(every) else str(len(rows))
    st.markdown(f"**{shown} failing instance{'' if len(every) == 1 else 's'}** · click a row for its trajectory")
    event = st.dataframe(rows, key=f"members:{scope}:table", hide_index=True, width="stretch",
                         on_select="rerun", selection_mode="single-row",
                         column_config={"evidence": st.column_config.TextColumn("evidence", width="large"),
                                        "mechanism": st.column_config.TextColumn(
                                            "mechanism", help="how the calls went wrong"),
                                        "check": st.column_config.TextColumn(
                                            "check", help="the checker's first broken rule", width="large")})
    picked = list(getattr(getattr(event, "selection", None), "rows", None) or [])
    clicked = ui.new_click(f"members:{scope}", f"{rows[picked[0]]['run']}/{rows[picked[0]]['instance']}"
                           if picked and picked[0] < len(rows) else None)
    if clicked:  # a row click opens that instance's trajectory below
        remember(_member_memory(report), clicked)
    if not rows:
        return
    options = [f"{r['run']}/{r['instance']}" for r in rows]
    labels = {f"{r['run']}/{r['instance']}": f"{r['instance']} · {r['model']} · {r['category']}" for r in rows}
    chosen = ui.pick("Trajectory of instance", options, labels, key=f"member:{report.id}:{cluster.id}",
                     memory=_member_memory(report))
    if chosen:
        run_id, _, instance_id = chosen.partition("/")
        row = next(r for r in rows if f"{r['run']}/{r['instance']}" == chosen)
        title = FAILURE_TITLES.get(row["failure"], row["failure"])
        st.caption(f"failure type: {ui.md(title)} — {ui.md(views.member_evidence(row))}")
        result = ui.find_result(svc, run_id, instance_id)
        if result is None:
            st.warning(f"The result of {ui.md(instance_id)} in run {ui.md(run_id)} is no longer stored.")
        else:
            ui.trajectory(result, ui.agent_instance(svc, svc.get_run(run_id).suite, result))


def conversation(report: DiagnosisReport) -> None:
    """One cluster's diagnosis: the roles' chat on the right, verdict and final spec on the left."""
    cluster = pick_cluster(report, key=f"conv:{report.id}")
    if cluster is None:
        return
    left, right = st.columns([2, 3], gap="large")
    with left:
        st.markdown(f"#### {ui.md(cluster.id)} · {ui.md(cluster.label)}")
        ui.verdict_badge(cluster.verdict)
        st.markdown(ui.md(cluster.reason))
        st.caption(f"{views.count(cluster.size, 'failure')} · {views.count(len(cluster.instances), 'instance')} · "
                   f"systematicity {cluster.systematicity:.2f}")
        _outcome(report, cluster, report.proposal_for(cluster.id))
    with right:
        st.markdown("#### Role conversation")
        ui.chat_transcript(report.transcript(cluster.id))


def _outcome(report: DiagnosisReport, cluster: Cluster, proposal: Proposal | None) -> None:
    st.divider()
    if proposal is None:
        st.markdown("**Outcome**")
        st.info(ui.md(report.patch(cluster.id).text()), icon=":material/block:")
    else:
        endorsed = proposal.status == "endorsed"  # Proposal.from_json reads the older name "accepted" as this
        st.markdown(f"**Final modification specification** — proposal `{proposal.id}`, "
                    f"{'endorsed by the Critic' if endorsed else 'rejected by the Critic'} after "
                    f"{views.plural(proposal.rounds, 'round')}")
        _proposal_body(proposal)
    alternative = report.alternative_for(cluster.id)
    if alternative is not None:
        st.markdown(f"**The engine's alternative** — proposal `{alternative.id}`, screened alone beside the "
                    "roles' proposal; the Review page lists both")
        st.caption(ui.md(alternative.alternative))
        _proposal_body(alternative)
    readings = report.readings_for(cluster.id)
    for reading in readings:
        st.markdown(f"**Another reading repair** — proposal `{reading.id}`, screened alone beside the others; "
                    "it asks the model nothing new, so trying it costs no model call")
        st.caption(ui.md(reading.alternative))
        _proposal_body(reading)
    reviewable = [p for p in (proposal, alternative, *readings) if p is not None and p.status == "endorsed"]
    if reviewable:
        remember("proposal", reviewable[0].id)
        ui.page_link("review", "Review this proposal" if len(reviewable) == 1 else "Review these proposals",
                     ":material/rate_review:")


def _proposal_body(proposal: Proposal) -> None:
    ui.spec_card(proposal.spec)
    if proposal.objections:
        st.markdown("**Critic's objections**\n" + "\n".join(f"- {ui.md(o)}" for o in proposal.objections))


def remembered_runs() -> list[str]:
    run = remembered("runs_for_diagnosis")
    return [run] if run else []

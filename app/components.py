"""Shared UI pieces the page scripts are made of: background-job progress (polled by a fragment),
run and result tables, a trajectory viewer, cluster cards, the role chat, spec cards, diff views."""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Mapping, Sequence

import streamlit as st

from app import diffview, views
from app.guard import error_text, shown_errors
from app.state import remember, remembered
from app.text import code, md
from app.tool_calls import ToolCallsView, tool_calls_view
from ecdysis.aggregate import Cluster
from ecdysis.diagnosis import PatchOutcome
from ecdysis.diffs import FileDiff
from ecdysis.errors import NotFound
from ecdysis.failures import calls_target, is_agent_instance
from ecdysis.records import Instance, InstanceResult, RunRecord
from ecdysis.roles.base import ModificationSpec, RoleMessage
from ecdysis.service import Service
from ecdysis.store import JobRecord

POLL_SECONDS = 1.5
PAGES = {"runs": "../pages/1_runs.py", "clusters": "../pages/2_clusters.py", "diagnoses": "../pages/3_diagnoses.py",
         "review": "../pages/4_review.py", "evolution": "../pages/5_evolution.py",
         "harnesses": "../pages/6_harnesses.py"}
VERDICT_BADGE = {"harness-level": "red", "model-specific": "orange", "noise": "gray"}
STATUS_BADGE = {"pending": "blue", "approved": "green", "edited": "green", "applied": "violet",
                "rejected": "red", "superseded": "gray"}
ROLE_AVATAR = {"investigator": ":material/search:", "attributor": ":material/balance:",
               "proposer": ":material/edit_note:", "critic": ":material/gavel:", "engine": ":material/rule:"}


def page_link(name: str, label: str, icon: str | None = None) -> None:
    st.page_link(PAGES[name], label=label, icon=icon)


def empty_state(message: str, hint: str | None = None, icon: str = ":material/inbox:") -> None:
    st.info(f"**{message}**" + (f"  \n{hint}" if hint else ""), icon=icon)


def pick(label: str, options: Sequence[str], labels: Mapping[str, str], *, key: str,
         memory: str | None = None, default: str | None = None, help: str | None = None) -> str | None:
    """A selectbox over ids that keeps its choice for this session; `memory` names a slot shared
    with other pages (the diagnosis chosen on one page is the one shown on the next)."""
    if not options:
        return None
    slot = memory or f"pick:{key}"
    wanted = remembered(slot)
    wanted = wanted if wanted in options else default
    index = list(options).index(wanted) if wanted is not None and wanted in options else 0
    # The choice and the option labels are part of the widget key: when another page, a finished
    # job or a status change alters them, a fresh widget shows them instead of stale ones.
    shown = "\x1f".join(labels.get(o, o) for o in options)
    widget_key = f"{key}:{wanted}:{hashlib.sha1(shown.encode()).hexdigest()[:10]}"

    def keep() -> None:
        remember(slot, st.session_state.get(widget_key))
    choice = st.selectbox(label, list(options), index=index, key=widget_key, help=help,
                          format_func=lambda o: labels.get(o, o), on_change=keep)
    if choice:
        remember(slot, choice)
    return choice


# ---------------------------------------------------------------- background jobs

def _job_line(svc: Service, job: JobRecord, key: str) -> None:
    left, right = st.columns([6, 1], vertical_alignment="center")
    left.progress(views.job_fraction(job), text=md(views.job_text(job)))
    if job.status in views.ACTIVE_JOB and not job.cancel_requested:
        if right.button("Stop", key=f"{key}:stop:{job.id}", icon=":material/stop_circle:",
                        help="Stops cooperatively: the current instance finishes, the rest can be resumed"):
            with shown_errors():
                svc.cancel_job(job.id)


@st.fragment(run_every=POLL_SECONDS)
def _live_jobs(svc: Service, kinds: tuple[str, ...], key: str,
               on_done: Callable[[JobRecord], None] | None) -> None:
    """Reruns by itself every POLL_SECONDS while the page is open; reads job state from the store
    (never from a worker thread), and reruns the whole page once a watched job ends."""
    try:
        jobs = [j for j in svc.recent_jobs(limit=40) if j.kind in kinds]
    except Exception as exc:  # the store briefly unavailable must not kill the poller
        st.warning(md(error_text(exc)))
        return
    watched: set[str] = st.session_state.setdefault(f"_watch:{key}", set())
    active = views.active_jobs(jobs, kinds)
    for job in active:
        watched.add(job.id)
        _job_line(svc, job, key)
    if active:
        _slots_held_elsewhere()
    ended = [j for j in jobs if j.id in watched and j.status not in views.ACTIVE_JOB]
    if ended:
        for job in ended:
            watched.discard(job.id)
            st.session_state.setdefault(f"_ended:{key}", []).append(job.id)
            if on_done is not None and job.status == "done":
                on_done(job)
        st.rerun(scope="app")


def _slots_held_elsewhere() -> None:
    """Why a job may sit still: every generation on this machine takes turns at the cores, and
    another process (a CLI run, tests, a second app) may hold every turn for a while."""
    import time
    from ecdysis.models import admission
    try:
        others = admission.held_elsewhere()  # [] while a turn is free
    except OSError:
        return
    for h in others:
        command = h.command if len(h.command) <= 80 else h.command[:79] + "…"
        st.caption(f"Waiting for a turn at the cores: another process is generating (pid {h.pid}"
                   f"{', ' + md(command) if command else ''}, for {max(0.0, time.time() - h.since):.0f} s). "
                   "Embedded models take turns machine-wide; this job goes on when it yields.")


def _ended_notes(svc: Service, key: str) -> None:
    """Say once how each job watched in this session ended (failures stay readable)."""
    for job_id in st.session_state.pop(f"_ended:{key}", []):
        with shown_errors():
            job = svc.job(job_id)
            what = {"run": "Batch", "diagnose": "Diagnosis", "evolve": "Evolution"}.get(job.kind, job.kind)
            if job.status == "failed":
                st.error(f"{what} {job.id} failed: {md(job.error)}", icon=":material/error:")
            elif job.status == "cancelled":
                st.warning(f"{what} {job.id} was stopped; it can be resumed.", icon=":material/stop_circle:")
            else:
                st.toast(f"{what} {job.id} finished", icon=":material/check_circle:")


def job_panel(svc: Service, kinds: Sequence[str], *, key: str,
              on_done: Callable[[JobRecord], None] | None = None) -> list[JobRecord]:
    """Progress bars of this page's background jobs, polled while any is active (so the page stays
    usable and a browser refresh finds them again: their state is in the store). Returns the
    active jobs as of this script run."""
    _ended_notes(svc, key)
    active = views.active_jobs(svc.recent_jobs(limit=40), kinds)
    if active:
        _live_jobs(svc, tuple(kinds), key, on_done)
    return active


def recent_failures(svc: Service, kinds: Sequence[str], within_s: float = 3600.0) -> None:
    """Failed jobs of the last hour, collapsed: a failure must stay findable after a refresh."""
    import time
    failed = [j for j in svc.recent_jobs(limit=40) if j.kind in kinds and j.status == "failed"
              and time.time() - j.updated_at < within_s]
    if failed:
        with st.expander(f"{views.plural(len(failed), 'background job')} failed in the last hour", icon=":material/error:"):
            for j in failed:
                st.markdown(f"- `{j.id}` ({j.kind}, {views.when(j.updated_at)}): {md(j.error or 'no message')}")


# ---------------------------------------------------------------- runs and trajectories

def run_table(svc: Service, runs: Sequence[RunRecord], *, key: str) -> None:
    """Every run; an unfinished one counts what its stored results say (its summary is written
    only when an execution ends)."""
    rows = [views.run_row(r, views.run_numbers(r, svc.results(r.id)) if r.status != "done" else None)
            for r in runs]
    st.dataframe(rows, key=key, hide_index=True, width="stretch", column_config={
        "scored": st.column_config.TextColumn("scored", help="instances with a result / instances in the run"),
        "accuracy": st.column_config.TextColumn("accuracy", help="of the scored instances"),
        "tokens": st.column_config.NumberColumn("tokens", help="prompt + completion tokens (the cost)"),
        "seconds": st.column_config.TextColumn("seconds", help="wall-clock time of the batch"),
        "label": None if any(r["label"] for r in rows) else st.column_config.Column(width="small"),
    })


@st.fragment(run_every=POLL_SECONDS)
def live_run_table(svc: Service, *, key: str) -> None:
    """`run_table`, re-read every POLL_SECONDS while the page is open: a run started anywhere (the
    CLI, another app) appears and an unfinished run's numbers move as its results are stored. Only
    when a run stops running does the whole page rerun, so its buttons and pickers catch up: a rerun
    for every new run would fold away the form a reader is filling in."""
    runs = svc.runs()
    run_table(svc, runs, key=key)
    now = {r.id: r.status for r in runs}
    before = st.session_state.get(f"_statuses:{key}")
    st.session_state[f"_statuses:{key}"] = now
    if before and any(before.get(run_id) == "running" and status != "running" for run_id, status in now.items()):
        st.rerun(scope="app")


def new_click(key: str, value: str | None) -> str | None:
    """`value` (what a table row click selects) only when it differs from the click already acted
    on: a table keeps its selection across reruns, and re-applying it would undo a choice the
    reader made since in a select box."""
    slot = f"_click:{key}"
    if value == st.session_state.get(slot):
        return None
    st.session_state[slot] = value
    return value


def results_table(results: Sequence[InstanceResult], *, key: str) -> str | None:
    """The results with filters (outcome, category, text search over answers, targets and replies);
    a click on a row returns that instance's id, for its trajectory."""
    outcome_col, category_col, search_col = st.columns([1, 2, 2])
    outcome = outcome_col.segmented_control("Show", ["all", "failed", "correct"], default="all",
                                            key=f"{key}:outcome") or "all"
    categories = category_col.multiselect("Categories", sorted({r.category for r in results}),
                                          key=f"{key}:categories", placeholder="all categories")
    text = search_col.text_input("Search", key=f"{key}:search", placeholder="id, answer, target or reply text")
    shown = views.filter_results(results, outcome=outcome, categories=categories, text=text)
    if len(shown) < len(results):
        st.caption(f"{len(shown)} of {len(results)} instances match")
    event = st.dataframe([views.result_row(r) for r in shown], key=key, hide_index=True, width="stretch",
                         on_select="rerun", selection_mode="single-row")
    rows = list(getattr(getattr(event, "selection", None), "rows", None) or [])
    return new_click(key, shown[rows[0]].instance_id if rows and rows[0] < len(shown) else None)


def _clip(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


_ROLE_NAMES = {"system": ":material/settings:", "user": "user", "assistant": "assistant"}


def _message(role: str, content: str) -> None:
    avatar = _ROLE_NAMES.get(role, ":material/chat:")
    with st.chat_message(role if role in ("user", "assistant") else "system", avatar=avatar):
        st.caption(md(role))
        st.text(content)


def agent_instance(svc: Service, suite: str, result: InstanceResult) -> Instance | None:
    """The instance behind `result` when it is an agent instance (its answer is function calls),
    for the Tool calls view; None for every other result, decided on the stored target before any
    suite is loaded, and when the suite is no longer there."""
    if not calls_target(result.target):
        return None
    with shown_errors():
        try:
            instances = svc.suite(suite).instances
        except NotFound:
            return None  # the suite was removed since the run: the turns are all there is to show
        found = next((i for i in instances if i.id == result.instance_id), None)
        return found if found is not None and is_agent_instance(found) else None
    return None


def tool_calls(view: ToolCallsView, *, key: str) -> None:
    """An agent's final answer as the checker read it: the calls (each marked whether the task
    lists its function), the calls the task expects, and the checker's verdict."""
    with st.container(border=True):
        st.markdown("**Tool calls** · read from the final answer the way the checker reads them")
        mark = ":green[✓]" if view.correct else ":red[✗]"
        st.markdown(f"{mark} **checker**: {md(view.verdict)}")
        if view.calls is None:
            st.caption("The answer is not calls in JSON or Python syntax; the model's reply is in the turns below.")
        elif not view.calls:
            st.caption("The answer holds no call.")
        else:
            st.dataframe(view.call_rows(), key=f"{key}:calls", hide_index=True, width="stretch", column_config={
                "listed by the task": st.column_config.TextColumn(
                    "listed by the task", help="no: a function the task does not offer (the model invented it)"),
                "arguments": st.column_config.TextColumn("arguments", help="as JSON", width="large"),
                "by position": st.column_config.TextColumn("by position", help="the checker refuses these")
                if view.positional else None,
            })
        st.markdown(f"**Expected** · {views.count(view.expected_calls, 'call')}, in any order")
        if not view.expected:
            st.caption("No function applies here: the right answer is no call at all.")
        else:
            st.dataframe(view.expected_rows(), key=f"{key}:expected", hide_index=True, width="stretch",
                         column_config={"allowed values": st.column_config.TextColumn(
                             "allowed values", help="any one of these, as JSON", width="large")})


def trajectory(result: InstanceResult, instance: Instance | None = None) -> None:
    """Everything the harness did on one instance: every prompt it sent and every response; for
    an agent instance (give it as `instance`, see `agent_instance`) also the Tool calls view."""
    outcome = "correct" if result.correct else (result.error_type or "wrong answer")
    st.markdown(f"**{md(result.instance_id)}** · {md(result.model)} · {md(result.category)} · **{md(outcome)}**")
    a, t, c = st.columns(3)
    a.markdown(f"answer  \n{code(_clip(result.answer, 240)) if result.answer is not None else '—'}")
    t.markdown(f"target  \n{code(result.target)}")
    generating = sum(c.latency_s for c in result.calls if not c.cache_hit)
    c.markdown(f"cost  \n{views.plural(len(result.calls), 'call')}, {result.prompt_tokens}+{result.completion_tokens} tokens, "
               f"{result.wall_seconds:.2f} s in all, {generating:.2f} s of it generating",
               help="the rest is waiting for the model (other jobs share it), the sandbox and the harness's own code")
    if result.error_type:
        st.error(f"{md(result.error_type)}: {md(result.error_message or '')}", icon=":material/bug_report:")
    view = None
    if instance is not None:
        with shown_errors():  # a suite whose target and docs disagree: one line, the turns still show
            view = tool_calls_view(result.answer, instance)
    if view is not None:
        tool_calls(view, key=f"tools:{result.run_id}:{result.instance_id}")
    if result.stdout_tail:
        with st.expander("harness output (stdout tail)"):
            st.code(result.stdout_tail, language=None)
    if not result.calls:
        st.caption("The harness made no model call on this instance.")
    elif view is not None:
        st.markdown(f"**Turns** · {views.count(len(result.calls), 'model call')}: what the harness sent, what the "
                    f"model replied")
    for call in result.calls:
        with st.container(border=True):
            cache = " · cache hit" if call.cache_hit else ""
            tokens = f"{call.prompt_tokens}+{call.completion_tokens} tokens"
            options = [str(o) for o in call.request.get("options") or []]
            doing = "scoring options" if options else "generating"
            st.caption(f"call {call.seq + 1} · {md(call.model)} · {tokens} · "
                       f"{call.latency_s:.2f} s {'to read the cache' if call.cache_hit else doing} · "
                       f"finish: {md(call.finish_reason)}{cache}")
            for m in call.request.get("messages", []):
                _message(str(m.get("role", "user")), str(m.get("content", "")))
            if options:
                st.caption("Scored, not generated: each option's log-probability as the reply")
                st.dataframe(views.option_rows(options, call.option_logprobs), hide_index=True,
                             width="stretch", key=f"options:{result.run_id}:{result.instance_id}:{call.seq}")
            else:
                _message("assistant", call.text)
            if call.error:
                st.error(md(call.error), icon=":material/error:")


def run_metrics(run: RunRecord, results: Sequence[InstanceResult]) -> None:
    """The header numbers, counted from the stored results, so they agree with the table below
    and with the progress bar while the run goes on."""
    n = views.run_numbers(run, results)
    cols = st.columns(5)
    cols[0].metric("accuracy", views.pct(n.accuracy),
                   help=f"{n.correct} correct of {n.scored} scored" if n.scored else "nothing scored yet")
    cols[1].metric("scored", f"{n.scored}/{n.instances}", help="instances with a result / instances in the run")
    cols[2].metric("tokens", n.tokens)
    cols[3].metric("model calls", n.calls, help=f"{n.cache_hits} served from the cache")
    cols[4].metric("seconds", "—" if n.seconds is None else f"{n.seconds:.1f}",
                   help="wall-clock time of the finished executions")
    by_cat = (run.summary or {}).get("accuracy_by_category") or {}
    if by_cat and not n.partial:
        st.caption("by category: " + " · ".join(f"{md(k)} {v:.0%}" for k, v in by_cat.items()))


def run_detail(svc: Service, run: RunRecord) -> None:
    """One run: its numbers, its per-instance results, and any instance's whole trajectory; while
    the run is running (here or in another process) it re-reads all of it every POLL_SECONDS."""
    if run.status == "running":
        _live_run_detail(svc, run.id)
    else:
        _run_detail(svc, run)


@st.fragment(run_every=POLL_SECONDS)
def _live_run_detail(svc: Service, run_id: str) -> None:
    run = svc.get_run(run_id)
    _run_detail(svc, run)
    if run.status != "running":
        st.rerun(scope="app")  # the run ended: the whole page (table, resume buttons) catches up


def _run_detail(svc: Service, run: RunRecord) -> None:
    results = svc.results(run.id)
    run_metrics(run, results)
    if not results:
        st.caption("No instance has finished yet.")
        return
    st.caption(f"{len(results)} of {len(run.instance_ids)} instances finished · "
               f"{sum(1 for r in results if r.correct)} correct")
    clicked = results_table(results, key=f"results:{run.id}")
    down_csv, down_json, _ = st.columns([1, 1, 3])
    down_csv.download_button("Results as CSV", views.run_csv(results), file_name=f"ecdysis-run-{run.id}.csv",
                             mime="text/csv", key=f"csv:{run.id}", icon=":material/table:")
    down_json.download_button("Run as JSON", views.run_json(run, results), file_name=f"ecdysis-run-{run.id}.json",
                              mime="application/json", key=f"json:{run.id}", icon=":material/data_object:",
                              help="the run, its summary and every instance with each model call")
    left, right = st.columns([3, 2], vertical_alignment="bottom")
    ordered = sorted(results, key=lambda r: (r.correct, r.instance_id))
    labels = {r.instance_id: f"{r.instance_id} · {'correct' if r.correct else r.error_type or 'wrong'}"
              for r in ordered}
    if clicked:
        remember(f"pick:traj:{run.id}", clicked)  # a row click opens that instance's trajectory below
    with left:
        chosen = pick("Trajectory of instance", [r.instance_id for r in ordered], labels, key=f"traj:{run.id}",
                      help="or click a row of the table")
    with right:
        if st.button("Diagnose this run's failures", key=f"diagnose:{run.id}", icon=":material/hub:",
                     disabled=run.status != "done"):
            with shown_errors():
                svc.start_diagnosis_job([run.id])
                remember("runs_for_diagnosis", run.id)
                st.success("Diagnosis started.")
                page_link("clusters", "Watch it on Failure clusters", ":material/bubble_chart:")
    found = next((r for r in results if r.instance_id == chosen), None)
    if found is not None:
        trajectory(found, agent_instance(svc, run.suite, found))


def find_result(svc: Service, run_id: str, instance_id: str) -> InstanceResult | None:
    return next((r for r in svc.results(run_id) if r.instance_id == instance_id), None)


# ---------------------------------------------------------------- clusters and roles

def verdict_badge(verdict: str) -> None:
    st.badge(verdict, color=VERDICT_BADGE.get(verdict, "gray"))  # type: ignore[arg-type]


def cluster_card(c: Cluster, patch: PatchOutcome) -> None:
    """A cluster as the engine judged it: verdict, spread, systematicity, why, evidence, patch."""
    with st.container(border=True):
        head, badge = st.columns([5, 1], vertical_alignment="center")
        head.markdown(f"#### {md(c.id)} · {md(c.label)}")
        with badge:
            verdict_badge(c.verdict)
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("failures", c.size)
        m2.metric("instances", len(c.instances))
        m3.metric("categories", len(c.categories))
        m4.metric("systematicity", f"{c.systematicity:.2f}")
        st.markdown(md(c.reason))
        st.caption("systematicity components: " + " · ".join(
            f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in c.components.items()))
        if c.evidence:
            st.markdown("\n".join(f"- {md(e)}" for e in c.evidence))
        st.caption(f"patch: {md(patch.text())}")


def _checks(checks: Iterable[Mapping[str, Any]]) -> None:
    for ch in checks:
        mark = ":green[✓]" if ch.get("ok") else ":red[✗]"
        st.markdown(f"{mark} **{md(ch.get('name'))}** — {md(ch.get('detail', ''))}")


def _role_message(m: RoleMessage) -> None:
    role, kind = str(m.role or ""), str(m.kind or "")
    who = "Engine checks" if kind == "check" else role.title()
    avatar = ROLE_AVATAR["engine"] if kind == "check" else ROLE_AVATAR.get(role, ":material/person:")
    with st.chat_message(who, avatar=avatar):
        st.markdown(f"**{md(who)}** :gray[· {md(kind)} · {md(m.backend or '')}]")
        if kind == "check" and (m.data or {}).get("checks"):
            _checks((m.data or {}).get("checks", []))
        elif kind == "check":  # the engine's word without a list of checks: a veto upheld, an alternative
            st.markdown(md(m.text or ""))
        elif kind in ("prompt", "reply", "repair"):
            with st.expander({"prompt": "prompt sent", "reply": "raw reply", "repair": "repair request"}[kind]):
                st.text(m.text or "")
        else:
            st.markdown(md(m.text or ""))
            if m.data:
                with st.expander("structured output"):
                    st.json(m.data, expanded=1)


def chat_transcript(messages: Sequence[RoleMessage]) -> None:
    """The role-by-role conversation, round by round, readable like a chat."""
    if not messages:
        st.caption("No role conversation for this cluster.")
        return
    for number, round_messages in views.by_round(messages):
        st.markdown(f"<div style='color:#8a857c;font-size:0.85rem;margin:0.6rem 0 0.2rem'>— {views.round_label(number)} —</div>",
                    unsafe_allow_html=True)
        for m in round_messages:
            _role_message(m)


def spec_card(spec: ModificationSpec) -> None:
    """A modification specification: what changes where, why, the expected effect, the risk."""
    files = ", ".join(code(f) for f in spec.target_files)
    operator = f" · operator {code(spec.operator)}" if spec.operator else " · hand-written"
    st.markdown(f"**Change** ({files}{operator})  \n{md(spec.change)}")
    st.markdown(f"**Root cause**  \n{md(spec.root_cause)}")
    st.markdown(f"**Expected effect**  \n{md(spec.expected_effect)}")
    st.markdown(f"**Scope**  \n{md(spec.scope)}")
    st.warning(f"**Risk** — {md(spec.risk)}", icon=":material/warning:")
    if spec.exemplars:
        st.caption("few-shot exemplars quoted: " + md(", ".join(map(str, spec.exemplars))))


def checks_list(checks: Iterable[Mapping[str, Any]]) -> None:
    _checks(checks)


# ---------------------------------------------------------------- diffs

DIFF_MODES = ("Side by side", "Inline", "Unified")


def as_file_diffs(diffs: Iterable[FileDiff | Mapping[str, Any]]) -> list[FileDiff]:
    return [d if isinstance(d, FileDiff) else FileDiff.from_json(d) for d in diffs]


def diff_view(diffs: Iterable[FileDiff | Mapping[str, Any]], *, key: str) -> None:
    """Per-file diffs, side by side or inline (diff-match-patch, character highlights), or unified."""
    shown = as_file_diffs(diffs)
    if not shown:
        st.caption("No file differs.")
        return
    mode = st.segmented_control("Diff view", DIFF_MODES, default=DIFF_MODES[0], key=f"{key}:mode",
                                label_visibility="collapsed") or DIFF_MODES[0]
    for d in shown:
        added, removed = diffview.stats(d.old, d.new)
        st.markdown(f"**{code(d.path)}** · {d.change} · :green[+{added}] :red[−{removed}]")
        if mode == "Unified":
            st.code(d.unified, language="diff")
        elif mode == "Inline":
            st.html(diffview.inline_html(d.old, d.new))
        else:
            st.html(diffview.side_by_side_html(d.old, d.new))

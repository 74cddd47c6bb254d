"""The human gate: one proposal's specification, risk, checks and per-file diff, and the three
decisions (approve, edit the patched files with a live diff, reject with a reason); then apply it as
the next harness version and offer to evaluate that version."""

from __future__ import annotations

import streamlit as st

from app import components as ui
from app import views
from app.guard import shown_errors
from app.state import remember
from ecdysis.diffs import diff_files
from ecdysis.roles.base import ModificationSpec
from ecdysis.service import RunRequest, Service
from ecdysis.store import ProposalRecord

STATUS_FILTERS = ["pending", "approved", "edited", "applied", "rejected", "all"]
FILTER_KEY = "review:filter"
_NEXT_FILTER = "_review:next_filter"
_FLASH = "_review:flash"


def follow(status: str, said: str | None = None) -> None:
    """After a decision, show the proposal under its new status on the next run (a widget's state
    may only be set before the widget is drawn, so the page calls `apply_follow` first), and say
    once what was done (`said`, already inert Markdown)."""
    st.session_state[_NEXT_FILTER] = status
    if said:
        st.session_state[_FLASH] = said


def apply_follow() -> str:
    """The status filter to draw the page with. The filter widget gets its value from session
    state only (never also a default), so Streamlit has no conflict to warn about."""
    if _NEXT_FILTER in st.session_state:
        st.session_state[FILTER_KEY] = st.session_state.pop(_NEXT_FILTER)
    st.session_state.setdefault(FILTER_KEY, "pending")
    flash = st.session_state.pop(_FLASH, None)
    if flash:
        st.success(flash, icon=":material/task_alt:")
    return str(st.session_state[FILTER_KEY] or "pending")


def next_pending(svc: Service, current: str | None) -> None:
    """One control (and Alt+N) to the next proposal waiting for a decision, whatever is shown."""
    pending = [p.id for p in svc.proposals(status="pending")]
    after = [pid for pid in pending if pid != current]
    if st.button(f"Next pending ({len(after)})", key="review:next", icon=":material/skip_next:", disabled=not after,
                 shortcut="Alt+N", help="the next proposal that waits for a decision"):
        follow("pending")
        remember("proposal", after[0])
        st.rerun()


def header(svc: Service, p: ProposalRecord, title: str) -> None:
    head, badge = st.columns([6, 1], vertical_alignment="center")
    head.markdown(f"### {ui.md(title)}")
    with badge:
        st.badge(p.status, color=ui.STATUS_BADGE.get(p.status, "gray"))  # type: ignore[arg-type]
    evolution = views.evolution_of(p, svc.evolutions())
    origin = (f"evolution {evolution.id} ({evolution.strategy}, iteration "
              f"{views.evolution_iteration_of(p, evolution)})" if evolution else "a diagnosis started by hand")
    st.caption(f"proposal {p.id} · from {ui.md(origin)} · diagnosis {p.diagnosis_id} · cluster {p.cluster_id} · "
               f"applies to harness {views.short(p.harness_version, 12)} · {views.when(p.created_at)}")
    if p.data.get("alternative"):
        st.info(ui.md(p.data["alternative"]), icon=":material/alt_route:")
    for d in svc.decisions(p.id):
        why = f" — {ui.md(d.reason)}" if d.reason else ""
        st.caption(f"{d.decision} by {ui.md(d.who)} at {views.when(d.at)}{why}")


def same_change(svc: Service, p: ProposalRecord, twin: ProposalRecord | None) -> None:
    """Says when an earlier proposal made exactly this change, and what became of it."""
    if twin is None:
        return
    made = views.applied_version(twin.id, svc.harnesses()) if twin.status in ("applied", "superseded") else None
    fate = {"applied": "already applied", "superseded": "already applied within a composition",
            "rejected": "already rejected", "pending": "still pending"}.get(twin.status, f"already {twin.status}")
    version = f" as version {views.short(made.id, 12)}" if made else ""
    st.warning(f"The same change to the same version as proposal {twin.id}, {fate}{version}. Deciding this one "
               f"decides it again.", icon=":material/content_copy:")


def details(p: ProposalRecord) -> None:
    """Spec and risk on the left, the Critic's hard checks and objections on the right."""
    left, right = st.columns([3, 2], gap="large")
    with left:
        ui.spec_card(ModificationSpec.from_json(p.spec))
    with right:
        st.markdown("**Critic's checks**")
        ui.checks_list(p.data.get("checks", []))
        if p.data.get("objections"):
            st.markdown("**Objections**\n" + "\n".join(f"- {ui.md(o)}" for o in p.data["objections"]))
        if p.data.get("reason"):
            st.caption(ui.md(p.data["reason"]))


def _edited_files(p: ProposalRecord) -> dict[str, str]:
    return {path: st.session_state.get(f"edit:{p.id}:{path}", text) for path, text in p.files.items()}


def editor(svc: Service, p: ProposalRecord, who: str) -> None:
    """An editor per patched file; the diff against the base version follows every change."""
    base = svc.harness(p.harness_version).files
    for path, text in p.files.items():
        st.text_area(f"{ui.code(path)} (patched)", value=text, height=320, key=f"edit:{p.id}:{path}",
                     help="Ctrl+Enter (or leaving the box) updates the diff below")
    edited = _edited_files(p)
    st.markdown("**Your version against the base harness**")
    ui.diff_view(diff_files({k: base.get(k, "") for k in edited}, edited), key=f"editdiff:{p.id}")
    if st.button("Save edit and approve it", key=f"save:{p.id}", type="primary", icon=":material/save:"):
        with shown_errors():
            svc.decide(p.id, "edit", who=who, reason="edited in review", files=edited)
            follow("edited", f"Saved your edit of {p.id} and approved it.{_left(svc)}")
            st.rerun()


def _left(svc: Service) -> str:
    n = len(svc.proposals(status="pending"))
    return f" {n} proposal{'s' if n != 1 else ''} left to review." if n else " No proposal left to review."


def decisions(svc: Service, p: ProposalRecord, who: str) -> None:
    """Approve | reject with a reason | edit (toggle), for a pending proposal. The reason and the
    Reject button form one form, so a single click sends the reason as typed (a plain text box
    sends its value only when it loses focus, and a button disabled until then needs two clicks)."""
    approve, reject = st.columns([1, 3], vertical_alignment="bottom")
    if approve.button("Approve", key=f"approve:{p.id}", type="primary", icon=":material/check:", shortcut="Alt+A"):
        with shown_errors():
            svc.decide(p.id, "approve", who=who)
            follow("approved", f"Approved {p.id}.{_left(svc)}")
            st.rerun()
    with reject:
        with st.form(f"reject-form:{p.id}", border=False, enter_to_submit=True):
            r1, r2 = st.columns([4, 1], vertical_alignment="bottom")
            reason = r1.text_input("Reason for rejecting", key=f"reason:{p.id}",
                                   placeholder="e.g. too specific to one category")
            rejected = r2.form_submit_button("Reject", key=f"reject:{p.id}", icon=":material/close:")
        if rejected:
            if not reason.strip():
                st.error("Say why you reject it: the reason is recorded with the decision.", icon=":material/error:")
            else:
                with shown_errors():
                    svc.decide(p.id, "reject", who=who, reason=reason.strip())
                    follow("rejected", f"Rejected {p.id} — {ui.md(reason.strip())}.{_left(svc)}")
                    st.rerun()
    if st.toggle("Edit the patched files", key=f"editing:{p.id}"):
        editor(svc, p, who)


def patch(svc: Service, p: ProposalRecord) -> None:
    """The patch as it stands: once a reviewer edited it, their files against the base version
    (what is, or will be, applied), with the Proposer's original one click away."""
    edit = next((d for d in reversed(svc.decisions(p.id)) if d.decision == "edit" and d.files_as_applied), None)
    if edit is None:
        ui.diff_view(p.data.get("diffs", []), key=f"diff:{p.id}")
        return
    base = svc.harness(p.harness_version).files
    files = edit.files_as_applied or {}
    st.caption(f"As edited by {ui.md(edit.who)} at {views.when(edit.at)}: the files "
               f"{'applied' if p.status == 'applied' else 'to apply'}.")
    ui.diff_view(diff_files({k: base.get(k, "") for k in files}, files), key=f"diff:{p.id}")
    with st.expander("The Proposer's original patch", icon=":material/history:"):
        ui.diff_view(p.data.get("diffs", []), key=f"origdiff:{p.id}")


def apply_and_evaluate(svc: Service, p: ProposalRecord) -> None:
    """After approval: apply as the next version; after applying: evaluate it against its parent."""
    evolution = views.evolution_of(p, svc.evolutions())
    if evolution is not None:
        st.info(f"This proposal belongs to evolution {evolution.id}; the evolution applies and validates it "
                f"itself.", icon=":material/trending_up:")
        ui.page_link("evolution", "Watch the evolution", ":material/trending_up:")
        return
    if p.status in ("approved", "edited"):
        if st.button("Apply — create the next harness version", key=f"apply:{p.id}", type="primary",
                     icon=":material/merge:"):
            with shown_errors():
                version = svc.apply_proposal(p.id)
                remember("harness", version.id)
                follow("applied")
                st.rerun()
    elif p.status == "applied":
        applied = views.applied_version(p.id, svc.harnesses())
        if applied is not None:
            st.success(f"Applied as harness version {applied.id} (parent {applied.parent}).", icon=":material/merge:")
            evaluate_offer(svc, p, applied.id, applied.parent)


def evaluate_offer(svc: Service, p: ProposalRecord, version_id: str, parent_id: str | None) -> None:
    """Run the new version and its parent on the same validation instances, per model of the batch."""
    diagnosis = svc.get_diagnosis(p.diagnosis_id)
    runs = [svc.get_run(r) for r in diagnosis.run_ids]
    suite = runs[0].suite if runs else ""
    models = sorted({r.model for r in runs})
    earlier = views.evaluations_of(p.id, svc.runs())
    if earlier:
        # Read from the store, so a reload (or another browser) still finds what was evaluated.
        st.info(f"Evaluated {views.when(earlier['applied'].created_at)}: the parent ({earlier['parent'].status}) and "
                f"the new version ({earlier['applied'].status}) on {len(earlier['applied'].instance_ids)} validation "
                f"instances.", icon=":material/science:")
        if st.button("Compare them instance by instance on Runs", key=f"compare:{p.id}", icon=":material/play_circle:"):
            remember("compare_a", earlier["parent"].id)
            remember("compare_b", earlier["applied"].id)
            st.switch_page(ui.PAGES["runs"])
    left, right = st.columns([1, 3], vertical_alignment="bottom")
    size = left.number_input("Validation instances", 1, 5000, 12, key=f"evalsize:{p.id}")
    again = "Evaluate again" if earlier else "Evaluate"
    if right.button(f"{again} on {ui.md(suite)} validation with {ui.md(', '.join(models))} (new and parent version)",
                    key=f"evaluate:{p.id}", icon=":material/science:"):
        with shown_errors():
            started: dict[str, str] = {}
            for model in models:
                for harness, tag in ((parent_id, "parent"), (version_id, "applied")):
                    if harness:
                        run_id = svc.job(svc.start_run_job(RunRequest(
                            suite=suite, model=model, harness=harness, split="validation", limit=int(size),
                            label=views.evaluation_label(tag, p.id)))).params["run_id"]
                        started.setdefault(tag, run_id)
            # The Runs page's comparison opens on the parent (A) against the applied version (B).
            remember("compare_a", started.get("parent"))
            remember("compare_b", started.get("applied"))
            st.success("Evaluation started: the parent and the new version on the same validation instances.")
            ui.page_link("runs", "Compare them instance by instance on Runs", ":material/play_circle:")

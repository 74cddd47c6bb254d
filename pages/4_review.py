"""Review: every proposed harness modification as a per-file diff with its specification and risk,
and the human decision on it (approve, edit, reject with a reason); applying makes the next version."""

import streamlit as st

from app import components as ui
from app import review_ui as rv
from app import views
from app.guard import shown_errors
from app.state import service

svc = service()
st.title("Review")
st.caption("Nothing changes the harness until a person approves it here (or an evolution runs with auto-approve).")

with shown_errors():
    rv.apply_follow()
    top_left, top_right = st.columns([3, 1], vertical_alignment="bottom")
    shown = top_left.segmented_control("Show", rv.STATUS_FILTERS, key=rv.FILTER_KEY) or "pending"
    who = top_right.text_input("Reviewer", value="reviewer", key="review:who", help="recorded with each decision")
    proposals = svc.proposals(status=None if shown == "all" else shown)
    if not proposals:
        ui.empty_state(f"No {'' if shown == 'all' else shown + ' '}proposals.",
                       "Proposals come from diagnosing a batch on the Failure clusters page.")
        ui.page_link("clusters", "Go to Failure clusters", ":material/bubble_chart:")
    else:
        diagnoses = svc.diagnoses()
        titles, full = views.cluster_titles(diagnoses), views.cluster_titles(diagnoses, width=200)
        twins = views.same_changes(svc.proposals())
        chosen = ui.pick("Proposal", [p.id for p in proposals],
                         {p.id: views.proposal_label(p, titles, twins) for p in proposals},
                         key="review:proposal", memory="proposal")
        proposal = svc.get_proposal(chosen) if chosen else None
        rv.next_pending(svc, chosen)
        if proposal is not None:
            rv.header(svc, proposal, full.get(f"{proposal.diagnosis_id}/{proposal.cluster_id}", proposal.cluster_id))
            rv.same_change(svc, proposal, twins.get(proposal.id))
            rv.details(proposal)
            st.subheader("The patch")
            rv.patch(svc, proposal)
            if proposal.status == "pending":
                st.subheader("Your decision")
                rv.decisions(svc, proposal, who.strip() or "reviewer")
            rv.apply_and_evaluate(svc, proposal)

"""The demo: one click takes the embedded models through a batch, its failure clusters, a diagnosis
and proposals to review, with the time each step should take on this machine (measured from its
own earlier runs) and, once done, the time each step did take."""

from __future__ import annotations

import streamlit as st

from app import components as ui
from app import views
from app.guard import shown_errors
from app.state import remember, remembered
from ecdysis.service import Service

DEMO_SUITE = "reasoning-mix"
DEMO_LIMIT = 12


def estimate_text(estimates: dict[str, float | None]) -> str:
    """'about 3 min here (qwen2.5-coder-0.5b 140 s, smollm2 45 s, from this machine's runs)', or
    what is unknown."""
    known = {m: s for m, s in estimates.items() if s is not None}
    if not known:
        return "no run of these models has finished on this machine yet, so no estimate"
    total = sum(known.values()) + 5  # the heuristic diagnosis of a 12-instance batch takes seconds
    parts = ", ".join(f"{m} {s:.0f} s" for m, s in known.items())
    unknown = [m for m, s in estimates.items() if s is None]
    tail = f"; no earlier run of {', '.join(unknown)} to measure" if unknown else ""
    return f"about {max(1, round(total / 60))} min here ({parts}, from this machine's earlier runs{tail})"


def started_here() -> bool:
    """The demo was started in this browser session: its panel stays open to show how it went,
    though the batches it made would otherwise fold it away."""
    return remembered("demo") == "started"


def demo(svc: Service) -> None:
    models = list(svc.settings.default_models)
    st.markdown(f"A batch of {DEMO_LIMIT} `{DEMO_SUITE}` instances on {', '.join(f'`{m}`' for m in models)}, "
                f"then the failure clusters and a diagnosis, then the proposals on the Review page: "
                f"{estimate_text(svc.demo_estimate(models=models, limit=DEMO_LIMIT))}.")
    if st.button("Run the demo", key="demo:start", icon=":material/rocket_launch:", type="primary"):
        with shown_errors():
            svc.start_demo_job(suite=DEMO_SUITE, models=models, limit=DEMO_LIMIT)
            remember("demo", "started")
            st.toast("Demo started: its progress is below", icon=":material/rocket_launch:")
    last = next((j for j in svc.recent_jobs(limit=40) if j.kind == "demo" and j.status == "done"), None)
    if last is not None and last.result:
        timings = last.result.get("timings", {})
        proposals = int(last.result.get("proposals", 0))
        st.success("Last demo: " + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in timings.items())
                   + f"; {views.plural(proposals, 'proposal')} {'waits' if proposals == 1 else 'wait'} for review.",
                   icon=":material/check_circle:")
        left, right = st.columns(2)
        with left:
            ui.page_link("clusters", "See the failure clusters", ":material/bubble_chart:")
        with right:
            ui.page_link("review", "Review the proposals", ":material/rate_review:")

"""Two runs side by side, instance by instance: which instances a harness change (or another
model) fixed, broke or left as they were, with the harness diff between the two versions."""

from __future__ import annotations

from typing import Sequence

import streamlit as st

from app import components as ui
from app import views
from ecdysis.records import RunRecord
from ecdysis.service import Service

CHANGE_COLORS = {"fixed": "green", "broken": "red", "still right": "gray", "still wrong": "gray"}


def compare_runs(svc: Service, runs: Sequence[RunRecord]) -> None:
    if len(runs) < 2:
        st.caption("Two runs are needed: for instance a version and its parent, or two models, on the same instances.")
        return
    labels = {r.id: views.run_label(r) for r in runs}
    ids = [r.id for r in runs]
    default = views.comparable_pair(runs) or (ids[1], ids[0])
    left, right = st.columns(2)
    with left:
        a = ui.pick("A (before)", ids, labels, key="cmp:a", memory="compare_a", default=default[0])
    with right:
        b = ui.pick("B (after)", ids, labels, key="cmp:b", memory="compare_b", default=default[1])
    if not a or not b:
        return
    if a == b:
        st.info("Pick two different runs.", icon=":material/info:")
        return
    run_a, run_b = svc.get_run(a), svc.get_run(b)
    paired = views.pair_runs(svc.results(a), svc.results(b))
    cols = st.columns(4)
    for col, outcome in zip(cols, views.PAIR_ORDER):
        col.metric(outcome, paired.count(outcome))
    st.markdown(ui.md(paired.sentence()))
    if paired.only_a or paired.only_b:
        st.caption(f"Not paired: {views.plural(paired.only_a, 'instance')} scored only in A, {paired.only_b} only in B.")
    if paired.rows:
        shown = st.pills("Show", list(views.PAIR_ORDER), default=["fixed", "broken"], selection_mode="multi",
                         key=f"cmp:show:{a}:{b}") or list(views.PAIR_ORDER)
        picked = [r for r in paired.rows if r["change"] in shown]
        if picked:
            st.dataframe(picked, hide_index=True, width="stretch", key=f"cmp:rows:{a}:{b}")
        else:
            st.caption(f"No instance is {' or '.join(shown)}.")
    same = run_a.harness_version == run_b.harness_version
    what = [] if run_a.model == run_b.model else [f"model {ui.code(run_a.model)} → {ui.code(run_b.model)}"]
    if not same:
        what.append(f"harness {ui.code(views.short(run_a.harness_version))} → "
                    f"{ui.code(views.short(run_b.harness_version))}")
    st.caption("What differs: " + (", ".join(what) if what else "nothing but the run itself (noise)"))
    if not same:
        with st.expander("The harness diff from A's version to B's", expanded=True, icon=":material/difference:"):
            ui.diff_view(svc.harness_diff(run_a.harness_version, run_b.harness_version), key=f"cmp:diff:{a}:{b}")

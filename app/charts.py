"""Plotly figures for the pages: cluster sizes by verdict, cluster x category, cluster x model,
the 2-D failure map, and evolution curves. Pure functions from report JSON / view data to figures."""

from __future__ import annotations

from typing import Any, Sequence

import plotly.graph_objects as go

from app.text import chart
from app.views import MapPoint, StrategyStats, cluster_title
from ecdysis.diagnosis import DiagnosisReport
from ecdysis.evolution_log import IterationRow

VERDICT_COLORS: dict[str, str] = {"harness-level": "#c53948", "model-specific": "#e0a030", "noise": "#9a968c"}
STRATEGY_COLORS: dict[str, str] = {"ecdysis": "#c53948", "per-instance": "#3b6fb6"}
# Models are told apart by colours that no verdict uses: a red bar would read "harness-level".
MODEL_PALETTE = ["#3b6fb6", "#2f8f6b", "#7a4bb0", "#4f9fb0", "#b0497a", "#6b8e23", "#8c6d46"]
PALETTE = ["#c53948", "#3b6fb6", "#2f8f6b", "#e0a030", "#7a4bb0", "#d9731a", "#4f9fb0", "#9a968c",
           "#b0497a", "#6b8e23"]


def _layout(fig: go.Figure, *, height: int, title: str | None = None, **extra: Any) -> go.Figure:
    fig.update_layout(height=height, margin={"l": 8, "r": 8, "t": 36 if title else 8, "b": 8},
                      title={"text": title, "font": {"size": 14}} if title else None,
                      legend={"orientation": "h", "y": -0.18, "x": 0}, **extra)
    return fig


def cluster_sizes(report: DiagnosisReport, height: int = 320) -> go.Figure:
    """Failures per cluster, one bar each in priority order, coloured by verdict."""
    fig = go.Figure()
    rows = report.clusters
    for verdict, color in VERDICT_COLORS.items():
        mine = [c for c in rows if c.verdict == verdict]
        if not mine:
            continue
        fig.add_bar(
            y=[chart(cluster_title(c, 42)) for c in mine], x=[c.size for c in mine], orientation="h",
            name=verdict, marker_color=color, customdata=[[c.id, c.systematicity, len(c.instances)] for c in mine],
            hovertemplate="%{y}<br>%{x} failures on %{customdata[2]} instances"
                          "<br>systematicity %{customdata[1]:.2f}<extra>" + verdict + "</extra>")
    order = [chart(cluster_title(c, 42)) for c in rows]
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)), automargin=True)
    fig.update_xaxes(title_text="failures", **count_axis(max((c.size for c in rows), default=1)))
    return _layout(fig, height=max(height, 60 + 28 * len(rows)), title="Cluster sizes by verdict",
                   barmode="stack")


def count_axis(largest: int, ticks: int = 6) -> dict[str, Any]:
    """Axis settings for a count: whole-number ticks only (no '0.2 failures')."""
    step = max(1, -(-int(largest) // ticks))
    return {"tick0": 0, "dtick": step, "tickformat": "d", "rangemode": "tozero"}


def category_heatmap(report: DiagnosisReport, height: int = 320) -> go.Figure:
    """Failures of each cluster in each task category (spread across categories is evidence)."""
    rows = report.clusters
    spread = [c.categories for c in rows]
    cats = sorted({cat for counts in spread for cat in counts})
    z = [[counts.get(cat, 0) for cat in cats] for counts in spread]
    text = [[str(v) if v else "" for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, x=[chart(cat) for cat in cats], y=[c.id for c in rows], colorscale="Reds", text=text,
                               texttemplate="%{text}", hovertemplate="%{y} · %{x}: %{z} failures<extra></extra>",
                               showscale=False, xgap=2, ygap=2))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category")
    return _layout(fig, height=max(height, 60 + 28 * len(rows)), title="Cluster × category")


def model_comparison(report: DiagnosisReport, height: int = 320) -> go.Figure:
    """For each cluster, the share of its instances each model ran on which the model fails this
    way: equal bars point at the harness, one tall bar at a model's quirk. Each bar names its
    model in the legend, even when only one model ran (then the chart says so in its title)."""
    rows = report.clusters
    models = sorted({m for c in rows for m in c.rates or c.models})
    fig = go.Figure()
    ticks = [f"{c.id} · {c.verdict}" for c in rows]
    for i, model in enumerate(models):
        rates, texts = [], []
        for c in rows:
            r = c.rates.get(model)
            if r and r.ran:
                hit = r.hit + r.kin
                rates.append(hit / r.ran)
                texts.append(f"{hit}/{r.ran}")
            else:
                rates.append(0.0)
                texts.append(str(c.models.get(model, 0)))
        fig.add_bar(x=ticks, y=rates, name=chart(model), text=texts, textposition="outside", showlegend=True,
                    marker_color=MODEL_PALETTE[i % len(MODEL_PALETTE)], cliponaxis=False,
                    hovertemplate="%{x} · " + chart(model) + ": %{text} instances<extra></extra>")
    fig.update_yaxes(title_text="share of instances", tickformat=".0%", range=[0, 1.15])
    fig.update_xaxes(type="category")
    title = "Cluster × model" if len(models) != 1 else "Cluster × model (one model ran: no cross-model evidence)"
    _layout(fig, height=height, title=title, barmode="group")
    fig.update_layout(showlegend=True)
    return fig


def failure_map_figure(points: Sequence[MapPoint], height: int = 320) -> go.Figure:
    """Each failure as a dot placed by its evidence text, coloured by the cluster it fell in."""
    fig = go.Figure()
    ids = sorted({p.cluster_id for p in points}, key=lambda cid: (len(cid), cid))
    for i, cid in enumerate(ids):
        mine = [p for p in points if p.cluster_id == cid]
        fig.add_scatter(x=[p.x for p in mine], y=[p.y for p in mine], mode="markers", name=cid,
                        marker={"size": 9, "color": PALETTE[i % len(PALETTE)], "opacity": 0.8,
                                "line": {"width": 0.5, "color": "white"}},
                        customdata=[[chart(p.instance), chart(p.model), chart(p.category), chart(p.excerpt[:120]),
                                     p.cluster_id, p.member] for p in mine],
                        hovertemplate="%{customdata[0]} · %{customdata[1]} · %{customdata[2]}"
                                      "<br>%{customdata[3]}<extra>" + cid + "</extra>")
    fig.update_xaxes(showticklabels=False, title_text="evidence · component 1", zeroline=False)
    fig.update_yaxes(showticklabels=False, title_text="component 2", zeroline=False)
    return _layout(fig, height=height, title="Failure map (TF-IDF + SVD of the evidence)")


def evolution_curves(series: Sequence[tuple[str, str, Sequence[IterationRow], float | None]],
                     height: int = 340, base: float | None = None) -> go.Figure:
    """Validation accuracy per iteration for each evolution, and its held-out test accuracy as a
    final marker. `series` holds (name, strategy, iteration rows, test accuracy); `base`, the
    starting version's validation accuracy, is drawn at iteration 0 so that even one iteration
    reads as a change from somewhere. The accuracy axis spans the data, not always 0–100 %."""
    fig = go.Figure()
    values: list[float] = [] if base is None else [base]
    stars: list[tuple[str, str, float]] = []
    last_x = 0
    for i, (name, strategy, rows, test) in enumerate(series):
        color = STRATEGY_COLORS.get(strategy, PALETTE[(i + 2) % len(PALETTE)])
        xs = [r.iteration or i for i, r in enumerate(rows, start=1)]
        ys = [r.val_accuracy for r in rows]
        if base is not None:
            xs, ys = [0, *xs], [base, *ys]
        fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=f"{name} validation",
                        line={"color": color, "width": 2.5}, marker={"size": 9})
        train = [r.train_accuracy for r in rows]
        if any(t is not None for t in train):
            fig.add_scatter(x=[x for x in xs if x > 0], y=train, mode="lines+markers",
                            name=f"{name} train batch", line={"color": color, "width": 1, "dash": "dot"})
        values += [float(v) for v in [*ys, *train] if isinstance(v, (int, float))]
        last_x = max([last_x, *xs])
        if test is not None:
            stars.append((name, color, test))
            values.append(float(test))
    # Every sealed-test star stands in one column after the last iteration, labelled "test": at the
    # next iteration's number it read as one more iteration.
    for name, color, test in stars:
        fig.add_scatter(x=[last_x + 1], y=[test], mode="markers+text", name=f"{name} test",
                        marker={"symbol": "star", "size": 14, "color": color}, text=[f"{test:.0%}"],
                        textposition="top center", cliponaxis=False)
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    pad = max(0.05, (0.3 - (high - low)) / 2)
    first = 0 if base is not None else 1
    ticks = list(range(first, max(first + 1, last_x + (2 if stars else 1))))  # no iteration yet: one tick
    fig.update_xaxes(title_text="iteration (base: the starting version; test: the sealed test split, scored once)",
                     tickvals=ticks,
                     ticktext=["base" if t == 0 else "test" if t > last_x else str(t) for t in ticks],
                     range=[ticks[0] - 0.4, ticks[-1] + 0.4])
    fig.update_yaxes(title_text="accuracy", tickformat=".0%", range=[max(-0.02, low - pad), min(1.05, high + pad)])
    _layout(fig, height=height, title="Accuracy per iteration")
    fig.update_layout(legend={"orientation": "h", "y": -0.32, "x": 0}, margin={"b": 70})
    return fig


def cost_bars(stats: Sequence[StrategyStats], height: int = 280) -> go.Figure:
    """Training time and model calls per evolution, side by side. The panel titles sit above the
    plot area, so the figure keeps a top margin for them (without one they were cut off)."""
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=("training time (s)", "model calls"))
    names = [f"{s.strategy} {s.evolution_id[:6]}" for s in stats]
    colors = [STRATEGY_COLORS.get(s.strategy, "#9a968c") for s in stats]
    fig.add_bar(x=names, y=[s.train_seconds for s in stats], marker_color=colors, row=1, col=1, showlegend=False,
                text=[f"{s.train_seconds:.0f}" for s in stats], textposition="outside", cliponaxis=False)
    fig.add_bar(x=names, y=[s.model_calls for s in stats], marker_color=colors, row=1, col=2, showlegend=False,
                text=[str(s.model_calls) for s in stats], textposition="outside", cliponaxis=False)
    fig.update_yaxes(rangemode="tozero")
    _layout(fig, height=height, title="Cost of training")
    fig.update_layout(margin={"t": 72})
    return fig

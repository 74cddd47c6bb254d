"""How two evolutions compare, by one definition for the benchmark and the app.

- The curve of an evolution: after each kept change and after each iteration, the calls and
  charged model seconds spent so far and the validation accuracy of the version it keeps
  (starting from the starter harness).
- Time to target: what an evolution spent before its validation accuracy first reached a target.
- Speedup over a baseline: the baseline's time to its own final validation accuracy, divided by
  ours to the same accuracy; in calls and in model seconds. It is undefined when the baseline
  never rose above where both started, and 0 when we never reach the target.

Model seconds are the latencies charged to the budget (recorded when each call was made, cached
or not when the evolution charges cached calls), so time spent waiting for a human, or for another
job on the machine, never counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ecdysis.store import EvolutionRecord


@dataclass(frozen=True)
class Point:
    calls: int
    seconds: float
    val_accuracy: float


def start_accuracy(evo: EvolutionRecord) -> float | None:
    """The validation accuracy the evolution started from: the parent side of its first gate."""
    for row in evo.rows:
        for step in row.steps or ():
            if step.verdict is not None:
                return step.verdict.parent_accuracy
        if row.val_accuracy is not None and not row.steps:  # rows of older versions: no steps recorded
            return None
    return None


def curve(evo: EvolutionRecord, start: float) -> list[Point]:
    points, calls, seconds, acc = [Point(0, 0.0, start)], 0, 0.0, start
    for row in evo.rows:
        for step in row.steps or ():
            # A kept change is the evolution's version from the moment its gate said so, not from the
            # end of its iteration (which may validate further changes).
            if step.kept and step.verdict is not None and step.spent is not None:
                acc = step.verdict.candidate_accuracy
                points.append(Point(calls + step.spent.calls, round(seconds + step.spent.seconds, 3), acc))
        calls += row.model_calls
        # Rows stored before model seconds were charged count their working time instead.
        seconds += row.model_seconds if row.model_seconds is not None else row.wall_seconds
        if row.val_accuracy is not None:
            acc = row.val_accuracy
        points.append(Point(calls, round(seconds, 3), acc))
    return points


def reach(points: Sequence[Point], target: float) -> Point | None:
    return next((p for p in points if p.val_accuracy >= target - 1e-9), None)


def speedup(baseline: Sequence[Point], ours: Sequence[Point], start: float) -> dict[str, Any]:
    """Speedup to the baseline's final validation accuracy (see the module docstring)."""
    target = baseline[-1].val_accuracy
    if target <= start + 1e-9:
        return {"target": target, "calls": None, "seconds": None,
                "why": "the baseline never raised validation accuracy above the starting harness"}
    theirs, mine = reach(baseline, target), reach(ours, target)
    assert theirs is not None  # its own final point reaches it
    if mine is None:
        return {"target": target, "calls": 0.0, "seconds": 0.0, "why": "Ecdysis never reached the target"}
    return {"target": target,
            "calls": round(theirs.calls / mine.calls, 3) if mine.calls else None,
            "seconds": round(theirs.seconds / mine.seconds, 3) if mine.seconds else None,
            "baseline_calls": theirs.calls, "ecdysis_calls": mine.calls,
            "baseline_seconds": theirs.seconds, "ecdysis_seconds": mine.seconds}

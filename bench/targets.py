#!/usr/bin/env python3
"""Where Ecdysis stands against issue 11's two targets, read from the committed results files that
are the current standing: per suite and baseline, the paired test delta (both intervals), whether
it excludes no gain, the speedup to the baseline's final validation accuracy in calls and in
charged model seconds, whether it reaches the paper's best case (1.84x), and the largest speedup
any strategy of the run could have shown (`bench/speedup_ceiling.py`).

    python bench/targets.py   # write bench/results/targets.md

`tests/test_bench.py` fails when that file is not what the results files say. The README's section
between `<!-- bench:targets -->` markers is that file (`scripts/readme_tables.py`). Which files are
the standing, and the code each ran, are listed here; every figure is read from the files.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.speedup_ceiling import ceilings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "targets.md"
PAPER_SPEEDUP = 1.84  # the paper's best case (tau^2-bench airline), issue 11's speedup target
BASELINES = {"per-instance": "per-instance search", "self-evolution": "Self-Evolution"}


@dataclass(frozen=True)
class Standing:
    title: str      # the suite, as the README names it
    results: str    # file stem in bench/results
    code: str       # the commits the file's evolutions ran


STANDING = (
    Standing("BFCL single-turn, run to the budget", "compare_strategies_bfcl_budget",
             "Ecdysis `8ea007a`, baselines `4c8c1ec`"),
    Standing("BIG-Bench Hard, first mixture, run to the budget", "compare_strategies_bbh_budget", "`fc1b353`"),
)


def _seeds(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def accuracy_verdict(delta: Mapping[str, Any]) -> str:
    """Whether a paired delta meets the accuracy target: its interval over the held-out instances
    excludes no gain, and so does the one across seeds (the seeds resampled too) where recorded."""
    held_out = delta["ci95"][0] > 0
    wide = delta.get("ci95_seeds")
    if held_out and (wide is None or wide[0] > 0):
        return "met"
    if held_out:
        return "met on the held-out instances; across seeds the interval reaches no gain"
    return "not met"


def speedup_verdict(calls: float | None, seconds: float | None) -> str:
    if calls is None:
        return "undefined: the baseline never rose above the starting harness on any seed"
    met = [unit for unit, value in (("calls", calls), ("model seconds", seconds))
           if value is not None and value >= PAPER_SPEEDUP]
    if len(met) == 2:
        return "met"
    return f"met in {met[0]} only" if met else "missed"


def _delta_text(delta: Mapping[str, Any]) -> str:
    lo, hi = delta["ci95"]
    text = f"{delta['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    if delta.get("ci95_seeds"):
        text += f"; across seeds [{delta['ci95_seeds'][0]:+.1f}, {delta['ci95_seeds'][1]:+.1f}]"
    return f"**{text}**" if accuracy_verdict(delta) == "met" else text


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def rows(s: Standing) -> list[str]:
    path = RESULTS / f"{s.results}.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    out = []
    first = True
    for suite, per_roles in data["suites"].items():
        for roles, block in per_roles.items():
            for baseline, name in BASELINES.items():
                cmp = block.get("comparison", {}).get(baseline)
                if not cmp:
                    continue
                calls, seconds = cmp.get("speedup_calls"), cmp.get("speedup_seconds")
                ceiling = ceilings(block, baseline)
                measured = ("undefined" if calls is None else f"{_x(calls)} in calls, {_x(seconds)} in model s")
                most = ("—" if ceiling["ceiling_calls"] is None
                        else f"{_x(ceiling['ceiling_calls'])} in calls, {_x(ceiling['ceiling_seconds'])} in model s")
                where = f"{s.title} (`{s.results}`; {s.code}; roles {roles})" if first else ""
                first = False
                out.append("| " + " | ".join([
                    where, _seeds(block["seeds"]), name,
                    _delta_text(cmp["test_delta_points"]), accuracy_verdict(cmp["test_delta_points"]),
                    measured, speedup_verdict(calls, seconds), most]) + " |")
    return out


def render() -> str:
    head = ("| suite (results file, code) | seeds | against | Ecdysis − baseline (test points, 95 %) "
            "| accuracy target | speedup to the baseline's final validation accuracy | 1.84x "
            "| the most any strategy of the run could have shown |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [line for s in STANDING for line in rows(s)]
    note = ("Deltas are paired on the same sealed test instances; the first interval resamples those "
            "instances (each with both models' outcomes, drawn alike in every seed), the second the seeds "
            "too; in bold where both exclude no gain. The speedup is the mean over seeds of the baseline's "
            "calls (charged model seconds) to its own final validation accuracy over Ecdysis's to the same "
            "accuracy, roles, screening and validation included; undefined on a seed where the baseline kept "
            "nothing. The last column is `bench/speedup_ceiling.py`: the baseline's cost to its target over the "
            "fewest any evolution of the run spent to reach it. Generated by `bench/targets.py` from "
            "`bench/results/`.")
    return "\n".join([head, *lines, "", note]) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())

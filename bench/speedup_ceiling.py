"""How large a speedup any strategy could have shown in a strategy benchmark's results.

The benchmark (`bench/compare_strategies.py`) reports Ecdysis's speedup over a baseline: the
baseline's calls (and charged model seconds) to its own final validation accuracy, divided by
Ecdysis's to the same accuracy (`ecdysis.compare`). When both strategies find the same change,
the cheapest way to that accuracy is one iteration that keeps it, and its validation is most of
its cost, which every strategy pays. So the speedup has a ceiling set by the baseline alone: its
cost to the target divided by the fewest calls any evolution of the run spent to reach that
accuracy. A strategy that reached every seed's target as cheaply as the cheapest evolution did on
any seed would show this mean speedup, and no measured way of reaching the target did better.

The figure reads only the committed results (each evolution's curve of calls, seconds and
validation accuracy); it runs no model. Seeds where the baseline never rose above the starting
harness are left out, as the benchmark leaves them out of its mean.

    .venv/bin/python bench/speedup_ceiling.py bench/results/compare_strategies_bfcl_budget.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_strategies import mean  # noqa: E402
from ecdysis.compare import Point, reach  # noqa: E402


def ceilings(block: Mapping[str, Any], baseline: str) -> dict[str, Any]:
    """For one suite-and-roles block of a results file: per seed, the baseline's cost to its final
    validation accuracy, the fewest any evolution of the block spent to reach it, and their ratio
    in calls and in seconds; then the mean ratios over the seeds where the ratio is defined."""
    curves = {(name, seed): [Point(**p) for p in facts["curve"]]
              for name, figures in block["strategies"].items()
              for seed, facts in figures.get("per_seed", {}).items()}
    # A run that rotates its held-out windows validates seeds on different instances: accuracies
    # compare only within one window.
    windows = {str(k): str(v) for k, v in (block.get("holdout_windows") or {}).items()}
    seeds: dict[str, Any] = {}
    for (name, seed), theirs in sorted(curves.items()):
        if name != baseline:
            continue
        window = windows.get(seed)
        start = float((block.get("base_val_by_window") or {}).get(window, block["base_val_accuracy"]))
        target = theirs[-1].val_accuracy
        if target <= start + 1e-9:
            seeds[seed] = {"target": target, "why": "the baseline never rose above the starting harness"}
            continue
        reached = {key: point for key, curve in curves.items()
                   if windows.get(key[1]) == window and (point := reach(curve, target)) is not None}
        own = reached[(name, seed)]
        cheapest = min(reached.items(), key=lambda kv: (kv[1].calls, kv[1].seconds))
        fastest = min(reached.items(), key=lambda kv: (kv[1].seconds, kv[1].calls))
        seeds[seed] = {"target": target, "baseline_calls": own.calls, "baseline_seconds": own.seconds,
                       "fewest_calls": cheapest[1].calls, "fewest_calls_by": list(cheapest[0]),
                       "fewest_seconds": fastest[1].seconds, "fewest_seconds_by": list(fastest[0]),
                       "calls": round(own.calls / cheapest[1].calls, 3) if cheapest[1].calls else None,
                       "seconds": round(own.seconds / fastest[1].seconds, 3) if fastest[1].seconds else None}
    return {"baseline": baseline, "per_seed": seeds,
            "ceiling_calls": mean([s.get("calls") for s in seeds.values()]),
            "ceiling_seconds": mean([s.get("seconds") for s in seeds.values()])}


def report(results: Mapping[str, Any], baseline: str) -> list[dict[str, Any]]:
    out = []
    for suite, per_roles in results.get("suites", {}).items():
        for roles, block in per_roles.items():
            if baseline in block.get("strategies", {}):
                measured = (block.get("comparison", {}).get(baseline) or {}).get("speedup_calls")
                out.append({"suite": suite, "roles": roles, "measured_calls": measured,
                            **ceilings(block, baseline)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="a results file of bench/compare_strategies.py")
    parser.add_argument("--baseline", default="per-instance", help="the baseline (default: per-instance)")
    args = parser.parse_args(argv)
    for name in args.results:
        try:
            results = json.loads(Path(name).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read {name}: {exc}")
        for row in report(results, args.baseline):
            print(f"{name}: {row['suite']}, roles {row['roles']}, against {row['baseline']}: ceiling "
                  f"{row['ceiling_calls']}x in calls, {row['ceiling_seconds']}x in model seconds "
                  f"(measured {row['measured_calls']}x in calls)")
            for seed, s in row["per_seed"].items():
                if "calls" not in s:
                    print(f"  seed {seed}: undefined, {s['why']}")
                    continue
                print(f"  seed {seed}: target {s['target']}: the baseline {s['baseline_calls']} calls, the fewest "
                      f"{s['fewest_calls']} ({' seed '.join(s['fewest_calls_by'])}): {s['calls']}x; "
                      f"{s['baseline_seconds']} s against {s['fewest_seconds']} s: {s['seconds']}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

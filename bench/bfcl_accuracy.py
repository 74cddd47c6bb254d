"""The starter agent harness on BFCL's single-turn categories, per embedded model: accuracy with a
95 % Wilson interval on the sealed test split, and what the failures are, in the agent failure
taxonomy (`ecdysis.failures`). Every run goes through the engine (sandbox, gateway, cache, store).

    .venv/bin/python bench/bfcl_accuracy.py                          # 5 categories x 50 x 3 models
    .venv/bin/python bench/bfcl_accuracy.py --models smollm2 --limit 3 --suites bfcl-simple   # a smoke run

The test split is the one an evolution never sees, so an evolved harness's held-out result is
comparable with these figures on the same instances. Nothing else should be generating while it
runs if the seconds matter; load and CPU steal are recorded with each row.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

NAME = "bfcl_accuracy"
SUITES = ("bfcl-simple", "bfcl-multiple", "bfcl-parallel", "bfcl-parallel_multiple", "bfcl-irrelevance")
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of k successes in n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def measure(svc: Any, suite: str, model: str, harness: str | None, limit: int) -> dict[str, Any]:
    from ecdysis.failures import extract_failures
    from ecdysis.service import RunRequest
    before, load0, t0 = cpu_counters(), load_average(), time.time()
    run = svc.run(RunRequest(suite=suite, model=model, harness=harness, split="test", limit=limit))
    results = svc.results(run.run_id)
    instances = {i.id: i for i in svc.suite(suite).instances}
    failures = extract_failures(results, instances, suite=suite)
    calls = [c for r in results for c in r.calls]
    k, n = sum(1 for r in results if r.correct), len(results)
    low, high = wilson(k, n)
    return {"suite": suite, "model": model, "n": n, "correct": k, "accuracy": k / n if n else 0.0,
            "low": low, "high": high, "calls": len(calls),
            "model_s": round(sum(c.latency_s for c in calls if not c.cache_hit), 1),
            "cache_hits": sum(1 for c in calls if c.cache_hit),
            "failures": dict(Counter(f.type for f in failures).most_common()),
            "mechanisms": dict(Counter(f"{f.type}: {f.detail.get('mechanism', '')}".rstrip(": ")
                                       for f in failures).most_common()),
            "run_id": run.run_id, "harness": run.harness_version,
            "wall_s": round(time.time() - t0, 1), "load": load0, "steal_pct": steal_pct(before, cpu_counters())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ecdysis.service import Service
    from storage import open_store
    svc = Service(open_store())
    rows = []
    for model in args.models:
        for suite in args.suites:
            row = measure(svc, suite, model, args.harness, args.limit)
            rows.append(row)
            print(f"{model} {suite}: {row['correct']}/{row['n']} = {row['accuracy']:.3f} "
                  f"[{row['low']:.3f}, {row['high']:.3f}]; failures {row['failures']}; "
                  f"{row['model_s']} model s", flush=True)
    return {"when": now(), "limit": args.limit, "split": "test", "harness": args.harness or "starter-agent",
            "rows": rows}


def _seconds(row: dict[str, Any]) -> str:
    """Model seconds per instance of the calls made fresh; a row served from the response cache has
    none to show (its calls were timed in an earlier run)."""
    fresh = row["calls"] - row.get("cache_hits", 0)
    if not fresh:
        return "cached"
    share = "" if not row.get("cache_hits") else f" ({fresh} of {row['calls']} calls)"
    return f"{row['model_s'] / row['n']:.2f}{share}"


def _failures(row: dict[str, Any]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in row["failures"].items()) or "none"


def table(result: dict[str, Any]) -> str:
    suites = list(dict.fromkeys(r["suite"].removeprefix("bfcl-") for r in result["rows"]))
    versions = Counter(r["harness"] for r in result["rows"])
    stored = ", ".join(f"`{v}` ({n} rows)" for v, n in versions.items()) if len(versions) > 1 else f"`{next(iter(versions), '')}`"
    lines = [f"Harness `{result['harness']}` on BFCL's {', '.join(suites)}: at most {result['limit']} instances of "
             f"each category's {result['split']} split, accuracy with a 95 % Wilson interval, and the failures by type "
             f"in the agent failure taxonomy. Stored harness version {stored}. Measured {result['when']}.", "",
             "| model | suite | n | accuracy | 95 % interval | failures by type | model s per instance | load | steal % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['suite']} | {r['n']} | {r['accuracy']:.3f} | [{r['low']:.3f}, "
                     f"{r['high']:.3f}] | {_failures(r)} | {_seconds(r)} | {r['load']} | {r['steal_pct']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--suites", nargs="+", default=list(SUITES))
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--harness", default=None, help="harness version id or folder (default: the starter agent)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default=NAME, help="results file name (without extension)")
    parser.add_argument("--home", type=Path, default=None, help="data folder (default: a temporary one)")
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="ecdysis-bfcl-"))
    os.environ["ECDYSIS_HOME"] = str(home)
    os.environ.pop("ECDYSIS_DATABASE_URL", None)
    result = run(args)
    write_results(args.out, args.name, result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

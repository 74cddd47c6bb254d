"""Ecdysis vs iterative per-instance search, side by side: same suite, models, seeds, budgets and
role backend, one process. Writes a JSON and a Markdown table (bench/results/ by default).

    .venv/bin/python bench/compare_strategies.py                 # default size, embedded SmolLM2
    .venv/bin/python bench/compare_strategies.py --model smollm2 --model gemma3-270m --iterations 4

Speedup = the per-instance search's training time to reach Ecdysis's final validation accuracy
(its whole training time, marked as a lower bound, if it never does) / Ecdysis's training time to
reach that accuracy. The accuracy delta is on the sealed test split, scored once per strategy."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_strategy(svc: Any, strategy: str, args: argparse.Namespace) -> dict[str, Any]:
    from ecdysis.evolve import EvolveConfig, Evolver, summary
    cfg = EvolveConfig(suite=args.suite, models=args.model, strategy=strategy, iterations=args.iterations,
                       batch_size=args.batch_size, val_limit=args.val_limit, test_limit=args.test_limit,
                       auto_approve=True, role_backend=args.roles, max_rounds=3, concurrency=1,
                       max_model_calls=args.max_model_calls, label=f"bench-{strategy}")
    evolver = Evolver(svc, events=lambda e: print(f"  [{strategy}] iteration {e['iteration']}: "
                                                   f"val {e['val_accuracy']} — {e['gate']}", flush=True)
                      if e["type"] == "iteration_done" else None)
    started = time.perf_counter()
    evo = evolver.run(evolver.create(cfg).id)
    out = summary(evo)
    out["total_wall_seconds"] = round(time.perf_counter() - started, 2)
    out["evaluations"] = sum(1 for r in evo.iterations if r.get("candidate_version"))
    out["model_calls"] = sum(r["model_calls"] for r in evo.iterations)
    out["tokens"] = sum(r["tokens"] for r in evo.iterations)
    out["final_val_accuracy"] = evo.iterations[-1]["val_accuracy"] if evo.iterations else None
    return out


def time_to_reach(result: dict[str, Any], target: float | None) -> tuple[float, bool]:
    """Cumulative training seconds until validation accuracy first reached `target`."""
    elapsed = 0.0
    for row in result["iterations"]:
        elapsed += row["wall_seconds"]
        if target is not None and row["val_accuracy"] is not None and row["val_accuracy"] >= target:
            return elapsed, True
    return elapsed, False


def compare(ec: dict[str, Any], pi: dict[str, Any]) -> dict[str, Any]:
    target = ec["final_val_accuracy"]
    t_ec, _ = time_to_reach(ec, target)
    t_pi, reached = time_to_reach(pi, target)
    speedup = round(t_pi / t_ec, 2) if t_ec > 0 else None
    delta = None
    if ec["test_accuracy"] is not None and pi["test_accuracy"] is not None:
        delta = round(ec["test_accuracy"] - pi["test_accuracy"], 4)
    return {"target_val_accuracy": target, "ecdysis_seconds_to_target": round(t_ec, 2),
            "per_instance_seconds_to_target": round(t_pi, 2), "per_instance_reached_target": reached,
            "speedup": speedup, "speedup_is_lower_bound": not reached,
            "test_accuracy_delta": delta,
            "test_accuracy_delta_points": None if delta is None else round(100 * delta, 2)}


def markdown(args: argparse.Namespace, ec: dict[str, Any], pi: dict[str, Any], cmp: dict[str, Any]) -> str:
    rows = [("training wall time (s)", "train_wall_seconds"), ("model calls", "model_calls"), ("tokens", "tokens"),
            ("candidate evaluations", "evaluations"), ("final validation accuracy", "final_val_accuracy"),
            ("held-out test accuracy", "test_accuracy"), ("starter harness test accuracy", "base_test_accuracy"),
            ("final harness version", "final_version")]
    lines = [f"Suite `{args.suite}`, models {', '.join(args.model)}, {args.iterations} iterations, "
             f"batch {args.batch_size}, validation {args.val_limit}, test {args.test_limit}, roles `{args.roles}`.", "",
             "| | Ecdysis | per-instance |", "|---|---|---|"]
    lines += [f"| {label} | {ec.get(key)} | {pi.get(key)} |" for label, key in rows]
    bound = " (lower bound: per-instance never reached it)" if cmp["speedup_is_lower_bound"] else ""
    lines += ["", f"- speedup to Ecdysis's final validation accuracy ({cmp['target_val_accuracy']}): "
                  f"**{cmp['speedup']}x**{bound}",
              f"- held-out test accuracy delta (Ecdysis − per-instance): **{cmp['test_accuracy_delta_points']} points**"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="reasoning-mix")
    parser.add_argument("--model", action="append", help="repeatable (default: smollm2)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--val-limit", type=int, default=30)
    parser.add_argument("--test-limit", type=int, default=40)
    parser.add_argument("--roles", default="heuristic")
    parser.add_argument("--max-model-calls", type=int, default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--home", default=None, help="data folder (default: a fresh temp folder)")
    args = parser.parse_args()
    args.model = args.model or ["smollm2"]
    os.environ["ECDYSIS_HOME"] = args.home or tempfile.mkdtemp(prefix="ecdysis-bench-")
    os.environ.pop("ECDYSIS_DATABASE_URL", None)
    from ecdysis.service import Service
    from storage import open_store
    results = {}
    for strategy in ("ecdysis", "per-instance"):
        # A database (and so a response cache) per strategy: neither may ride on calls the other paid for.
        svc = Service(open_store(f"sqlite:///{Path(os.environ['ECDYSIS_HOME']) / strategy}.db"))
        print(f"== {strategy}", flush=True)
        results[strategy] = run_strategy(svc, strategy, args)
    cmp = compare(results["ecdysis"], results["per-instance"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"config": vars(args), "results": results, "comparison": cmp}
    (out_dir / "compare_strategies.json").write_text(json.dumps(payload, indent=2, default=str))
    table = markdown(args, results["ecdysis"], results["per-instance"], cmp)
    (out_dir / "compare_strategies.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

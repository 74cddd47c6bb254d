"""One Ecdysis evolution of the starter agent on a BFCL suite, heuristic roles, every proposal
approved: what each iteration found and tried, and the sealed test of the final version against
the starter, paired on the same instances and models.

    .venv/bin/python bench/bfcl_evolution.py                       # the committed run (about 1-2 h)
    .venv/bin/python bench/bfcl_evolution.py --iterations 1 --batch-size 4 --val-limit 4 --test-limit 4

The test delta's interval is a 95 % bootstrap over the paired (model, instance) outcomes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_strategies import bootstrap, outcomes  # noqa: E402
from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

NAME = "bfcl_evolution"


def paired_delta(base: dict[tuple[str, str], float], final: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Final minus base accuracy over the outcomes both have, with the strategy benchmark's
    bootstrap interval (the paired differences resampled by instance, both models' together)."""
    keys = sorted(set(base) & set(final))
    diffs = [int(final[k]) - int(base[k]) for k in keys]
    mean, ci = bootstrap([dict(zip(keys, diffs))])
    return {"n": len(diffs), "mean": mean, "ci95": ci, "won": diffs.count(1), "lost": diffs.count(-1)}


def by_model(result: dict[tuple[str, str], float]) -> dict[str, float]:
    seen: dict[str, list[float]] = {}
    for (model, _), ok in result.items():
        seen.setdefault(model, []).append(ok)
    return {m: round(sum(v) / len(v), 4) for m, v in seen.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ecdysis.evolve import EvolveConfig
    from ecdysis.service import Service
    from storage import open_store
    svc = Service(open_store())
    cfg = EvolveConfig(suite=args.suite, models=args.models, iterations=args.iterations, batch_size=args.batch_size,
                       val_limit=args.val_limit, test_limit=args.test_limit, auto_approve=True, seed=args.seed,
                       role_backend=args.roles, label="bench-bfcl")
    before, load0, t0 = cpu_counters(), load_average(), time.time()

    def progress(e: dict[str, Any]) -> None:
        if e["type"] == "iteration_done":
            print(f"iteration {e['iteration']}: val {e['val_accuracy']} — {e['gate']} "
                  f"({e['model_calls']} calls)", flush=True)
    evo = svc.run_evolution(cfg, events=progress)
    done = evo.outcome
    base, final = outcomes(svc, list(done.test_base_runs)), outcomes(svc, list(done.test_runs))
    iterations = []
    for row in evo.rows:
        iterations.append({k: getattr(row, k) for k in ("iteration", "train_accuracy", "val_accuracy", "proposals",
                                                        "screened", "screen_rounds", "applied", "kept", "gate",
                                                        "model_calls", "wall_seconds")}
                          | {"calls_by_phase": dict(row.calls_by_phase),
                             "tried": [{"operator": h.operator, "outcome": h.outcome, "why": h.why}
                                       for h in row.history]})
    return {"when": now(), "suite": args.suite, "models": args.models, "roles": args.roles, "seed": args.seed,
            "iterations_asked": args.iterations, "batch_size": args.batch_size, "val_limit": args.val_limit,
            "test_limit": args.test_limit, "evolution_id": evo.id, "status": evo.status,
            "base_version": evo.base_version, "final_version": done.final_version,
            "iterations": iterations,
            "train_calls": sum(r["model_calls"] or 0 for r in iterations),
            "test": {"base": done.base_test_accuracy, "final": done.test_accuracy,
                     "base_by_model": by_model(base), "final_by_model": by_model(final),
                     "delta": paired_delta(base, final), "instances": done.test_instances},
            "wall_s": round(time.time() - t0, 1), "load": load0, "steal_pct": steal_pct(before, cpu_counters())}


def _tried(row: dict[str, Any]) -> str:
    return "; ".join(f"{t['operator'] or '?'}: {t['outcome']}" for t in row["tried"]) or "nothing"


def table(r: dict[str, Any]) -> str:
    t = r["test"]
    d = t["delta"]
    models = ", ".join(r["models"])
    per_model = ", ".join(f"{m} {t['base_by_model'].get(m, 0):.3f} → {t['final_by_model'].get(m, 0):.3f}"
                          for m in r["models"])
    lines = [f"Evolution `{r['evolution_id']}` of the starter agent on `{r['suite']}` with {models}, roles "
             f"`{r['roles']}`, every proposal approved: {r['iterations_asked']} iterations, batch {r['batch_size']}, "
             f"validation {r['val_limit']}, sealed test {r['test_limit']} per model. Measured {r['when']} "
             f"(load {r['load']}, steal {r['steal_pct']} %, {r['wall_s']:.0f} s wall).", "",
             "| iteration | train | validation | proposals | screened | kept | tried | gate | calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    for it in r["iterations"]:
        val = "–" if it["val_accuracy"] is None else f"{it['val_accuracy']:.3f}"
        train = "–" if it["train_accuracy"] is None else f"{it['train_accuracy']:.3f}"
        gate = str(it["gate"]).replace("|", "/")[:160]
        lines.append(f"| {it['iteration']} | {train} | {val} | {it['proposals']} | {it['screened']} | {it['kept']} "
                     f"| {_tried(it)} | {gate} | {it['model_calls']} |")
    lines += ["", f"Sealed test ({d['n']} paired outcomes): starter {t['base']:.3f}, final {t['final']:.3f} "
                  f"(version `{r['final_version']}`); per model {per_model}; paired delta {d['mean'] * 100:+.1f} "
                  f"points, 95 % interval [{d['ci95'][0] * 100:+.1f}, {d['ci95'][1] * 100:+.1f}], "
                  f"{d['won']} won and {d['lost']} lost. Training used {r['train_calls']} model calls."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="bfcl-single_turn")
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2"])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=30)
    parser.add_argument("--val-limit", type=int, default=60)
    parser.add_argument("--test-limit", type=int, default=100)
    parser.add_argument("--roles", default="heuristic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default=NAME, help="results file name (without extension)")
    parser.add_argument("--home", type=Path, default=None, help="data folder (default: a temporary one)")
    args = parser.parse_args(argv)
    os.environ["ECDYSIS_HOME"] = str(args.home or tempfile.mkdtemp(prefix="ecdysis-bench-bfcl-evo-"))
    result = run(args)
    write_results(args.out, args.name, result, table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Option scoring against generation, on real BIG-bench tasks with a closed answer space: the
starter harness, and the starter with the `option_scoring` operator (each option scored as the
reply "Answer: <option>", by total or by per-token log-probability), run through the engine
(sandbox, gateway, cache, store) on the same instances with each embedded model.

    .venv/bin/python bench/option_scoring.py                       # 9 tasks x 30 instances x 2 models
    .venv/bin/python bench/option_scoring.py --tasks navigate --limit 4 --models smollm2   # a smoke run

Figures per model and task: accuracy of each harness, the paired wins and losses of option scoring
(plain and calibrated) against the starter with an exact two-sided sign test, and model seconds
per instance of the starter and of plain scoring (the other variants reuse plain scoring's cached
calls, so only their accuracy is given; calibration adds one scoring call per distinct prompt).
Nothing else should be generating while it runs; load and CPU steal are recorded."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

NAME = "option_scoring"
# Closed-answer tasks of the generalisation corpus (tests/test_corpus.py): options, yes/no, true/false.
TASKS = ("navigate", "causal_judgment", "strategyqa", "sports_understanding", "date_understanding",
         "logical_deduction", "disambiguation_qa", "temporal_sequences", "formal_fallacies_syllogisms_negation")


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test p-value of `wins` against `losses` (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def measure(svc: Any, suite: str, model: str, harness: str, limit: int) -> dict[str, Any]:
    from ecdysis.service import RunRequest
    run_id = svc.run(RunRequest(suite=suite, model=model, harness=harness, split="validation", limit=limit)).run_id
    results = svc.results(run_id)
    calls = [c for r in results for c in r.calls]
    return {"correct": {r.instance_id: bool(r.correct) for r in results},
            "model_s": sum(c.latency_s for c in calls if not c.cache_hit),
            "tokens": sum(c.prompt_tokens + c.completion_tokens for c in calls),
            "scoring_calls": sum(1 for c in calls if c.option_logprobs is not None),
            "calls": len(calls), "n": len(results)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ecdysis.harness import ensure_starter, new_version
    from ecdysis.roles.operators import OPERATORS
    from ecdysis.service import Service
    from storage import open_store
    svc = Service(open_store())
    starter = ensure_starter(svc.store)
    op = OPERATORS["option_scoring"]
    versions = {"starter": starter.id}
    for name, score_by, calibrate in (("total", "total", False), ("per_token", "per_token", False),
                                      ("calibrated", "total", True)):
        files = op.patched(starter.files, score_by=score_by, calibrate=calibrate, margin=None)  # type: ignore[attr-defined]
        version = new_version(files, parent=starter.id, note=f"option_scoring ({name})")
        versions[name] = (svc.store.get_harness(version.id) or svc.store.put_harness(version)).id
    rows = []
    for model in args.models:
        for task in args.tasks:
            suite = f"bigbench:{task}"
            before, load0, t0 = cpu_counters(), load_average(), time.time()
            got = {name: measure(svc, suite, model, version, args.limit) for name, version in versions.items()}
            base = got["starter"]["correct"]
            n = got["starter"]["n"]
            row: dict[str, Any] = {"model": model, "task": task, "n": n, "starter": sum(base.values()) / n}
            for name in ("total", "per_token", "calibrated"):
                mine = got[name]["correct"]
                row[name] = sum(mine.values()) / n
                row[f"{name}_wins"] = sum(1 for i in base if mine.get(i) and not base[i])
                row[f"{name}_losses"] = sum(1 for i in base if base[i] and not mine.get(i))
                row[f"{name}_p"] = sign_test(row[f"{name}_wins"], row[f"{name}_losses"])
            row.update({"starter_s": got["starter"]["model_s"] / n, "scored_s": got["total"]["model_s"] / n,
                        "starter_tokens": got["starter"]["tokens"] / n, "scored_tokens": got["total"]["tokens"] / n,
                        "calibrated_calls": got["calibrated"]["calls"] / n,
                        "scoring_calls": got["total"]["scoring_calls"], "scored_calls": got["total"]["calls"],
                        "wall_s": round(time.time() - t0, 1), "load": load0, "steal_pct": steal_pct(before, cpu_counters())})
            rows.append(row)
            print(f"{model} {task}: starter {row['starter']:.3f}, scored {row['total']:.3f} (+{row['total_wins']}/"
                  f"-{row['total_losses']}), per token {row['per_token']:.3f}, calibrated {row['calibrated']:.3f} "
                  f"(+{row['calibrated_wins']}/-{row['calibrated_losses']}); {row['scoring_calls']} of "
                  f"{row['scored_calls']} calls scored options", flush=True)
    return {"when": now(), "limit": args.limit, "split": "validation", "rows": rows, "totals": totals(rows)}


def totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        n = sum(r["n"] for r in mine)
        total: dict[str, Any] = {"model": model, "n": n}
        for key in ("starter", "total", "per_token", "calibrated", "starter_s", "scored_s", "calibrated_calls"):
            total[key] = sum(r[key] * r["n"] for r in mine) / n
        for name in ("total", "per_token", "calibrated"):
            total[f"{name}_wins"] = sum(r[f"{name}_wins"] for r in mine)
            total[f"{name}_losses"] = sum(r[f"{name}_losses"] for r in mine)
            total[f"{name}_p"] = sign_test(total[f"{name}_wins"], total[f"{name}_losses"])
        out.append(total)
    return out


def _paired(r: dict[str, Any], name: str) -> str:
    return f"+{r[name + '_wins']} / −{r[name + '_losses']} (p {r[name + '_p']:.3f})"


def table(result: dict[str, Any]) -> str:
    lines = [f"Accuracy of the starter harness and of the starter with `option_scoring` (by total log-probability, "
             f"by log-probability per token, and calibrated: minus each option's score with the input blanked), "
             f"{result['limit']} validation instances per task; wins / losses are paired against the starter on the "
             f"same instances (exact sign test). Measured {result['when']}.", "",
             "| model | task | starter | scored | per token | calibrated | scored vs starter | calibrated vs starter "
             "| model s per instance (starter → scored) | load | steal % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['task']} | {r['starter']:.3f} | {r['total']:.3f} | {r['per_token']:.3f} | "
                     f"{r['calibrated']:.3f} | {_paired(r, 'total')} | {_paired(r, 'calibrated')} | "
                     f"{r['starter_s']:.2f} → {r['scored_s']:.2f} | {r['load']} | {r['steal_pct']} |")
    for t in result["totals"]:
        lines.append(f"| **{t['model']}** | **all {t['n']}** | **{t['starter']:.3f}** | **{t['total']:.3f}** | "
                     f"**{t['per_token']:.3f}** | **{t['calibrated']:.3f}** | **{_paired(t, 'total')}** | "
                     f"**{_paired(t, 'calibrated')}** | **{t['starter_s']:.2f} → {t['scored_s']:.2f}** | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2"])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--home", type=Path, default=None, help="data folder (default: a temporary one)")
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="ecdysis-optscore-"))
    os.environ["ECDYSIS_HOME"] = str(home)
    os.environ.pop("ECDYSIS_DATABASE_URL", None)
    result = run(args)
    write_results(args.out, NAME, result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: how well a model plays the four roles, on real clusters from real runs.

For each suite, the subject models run a batch with the starter harness; the batch is diagnosed
with `--roles MODEL` (structured output: a llama.cpp grammar for embedded models); batches are
added until at least `--min-clusters` clusters have been through the roles. From the stored
transcripts it counts, per role:
- **first try**: turns whose first reply was valid (schema, and for the Proposer, a patch that
  can be built);
- **repaired**: valid after the one repair request;
- **fallback**: turns the heuristic backend had to answer;
and, per proposal, whether it passed every hard check of the Critic (patch applies, harness loads,
smoke run, no leakage).

Run: `.venv/bin/python bench/role_outputs.py [--roles qwen2.5-coder-1.5b] [--model M ...]
[--suite S ...] [--limit 12] [--min-clusters 10] [--out bench/results]`. Writes
`role_outputs.json` and `role_outputs.md`. Slow on 2 cores (minutes per cluster with the 1.5B).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

ROLES = ("investigator", "attributor", "proposer", "critic")
DEFAULT_SUITES = ("reasoning-mix", "bigbench:logical_deduction/three_objects", "bigbench:navigate",
                  "bigbench:sports_understanding", "bigbench:date_understanding",
                  "bigbench:temporal_sequences", "bigbench:causal_judgment")


def role_turns(transcript: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Split a transcript into role turns (a turn starts at the role's prompt) and classify each:
    'first_try', 'repaired' or 'fallback'. Messages of the engine (hard checks) are skipped."""
    turns: list[dict[str, Any]] = []
    for m in transcript:
        if m["kind"] == "prompt":
            turns.append({"role": m["role"], "round": m["round"], "kinds": []})
        elif turns and m["role"] == turns[-1]["role"]:
            turns[-1]["kinds"].append(m["kind"])
    for t in turns:
        kinds = t.pop("kinds")
        t["outcome"] = ("fallback" if "fallback" in kinds else "repaired" if "repair" in kinds
                        else "first_try" if "output" in kinds else "none")
    return turns


def tally(reports: list[Mapping[str, Any]]) -> dict[str, Any]:
    per_role: dict[str, Counter[str]] = {r: Counter() for r in ROLES}
    clusters = proposals = passed = 0
    for report in reports:
        transcripts = {p["cluster_id"]: p for p in report["proposals"]}
        for cluster in report["clusters"]:
            proposal = transcripts.get(cluster["id"])
            transcript = proposal["transcript"] if proposal else cluster.get("patch", {}).get("transcript")
            if not transcript:
                continue
            clusters += 1
            for turn in role_turns(transcript):
                per_role[turn["role"]][turn["outcome"]] += 1
            if proposal:
                proposals += 1
                passed += all(c["ok"] for c in proposal["checks"]) and bool(proposal["checks"])
    roles = {}
    for role, counts in per_role.items():
        total = sum(counts.values())
        roles[role] = {"turns": total, **{k: counts.get(k, 0) for k in ("first_try", "repaired", "fallback")},
                       "first_try_rate": round(counts["first_try"] / total, 3) if total else None,
                       "fallback_rate": round(counts["fallback"] / total, 3) if total else None}
    return {"clusters": clusters, "proposals": proposals, "passed_hard_checks": passed,
            "hard_check_pass_rate": round(passed / proposals, 3) if proposals else None, "roles": roles}


def markdown(result: Mapping[str, Any]) -> str:
    t = result["tally"]
    lines = [f"Roles played by `{result['roles']}` on {t['clusters']} real clusters "
             f"({', '.join(result['models'])}; suites: {', '.join(result['suites'])}).", "",
             "| role | turns | valid on the first try | valid after one repair | fell back to heuristic |",
             "|---|---:|---:|---:|---:|"]
    for role, r in t["roles"].items():
        def pct(n: int) -> str:
            return f"{n} ({100 * n / r['turns']:.0f} %)" if r["turns"] else "-"
        lines.append(f"| {role} | {r['turns']} | {pct(r['first_try'])} | {pct(r['repaired'])} | {pct(r['fallback'])} |")
    rate = t["hard_check_pass_rate"]
    lines += ["", f"Proposals: {t['proposals']}; passed every hard check of the Critic: {t['passed_hard_checks']}"
                  f" ({'-' if rate is None else f'{100 * rate:.0f} %'}).",
              f"{result['meta']['wall_s']:.0f} s of runs and diagnoses in all"
              + ("" if result["meta"]["load_before"] is None else
                 f"; load {result['meta']['load_before']} → {result['meta']['load_after']}, "
                 f"CPU stolen {result['meta']['steal_pct']} %") + f"; {result['meta']['date']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--roles", default="qwen2.5-coder-1.5b")
    parser.add_argument("--model", action="append", help="subject models (default: the two-model batch)")
    parser.add_argument("--suite", action="append", help=f"default: {', '.join(DEFAULT_SUITES)}")
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--min-clusters", type=int, default=10)
    parser.add_argument("--max-rounds", type=int, default=2)
    parser.add_argument("--home", type=Path, help="data folder (default: a temporary one)")
    parser.add_argument("--tally-only", action="store_true",
                        help="run nothing: count the diagnoses already stored in --home by these roles")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="ecdysis-roles-"))
    os.environ["ECDYSIS_HOME"] = str(home)
    from ecdysis.diagnosis import DiagnosisReport
    from ecdysis.service import RunRequest, Service
    from ecdysis.settings import Settings
    from storage import open_store
    settings = Settings.from_env()
    svc = Service(open_store(settings.database_url), settings)
    models = args.model or list(settings.default_models)
    reports: list[dict[str, Any]] = []
    used: list[str] = []
    started, load_before, cpu_before = time.perf_counter(), load_average(), cpu_counters()
    if args.tally_only:
        for record in reversed(svc.diagnoses(limit=1000)):
            report = DiagnosisReport.from_json(record.report).to_json()
            if report["role_backend"] == f"llm:{args.roles}":
                reports.append(report)
                used += [s for s in report["suites"] if s not in used]
        runs = [svc.get_run(r) for rep in reports for r in rep["run_ids"]]
        models = sorted({r.model for r in runs}) or models
        wall = sum(r.summary.get("wall_seconds", 0) for r in runs) + sum(rep["stats"].get("total_seconds", 0)
                                                                           for rep in reports)
    for suite in [] if args.tally_only else (args.suite or DEFAULT_SUITES):
        runs = [svc.run(RunRequest(suite=suite, model=m, limit=args.limit)).run_id for m in models]
        record = svc.diagnose(runs, role_backend=args.roles, max_rounds=args.max_rounds)
        report = DiagnosisReport.from_json(record.report).to_json()
        reports.append(report)
        used.append(suite)
        so_far = tally(reports)
        print(f"{suite}: {report['stats']['clusters']} clusters, {report['stats']['harness_level']} through the "
              f"roles; {so_far['clusters']} so far ({time.perf_counter() - started:.0f} s)", flush=True)
        if so_far["clusters"] >= args.min_clusters:
            break
    if args.tally_only:  # the machine's state now says nothing about when the work ran
        load_before = cpu_before = None  # type: ignore[assignment]
    result = {"roles": args.roles, "models": models, "suites": used, "limit": args.limit,
              "max_rounds": args.max_rounds, "diagnoses": [r["id"] for r in reports], "tally": tally(reports),
              "meta": {"wall_s": round(wall if args.tally_only else time.perf_counter() - started, 1),
                       "load_before": load_before,
                       "load_after": None if args.tally_only else load_average(),
                       "steal_pct": steal_pct(cpu_before, cpu_counters()),
                       "cpus": os.cpu_count(), "date": now()}}
    svc.store.close()
    write_results(args.out, "role_outputs", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

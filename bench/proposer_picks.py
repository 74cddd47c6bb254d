"""Benchmark: which catalogue operator an LLM Proposer names for real clusters, against the engine's
ranking for them.

The cases are the first batches of the heuristic-role Ecdysis evolutions a strategy benchmark
(`bench/compare_strategies.py`) left in `--home`: each batch is diagnosed again with heuristic
roles (its probe and smoke calls come from the home's cache), and every case the Proposer is given
in a first round is kept. Then the LLM Proposer (`--roles`) answers each case once. Per case it
records the open operators in ranking order, the operator named, and how the turn ended:
- **model**: the model's own valid reply (first try or after the repair request);
- **kept without edits**: it named an open operator and added edits that never applied; the
  operator is kept as the catalogue writes it;
- **fallback**: the heuristic answered instead (then the pick is the heuristic's, not counted as
  the model's).

Run: `.venv/bin/python bench/proposer_picks.py --home DIR --tag v6c --tag v7b
[--roles qwen2.5-coder-1.5b] [--seed 13 ...] [--suite bigbench ...] [--out bench/results]`. Writes `proposer_picks.json`
and `proposer_picks.md`. About a minute a case with the 1.5B on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_strategies import parse_label  # noqa: E402
from machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402


def evolution_cases(svc: Any, tags: Sequence[str], seeds: Sequence[int],
                    suites: Sequence[str] = ()) -> list[tuple[str, Any]]:
    """(evolution label, CaseFile) for every first-round Proposer case of the first iteration of each
    heuristic-role Ecdysis evolution with one of `tags` (and one of `seeds`, and a suite name
    containing one of `suites`, if given)."""
    from ecdysis import diagnosis
    from ecdysis.roles import HeuristicRoleBackend

    class Capture(HeuristicRoleBackend):
        def __init__(self) -> None:
            super().__init__()
            self.cases: list[Any] = []

        def run(self, role: Any, case: Any, round: int) -> Any:
            if role == "proposer" and round == 1 and not case.objections:
                self.cases.append(case)
            return super().run(role, case, round)

    out: list[tuple[str, Any]] = []
    for evo in sorted(svc.store.list_evolutions(limit=1000), key=lambda e: e.config.get("label", "")):
        fields = parse_label(evo.config.get("label", ""))
        if fields is None or fields["tag"] not in tags or fields["roles"] != "heuristic" \
                or fields["strategy"] != "ecdysis" or not evo.iterations:
            continue
        if (seeds and fields["seed"] not in seeds) or (suites and not any(x in fields["suite"] for x in suites)):
            continue
        record = svc.store.get_diagnosis(evo.iterations[0]["diagnosis_id"])
        capture = Capture()
        diagnosis.diagnose(svc.store, record.run_ids, suite_loader=svc.suite, role_backend=capture,
                           smoke_model=svc.backend(evo.config["models"][0]), backend_factory=svc.backend,
                           limits=svc.limits(), passes=1)
        out += [(evo.config["label"], case) for case in capture.cases]
    return out


def pick(roles: Any, case: Any) -> dict[str, Any]:
    """One Proposer turn on `case`: the ranking's open operators, the operator named, how it ended."""
    from ecdysis.roles.llm import open_operators
    ranked = open_operators(case)[0]
    started = time.perf_counter()
    turn = roles.run("proposer", case, 1)
    kinds = [m.kind for m in turn.messages]
    ended = "fallback" if "fallback" in kinds else "kept without edits" if "check" in kinds else "model"
    named = (turn.output or {}).get("operator") or ("edits" if (turn.output or {}).get("edits") else "none")
    return {"cluster": case.cluster.label, "type": case.cluster.type, "ranked": ranked, "named": named,
            "ended": ended, "head": bool(ranked) and named == ranked[0], "top3": named in ranked[:3],
            "seconds": round(time.perf_counter() - started, 1)}


def tally(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    mine = [r for r in rows if r["ended"] != "fallback"]
    return {"cases": len(rows), "fallback": len(rows) - len(mine),
            "kept_without_edits": sum(r["ended"] == "kept without edits" for r in rows),
            "head": sum(r["head"] for r in mine), "top3": sum(r["top3"] for r in mine),
            "named": dict(Counter(r["named"] for r in mine).most_common())}


def markdown(result: Mapping[str, Any]) -> str:
    t, m = result["tally"], result["meta"]
    own = t["cases"] - t["fallback"]
    lines = [f"The Proposer played by `{result['roles']}` on {t['cases']} real clusters (the first batches of "
             f"the heuristic Ecdysis evolutions tagged {', '.join(result['tags'])} in the strategy benchmark). "
             f"Measured {m['date']} (load {m['load_before']}→{m['load_after']}, steal {m['steal_pct']} %, "
             f"{m['wall_s']} s).", "",
             "| suite · seed | cluster | ranking (open operators, best first) | named | ended |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        cluster = r["cluster"].replace("|", "/")
        cluster = cluster if len(cluster) <= 60 else cluster[:59].rstrip() + "…"
        lines.append(f"| {r['evolution']} | {cluster} | {', '.join(r['ranked'][:3])} | {r['named']} | {r['ended']} |")
    named = ", ".join(f"{k} {v}" for k, v in t["named"].items())
    lines += ["", f"Of {own} turns the model answered itself, it named the ranking's first operator in {t['head']} "
              f"and one of its first three in {t['top3']} ({named}); {t['kept_without_edits']} kept a named "
              f"operator without edits that did not apply; the heuristic answered {t['fallback']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="a strategy benchmark's data folder")
    parser.add_argument("--tag", action="append", required=True,
                        help="the benchmark's --tag (repeatable; \"\" for a run without one)")
    parser.add_argument("--seed", type=int, action="append", default=[])
    parser.add_argument("--suite", action="append", default=[], help="only suites whose name contains this")
    parser.add_argument("--roles", default="qwen2.5-coder-1.5b")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    os.environ["ECDYSIS_HOME"] = str(args.home)
    from ecdysis.roles import make_role_backend
    from ecdysis.service import Service
    from ecdysis.settings import Settings
    from storage import open_store
    settings = Settings.from_env()
    svc = Service(open_store(settings.database_url), settings)
    started, load_before, cpu_before = time.perf_counter(), load_average(), cpu_counters()
    cases = evolution_cases(svc, args.tag, args.seed, args.suite)
    if not cases:
        print(f"no heuristic Ecdysis evolution tagged {', '.join(args.tag)} in {args.home}", file=sys.stderr)
        return 2
    roles = make_role_backend(args.roles)
    rows = []
    for n, (label, case) in enumerate(cases, 1):
        fields = parse_label(label) or {}
        tasks = str(fields.get("suite", "")).split("+")
        more = f" +{len(tasks) - 1}" if len(tasks) > 1 else ""
        row = {"evolution": f"{tasks[0]}{more} · seed {fields.get('seed')}", **pick(roles, case)}
        rows.append(row)
        print(f"[{n}/{len(cases)}] {row['evolution']} {row['type']}: ranked {row['ranked'][:3]}, named "
              f"{row['named']} ({row['ended']}, {row['seconds']} s)", flush=True)
    result = {"roles": args.roles, "tags": args.tag, "seeds": args.seed, "rows": rows, "tally": tally(rows),
              "meta": {"wall_s": round(time.perf_counter() - started, 1), "load_before": load_before,
                       "load_after": load_average(), "steal_pct": steal_pct(cpu_before, cpu_counters()),
                       "cpus": os.cpu_count(), "date": now()}}
    svc.store.close()
    write_results(args.out, "proposer_picks", result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

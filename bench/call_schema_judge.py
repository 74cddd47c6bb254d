"""What `call_schema`'s judge does on a function-calling suite: the starter agent, `call_schema`
with its judge off, and `call_schema` as the repair writes it (judge on), on the validation and
sealed test splits with each model, paired on the same instances.

`call_schema` asks for a reply again under a grammar made from the task's function docs when the
reply does not fit them. A grammar always yields a call's shape, so a reply that called nothing in
its own words becomes a call. The judge first asks the model's log-probabilities whether the
request raises calling nothing ("[]") more than the start of any listed call, against the same
prompt with the request replaced by "N/A"; if so, the reply is [] and nothing is generated again.

    .venv/bin/python bench/call_schema_judge.py --home DIR      # the committed run (minutes on a warm cache)
    .venv/bin/python bench/call_schema_judge.py --val-limit 4 --test-limit 4 --models smollm2

Paired deltas carry a 95 % bootstrap interval drawn as the strategy benchmark draws it (instances,
each with every model's outcome on it). Nothing else should be generating while it runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

NAME = "call_schema_judge"
VARIANTS = ("starter agent", "call_schema, judge off", "call_schema")
PAIRS = (("call_schema, judge off", "starter agent"), ("call_schema", "starter agent"),
         ("call_schema", "call_schema, judge off"))


def variants() -> dict[str, dict[str, str]]:
    from ecdysis.aggregate import Cluster
    from ecdysis.harness import STARTER_AGENT_DIR, read_dir
    from ecdysis.roles.operators import OPERATORS
    from ecdysis.roles.repairs import RepairInput, set_param
    starter = read_dir(STARTER_AGENT_DIR)
    anything = Cluster(id="judge", type="unparsable_call", label="any reply", failures=[], terms=[],
                       systematicity=1.0, components={}, verdict="harness", reason="the benchmark's own",
                       evidence=[])
    judged = OPERATORS["call_schema"].apply(RepairInput(files=dict(starter), cluster=anything)).files
    off = dict(judged, **{"harness.toml": set_param(judged["harness.toml"], "call_schema_judge", "false",
                                                    "the benchmark's judge-off variant")})
    return dict(zip(VARIANTS, (starter, off, judged)))


def by_category(mine: dict, base: dict, category: dict[str, str]) -> dict[str, list[int]]:
    """Won and lost outcomes per (category, model)."""
    out: dict[str, list[int]] = {}
    for key in sorted(set(mine) & set(base)):
        model, iid = key
        if mine[key] != base[key]:
            cell = out.setdefault(f"{category[iid]} · {model}", [0, 0])
            cell[0 if mine[key] > base[key] else 1] += 1
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.catalogue_ceiling import Split, measure, paired
    from bench.compare_strategies import home_settings
    from ecdysis.service import Service
    from storage import open_store
    settings = home_settings(str(args.home))
    svc = Service(open_store(settings.database_url), settings)
    suite = svc.suite(args.suite)
    category = {i.id: i.category for i in suite.instances}
    files = variants()
    cpu0, load0, started = cpu_counters(), load_average(), time.perf_counter()
    splits: dict[str, Any] = {}
    for name, limit in (("validation", args.val_limit), ("test", args.test_limit)):
        split = Split.of(suite, name, limit)
        got = {v: measure(svc, split, args.models, (), dict(f), f"{NAME}: {v}") for v, f in files.items()}
        splits[name] = {
            "instances": len(split.instances),
            "categories": dict(Counter(category[i.id] for i in split.instances)),
            "variants": {v: {"accuracy": round(m.accuracy, 4), "harness": m.harness_id, "calls": m.calls,
                             "new_calls": m.new_calls, "new_model_s": m.model_s} for v, m in got.items()},
            "paired": [{"variant": a, "against": b, **paired(got[a], got[b]),
                        "by_category": by_category(got[a].outcomes, got[b].outcomes, category)}
                       for a, b in PAIRS]}
        print(f"{name}: " + ", ".join(f"{v} {m.accuracy:.3f}" for v, m in got.items()), flush=True)
    return {"when": now(), "suite": args.suite, "models": args.models, "splits": splits,
            "wall_s": round(time.perf_counter() - started, 1), "load": load0,
            "steal_pct": steal_pct(cpu0, cpu_counters())}


def table(r: dict[str, Any]) -> str:
    lines = [f"`{r['suite']}` with {', '.join(r['models'])}, measured {r['when']} ({r['wall_s']:.0f} s wall, "
             f"load {r['load']}, CPU steal {r['steal_pct']} %; calls answered from the cache cost no time).", "",
             "| split | harness | accuracy | calls | against | won / lost | delta (points, 95 % CI) | moved (won / lost) |",
             "|---|---|---:|---:|---|---|---|---|"]
    for name, s in r["splits"].items():
        for p in s["paired"]:
            v = s["variants"][p["variant"]]
            d = p["delta_points"]
            moved = "; ".join(f"{k} {w}/{l}" for k, (w, l) in p["by_category"].items()) or "none"
            lines.append(f"| {name} ({s['instances']}) | {p['variant']} | {v['accuracy']:.3f} | {v['calls']} "
                         f"| {p['against']} ({s['variants'][p['against']]['accuracy']:.3f}) "
                         f"| {p['wins']} / {p['losses']} | {d['mean']:+.1f} [{d['ci95'][0]:+.1f}, "
                         f"{d['ci95'][1]:+.1f}] | {moved} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="bfcl-single_turn")
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2"])
    parser.add_argument("--val-limit", type=int, default=60)
    parser.add_argument("--test-limit", type=int, default=100)
    parser.add_argument("--home", type=Path, default=None, help="data folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.home = args.home or Path(tempfile.mkdtemp(prefix="ecdysis-bench-judge-"))
    result = run(args)  # on the data folder's own database (`home_settings`), whatever the environment names
    write_results(args.out, NAME, result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far the repair catalogue can lift a suite at all: the best held-out accuracy of any harness
built from the text-answer operators, found by a greedy search that chooses on the held-out split
itself, so that no strategy drawing on the same catalogue can beat it there.

The strategy benchmark (`bench/compare_strategies.py`) asks which strategy trains the better
harness. This one asks how much better any harness from the catalogue could be, on the same
models and the same sealed test instances. A strategy can only lead another by what lies between
the other's harness and this ceiling; where that gap is smaller than the test split resolves, no
strategy can be shown ahead, however it searches.

What it does:
1. Runs the starter harness on a train batch with each model, and makes one cluster of all its
   failures there (so every operator whose answer form is present can apply) and the sanctioned
   exemplars (train instances every model passed) for few-shot.
2. Greedy forward selection on the chosen split: each round adds to the best harness so far each
   operator not yet in it, one at a time, runs every candidate on the split with every model, and
   keeps the best if it answers at least one more outcome right; it stops when nothing gains or at
   `--depth`.
3. Reports every candidate of every round (accuracy, paired wins and losses against its round's
   base, charged calls and model seconds), the path, and the ceiling's paired delta against the
   starter and against each `--reference` harness (the harnesses the strategies kept), in points
   with a 95 % bootstrap interval drawn as the strategy benchmark draws it (test instances, each
   with every model's outcome on it).

The ceiling chooses on the split it reports, so it is an upper bound, not a result a strategy
could claim: it fits the test instances. Repairs of reading (`answer_extraction`,
`choice_matching`) reuse the cached replies and cost nothing more; the response cache makes a
rerun on the same `--home` continue where it stopped.

    .venv/bin/python bench/catalogue_ceiling.py --suite bbh:date_understanding+formal_fallacies+navigate \\
        --reference answer_extraction --reference choice_matching --home DIR
    .venv/bin/python bench/catalogue_ceiling.py --quick      # a smoke run: smollm2, tiny splits

`self_consistency` is left out unless named in `--operators`: its five samples make a candidate
cost five times the calls (600 on a validation of 60 questions and two models, most of the
strategies' 800-call budget), and every strategy round that validated it rolled it back.
Nothing else should be generating while it runs; load and CPU steal are recorded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

NAME = "catalogue_ceiling"
SKIPPED_BY_DEFAULT = ("self_consistency",)
POLL_S = 10.0  # how often a run another process holds is looked at again


@dataclass
class Measured:
    """One harness on the split: each model's outcome per instance, its calls, and the model seconds
    of the calls it was the first to make (a call another candidate made first came from the cache:
    a repair of reading costs nothing more than the replies it reads)."""

    chain: tuple[str, ...]
    harness_id: str
    outcomes: dict[tuple[str, str], float] = field(default_factory=dict)
    calls: int = 0
    new_calls: int = 0
    model_s: float = 0.0

    @property
    def right(self) -> int:
        return int(sum(self.outcomes.values()))

    @property
    def accuracy(self) -> float:
        return self.right / len(self.outcomes) if self.outcomes else 0.0


@dataclass(frozen=True)
class TrainContext:
    """What operators are given: one cluster of every starter failure on the train batch, and the
    train instances every model passed (the only instances few-shot may quote)."""

    cluster: Any
    exemplars: tuple[Any, ...]
    failures: int
    outcomes: int


@dataclass(frozen=True)
class Split:
    """The instances every candidate runs on (the suite loaded and the window picked once), and how
    its runs are named in --home so that a rerun finds them."""

    suite: Any
    name: str
    window: int
    limit: int
    instances: tuple[Any, ...]

    @staticmethod
    def of(suite: Any, name: str, limit: int, window: int = 0) -> "Split":
        from ecdysis.runner import pick_instances
        return Split(suite, name, window, limit, tuple(pick_instances(suite, name, limit, window=window)))

    def label(self, harness_id: str, model: str) -> str:
        """What a run ran, on which instances (the split's `limit` instances of `window`)."""
        return f"ceiling:{self.suite.name}:{self.name}:{self.window}:{self.limit}:{harness_id}:{model}"


def run_once(svc: Any, split: Split, model: str, version: Any, say: Any = print) -> list[Any]:
    """The results of `version` on the split with `model`: a finished run of its label is reused,
    an unfinished one continued, else one is made. A run another process is executing (a second
    ceiling on the same --home) is waited for: it ends done, or its holder died and its lease
    lapses, and then this process continues it."""
    from ecdysis.budget import CallBudget
    from ecdysis.errors import Conflict
    from ecdysis.runner import Runner
    run_label = split.label(version.id, model)
    mine = [r for r in svc.store.list_runs(limit=100000) if r.label == run_label]
    run = mine[0] if mine else Runner(svc.store, limits=svc.limits()).create(
        split.suite, model, version, split=split.name, label=run_label, instances=list(split.instances))
    waiting = False
    while svc.store.get_run(run.id).status != "done":
        try:
            svc.execute_run(run.id, budget=CallBudget())
            break
        except Conflict as exc:
            if not waiting:
                say(f"  waiting: {exc.message}")
                waiting = True
            time.sleep(POLL_S)
    return svc.store.get_results(run.id)


def train_context(svc: Any, suite: Any, models: Sequence[str], batch: int) -> TrainContext:
    """The starter on the first `batch` train instances with each model, as one cluster."""
    from ecdysis.aggregate import Cluster
    from ecdysis.diagnosis import sanctioned_exemplars
    from ecdysis.failures import extract_failures
    from ecdysis.harness import ensure_starter
    starter = ensure_starter(svc.store)
    train = Split.of(suite, "train", batch)
    by_id = {i.id: i for i in suite.instances}
    results, failures = [], []
    for model in models:
        got = run_once(svc, train, model, starter)
        results += [(suite.name, r) for r in got]
        failures += extract_failures(got, by_id, suite=suite.name, harness_version=starter.id)
    cluster = Cluster(id="ceiling", type="wrong_answer", label="every starter failure of the train batch",
                      failures=failures, terms=[], systematicity=1.0, components={}, verdict="harness",
                      reason="the ceiling's own cluster", evidence=[])
    exemplars = sanctioned_exemplars(results, {suite.name: suite}, failures)
    return TrainContext(cluster, tuple(exemplars), len(failures), len(results))


def build(chain: Sequence[str], ctx: TrainContext, catalogue: Mapping[str, Any]) -> dict[str, str] | str:
    """The starter with the chain's operators applied in order, or why one of them cannot apply."""
    from ecdysis.harness import starter_files
    from ecdysis.roles.repairs import RepairInput
    files = dict(starter_files())
    for name in chain:
        op = catalogue[name]
        inp = RepairInput(files=files, cluster=ctx.cluster, exemplars=ctx.exemplars)
        if op.present(files):
            return f"{name} is already in the harness"
        why = op.unavailable(inp)
        if why:
            return f"{name}: {why}"
        files = op.apply(inp).files
    return files


def measure(svc: Any, split: Split, models: Sequence[str], chain: Sequence[str], files: dict[str, str],
            note: str) -> Measured:
    from ecdysis.harness import harness_id, new_version
    version = svc.store.get_harness(harness_id(files)) or svc.store.put_harness(
        new_version(files, parent=None, note=note))
    out = Measured(tuple(chain), version.id)
    for model in models:
        for r in run_once(svc, split, model, version):
            out.outcomes[(model, r.instance_id)] = float(r.correct)
            for c in r.calls:
                out.calls += 1
                out.new_calls += not c.cache_hit
                out.model_s += 0.0 if c.cache_hit else c.latency_s
    out.model_s = round(out.model_s, 1)
    return out


def paired(mine: Measured, base: Measured) -> dict[str, Any]:
    """Wins and losses of `mine` against `base` on the outcomes both have, and the delta in points
    with a 95 % bootstrap interval (instances drawn with all their models' outcomes)."""
    from bench.compare_strategies import bootstrap
    keys = sorted(set(mine.outcomes) & set(base.outcomes))
    wins = sum(1 for k in keys if mine.outcomes[k] > base.outcomes[k])
    losses = sum(1 for k in keys if mine.outcomes[k] < base.outcomes[k])
    mean, ci95 = bootstrap([{k: 100 * (mine.outcomes[k] - base.outcomes[k]) for k in keys}])
    return {"wins": wins, "losses": losses, "delta_points": {"mean": mean, "ci95": ci95}}


Seen = dict[tuple[str, ...], Measured]


def greedy(svc: Any, args: argparse.Namespace, split: Split, ctx: TrainContext, catalogue: Mapping[str, Any],
           starter: Measured, say: Any = print) -> tuple[list[dict[str, Any]], Measured, Seen]:
    """Rounds of forward selection from the starter; each candidate measured once (by chain), and
    every measured chain returned so a reference among them is not run again."""
    seen: Seen = {(): starter}
    best, rounds = starter, []
    for depth in range(1, args.depth + 1):
        tried: list[dict[str, Any]] = []
        for name in catalogue:
            if name in best.chain:
                continue
            chain = best.chain + (name,)
            files = build(chain, ctx, catalogue)
            if isinstance(files, str):
                tried.append({"operator": name, "unavailable": files})
                continue
            if chain not in seen:
                t0 = time.perf_counter()
                seen[chain] = measure(svc, split, args.model, chain, files, f"ceiling: {' + '.join(chain)}")
                say(f"  round {depth}: {' + '.join(chain)}: {seen[chain].accuracy:.3f} "
                    f"({seen[chain].new_calls} new calls, {time.perf_counter() - t0:.0f} s)")
            got = seen[chain]
            tried.append({"operator": name, "accuracy": round(got.accuracy, 4), "right": got.right,
                          "calls": got.calls, "new_calls": got.new_calls, "model_s": got.model_s,
                          **paired(got, best)})
        measured = [t for t in tried if "accuracy" in t]
        top = max(measured, key=lambda t: (t["right"], -t["calls"]), default=None)  # a tie: the fewer calls
        gained = top is not None and top["right"] > best.right
        rounds.append({"depth": depth, "base": list(best.chain), "base_accuracy": round(best.accuracy, 4),
                       "candidates": tried, "kept": top["operator"] if gained else None})
        if not gained:
            break
        best = seen[best.chain + (top["operator"],)]
    return rounds, best, seen


def run(args: argparse.Namespace, settings: Any, say: Any = print) -> dict[str, Any]:
    from ecdysis.harness import starter_files
    from ecdysis.roles.operators import OPERATORS
    from ecdysis.service import Service
    from storage import open_store
    svc = Service(open_store(settings.database_url), settings)
    wanted = args.operators or [n for n in OPERATORS if n not in SKIPPED_BY_DEFAULT and n not in _agent_operators()]
    unknown = [n for n in wanted + [op for ref in args.reference for op in ref.split("+")] if n not in OPERATORS]
    if unknown:
        raise SystemExit(f"unknown operator(s): {', '.join(unknown)}; the catalogue has {', '.join(OPERATORS)}")
    catalogue = {n: OPERATORS[n] for n in wanted}
    cpu0, load0, started = cpu_counters(), load_average(), time.perf_counter()
    suite = svc.suite(args.suite)
    from ecdysis.harness import calls_functions
    if calls_functions(suite):
        raise SystemExit(f"{args.suite} is answered with function calls: the ceiling builds on the reasoning "
                         "starter and its operators, which never show the model the functions")
    ctx = train_context(svc, suite, args.model, args.train)
    say(f"train batch: {ctx.outcomes} outcomes, {ctx.failures} failures, {len(ctx.exemplars)} exemplars")
    split = Split.of(suite, args.split, args.limit, args.holdout_window)
    starter = measure(svc, split, args.model, (), dict(starter_files()), "starter")
    say(f"starter: {starter.accuracy:.3f} on {len(starter.outcomes)} outcomes")
    rounds, ceiling, seen = greedy(svc, args, split, ctx, catalogue, starter, say)
    references: dict[str, Any] = {}
    for name in args.reference:
        chain = tuple(name.split("+"))
        files = build(chain, ctx, OPERATORS)
        if isinstance(files, str):
            references[name] = {"unavailable": files}
            continue
        ref = seen.get(chain) or measure(svc, split, args.model, chain, files, f"ceiling reference: {name}")
        references[name] = {"accuracy": round(ref.accuracy, 4), "ceiling_minus_it": paired(ceiling, ref)}
    from bench.compare_strategies import intervals
    return {
        "suite": args.suite, "models": list(args.model), "split": args.split, "window": args.holdout_window,
        "limit": args.limit, "train": args.train, "depth": args.depth, "operators": list(catalogue),
        "left_out": [n for n in OPERATORS if n not in catalogue and n not in _agent_operators()],
        "train_failures": ctx.failures, "train_outcomes": ctx.outcomes, "exemplars": len(ctx.exemplars),
        "starter": {"accuracy": round(starter.accuracy, 4), "n": len(starter.outcomes),
                    "harness": starter.harness_id, "model_s": starter.model_s},
        "rounds": rounds,
        "ceiling": {"chain": list(ceiling.chain), "harness": ceiling.harness_id,
                    "accuracy": intervals([ceiling.outcomes]), "vs_starter": paired(ceiling, starter)},
        "references": references,
        "measured": now(), "wall_s": round(time.perf_counter() - started, 1), "load": [load0, load_average()],
        "steal_pct": steal_pct(cpu0, cpu_counters()),
    }


def _agent_operators() -> set[str]:
    from ecdysis.roles.agent_operators import AGENT_OPERATORS
    return {op.name for op in AGENT_OPERATORS}


def _pts(d: Mapping[str, Any]) -> str:
    lo, hi = d["ci95"]
    return f"{d['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def markdown(result: Mapping[str, Any]) -> str:
    acc = result["ceiling"]["accuracy"]
    chain = " + ".join(result["ceiling"]["chain"]) or "the starter (no operator gains)"
    lines = [f"**{result['suite']}**, models {', '.join(result['models'])}: the {result['split']} split "
             f"(window {result['window']}, {result['starter']['n']} outcomes). Greedy forward selection over "
             f"{', '.join(f'`{n}`' for n in result['operators'])}, choosing on this split (an upper bound, fitted "
             f"to it); left out: {', '.join(f'`{n}`' for n in result['left_out']) or 'none'}. Operators see one "
             f"cluster of the starter's {result['train_failures']} failures on {result['train_outcomes']} train "
             f"outcomes and {result['exemplars']} exemplars. Measured {result['measured']}, {result['wall_s']:.0f} s; "
             f"load {result['load'][0]}→{result['load'][1]}, CPU steal {result['steal_pct']} %.", ""]
    lines += ["| round | base | candidate | accuracy | vs base (won / lost) | delta (points, 95 % CI) "
              "| calls (new) | new model s |", "|---|---|---|---:|---|---|---:|---:|"]
    for rnd in result["rounds"]:
        base = " + ".join(rnd["base"]) or "starter"
        for c in rnd["candidates"]:
            if "unavailable" in c:
                lines.append(f"| {rnd['depth']} | {base} | `{c['operator']}` | — | unavailable: "
                             f"{c['unavailable'].split(': ', 1)[-1]} | | | |")
                continue
            mark = "**" if c["operator"] == rnd["kept"] else ""
            lines.append(f"| {rnd['depth']} | {base} | {mark}`{c['operator']}`{mark} | {c['accuracy']:.3f} | "
                         f"{c['wins']} / {c['losses']} | {_pts(c['delta_points'])} | {c['calls']} ({c['new_calls']}) "
                         f"| {c['model_s']:.0f} |")
    lines += ["", f"- Starter: {result['starter']['accuracy']:.3f}. **Ceiling: {chain}, "
                  f"{acc['mean']:.3f} [{acc['ci95'][0]:.3f}, {acc['ci95'][1]:.3f}]**, "
                  f"{_pts(result['ceiling']['vs_starter']['delta_points'])} points over the starter "
                  f"({result['ceiling']['vs_starter']['wins']} won, {result['ceiling']['vs_starter']['losses']} lost)."]
    for name, ref in result["references"].items():
        if "unavailable" in ref:
            lines.append(f"- `{name}`: unavailable ({ref['unavailable']}).")
            continue
        gap = ref["ceiling_minus_it"]
        alone = " alone" if "+" not in name else ""
        lines.append(f"- `{name}`{alone}: {ref['accuracy']:.3f}; the ceiling is {_pts(gap['delta_points'])} points "
                     f"above it ({gap['wins']} won, {gap['losses']} lost).")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="bbh:date_understanding+formal_fallacies+navigate")
    parser.add_argument("--model", action="append", help="repeatable (default: the two-model batch)")
    parser.add_argument("--split", default="test", choices=("validation", "test"))
    parser.add_argument("--limit", type=int, default=100, help="instances of the split (the strategies' test-limit)")
    parser.add_argument("--holdout-window", type=int, default=0, help="which --limit window of the split")
    parser.add_argument("--train", type=int, default=24, help="train instances the operators' cluster comes from")
    parser.add_argument("--depth", type=int, default=3, help="most operators in the ceiling's harness")
    parser.add_argument("--operators", nargs="+", default=None,
                        help="the catalogue to search (default: every operator of written answers but "
                             f"{', '.join(SKIPPED_BY_DEFAULT)}; the agent operators apply to function calls only)")
    parser.add_argument("--reference", action="append", default=[],
                        help="a harness the ceiling is compared with, as its operators joined by '+' in the "
                             "order they apply (the change a strategy kept; repeatable)")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration, for tests")
    parser.add_argument("--home", default=None, help="data folder (kept: a rerun reuses its runs and cache)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--name", default=NAME, help="results file name (without .json/.md)")
    args = parser.parse_args(argv)
    if args.quick:
        args.model = args.model or ["smollm2"]
        args.suite, args.limit, args.train, args.depth = "bbh:navigate", 6, 6, 2
        args.operators = args.operators or ["answer_extraction", "choice_matching", "answer_format_instruction"]
    from bench.compare_strategies import home_settings
    settings = home_settings(args.home or tempfile.mkdtemp(prefix="ecdysis-ceiling-"))
    args.model = args.model or list(settings.default_models)
    result = run(args, settings)
    write_results(Path(args.out), args.name, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

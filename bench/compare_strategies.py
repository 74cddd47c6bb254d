"""Ecdysis against the per-instance search and the paper's Self-Evolution baseline, on the same
budget in model calls, over several seeds (different train windows) and suites.

    .venv/bin/python bench/compare_strategies.py                       # the full benchmark
    .venv/bin/python bench/compare_strategies.py --quick --model scripted:FILE   # a smoke run (tests)

Fairness:
- One database, so one response cache, for every strategy and seed: the starter harness's
  validation and test runs are made once. Every strategy is charged for every request it makes,
  cached or not (`EvolveConfig.charge_cached`), and for model time by the latency recorded when
  the call was made, so none rides for free on another's calls; a request it already paid for is
  free, as its own cache would have answered it (so each pays what it would pay alone on an
  empty cache).
- The same budget of model calls (instances, roles, smoke runs, screening, validation); a strategy
  that spends it stops where it stands and its kept version goes to the sealed test
  (`Evolver.seal`). The sealed test is not charged to training. The budget is only the same if it
  is what ends each strategy: with a count of iterations that ends a cheap strategy first, it
  stops with calls left that a dearer one spends (on BFCL with 4 iterations, Ecdysis spent 129 of
  800 on one seed and the per-instance search 465 on two others), so `--iterations` is a cap to
  set high.
- Human time does not exist here (auto-approval), and no wall time is compared: time is charged
  model seconds.

Figures, per suite and baseline B:
- held-out test accuracy per strategy: the mean over seeds, with a 95 % bootstrap interval
  (test instances resampled, each with both models' outcomes, and drawn alike in every seed that
  tests on it; the seeds kept), and a wider one across seeds (the seeds resampled too): the first
  says how sure the figure is on these seeds and held-out sets, the second whether it would hold
  on others;
- test delta (Ecdysis - B) in points: paired on the same test instances, same two intervals;
- held-out sets: one window of each split for every seed (`--holdout-window`), or with
  `--rotate-holdout K` window `seed mod K` for seed `seed`, so that the seeds vary the
  validation and test instances as well as the train window and the across-seeds interval
  carries the held-out split's variance;
- time to target (`ecdysis.compare`, the app's definition too): the calls (and charged model
  seconds) each strategy spent before its validation accuracy first reached B's final validation
  accuracy; speedup = B's / Ecdysis's. A target B never raised above the starter harness makes
  the speedup undefined (None), and a target Ecdysis never reached makes it 0 for that seed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402
from ecdysis.compare import curve, speedup  # noqa: E402

STRATEGIES = ("ecdysis", "per-instance", "self-evolution")
BASELINES = ("per-instance", "self-evolution")
NAME = "compare_strategies"


def config(args: argparse.Namespace, suite: str, strategy: str, seed: int, roles: str) -> Any:
    from ecdysis.evolve import EvolveConfig
    return EvolveConfig(suite=suite, models=list(args.model), strategy=strategy, iterations=args.iterations,
                        batch_size=args.batch_size, val_limit=args.val_limit, test_limit=args.test_limit,
                        auto_approve=True, role_backend=roles, max_rounds=2, concurrency=1,
                        max_model_calls=args.budget, charge_cached=True, seed=seed,
                        holdout_window=window_of(args, seed),
                        label=evolution_label(suite, strategy, seed, roles,
                                              run_tag(args, window_of(args, seed), strategy)))


def window_of(args: argparse.Namespace, seed: int) -> int:
    """The held-out window of a seed: `--holdout-window` for all, or `seed mod --rotate-holdout`."""
    return seed % args.rotate_holdout if args.rotate_holdout > 1 else args.holdout_window


def holdout_part(window: int) -> str:
    """`holdoutN` for a held-out window other than the first, else "": added to the labels, so that
    a run on another window never finds the evolutions or starter runs of this one (and a seed
    that `--rotate-holdout` puts on the first window finds the same evolution as without it)."""
    return f"holdout{window}" if window else ""


def reused(args: argparse.Namespace, strategy: str) -> bool:
    """Whether this strategy's evolutions are an earlier run's, found finished (`--baselines-tag`)."""
    return args.baselines_tag is not None and strategy in BASELINES


def run_tag(args: argparse.Namespace, window: int, strategy: str = "ecdysis") -> str:
    """The evolutions' tag: `--tag` (`--baselines-tag` for a `reused` baseline), and the held-out
    window (`holdout_part`)."""
    tag = args.baselines_tag if reused(args, strategy) else args.tag
    return "-".join(part for part in (tag, holdout_part(window)) if part)


def evolution_label(suite: str, strategy: str, seed: int, roles: str, tag: str = "") -> str:
    """How the benchmark names an evolution in its --home: `bench:SUITE:STRATEGY:SEED:ROLES[:TAG]`."""
    return f"bench:{suite}:{strategy}:{seed}:{roles}" + (f":{tag}" if tag else "")


def parse_label(label: str) -> dict[str, Any] | None:
    """The fields of an `evolution_label` (a suite name may hold colons), or None for another label."""
    parts = label.split(":")
    if len(parts) < 5 or parts[0] != "bench":
        return None
    if parts[-2].isdigit():
        rest, tag = parts, ""
    elif parts[-3].isdigit() and len(parts) >= 6:
        rest, tag = parts[:-1], parts[-1]
    else:
        return None
    return {"suite": ":".join(rest[1:-3]), "strategy": rest[-3], "seed": int(rest[-2]), "roles": rest[-1], "tag": tag}


def evolve(svc: Any, cfg: Any, *, stored_only: bool = False) -> Any:
    """The evolution of this configuration: found finished in the store (a resumed benchmark),
    continued, or run; sealed where it stands if the budget ran out. With `stored_only` (a baseline
    under `--baselines-tag`), only found finished: it is never run on this code."""
    from ecdysis.evolve import Evolver
    tag = cfg.strategy

    def say(e: dict[str, Any]) -> None:
        if e["type"] == "iteration_done":
            print(f"  [{tag} seed {cfg.seed}] iteration {e['iteration']}: val {e['val_accuracy']}, "
                  f"{e['model_calls']} calls — {e['gate']}", flush=True)
    evolver = Evolver(svc, events=say)
    mine = [e for e in svc.store.list_evolutions(limit=1000) if e.config.get("label") == cfg.label]
    if stored_only and not (mine and mine[0].status not in ("running", "failed")):
        raise SystemExit(f"--baselines-tag: no finished evolution labelled {cfg.label} in this --home")
    evo = mine[0] if mine else evolver.create(cfg)
    if evo.status in ("running", "failed") or not mine:
        evo = _run_when_free(evolver, evo.id)
    if evo.status == "stopped":
        evo = evolver.seal(evo.id)
    return evo


def _run_when_free(evolver: Any, evolution_id: str) -> Any:
    """Run (or resume) it; a benchmark killed a moment ago still holds its lease, which lapses."""
    from ecdysis.errors import Conflict
    for _ in range(3):
        try:
            return evolver.run(evolution_id)
        except Conflict as exc:
            print(f"  waiting: {exc.message}", flush=True)
            time.sleep(30)
    return evolver.run(evolution_id)


def base_val(svc: Any, args: argparse.Namespace, suite: str, window: int) -> float:
    """The starter harness's validation accuracy on a held-out window (the curves' starting point
    for the seeds on it), run once. The starter is the one the evolutions start from: the suite's
    own (the starter agent for function calls). Until 2026-12-07 it was always the reasoning
    starter, which is no harness for a BFCL suite: its 0.2 made the per-instance search's
    unchanged 0.308 a target it had raised, and the speedup against it a number instead of None."""
    from ecdysis.budget import CallBudget
    from ecdysis.runner import Runner, pick_instances
    loaded = svc.suite(suite)
    instances = pick_instances(loaded, "validation", args.val_limit, window=window)
    starter = svc.harness(None, suite=loaded)
    correct = total = 0
    for model in args.model:
        run = Runner(svc.store, limits=svc.limits()).create(loaded, model, starter, split="validation",
                                                            label=":".join(p for p in (
                                                                f"bench:{suite}:base-val", holdout_part(window)) if p),
                                                            instances=instances)
        svc.execute_run(run.id, budget=CallBudget())
        results = svc.store.get_results(run.id)
        correct += sum(r.correct for r in results)
        total += len(results)
    return round(correct / total, 4) if total else 0.0


def outcomes(svc: Any, run_ids: Sequence[str]) -> dict[tuple[str, str], float]:
    return outcomes_in(svc.store, run_ids)


def outcomes_in(store: Any, run_ids: Sequence[str]) -> dict[tuple[str, str], float]:
    """Each test outcome of the runs, keyed by (model, instance)."""
    return {(r.model, r.instance_id): float(r.correct) for rid in run_ids for r in store.get_results(rid)}


def unit_of(key: Any) -> Any:
    """What one draw of the bootstrap takes: a test instance, with every model's outcome on it (a
    `(model, instance)` key's instance), since the models answer the same question; any other
    key is its own unit."""
    return key[-1] if isinstance(key, tuple) and len(key) == 2 else key


def bootstrap(per_seed: Sequence[Mapping[Any, float] | Sequence[float]], rounds: int = 2000, seed: int = 7, *,
              seeds_too: bool = False) -> tuple[float, list[float]]:
    """Mean over seeds of each seed's mean, and its 95 % interval. Each round draws every test
    instance a Poisson(1) number of times, the same number in every seed that holds it (a seed's
    values keyed by `(model, instance)`; a plain list's values are that seed's alone): seeds that
    share held-out instances share their draws, so a set of instances tested under 12 seeds counts
    as one set, not as 12 (resampled apart, as up to round 34, the seeds of one held-out window
    made the interval several times too narrow). With `seeds_too`, each round first draws the
    seeds with replacement (a two-level bootstrap: how far the mean moves on other seeds,
    held-out windows and instances)."""
    import numpy as np

    keyed = [dict(v) if isinstance(v, Mapping) else {("list", i, j): x for j, x in enumerate(v)}
             for i, v in enumerate(per_seed)]
    keyed = [v for v in keyed if v]
    if not keyed:
        return 0.0, [0.0, 0.0]
    units = sorted({unit_of(k) for v in keyed for k in v}, key=repr)
    column = {u: i for i, u in enumerate(units)}
    rng = np.random.default_rng(seed)
    weights = rng.poisson(1.0, size=(rounds, len(units))).astype(float)
    means = []
    for values in keyed:
        cols = np.array([column[unit_of(k)] for k in values])
        x = np.array(list(values.values()), dtype=float)
        w = weights[:, cols]
        total = w.sum(axis=1)
        # A round that draws none of a seed's instances (only likely for a handful) gives its plain mean.
        means.append(np.where(total > 0, (w @ x) / np.where(total > 0, total, 1.0), x.mean()))
    by_seed = np.stack(means, axis=1)
    if seeds_too:
        by_seed = np.take_along_axis(by_seed, rng.integers(0, len(keyed), size=by_seed.shape), axis=1)
    stats = np.sort(by_seed.mean(axis=1))
    mean = sum(sum(v.values()) / len(v) for v in keyed) / len(keyed)
    return round(mean, 4), [round(float(stats[int(0.025 * rounds)]), 4), round(float(stats[int(0.975 * rounds) - 1]), 4)]


def intervals(per_seed: Sequence[Mapping[Any, float]]) -> dict[str, Any]:
    """`{mean, ci95, ci95_seeds}`: the interval on these seeds, and the one across seeds."""
    m, ci = bootstrap(per_seed)
    return {"mean": m, "ci95": ci, "ci95_seeds": bootstrap(per_seed, seeds_too=True)[1]}


def mean(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(sum(got) / len(got), 3) if got else None


def summarise(svc: Any, args: argparse.Namespace, suite: str, evos: dict[tuple[str, int], Any],
              starts: dict[int, float]) -> dict[str, Any]:
    """The figures of one suite and roles; `starts` gives each held-out window's starter
    validation accuracy."""
    seeds = sorted({s for _, s in evos})
    strategies = sorted({k for k, _ in evos}, key=STRATEGIES.index)
    windows = {s: window_of(args, s) for s in seeds}
    start_of = {s: starts[windows[s]] for s in seeds}
    out: dict[str, Any] = {"seeds": seeds, "base_val_accuracy": round(sum(start_of.values()) / len(seeds), 4),
                           "strategies": {}, "comparison": {}}
    if len(set(windows.values())) > 1:
        out["holdout_windows"] = {str(s): w for s, w in windows.items()}
        out["base_val_by_window"] = {str(w): starts[w] for w in sorted(set(windows.values()))}
    tests = {key: outcomes(svc, list(evo.outcome.test_runs)) for key, evo in evos.items()}
    curves = {key: curve(evo, start_of[key[1]]) for key, evo in evos.items()}
    for name in strategies:
        runs = [evos[(name, s)] for s in seeds if (name, s) in evos]
        out["strategies"][name] = {
            "test_accuracy": accuracy_figures(tests, seeds, name),
            "base_test_accuracy": mean([e.outcome.base_test_accuracy for e in runs]),
            "final_val_accuracy": mean([curves[(name, s)][-1].val_accuracy for s in seeds if (name, s) in curves]),
            "model_calls": mean([e.outcome.spent.calls for e in runs]),
            "model_seconds": mean([e.outcome.spent.seconds for e in runs]),
            "iterations": mean([len(e.rows) for e in runs]),
            "kept_changes": mean([sum(r.kept for r in e.rows) for e in runs]),
            "evolutions": [e.id for e in runs],
            "per_seed": {str(s): {"test_accuracy": evos[(name, s)].outcome.test_accuracy,
                                  "curve": [p.__dict__ for p in curves[(name, s)]],
                                  **seed_facts(evos[(name, s)])}
                         for s in seeds if (name, s) in evos}}
    for base in [b for b in BASELINES if b in strategies and "ecdysis" in strategies]:
        ups = [speedup(curves[(base, s)], curves[("ecdysis", s)], start_of[s]) for s in seeds
               if ("ecdysis", s) in curves and (base, s) in curves]
        out["comparison"][base] = {"test_delta_points": delta_figures(tests, seeds, base),
                                   "speedup_calls": mean([u["calls"] for u in ups]),
                                   "speedup_seconds": mean([u["seconds"] for u in ups]),
                                   "per_seed": ups}
    return out


def accuracy_figures(tests: Mapping[tuple[str, int], Mapping[Any, float]], seeds: Sequence[int],
                     name: str) -> dict[str, Any]:
    """A strategy's test accuracy over the seeds it has outcomes for, with both intervals."""
    return intervals([tests[(name, s)] for s in seeds if (name, s) in tests])


def delta_figures(tests: Mapping[tuple[str, int], Mapping[Any, float]], seeds: Sequence[int],
                  base: str) -> dict[str, Any]:
    """Ecdysis's test outcome minus the baseline's, in points, paired on each test outcome both
    have, over the seeds, with both intervals."""
    deltas = []
    for s in seeds:
        ours, theirs = tests.get(("ecdysis", s), {}), tests.get((base, s), {})
        deltas.append({k: 100 * (ours[k] - theirs[k]) for k in sorted(set(ours) & set(theirs))})
    return intervals(deltas)


def seed_facts(evo: Any) -> dict[str, Any]:
    """What one evolution spent in all (an iteration abandoned when the budget stopped it
    included, which its curve leaves out), the changes it kept in the order its gate passed them (a
    step's operators joined by "+" when validated together, as Self-Evolution's composed edit is),
    and where and why it was abandoned, if it was."""
    return {"calls": evo.outcome.spent.calls, "seconds": round(evo.outcome.spent.seconds, 3),
            "kept": ["+".join(c.operator or c.proposal_id for c in step.changes)
                     for row in evo.rows for step in row.steps or () if step.kept],
            "abandoned": evo.result.get("abandoned")}


def per_seed_rows(block: dict[str, Any]) -> list[str]:
    """A row per seed and strategy: what each evolution ended on and spent (charged to training;
    the sealed test is not), and what it kept. Results files written before these were recorded
    per seed show their curve's last point and say "not recorded" for the kept changes."""
    rows = ["| seed | strategy | test accuracy | final validation | calls | model s | kept |",
            "|---:|---|---:|---:|---:|---:|---|"]
    windows = block.get("holdout_windows", {})
    for seed in block["seeds"]:
        window = f" (window {windows[str(seed)]})" if str(seed) in windows else ""
        for name, st in block["strategies"].items():
            got = st.get("per_seed", {}).get(str(seed))
            if not got:
                continue
            end = got["curve"][-1]
            kept = got.get("kept")
            said = "not recorded" if kept is None else (", ".join(f"`{k}`" for k in kept) or "nothing")
            test = "—" if got["test_accuracy"] is None else f"{got['test_accuracy']:.3f}"
            calls, seconds = got.get("calls", end["calls"]), got.get("seconds", end["seconds"])
            rows.append(f"| {seed}{window} | {name} | {test} | {end['val_accuracy']:.3f} | {calls} | {seconds:.0f} | {said} |")
    return rows


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    planned = [f"{cfg['seeds']} with heuristic roles"] * bool(cfg["seeds"]) + \
        [f"{cfg['llm_roles_seeds']} with `{cfg['llm_roles']}` roles"] * bool(cfg.get("llm_roles") and
                                                                          cfg.get("llm_roles_seeds"))
    lines = [f"Models {', '.join(cfg['model'])}; {cfg['iterations']} iterations, batch {cfg['batch_size']}, "
             f"validation {cfg['val_limit']}, test {cfg['test_limit']} "
             + (f"(window `seed mod {cfg['rotate_holdout']}` of each split for each seed: window N is the "
                f"instances after the first N windows of that size), " if cfg.get("rotate_holdout", 1) > 1
                else f"(window {cfg['holdout_window']} of each split: the instances after the first "
                f"{cfg['holdout_window']} windows of that size), " if cfg.get("holdout_window")
                else "(or the whole split if smaller), ")
             + "budget "
             f"{cfg['budget']} model calls a strategy; seeds planned: {', '.join(planned) or 'none'}; "
             f"{result['measured']}; load {result['machine']['load_before']}→{result['machine']['load_after']}, "
             f"CPU steal {result['machine']['steal_pct']} %. " + intervals_said(result)
             + (f" The baselines are their finished evolutions of an earlier run, tag `{cfg['baselines_tag']}` "
                f"in the same data folder, not run again on this code (`--baselines-tag`)."
                if cfg.get("baselines_tag") is not None else "")]
    for suite, per in result["suites"].items():
        for roles, block in per.items():
            old = block.get("carried_over")
            tag = (old or {}).get("config", {}).get("tag")
            when = (f"; carried over from the run of {old['measured']}" + (f", tag {tag}" if tag else "")
                    + f", load {old['machine']['load_before']}→{old['machine']['load_after']}" if old else "")
            by_window = block.get("base_val_by_window")
            starter = (", ".join(f"{v} on window {w}" for w, v in by_window.items()) if by_window
                       else block["base_val_accuracy"])
            lines += ["", f"**{suite}**, roles `{roles}`, seeds {', '.join(map(str, block['seeds']))} (starter "
                          f"harness: validation {starter}{when}):", "",
                      "| strategy | test accuracy (95 % CI) | across seeds | final validation | calls | model s "
                      "| kept changes |",
                      "|---|---|---|---|---:|---:|---:|"]
            for name, st in block["strategies"].items():
                t = st["test_accuracy"]
                wide = f"[{t['ci95_seeds'][0]:.3f}, {t['ci95_seeds'][1]:.3f}]" if "ci95_seeds" in t else "—"
                lines.append(f"| {name} | {t['mean']:.3f} [{t['ci95'][0]:.3f}, {t['ci95'][1]:.3f}] | {wide} | "
                             f"{st['final_val_accuracy']} | {st['model_calls']} | {st['model_seconds']} | "
                             f"{st['kept_changes']} |")
            for base, cmp in block["comparison"].items():
                d = cmp["test_delta_points"]
                wide = (f" (across seeds [{d['ci95_seeds'][0]:+.1f}, {d['ci95_seeds'][1]:+.1f}])"
                        if "ci95_seeds" in d else "")
                lines.append(f"\n- vs {base}: test delta **{d['mean']:+.1f} points** "
                             f"[{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]{wide}; speedup to its final validation "
                             f"accuracy **{_x(cmp['speedup_calls'])}** in calls, **{_x(cmp['speedup_seconds'])}** "
                             f"in model seconds" + _why(cmp))
            if len(block["seeds"]) > 1:
                lines += ["", "Per seed:", "", *per_seed_rows(block)]
    return "\n".join(lines) + "\n"


def _x(value: float | None) -> str:
    return "undefined" if value is None else f"{value}x"


def _why(cmp: dict[str, Any]) -> str:
    notes = sorted({u["why"] for u in cmp["per_seed"] if u.get("why")})
    return f" ({'; '.join(notes)} on some seeds)" if notes else ""


def merge(top: dict[str, Any], suite: str, roles: str, block: dict[str, Any]) -> None:
    top.setdefault("suites", {}).setdefault(suite, {})[roles] = block
    top["seeds"] = sorted({s for per in top["suites"].values() for b in per.values() for s in b["seeds"]})
    headline(top)


def headline(top: dict[str, Any]) -> None:
    """The headline shape: the first suite's heuristic-roles figures."""
    first = next(iter(top["suites"].values()))
    head = first.get("heuristic") or next(iter(first.values()))
    top["strategies"], top["comparison"] = head["strategies"], head["comparison"]


def carried_over(path: Path, rerun: Sequence[str], roles_measured: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The blocks (suite, roles) of an earlier results file that this run does not measure again:
    other suites, or other roles of a suite it does measure (rerun the heuristic rows, keep the
    LLM-roles rows). Each is stamped with when and on what it was measured (a block carried over
    twice keeps its stamp)."""
    earlier = json.loads(path.read_text())
    stamp = {"measured": earlier.get("measured"), "machine": earlier.get("machine"),
             "config": {k: earlier.get("config", {}).get(k) for k in
                        ("model", "iterations", "batch_size", "val_limit", "test_limit", "budget", "tag",
                         "holdout_window", "rotate_holdout")}}
    kept = {suite: {roles: {**block, "carried_over": block.get("carried_over") or stamp}
                    for roles, block in per.items() if suite not in rerun or roles not in roles_measured}
            for suite, per in earlier.get("suites", {}).items()}
    return {suite: per for suite, per in kept.items() if per}


def rerender(path: Path, store: Any = None) -> str:
    """The Markdown table of a stored results JSON (after a benchmark was stopped by hand). Given
    the store that holds its evolutions, a file written before each seed's spending, kept changes
    and stop were recorded gets them from there (each strategy lists its evolutions in the order
    of its seeds), and the JSON is written back; nothing else in it changes."""
    result = json.loads(path.read_text())
    if store is not None and backfill_seed_facts(result, store):
        path.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    path.with_suffix(".md").write_text(table)
    return table


INTERVALS = ("test instances resampled with both models' outcomes, each drawn alike in every seed that "
             "tests on it")


def intervals_said(result: dict[str, Any]) -> str:
    """How the file's 95 % intervals were drawn, for its table's first line."""
    got = result.get("intervals")
    if not got:
        return ("Intervals: test outcomes resampled one by one within each seed, the two models' outcomes on an "
                "instance apart and each seed apart from seeds that test on the same instances (too narrow where "
                "there are several seeds or models).")
    again = f" (recomputed {got['recomputed']})" if got.get("recomputed") else ""
    left = (f"; not recomputed, the evolutions gone with the machine they ran on: {', '.join(got['not_recomputed'])}"
            if got.get("not_recomputed") else "")
    return f"Intervals: {got['method']}{again}{left}."


def reinterval(path: Path, store: Any) -> str:
    """Recompute the intervals of a stored results JSON from its evolutions' test outcomes in
    `store` (files written before `bootstrap` drew a held-out instance alike in every seed that
    tests on it), write it back with its Markdown table, and return the table. The means are
    recomputed too and must come out as stored; a block whose evolutions the store does not hold
    all of is left as it was and listed under `intervals.not_recomputed` (a file with no such block
    is not written)."""
    result = json.loads(path.read_text())
    skipped, blocks = [], 0
    for suite, per in result.get("suites", {}).items():
        for roles, block in per.items():
            evos = {name: [store.get_evolution(i) for i in st.get("evolutions", [])]
                    for name, st in block["strategies"].items()}
            blocks += 1
            if any(e is None for got in evos.values() for e in got):
                skipped.append(f"{suite} ({roles})")
                continue
            tests = {(name, e.config["seed"]): outcomes_in(store, list(e.outcome.test_runs))
                     for name, got in evos.items() for e in got}
            seeds = block["seeds"]
            for name, st in block["strategies"].items():
                figure = accuracy_figures(tests, seeds, name)
                if abs(figure["mean"] - st["test_accuracy"]["mean"]) > 1e-3:
                    raise ValueError(f"{path.name}, {suite}, {name}: stored outcomes give a mean test accuracy of "
                                     f"{figure['mean']}, the file {st['test_accuracy']['mean']}")
                st["test_accuracy"] = figure
            for base, cmp in block["comparison"].items():
                cmp["test_delta_points"] = delta_figures(tests, seeds, base)
    if len(skipped) == blocks:
        return markdown(result)
    result["intervals"] = {"method": INTERVALS, "recomputed": now(), **({"not_recomputed": skipped} if skipped else {})}
    headline(result)
    path.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    path.with_suffix(".md").write_text(table)
    return table


def backfill_seed_facts(result: dict[str, Any], store: Any) -> int:
    """Fill each per-seed entry written before `seed_facts` was recorded from its stored
    evolution; how many were filled. An evolution the store does not hold leaves its entry
    as it was."""
    filled = 0
    for per in result.get("suites", {}).values():
        for block in per.values():
            for st in block["strategies"].values():
                seeds = [s for s in map(str, block["seeds"]) if s in st.get("per_seed", {})]
                for seed, evolution_id in zip(seeds, st.get("evolutions", [])):
                    entry = st["per_seed"][seed]
                    evo = None if "calls" in entry else store.get_evolution(evolution_id)
                    if evo is not None:
                        entry.update(seed_facts(evo))
                        filled += 1
    return filled


def home_settings(home: str) -> Any:
    """The settings of a benchmark's data folder: its own SQLite database, whatever the
    environment names."""
    os.environ["ECDYSIS_HOME"] = home
    os.environ.pop("ECDYSIS_DATABASE_URL", None)
    from ecdysis.settings import Settings
    return Settings.from_env()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", help="repeatable (default: reasoning-mix, bigbench:navigate)")
    parser.add_argument("--model", action="append", help="repeatable (default: the two-model batch)")
    parser.add_argument("--strategy", action="append", choices=STRATEGIES, help="repeatable (default: all three)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1, help="seeds run from here (new train windows)")
    parser.add_argument("--tag", default="", help="added to every evolution's label: in a kept --home, a rerun "
                                                  "with changed code makes new evolutions instead of finding "
                                                  "the old ones")
    parser.add_argument("--baselines-tag", default=None, metavar="TAG",
                        help="compare with the baselines' finished evolutions of this earlier --tag in "
                             "--home, never run again (for a change that leaves their code untouched: "
                             "Ecdysis alone is run on this code); the results and table say so")
    parser.add_argument("--iterations", type=int, default=3,
                        help="at most this many iterations a strategy; set it high (16 for a budget of 800) "
                             "so that the budget, not the count, ends each strategy")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--val-limit", type=int, default=60)
    parser.add_argument("--test-limit", type=int, default=100)
    parser.add_argument("--holdout-window", type=int, default=0,
                        help="which --val-limit and --test-limit window of the validation and test splits: "
                             "0 the first, 1 the next (a second draw of the held-out sets, same train windows)")
    parser.add_argument("--rotate-holdout", type=int, default=1, metavar="K",
                        help="K > 1: seed S validates and tests on window S mod K of the held-out splits, so "
                             "the seeds vary the held-out sets too (with --holdout-window left at 0)")
    parser.add_argument("--budget", type=int, default=900, help="model calls per strategy, roles included")
    parser.add_argument("--llm-roles", default="qwen2.5-coder-1.5b",
                        help="the local role model of the LLM-roles rows ('' to skip them)")
    parser.add_argument("--llm-roles-seeds", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tiny configuration, for tests")
    parser.add_argument("--home", default=None, help="data folder (kept: a rerun continues where it stopped)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--keep-from", default=None, metavar="JSON",
                        help="an earlier results file whose blocks this run does not measure (other suites, "
                             "or other roles of the same suite) are carried over, each with the date and "
                             "machine it was measured on (rerun one suite, or the heuristic rows, keep the rest)")
    parser.add_argument("--rerender", default=None, metavar="JSON",
                        help="only write the Markdown table of this results file again (with --home, first "
                             "fill in each seed's spending, kept changes and stop, for a file written before "
                             "they were recorded)")
    parser.add_argument("--reinterval", nargs="+", default=None, metavar="JSON",
                        help="only recompute these results files' intervals from their evolutions in --home "
                             "(files written before a held-out instance was drawn alike in every seed), and "
                             "write each back with its Markdown table")
    args = parser.parse_args(argv)
    if args.rotate_holdout > 1 and args.holdout_window:
        parser.error("--rotate-holdout picks each seed's held-out window; leave --holdout-window at 0")
    from storage import open_store
    if args.reinterval:
        if not args.home:
            parser.error("--reinterval reads the evolutions of --home")
        store = open_store(home_settings(args.home).database_url)
        for name in args.reinterval:
            before = Path(name).read_text()
            reinterval(Path(name), store)
            print(f"{'recomputed' if Path(name).read_text() != before else 'left as it was'}: {name}", flush=True)
        return 0
    if args.rerender:
        store = open_store(home_settings(args.home).database_url) if args.home else None
        print(rerender(Path(args.rerender), store), end="")
        return 0
    if args.quick:
        args.seeds, args.iterations, args.batch_size, args.val_limit, args.test_limit = 2, 1, 6, 6, 6
        args.budget, args.llm_roles = 200, ""
    settings = home_settings(args.home or tempfile.mkdtemp(prefix="ecdysis-bench-"))
    from ecdysis.service import Service
    args.model = args.model or list(settings.default_models)
    args.suite = args.suite or ["reasoning-mix", "bigbench:navigate"]
    strategies = args.strategy or list(STRATEGIES)
    svc = Service(open_store(settings.database_url), settings)
    cpu0, load0, started = cpu_counters(), load_average(), time.perf_counter()
    result: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()
                                         if k not in ("home", "out", "keep_from", "rerender", "reinterval")},
                              "intervals": {"method": INTERVALS}}
    measured = ["heuristic"] * bool(args.seeds) + [args.llm_roles] * bool(args.llm_roles and args.llm_roles_seeds)
    kept = carried_over(Path(args.keep_from), args.suite, measured) if args.keep_from else {}
    for suite in args.suite:
        first = args.first_seed
        windows = {window_of(args, s) for s in range(first, first + max(args.seeds, args.llm_roles_seeds))}
        starts = {w: base_val(svc, args, suite, w) for w in sorted(windows)}
        plans = [("heuristic", list(range(first, first + args.seeds)))]
        if args.llm_roles:
            plans.append((args.llm_roles, list(range(first, first + args.llm_roles_seeds))))
        for roles, seeds in plans:
            evos = {}
            for seed in seeds:
                for name in strategies:
                    print(f"== {suite} · {name} · seed {seed} · roles {roles}", flush=True)
                    evos[(name, seed)] = evolve(svc, config(args, suite, name, seed, roles),
                                                stored_only=reused(args, name))
                    # Written after every evolution: a long benchmark stopped midway keeps its figures
                    # (and `seeds` says which were complete).
                    done = {k: v for k, v in evos.items() if all((n, k[1]) in evos for n in strategies)}
                    if done:
                        merge(result, suite, roles, summarise(svc, args, suite, done, starts))
                        for kept_suite, per in kept.items():
                            for kept_roles, block in per.items():
                                merge(result, kept_suite, kept_roles, block)
                        result["machine"] = {"load_before": load0, "load_after": load_average(),
                                             "steal_pct": steal_pct(cpu0, cpu_counters()), "cores": os.cpu_count()}
                        result["measured"] = f"{now()}, {round(time.perf_counter() - started)} s in all"
                        write_results(Path(args.out), NAME, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

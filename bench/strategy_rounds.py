#!/usr/bin/env python3
"""One table of the strategy benchmark's rounds on BIG-Bench Hard, read from their committed
results files: each round's code, mixture, seeds, the three strategies' mean test accuracy, and
Ecdysis's paired test delta (95 % interval) and speedup in calls against each baseline.

    python bench/strategy_rounds.py   # write bench/results/compare_strategies_rounds.md

`tests/test_bench.py` fails when that file is not what the results files say.

The README's section between `<!-- bench:compare_strategies_rounds -->` markers is that file
(`scripts/readme_tables.py`). A round's code and what changed before it are not in its results
file, so they are listed here, next to the file's name; everything else is read from the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "compare_strategies_rounds.md"
MIXTURES = {"bbh:date_understanding+formal_fallacies+navigate": "BBH",
            "bbh:movie_recommendation+tracking_shuffled_objects_three_objects+object_counting+web_of_lies": "drawn",
            "bbh:hyperbaton+tracking_shuffled_objects_five_objects+boolean_expressions+word_sorting": "drawn 2"}


@dataclass(frozen=True)
class Round:
    name: str       # as the README's text calls it
    results: str    # file stem in bench/results
    code: str       # the commit the round ran
    change: str     # what changed in the engine before it


ROUNDS = (
    Round("7", "compare_strategies_bbh", "120a8f0", "(the code of BIG-bench round 6, first run on BBH)"),
    Round("8", "compare_strategies_bbh_round8", "1303668",
          "a union of clusters the probe can judge replaces its parts"),
    Round("9", "compare_strategies_bbh_round9", "807d8c5",
          "the probe asks whether the harness can read the answer"),
    Round("10", "compare_strategies_bbh_round10", "16cf25f", "a part the probe can see stays itself"),
    Round("11", "compare_strategies_bbh_round11", "1c2de56",
          "a repair of reading goes to validation when it reads"),
    Round("12", "compare_strategies_bbh_round12", "4e47f0e",
          "the Critic buys no evidence the budget cannot validate"),
    Round("13", "compare_strategies_bbh_drawn", "4e47f0e", "(a mixture drawn at random)"),
    Round("14", "compare_strategies_bbh_round14", "b11fa19",
          "validation order: clear batch gains, then cheapest"),
    Round("15", "compare_strategies_bbh_round15", "b11fa19", "(round 14 again, new seeds)"),
    Round("14+15", "compare_strategies_bbh_round14_15", "b11fa19", "(rounds 14 and 15 as one run)"),
    Round("16", "compare_strategies_bbh_round16", "38ad7c7",
          "near-miss pairs (validated if they beat the later member alone on the batch)"),
    Round("17", "compare_strategies_bbh_round17", "582de52",
          "a pair validated only if it beats each member alone on the batch"),
    Round("18", "compare_strategies_bbh_round18", "427df88",
          "round 17's question dropped; near misses ranked by validation wins"),
    Round("19", "compare_strategies_bbh_round19", "427df88", "(round 18's code on the first mixture)"),
    Round("20", "compare_strategies_bbh_round20", "2fb2927", "(round 18's engine on a second drawn mixture)"),
    Round("21", "compare_strategies_bbh_round21", "2455ca9",
          "a pair the batch puts behind is validated once both members fail alone"),
    Round("22", "compare_strategies_bbh_round22", "2455ca9", "(round 21's code on round 20's seeds)"),
    Round("23", "compare_strategies_bbh_round23", "2455ca9",
          "(round 21's seeds and code, the next 60 validation and 100 test instances)"),
    Round("24", "compare_strategies_bbh_round24", "2455ca9", "(round 21's code on round 19's seeds)"),
    Round("25", "compare_strategies_bbh_round25", "f7b0d39",
          "(round 21's engine; held-out window seed mod 2, 58–63 are rounds 21 and 23's evolutions)"),
    Round("26", "compare_strategies_bbh_round26", "dc45e72",
          "each request charged once per evolution, as a cache of its own would (round 25's seeds and windows)"),
    Round("27", "compare_strategies_bbh_round27", "dc45e72", "(round 26's code on rounds 19 and 24's seeds)"),
    Round("28", "compare_strategies_bbh_round28", "dc45e72",
          "(round 26 again on seeds no run had used, planned before it ran)"),
    Round("29", "compare_strategies_bbh_round29", "b3666e3",
          "a cluster's other reading repairs drafted too, and validated side by side (round 27's seeds)"),
    Round("30", "compare_strategies_bbh_round30", "b3666e3", "(round 29's code on seeds no run had used)"),
    Round("31", "compare_strategies_bbh_round31", "b3666e3", "(round 29's code on round 28's seeds and windows)"),
    Round("32", "compare_strategies_bbh_round32", "2ef19aa",
          "every repair of reading probed, on all of a one-model cluster's failures (round 29's seeds)"),
    Round("33", "compare_strategies_bbh_round33", "2ef19aa", "(round 32's code on round 30's seeds)"),
    Round("34", "compare_strategies_bbh_round34", "2ef19aa", "(round 32's code on round 31's seeds and windows)"),
    Round("35", "compare_strategies_bbh_round35", "a4da98f",
          "repairs of reading screened and validated before any other change is screened (round 33's seeds)"),
    Round("36", "compare_strategies_bbh_round36", "a4da98f", "(round 35's code on round 34's seeds and windows)"),
    Round("37", "compare_strategies_bbh_round37", "a4da98f", "(round 35's code on round 32's seeds)"),
    Round("38", "compare_strategies_bbh_round38", "a4da98f",
          "(round 35's code on seeds no run had used; held-out window seed mod 2, test 93: the seeds cover "
          "the whole test split)"),
    Round("39", "compare_strategies_bbh_round39", "ae46658",
          "the gate's and screening's standard error counts each question once, all its models' outcomes "
          "together (round 37's seeds)"),
    Round("40", "compare_strategies_bbh_round40", "ae46658", "(round 39's code on round 36's seeds and windows)"),
    Round("41", "compare_strategies_bbh_round41", "ae46658",
          "(round 39's code on seeds no run had used; held-out window seed mod 2, test 124: the seeds cover "
          "the whole test split)"),
)


def _seeds(seeds: list[int]) -> str:
    if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _delta(comparison: dict, baseline: str) -> str:
    c = comparison.get(baseline)
    if not c:
        return "—"
    d = c["test_delta_points"]
    lo, hi = d["ci95"]
    text = f"{d['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    wide = d.get("ci95_seeds")  # seeds resampled too (every round's file, once its intervals were recomputed)
    if wide:
        text += f"; across seeds [{wide[0]:+.1f}, {wide[1]:+.1f}]"
    # bold: an interval that excludes no gain (both, where both were recorded)
    return f"**{text}**" if lo > 0 and (not wide or wide[0] > 0) else text


def _speedup(comparison: dict, baseline: str) -> str:
    c = comparison.get(baseline)
    value = c.get("speedup_calls") if c else None
    return "undefined" if value is None else f"{value:.2f}x"


def row(r: Round) -> str | None:
    path = RESULTS / f"{r.results}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    suites = data["config"]["suite"]
    mixture = ", ".join(MIXTURES.get(s, s) for s in suites)
    acc = {name: s["test_accuracy"]["mean"] for name, s in data["strategies"].items()}
    cells = [r.name, f"`{r.code}`", r.change, mixture, _seeds(data["seeds"])]
    cells += [f"{acc[s]:.3f}" if s in acc else "—" for s in ("ecdysis", "per-instance", "self-evolution")]
    cmp = data["comparison"]
    cells += [_delta(cmp, "per-instance"), _delta(cmp, "self-evolution"), _speedup(cmp, "per-instance")]
    return "| " + " | ".join(cells) + " |"


def render() -> str:
    head = ("| round | code | what changed before it | mixture | seeds | Ecdysis | per-instance | Self-Evolution "
            "| Ecdysis − per-instance (points) | Ecdysis − Self-Evolution (points) "
            "| speedup vs per-instance (calls) |\n"
            "|---|---|---|---|---|---:|---:|---:|---|---|---|")
    rows = [line for r in ROUNDS if (line := row(r)) is not None]
    note = ("Mean test accuracy over the round's seeds; deltas are paired on the same test instances with "
            "95 % bootstrap intervals (test instances resampled, each with both models' outcomes and drawn "
            "alike in every seed that tests on it; across seeds, the seeds resampled first), in bold where both "
            "intervals exclude no gain. Recomputed on 2026-12-06 from the stored outcomes: until then each seed's "
            "instances were drawn apart, which made the intervals of seeds sharing a test window several times "
            "too narrow. BBH: "
            "date_understanding, formal_fallacies, navigate. Drawn: movie_recommendation, "
            "tracking_shuffled_objects_three_objects, object_counting, web_of_lies "
            "(`bench/draw_tasks.py --source bbh --seed ecdysis-bbh-round13`). Drawn 2: hyperbaton, "
            "tracking_shuffled_objects_five_objects, boolean_expressions, word_sorting (`bench/draw_tasks.py "
            "--source bbh --seed ecdysis-bbh-round20 --exclude` the drawn mixture). Every round: heuristic roles, "
            "qwen2.5-coder-0.5b and smollm2, 4 iterations, batch 12, validation 60, test 100, "
            "800 calls a strategy (round 38: test 93). Generated by `bench/strategy_rounds.py` from `bench/results/`.")
    return "\n".join([head, *rows, "", note]) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())

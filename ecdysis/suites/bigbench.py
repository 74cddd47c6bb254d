"""BIG-bench `task.json` files as suites: `load_suite("bigbench:TASK[/SUBTASK]")` and task.json
paths come here; the files are fetched once by `scripts/fetch_bigbench.py` and only read, never run.

How a task maps onto instances:

- An example becomes multiple choice when it has `target_scores` and the task prefers
  `multiple_choice_grade` (or the example has no `target`): the target is the first best-scoring
  key, and the choices are the keys in an order fixed per example by a hash of its id, never the
  file's order. Many task files list the right answer first (date_understanding in 364 of its
  first 369 examples, formal_fallacies_syllogisms_negation in all of them), so a harness that
  shows options as letters would teach "answer A" through its own few-shot examples.
- Otherwise an example is generative and scored `exact` against `target` (a string, or a list
  whose first item is the target).
- Other accepted answers (further items of a target list, tied best choices) go to the scorer's
  `aliases` option, never into `fields`, because fields reach the harness.
- `input` is the example's input as written. The task's formatting keys (`task_prefix`,
  `example_input_prefix`, `example_output_prefix`, `choice_prefix`, `append_choices_to_input`,
  `output_regex`, `stop_string`) are copied into `fields` under their BIG-bench names for a harness
  to use as it likes; they are not baked into `input`.
- A task whose task.json has no examples but subfolders with their own task.json (such as
  logical_deduction) is the union of its subtasks; each subtask is a category ("TASK/SUBTASK").
- Ids are "TASK-0007" or "TASK/SUBTASK-0007": the example's position in its file.
- "bigbench:TASK+TASK" is a mixture: the union of the tasks, each task (or subtask) a category
  with its own scoring rule, each task cut to the size of the smallest.
- A task's instances come in an order fixed by a hash of their ids, never the file's: files are
  often sorted, and the first 369 of formal_fallacies_syllogisms_negation are all "valid" (half of
  its 14,200 are not), so a mixture's cut or a run's `--limit` would otherwise see one label.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ecdysis.errors import InputError, NotFound
from ecdysis.records import Instance, ScorerSpec, Suite
from ecdysis.settings import Settings

PREFIX = "bigbench:"
FORMAT_KEYS = ("task_prefix", "example_input_prefix", "example_output_prefix", "choice_prefix",
               "append_choices_to_input", "output_regex", "stop_string")
FETCH_HINT = "run `python scripts/fetch_bigbench.py` or set ECDYSIS_BIGBENCH_DIR"

_Bad = Callable[[str], InputError]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def bigbench_dir() -> Path:
    """ECDYSIS_BIGBENCH_DIR, else ~/.cache/ecdysis/bigbench/benchmark_tasks (outside the clone:
    1.7 GB of task files are fetched once per machine, not once per checkout)."""
    configured = Settings.from_env().bigbench_dir
    if configured is not None:
        return configured
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ecdysis" / "bigbench" / "benchmark_tasks"


def bigbench_tasks(root: Path | None = None) -> list[str]:
    """Every loadable task name under `root`: "TASK" and "TASK/SUBTASK" (empty if not fetched)."""
    root = root or bigbench_dir()
    if not root.is_dir():
        return []
    names = {p.parent.relative_to(root).as_posix() for p in root.glob("*/task.json")}
    names |= {p.parent.relative_to(root).as_posix() for p in root.glob("*/*/task.json")}
    return sorted(names)


def load_bigbench(task: str, *, root: Path | None = None, name: str | None = None) -> Suite:
    """The suite for "TASK" or "TASK/SUBTASK" under `root` (default `bigbench_dir()`), or for a
    mixture "TASK+TASK[+...]": the union of the tasks, each its own category (scored by its own
    rule), so failures can recur across tasks, the way the paper counts a pattern as recurring."""
    root = root or bigbench_dir()
    if "+" in task:
        tasks = list(dict.fromkeys(t.strip() for t in task.split("+")))
        if len(tasks) < 2 or any(not t for t in tasks):
            raise NotFound(f"{task!r} is not a BIG-bench mixture", hint="use bigbench:TASK+TASK, two tasks or more")
        parts = [load_bigbench(t, root=root) for t in tasks]
        # Each task gives as many examples as the smallest one has, so a task of 14,000 examples does
        # not drown one of 400 in the train batches; its instances come in hash order, so these are a
        # sample, never the file's first ones (a file sorted by label would give one label only).
        size = min(len(p.instances) for p in parts)
        parts = [replace(p, instances=p.instances[:size]) for p in parts]
        parsed = [p for suite in parts for p in _parsed_of(suite)]
        return Suite(name=name or PREFIX + "+".join(tasks), instances=[i for s in parts for i in s.instances],
                     scorer=_combined_scorer(parsed), source=f"bigbench:{root.resolve()}",
                     description="A mixture of BIG-bench tasks: " + "; ".join(
                         f"{t}: {' '.join(s.description.split())[:120]}" for t, s in zip(tasks, parts)))
    parts = task.strip("/").split("/")
    if len(parts) > 2 or any(p in ("", ".", "..") for p in parts):
        raise NotFound(f"{task!r} is not a BIG-bench task name", hint="use bigbench:TASK or bigbench:TASK/SUBTASK")
    if not root.is_dir():
        raise NotFound(f"the BIG-bench task files are not at {root}", hint=FETCH_HINT)
    path = root.joinpath(*parts, "task.json")
    if not path.is_file():
        raise NotFound(f"no BIG-bench task {task!r} in {root}", hint=_task_hint(root, parts[0]))
    return load_task_file(path, task="/".join(parts), name=name or PREFIX + "/".join(parts))


def load_task_file(path: str | Path, *, task: str | None = None, name: str | None = None) -> Suite:
    """The suite in one task.json (with its subtask folders when it has no examples of its own)."""
    path = Path(path)
    data = _read(path)
    task = task or str(data.get("name") or path.parent.name)
    parsed = [_parse_task(data, path, task)] if "examples" in data else _subtasks(path, task)
    instances = [inst for p in parsed for inst in p.instances]
    return Suite(name=name or task, instances=instances, scorer=_combined_scorer(parsed),
                 description=str(data.get("description", "")), source=f"bigbench:{path.resolve()}")


def _parsed_of(suite: Suite) -> list[_Parsed]:
    """A loaded task's categories with their scoring rules, to combine with another task's."""
    spec = suite.scorer
    if spec.kind == "by_category":
        rules = dict(spec.options.get("categories", {}))
    else:
        rules = {c: {"kind": spec.kind, "options": dict(spec.options)} for c in suite.categories}
    out = []
    for category, rule in rules.items():
        members = [i for i in suite.instances if i.category == category]
        aliases = {i.id: a for i in members if (a := rule.get("options", {}).get("aliases", {}).get(i.id))}
        out.append(_Parsed(category=category, kind=rule["kind"], instances=members, aliases=aliases))
    return out


# ---------------------------------------------------------------- one task file

@dataclass
class _Parsed:
    category: str
    kind: str
    instances: list[Instance]
    aliases: dict[str, list[str]] = field(default_factory=dict)

    def spec(self) -> ScorerSpec:
        return ScorerSpec(self.kind, {"aliases": self.aliases} if self.aliases else {})


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise NotFound(f"no task file {path}", hint=FETCH_HINT) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", path=str(path), line=exc.lineno) from exc
    except RecursionError as exc:
        raise InputError("the JSON is nested too deeply", path=str(path)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the file: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise InputError("a BIG-bench task.json must hold a JSON object", path=str(path))
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        # "\ud800" escapes decode to lone surrogates, which no store, pipe or model can carry.
        raise InputError("a string holds an unpaired surrogate escape (such as \\ud800)", path=str(path)) from exc
    return data


def _subtasks(path: Path, task: str) -> list[_Parsed]:
    files = sorted(path.parent.glob("*/task.json"))
    if not files:
        raise InputError("this task.json has no 'examples' and no subtask folders (a programmatic task?)",
                         path=str(path), hint="only JSON tasks can be loaded")
    return [_parse_task(_read(f), f, f"{task}/{f.parent.name}") for f in files]


def _parse_task(data: dict[str, Any], path: Path, category: str) -> _Parsed:
    examples = data.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InputError("'examples' must be a non-empty list", path=str(path))
    prefer_choice = data.get("preferred_score") == "multiple_choice_grade"
    task_fields = {k: data[k] for k in FORMAT_KEYS if k in data}
    parsed = _Parsed(category=category, kind="", instances=[])
    kinds: set[str] = set()
    for index, example in enumerate(examples):
        inst, kind, extra = _parse_example(example, index, category, prefer_choice, task_fields, path)
        parsed.instances.append(inst)
        kinds.add(kind)
        if extra:
            parsed.aliases[inst.id] = extra
    if len(kinds) > 1:
        raise InputError("the task mixes multiple-choice and generative examples", path=str(path),
                         hint="split it into subtasks, one kind each")
    parsed.kind = kinds.pop()
    # In an order fixed by a hash of the ids, not the file's: task files are often sorted (by label,
    # by source), and a run limited to a split's first instances must still be a fair sample.
    parsed.instances.sort(key=_rank)
    return parsed


def _parse_example(example: Any, index: int, category: str, prefer_choice: bool,
                   task_fields: dict[str, Any], path: Path) -> tuple[Instance, str, list[str]]:
    """One example as (instance, scorer kind, aliases)."""
    def bad(message: str) -> InputError:
        return InputError(f"example {index}: {message}", path=str(path))

    if not isinstance(example, dict) or not isinstance(example.get("input"), str):
        raise bad("needs a string 'input'")
    fields = {**task_fields, **{k: example[k] for k in FORMAT_KEYS if k in example}}
    inst = Instance(id=f"{category}-{index:04d}", input=example["input"], target="", category=category,
                    fields=fields)
    scores = example.get("target_scores")
    if scores is not None and (prefer_choice or "target" not in example):
        choices, best = _choice_targets(scores, bad)
        return replace(inst, target=best[0], choices=_shuffled(choices, _rank(inst))), "multiple_choice", best[1:]
    targets = _text_targets(example.get("target"), bad)
    return replace(inst, target=targets[0]), "exact", targets[1:]


def _choice_targets(scores: Any, bad: _Bad) -> tuple[tuple[str, ...], list[str]]:
    valid = isinstance(scores, dict) and len(scores) >= 1 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scores.values())
    if not valid:  # NaN would make every comparison with the best score false: no target at all
        raise bad("'target_scores' must map each choice to a finite number")
    top = max(scores.values())
    return tuple(scores), [c for c, s in scores.items() if s == top]


def _rank(instance: Instance) -> bytes:
    """A SHA-256 of the instance's id: its place in the task's order, and its choices' shuffle."""
    return hashlib.sha256(instance.id.encode()).digest()


def _shuffled(choices: tuple[str, ...], seed: bytes) -> tuple[str, ...]:
    """The choices in an order that depends only on `seed` (the example's `_rank`): the same on
    every load and machine, and unrelated to where the file put the right answer."""
    order = list(choices)
    random.Random(seed).shuffle(order)
    return tuple(order)


def _text_targets(raw: Any, bad: _Bad) -> list[str]:
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(t, str) for t in items):
        raise bad("needs 'target' (a string or a list of strings) or 'target_scores'")
    return list(dict.fromkeys(items))  # drop repeats, keep the first as the target


def _combined_scorer(parsed: list[_Parsed]) -> ScorerSpec:
    kinds = {p.kind for p in parsed}
    if len(kinds) == 1:
        aliases = {i: a for p in parsed for i, a in p.aliases.items()}
        return ScorerSpec(kinds.pop(), {"aliases": aliases} if aliases else {})
    return ScorerSpec("by_category", {"categories": {
        p.category: {"kind": p.kind, "options": p.spec().options} for p in parsed}})


def _task_hint(root: Path, task: str) -> str:
    folder = root / task
    if folder.is_dir():
        subs = sorted(p.parent.name for p in folder.glob("*/task.json"))
        if subs:
            return f"subtasks of {task}: {', '.join(subs[:12])}"
        return f"{task} is a programmatic task (no task.json); only JSON tasks load"
    names = [n for n in bigbench_tasks(root) if "/" not in n]
    return f"{len(names)} tasks in {root}, e.g. {', '.join(names[:8])}"

"""Task suites, the first stage of the flow: `load_suite` resolves a name to a `Suite` whose every
instance has a train / validation / test split, ready for the runner; `describe_suites` lists them.

A name resolves, in this order, to: a built-in suite (`builtin_suite_names()`); a BFCL suite
(`bfcl-simple`, `bfcl-multiple`, ...; `bfcl.SUITES`, and the multi-turn `bfcl-multi_turn_base`;
`bfcl_multi_turn.MULTI_TURN_SUITES`) from `bfcl_dir()`; `bigbench:TASK`,
`bigbench:TASK/SUBTASK` or a mixture `bigbench:TASK+TASK` from `bigbench_dir()`; `bbh:TASK` or
`bbh:TASK+TASK` (BIG-Bench Hard, converted to task.json at set-up) from `bbh_dir()`; a path to a
`.jsonl` or BIG-bench `task.json` file;
a suite stored with `import_jsonl` (looked up with `store.get_suite`). The loaded suite's `name` is
the name it was loaded by (for a file, the path as given), so `load_suite(suite.name)` finds it
again, which is what a resumed run does.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ecdysis.errors import ConfigError, InputError, NotFound
from ecdysis.records import SPLITS, Suite
from ecdysis.store import Store
from ecdysis.suites.bfcl import MIXTURES as BFCL_MIXTURES
from ecdysis.suites.bfcl import SUITES as BFCL_SUITES
from ecdysis.suites.bfcl import is_fetched as bfcl_fetched
from ecdysis.suites.bfcl import bfcl_dir, load_bfcl, question_file
from ecdysis.suites.bbh import PREFIX as BBH_PREFIX
from ecdysis.suites.bbh import bbh_dir, bbh_tasks, load_bbh
from ecdysis.suites.bfcl_multi_turn import MULTI_TURN_SUITES, is_multi_turn_fetched, load_multi_turn
from ecdysis.suites.bigbench import PREFIX as BIGBENCH_PREFIX
from ecdysis.suites.bigbench import bigbench_dir, bigbench_tasks, load_bigbench, load_task_file
from ecdysis.suites.builtin import builtin_suite, builtin_suite_names
from ecdysis.suites.forms import attach_forms, suite_forms
from ecdysis.suites.jsonl import import_jsonl, load_jsonl
from ecdysis.suites.scorers import resolve, score
from ecdysis.suites.splits import assign_splits

__all__ = ["assign_splits", "bbh_dir", "bfcl_dir", "bfcl_suites", "bigbench_catalogue", "uncatalogued_tasks",
           "bigbench_dir",
           "bigbench_tasks", "builtin_suite_names",
           "describe_suites",
           "import_jsonl", "load_jsonl", "load_suite", "score"]

_FILE_SUFFIXES = (".jsonl", ".json")


def load_suite(name: str, *, store: Store | None = None, seed: int = 0) -> Suite:
    """The suite called `name`, splits assigned with `seed`; `NotFound` lists what exists.

    A suite file is parsed and checked once per version of the file (path, size and mtime): a job
    loads its suite several times, and 2,000 JSONL lines cost about 0.15 s each time."""
    stamp = _file_stamp(name)
    key = (name, seed, stamp)
    with _cache_lock:
        cached = _file_cache.get(key) if stamp is not None else None
    if cached is None:
        cached = _prepared(_resolve(name, store), seed)
        if stamp is not None:
            with _cache_lock:
                _file_cache[key] = cached
                while len(_file_cache) > _FILE_CACHE_SIZE:
                    _file_cache.pop(next(iter(_file_cache)))
    return replace(cached, instances=list(cached.instances))  # instances are frozen; the list is the caller's


def _prepared(suite: Suite, seed: int = 0) -> Suite:
    """The suite with splits assigned and each category's answer form attached."""
    return replace(suite, instances=attach_forms(assign_splits(suite.instances, seed=seed), suite.scorer))


_FILE_CACHE_SIZE = 8
_file_cache: dict[tuple[str, int, tuple[str, int, int]], Suite] = {}
_cache_lock = threading.Lock()


def _file_stamp(name: str) -> tuple[str, int, int] | None:
    """(resolved path, size, mtime in ns) of a suite file, None for every other kind of name. A BFCL
    suite's stamp is its question file's: the CLI and the app list all five at every call."""
    if name in BFCL_SUITES:
        name = str(question_file(BFCL_SUITES[name]))
    elif name in MULTI_TURN_SUITES:
        name = str(question_file(MULTI_TURN_SUITES[name]))
    elif (name in builtin_suite_names() or name.startswith((BIGBENCH_PREFIX, BBH_PREFIX))
          or not name.endswith(_FILE_SUFFIXES)):
        return None
    try:
        path = Path(name).expanduser().resolve()
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns) if path.is_file() else None


def describe_suites(store: Store | None = None, *, bigbench: bool = True,
                    bfcl: bool = True) -> list[dict[str, Any]]:
    """One row per built-in, stored, (with `bfcl`) fetched BFCL and (with `bigbench`) fetched
    BIG-bench and BIG-Bench Hard suite: name, size, categories, scorer, answer forms, splits,
    source, description."""
    suites = [load_suite(n) for n in builtin_suite_names()]
    if bfcl:
        suites += [load_suite(n) for n in bfcl_suites()]
    if store is not None:
        taken = set(builtin_suite_names()) | set(BFCL_SUITES) | set(BFCL_MIXTURES) | set(MULTI_TURN_SUITES)
        suites += [_prepared(s) for s in store.list_suites() if s.name not in taken]
    rows = [_describe(s) for s in suites]
    if bigbench:  # what the catalogue holds: building it takes minutes, so set-up does that
        rows += [r for r in bigbench_catalogue(build=False) if "error" not in r]
        rows += [r for r in bigbench_catalogue(bbh_dir(), build=False, prefix=BBH_PREFIX) if "error" not in r]
    return rows


def bfcl_suites(root: Path | None = None) -> list[str]:
    """The BFCL suite names, single-turn then multi-turn, when their files are fetched (else none:
    `bfcl.FETCH_HINT` says how)."""
    return (([*BFCL_SUITES, *BFCL_MIXTURES] if bfcl_fetched(root) else [])
            + (list(MULTI_TURN_SUITES) if is_multi_turn_fetched(root) else []))


CATALOGUE_FILE = "ecdysis-catalogue.json"
_CATALOGUE_VERSION = 2  # bump when a row changes meaning: every task is listed again


def bigbench_catalogue(root: Path | None = None, *, build: bool = True,
                       progress: Callable[[int, int, str], None] | None = None,
                       prefix: str = BIGBENCH_PREFIX) -> list[dict[str, Any]]:
    """One `describe_suites` row per top-level BIG-bench task under `root` (empty when none are
    fetched). Loading all 167 tasks takes minutes (one holds 1.4 million examples), so rows are
    kept in `ecdysis-catalogue.json` beside the task folder, each with the size and mtime of its
    task files. With `build`, tasks whose files changed (or that are not listed yet) are loaded
    and the file is rewritten; without it (the app, `ecdysis suites`), only listed rows whose files
    are unchanged come back, at once. Set-up builds it; a task that does not load gets a row with
    its `error`. The BIG-Bench Hard tasks (`prefix` "bbh:", under `bbh_dir()`) are task.json files
    too, and are listed the same way."""
    root = root or bigbench_dir()
    tasks = [t for t in bigbench_tasks(root) if "/" not in t]
    if not tasks:
        return []
    path = root.parent / CATALOGUE_FILE
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old = old.get("tasks", {}) if old.get("version") == _CATALOGUE_VERSION else {}
    except (OSError, ValueError, AttributeError):
        old = {}
    entries: dict[str, dict[str, Any]] = {}
    changed = False
    for n, task in enumerate(tasks, 1):
        stamp = _task_stamp(root, task)
        entry = old.get(task)
        if entry and entry.get("stamp") == stamp:
            entries[task] = entry
            continue
        if not build:
            continue
        if progress:
            progress(n, len(tasks), task)
        try:
            row = _describe(_prepared(load_bigbench(task, root=root, name=prefix + task)))
        except (InputError, NotFound, ConfigError) as exc:
            row = {"name": prefix + task, "error": str(exc)}
        row["source"] = prefix.rstrip(":")
        row["description"] = " ".join(str(row.get("description", "")).split())[:300]
        entries[task], changed = {"stamp": stamp, "row": row}, True
    if build and (changed or set(old) != set(entries)):
        _write_atomically(path, {"version": _CATALOGUE_VERSION, "tasks": entries})
    return [e["row"] for e in entries.values()]


def uncatalogued_tasks(root: Path | None = None) -> int:
    """How many fetched BIG-bench tasks `bigbench_catalogue(build=False)` leaves out."""
    root = root or bigbench_dir()
    listed = {r["name"] for r in bigbench_catalogue(root, build=False)}
    return sum(1 for t in bigbench_tasks(root) if "/" not in t and BIGBENCH_PREFIX + t not in listed)


def _task_stamp(root: Path, task: str) -> list[list[Any]]:
    files = [root / task / "task.json", *sorted((root / task).glob("*/task.json"))]
    return [[f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns] for f in files for st in [f.stat()]]


def _write_atomically(path: Path, data: Any) -> None:
    """Write, then rename into place: a second process reading the catalogue sees the old or the new
    file, never half of one. A read-only folder leaves the catalogue unsaved (rebuilt next time)."""
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".catalogue-", suffix=".tmp",
                                         delete=False, encoding="utf-8") as fh:
            json.dump(data, fh)
        os.chmod(fh.name, 0o644)  # a temporary file is private; the catalogue is for every user
        os.replace(fh.name, path)
    except OSError:
        pass


def _describe(suite: Suite) -> dict[str, Any]:
    return {
        "name": suite.name,
        "size": len(suite.instances),
        "categories": suite.categories,
        "scorer": suite.scorer.kind,
        "scorers": _scorer_per_category(suite),
        "answer_forms": {c: f.to_json() for c, f in sorted(suite_forms(suite.instances).items())},
        "splits": {s: len(suite.split(s)) for s in SPLITS},
        "source": suite.source,
        "description": suite.description,
    }


def _scorer_per_category(suite: Suite) -> dict[str, str]:
    first_of = {inst.category: inst for inst in reversed(suite.instances)}
    return {c: resolve(first_of[c], suite.scorer).kind for c in sorted(first_of)}


def _resolve(name: str, store: Store | None) -> Suite:
    if name in builtin_suite_names():
        return builtin_suite(name)
    if name in BFCL_SUITES or name in BFCL_MIXTURES:
        return load_bfcl(name)
    if name in MULTI_TURN_SUITES:
        return load_multi_turn(name)
    if name.startswith(BIGBENCH_PREFIX):
        return load_bigbench(name[len(BIGBENCH_PREFIX):], name=name)
    if name.startswith(BBH_PREFIX):
        return load_bbh(name[len(BBH_PREFIX):], name=name)
    path = Path(name).expanduser()
    if name.endswith(_FILE_SUFFIXES) and path.is_file():
        return load_jsonl(path, name=name) if name.endswith(".jsonl") else load_task_file(path, name=name)
    stored = store.get_suite(name) if store is not None else None
    if stored is not None:
        return stored
    if name.endswith(_FILE_SUFFIXES):
        raise NotFound(f"no file {name}", hint="give a path to an existing .jsonl or task.json file")
    raise NotFound(f"no suite named {name!r}", hint=_known_hint(store))


def _known_hint(store: Store | None) -> str:
    parts = [f"built-in: {', '.join(builtin_suite_names())}",
             f"BFCL: {', '.join([*BFCL_SUITES, *BFCL_MIXTURES, *MULTI_TURN_SUITES])}"
             + ("" if bfcl_fetched() else " once `scripts/fetch_bfcl.py` has run")]
    if store is not None:
        stored = sorted(s.name for s in store.list_suites())
        parts.append(f"stored: {', '.join(stored) if stored else 'none'}")
    tasks = [t for t in bigbench_tasks() if "/" not in t]
    if tasks:
        example = "date_understanding" if "date_understanding" in tasks else tasks[0]
        parts.append(f"BIG-bench: bigbench:TASK (or a mixture TASK+TASK) for {len(tasks)} tasks, "
                     f"e.g. bigbench:{example}")
    else:
        parts.append("BIG-bench: bigbench:TASK once `scripts/fetch_bigbench.py` has run")
    hard = [t for t in bbh_tasks() if "/" not in t]
    parts.append(f"BIG-Bench Hard: bbh:TASK (or bbh:TASK+TASK) for {len(hard)} tasks, e.g. bbh:{hard[0]}" if hard
                 else "BIG-Bench Hard: bbh:TASK once `scripts/fetch_bbh.py` has run")
    parts.append("or a path to a .jsonl / task.json file")
    return "; ".join(parts)

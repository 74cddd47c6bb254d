"""BFCL's multi-turn environments (GorillaFileSystem, MathAPI, MessageAPI, TicketAPI, TradingBot,
TravelAPI, TwitterAPI, VehicleControlAPI), run from literal calls: the classes are loaded from the
fetched source folder, each instance is set to an entry's `initial_config` by BFCL's own
`_load_scenario`, and a call runs as a method call with the literal arguments `parse_calls` read.
No text is ever evaluated; a name that is not a public method of an instance's class is refused.

`check` replays a model's calls and the ground truth's, turn by turn, each on its own instances,
and judges them the way BFCL's multi-turn checker does (see its docstring).

Standard library only and no engine imports (the environments' own sources need `mpmath`), so a
harness folder can carry a copy (the starter agent's `envs.py` is one, kept equal by a test), and
the scorer runs this file as a child process of its own (`python envs.py --serve`): a call that
runs away (a logarithm to a billion digits) ends that process, never the engine.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import json
import os
import sys
from copy import deepcopy
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

# BFCL's sources import each other by this package (`from bfcl_eval.eval_checker...long_context
# import ...`); each file is loaded under its dotted name there, so those imports resolve without
# the package being installed.
PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# Each environment class and the file defining it (its function docs are the `.json` of that name).
CLASS_MODULES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
STATELESS = frozenset({"MathAPI"})  # BFCL loads no scenario into these
ERROR = "Error during execution: "  # BFCL's prefix for a call that could not run
BRIEF_CHARS = 300


# ---------------------------------------------------------------- loading the classes

def load_module(folder: str | Path, stem: str, _loading: frozenset[str] = frozenset()) -> ModuleType:
    """`folder`/`stem`.py as the module `PACKAGE.stem`, after the files of `folder` it imports that
    way. A module already loaded from another folder is loaded again from this one."""
    if not stem.isidentifier():
        raise ValueError(f"{stem!r} is not a module name")
    path = (Path(folder) / f"{stem}.py").resolve()
    name = f"{PACKAGE}.{stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    for sibling in _siblings(path.read_text(encoding="utf-8")):
        if sibling not in _loading:
            load_module(folder, sibling, _loading | {stem})
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _siblings(source: str) -> list[str]:
    """The files of the same folder a source imports through `PACKAGE`."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    prefix = PACKAGE + "."
    return [n[len(prefix):] for n in names if n.startswith(prefix) and n[len(prefix):].isidentifier()]


def load_class(folder: str | Path, class_name: str) -> type:
    stem = CLASS_MODULES.get(class_name)
    if stem is None:
        raise KeyError(f"no BFCL environment class {class_name!r}; known: {', '.join(CLASS_MODULES)}")
    return getattr(load_module(folder, stem), class_name)


# ---------------------------------------------------------------- running calls

class Outcome(NamedTuple):
    """What one call gave: `result`, the text the model is shown (BFCL's form: a string as it is, a
    dict as JSON, anything else as str()), and `status`: ok, error (the method returned
    {"error": ...}), raised, bad_arguments (the method does not take them), unknown (no public
    method of that name), malformed (not a call)."""

    result: str
    status: str


class Environment:
    """One instance of each involved class; a call goes to the instance whose class defines a
    public method of that name (a later class wins, as in BFCL)."""

    def __init__(self, instances: dict[str, Any]) -> None:
        self.instances = instances
        self._owners: dict[str, str] = {}
        for class_name, instance in instances.items():
            for name, _ in inspect.getmembers(type(instance), inspect.isfunction):
                if not name.startswith("_"):
                    self._owners[name] = class_name

    @classmethod
    def create(cls, folder: str | Path, classes: list[str], initial_config: dict[str, Any] | None,
               *, long_context: bool = False) -> "Environment":
        """Fresh instances of `classes` from the sources in `folder`, each loaded with its part of
        `initial_config` (a deep copy: the entry is never changed)."""
        instances: dict[str, Any] = {}
        for class_name in classes:
            instance = load_class(folder, class_name)()
            if class_name not in STATELESS:
                instance._load_scenario(deepcopy((initial_config or {}).get(class_name, {})),
                                        long_context=long_context)
            instances[class_name] = instance
        return cls(instances)

    @property
    def functions(self) -> list[str]:
        return sorted(self._owners)

    def execute(self, call: Any) -> Outcome:
        """Run one call, {"name": str, "arguments": {...}, "positional": [...]}, whose values are
        literal data. Whatever the call is, the answer is an `Outcome`, never an exception."""
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Outcome(ERROR + "a call needs a function name", "malformed")
        name = call["name"]
        arguments = call.get("arguments") or {}
        positional = call.get("positional") or []
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments) \
                or not isinstance(positional, (list, tuple)):
            return Outcome(ERROR + f"{name}: the arguments must be an object of named values", "malformed")
        owner = self._owners.get(name)
        if owner is None:  # also every private, special or dotted name: only public methods are listed
            return Outcome(ERROR + f"there is no function {name!r}", "unknown")
        method = getattr(self.instances[owner], name)
        try:
            inspect.signature(method).bind(*positional, **arguments)
        except TypeError as exc:
            return Outcome(ERROR + f"{name}() {exc}", "bad_arguments")
        try:
            value = method(*positional, **arguments)
        except Exception as exc:  # noqa: BLE001 - what the environment raised is the call's result
            return Outcome(ERROR + str(exc), "raised")
        status = "error" if isinstance(value, dict) and "error" in value else "ok"
        return Outcome(result_text(value), status)

    def state(self) -> dict[str, Any]:
        """Each instance's public attributes as plain data, for reading (scoring compares the
        instances themselves)."""
        return {name: public_state(instance) for name, instance in self.instances.items()}


def result_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except Exception:  # noqa: BLE001 - values JSON cannot hold (an mpf, a Decimal) are shown as Python
            return str(value)
    return str(value)


def public_state(instance: Any) -> dict[str, Any]:
    return {k: to_data(v) for k, v in vars(instance).items() if not k.startswith("_")}


def to_data(value: Any, _path: tuple[int, ...] = ()) -> Any:
    """A JSON-able copy: objects become their public attributes; an object met again on the way
    down (a directory's parent) is named, not followed."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if id(value) in _path or len(_path) > 24:
        return f"<{type(value).__name__}>"
    path = _path + (id(value),)
    if isinstance(value, dict):
        return {str(k): to_data(v, path) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_data(v, path) for v in value]
    if hasattr(value, "__dict__"):
        return {k: to_data(v, path) for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


def brief(value: Any) -> str:
    text = json.dumps(to_data(value), ensure_ascii=False, default=str)
    return text if len(text) <= BRIEF_CHARS else text[:BRIEF_CHARS - 1] + "…"


# ---------------------------------------------------------------- BFCL's multi-turn check

def check(folder: str | Path, classes: list[str], initial_config: dict[str, Any], expected: list[list[Any]],
          got: list[list[Any]], *, long_context: bool = False) -> dict[str, Any]:
    """BFCL's verdict on a model's calls for one multi-turn entry. `expected` (the ground truth) and
    `got` (the model's calls) are lists of turns of calls; each side runs on its own fresh
    instances, turn by turn. After each turn whose ground truth holds calls: the model's turn must
    hold some ("empty_turn"), every public attribute of every instance must equal the ground
    truth's ("state_mismatch"; attributes starting with "_" are not compared), and each result of
    the ground truth's calls must be among the model's results so far, this turn's and earlier
    ones', each used once, in any order ("response_mismatch"). The first failure ends the replay.

    Returns {"valid", "reason", "turn", "detail", "turns"}: per turn replayed, the model's
    "results" and "statuses" and the ground truth's "expected_results"."""
    model = Environment.create(folder, classes, initial_config, long_context=long_context)
    truth = Environment.create(folder, classes, initial_config, long_context=long_context)
    so_far: list[str] = []
    turns: list[dict[str, Any]] = []

    def failed(index: int, reason: str, detail: str) -> dict[str, Any]:
        return {"valid": False, "reason": reason, "turn": index, "detail": detail, "turns": turns}

    for index, wanted in enumerate(expected):
        calls = got[index] if index < len(got) else []
        outcomes = [model.execute(c) for c in calls]
        truths = [truth.execute(c) for c in wanted]
        so_far += [o.result for o in outcomes]
        turns.append({"results": [o.result for o in outcomes], "statuses": [o.status for o in outcomes],
                      "expected_results": [o.result for o in truths]})
        if not wanted:  # a turn where nothing should be called; BFCL judges it apart (irrelevance)
            continue
        if not calls:
            return failed(index, "empty_turn", f"turn {index + 1} holds no call; the ground truth makes {len(wanted)}")
        differences = state_differences(model, truth)
        if differences:
            first = differences[0]
            return failed(index, "state_mismatch",
                          f"after turn {index + 1}, {first['path']} is {first['model']}, "
                          f"expected {first['ground_truth']}"
                          + (f" ({len(differences)} attributes differ)" if len(differences) > 1 else ""))
        missing = missing_results([o.result for o in truths], so_far)
        if missing:
            return failed(index, "response_mismatch",
                          f"after turn {index + 1}, {len(missing)} result(s) of the ground truth's calls are not "
                          f"among the model's: {brief(missing[0])}")
    return {"valid": True, "reason": "", "turn": None, "detail": "", "turns": turns}


def state_differences(model: Environment, truth: Environment) -> list[dict[str, str]]:
    """Each public attribute of a ground-truth instance that the model's instance does not equal."""
    out: list[dict[str, str]] = []
    for class_name, want in truth.instances.items():
        have = model.instances[class_name]
        for attribute, value in vars(want).items():
            if attribute.startswith("_"):
                continue
            mine = getattr(have, attribute, None)
            try:
                same = bool(mine == value)
            except Exception:  # noqa: BLE001 - values that cannot be compared are not equal
                same = False
            if not same:
                where = f"{class_name}.{attribute}"
                found = first_difference(mine, value, where) or (where, brief(mine), brief(value))
                out.append({"class": class_name, "attribute": attribute, "path": found[0], "model": found[1],
                            "ground_truth": found[2]})
    return out


def first_difference(mine: Any, want: Any, path: str,
                     _seen: frozenset[int] = frozenset()) -> tuple[str, str, str] | None:
    """Where two values first differ, walking dicts, lists and objects' public attributes:
    (path, mine, wanted), each value in brief, a key one side lacks as "absent"; None when no
    difference is found (an object met again on the way down, a directory's parent, is skipped)."""
    if id(want) in _seen:
        return None
    seen = _seen | {id(want)}
    if type(mine) is not type(want):
        return (path, brief(mine), brief(want))
    if isinstance(want, dict):
        for key in [*want, *(k for k in mine if k not in want)]:
            if key not in mine or key not in want:
                return (f"{path}.{key}", brief(mine[key]) if key in mine else "absent",
                        brief(want[key]) if key in want else "absent")
            found = first_difference(mine[key], want[key], f"{path}.{key}", seen)
            if found:
                return found
        return None
    if isinstance(want, (list, tuple)):
        if len(mine) != len(want):
            return (path, brief(mine), brief(want))
        for index, (a, b) in enumerate(zip(mine, want)):
            found = first_difference(a, b, f"{path}[{index}]", seen)
            if found:
                return found
        return None
    if hasattr(want, "__dict__") and not isinstance(want, type):
        public = {k: v for k, v in vars(want).items() if not k.startswith("_")}
        return first_difference({k: v for k, v in vars(mine).items() if not k.startswith("_")}, public, path, seen)
    try:
        return None if mine == want else (path, brief(mine), brief(want))
    except Exception:  # noqa: BLE001 - values that cannot be compared are shown as they are
        return (path, brief(mine), brief(want))


def missing_results(wanted: list[str], have: list[str]) -> list[str]:
    """The items of `wanted` not in `have`, each item of `have` matching once."""
    pool = list(have)
    missing = []
    for item in wanted:
        if item in pool:
            pool.remove(item)
        else:
            missing.append(item)
    return missing


# ---------------------------------------------------------------- the scorer's child process

def serve(memory_mb: int, seconds: int) -> int:
    """Answer one JSON request a line on stdin ({"check": {keyword arguments of `check`}}) with one
    JSON line on stdout, until stdin closes. The first line out is {"ready": true}."""
    import resource
    import signal

    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout = sys.stderr  # what environment code prints never reaches the replies
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            # SIGALRM's default action ends this process: a call that runs away inside C code
            # (a power, a precision of a billion digits) is stopped too, which no handler could do.
            signal.alarm(seconds)
            reply = check(**request["check"])
        except Exception as exc:  # noqa: BLE001 - reported to the engine, which raises it there
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            signal.alarm(0)
        out.write(json.dumps(reply, ensure_ascii=False, default=str) + "\n")
        out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay BFCL multi-turn calls (the bfcl_multi_turn scorer's process).")
    parser.add_argument("--serve", action="store_true", help="answer JSON check requests on stdin")
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--seconds", type=int, default=30, help="the most one request may take")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.error("nothing to do: give --serve")
    return serve(args.memory_mb, args.seconds)


if __name__ == "__main__":
    sys.exit(main())

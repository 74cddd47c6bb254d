"""BFCL (the Berkeley Function Calling Leaderboard) single-turn categories as suites, and the AST
checker behind the `bfcl_ast` scorer. The files are fetched once by `scripts/fetch_bfcl.py` from
the `bfcl-eval` wheel and only read; the package is never installed or imported.

How an entry maps onto an instance:

- `id` is BFCL's id ("simple_python_7"); `category` is BFCL's category ("simple_python",
  "multiple", "parallel", "parallel_multiple", "irrelevance");
- `input` is the user messages' text, joined by blank lines;
- `fields["functions"]` holds the function docs as BFCL gives them, for a harness to present;
- `target` is the possible answer as canonical JSON: a list of {function: {parameter: [allowed
  values]}}, where "" among the allowed values means the parameter may be left out. An
  irrelevance entry's target is "[]": the right answer is to call nothing.

The checker (`check_calls`) follows BFCL's published AST rules, re-implemented here: the number of
calls, the function names, the required parameters, no parameter the function does not declare or
the answer does not list, each value's type against the schema (an int is accepted for a float; a
tuple for a "tuple"; one level of item types for arrays; a value of the answer's own type is taken
as a variable and compared as is), and each value among the allowed ones (strings compared without
spaces or ",./-_*^", case-insensitively, with ' read as "). Parallel calls match in any order, one
to one: by a maximum matching, where BFCL pairs greedily in the answer's order, so the rare reply
that only a different pairing fits is right here and wrong there. Irrelevance is right when the
reply holds no call, which includes a reply that is not calls.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecdysis.errors import ConfigError, InputError, NotFound
from ecdysis.records import Instance, ScorerSpec, Suite
from ecdysis.settings import Settings
from ecdysis.suites.calls import parse_calls

FETCH_HINT = "run `python scripts/fetch_bfcl.py` (set-up does) or set ECDYSIS_BFCL_DIR"
SUITES: dict[str, str] = {  # suite name -> BFCL category (the file BFCL_v4_<category>.json)
    "bfcl-simple": "simple_python",
    "bfcl-multiple": "multiple",
    "bfcl-parallel": "parallel",
    "bfcl-parallel_multiple": "parallel_multiple",
    "bfcl-irrelevance": "irrelevance",
}
DESCRIPTIONS = {
    "simple_python": "BFCL simple: one function is given, the question asks for one call to it.",
    "multiple": "BFCL multiple: several functions are given, the question asks for one call to the right one.",
    "parallel": "BFCL parallel: one function is given, the question asks for several calls to it, in any order.",
    "parallel_multiple": "BFCL parallel multiple: several functions are given, the question asks for several "
                         "calls among them, in any order.",
    "irrelevance": "BFCL irrelevance: none of the functions given answers the question; the right reply calls none.",
}


# Suites that mix the categories, each its own category, each cut to the smallest one's size (the
# first entries in file order), so failures can recur across categories and none drowns another.
MIXTURES: dict[str, tuple[str, ...]] = {
    "bfcl-single_turn": ("bfcl-simple", "bfcl-multiple", "bfcl-parallel", "bfcl-parallel_multiple", "bfcl-irrelevance"),
}


def bfcl_dir() -> Path:
    """ECDYSIS_BFCL_DIR, else ~/.cache/ecdysis/bfcl/bfcl_eval: fetched once per machine, outside
    the clone, with the wheel's layout below `bfcl_eval/` (data/, eval_checker/...)."""
    configured = Settings.from_env().bfcl_dir
    if configured is not None:
        return configured
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ecdysis" / "bfcl" / "bfcl_eval"


def question_file(category: str, root: Path | None = None) -> Path:
    return (root or bfcl_dir()) / "data" / f"BFCL_v4_{category}.json"


def answer_file(category: str, root: Path | None = None) -> Path:
    return (root or bfcl_dir()) / "data" / "possible_answer" / f"BFCL_v4_{category}.json"


def is_fetched(root: Path | None = None) -> bool:
    """True when every single-turn category's question file is there."""
    return all(question_file(c, root).is_file() for c in SUITES.values())


def load_bfcl(name: str, *, root: Path | None = None) -> Suite:
    """The suite `name` (a key of `SUITES` or `MIXTURES`) from the files under `root` (default
    `bfcl_dir()`)."""
    if name in MIXTURES:
        parts = [load_bfcl(part, root=root) for part in MIXTURES[name]]
        size = min(len(p.instances) for p in parts)
        return Suite(name=name, instances=[i for p in parts for i in p.instances[:size]],
                     scorer=ScorerSpec("bfcl_ast"), source=parts[0].source,
                     description=f"BFCL single-turn mixture: {size} entries of each of " + ", ".join(
                         SUITES[p] for p in MIXTURES[name]) + ", each its own category.")
    if name not in SUITES:
        raise NotFound(f"no BFCL suite named {name!r}", hint=f"known: {', '.join([*SUITES, *MIXTURES])}")
    root = root or bfcl_dir()
    category = SUITES[name]
    questions = question_file(category, root)
    if not questions.is_file():
        raise NotFound(f"the BFCL data files are not at {root}", hint=FETCH_HINT)
    answers = {} if category == "irrelevance" else _answers(answer_file(category, root))
    instances = [_instance(entry, category, answers, questions, line)
                 for line, entry in _json_lines(questions)]
    return Suite(name=name, instances=instances, scorer=ScorerSpec("bfcl_ast"),
                 description=DESCRIPTIONS[category], source=f"bfcl:{root.resolve()}")


def _json_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, value) for each non-empty line: BFCL files hold one JSON object a line."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except ValueError as exc:
            raise InputError(f"not JSON: {exc}", path=str(path), line=number, hint=FETCH_HINT) from None
    return out


def _answers(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise NotFound(f"the BFCL possible answers are not at {path}", hint=FETCH_HINT)
    return {str(entry.get("id")): entry.get("ground_truth") for _, entry in _json_lines(path)}


def _instance(entry: Any, category: str, answers: dict[str, Any], path: Path, line: int) -> Instance:
    def bad(message: str) -> InputError:
        return InputError(message, path=str(path), line=line, hint=FETCH_HINT)

    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        raise bad("an entry needs a string `id`")
    functions = entry.get("function")
    if not isinstance(functions, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                  for f in functions):
        raise bad(f"entry {entry['id']}: `function` must be a list of function docs with names")
    expected = [] if category == "irrelevance" else answers.get(entry["id"])
    if not isinstance(expected, list):
        raise bad(f"entry {entry['id']} has no possible answer")
    return Instance(id=entry["id"], input=_user_text(entry.get("question")), target=canonical(expected),
                    category=category, fields={"functions": functions, "answer_form": {"kind": "json"}})


def _user_text(question: Any) -> str:
    """The user messages' content: BFCL's `question` is a list of turns, each a list of messages."""
    turns = question if isinstance(question, list) else []
    texts = [str(m.get("content", "")) for turn in turns if isinstance(turn, list)
             for m in turn if isinstance(m, dict) and m.get("role") == "user"]
    return "\n\n".join(t.strip() for t in texts if t.strip())


def canonical(value: Any) -> str:
    """One text per value: sorted keys, no spaces, so equal answers are equal strings."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------- the AST checker

@dataclass(frozen=True)
class CallCheck:
    """The verdict on a reply's calls. `reason` names the first rule broken ("" when correct):
    unparsable, called_when_irrelevant, wrong_count, wrong_function, positional_arguments,
    missing_required, unexpected_parameter, wrong_type, wrong_value, missing_parameter."""

    correct: bool
    reason: str = ""
    detail: str = ""


_OK = CallCheck(True)
# BFCL's schema types as Python types ("any" is read as a string, as BFCL does).
_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                           "array": list, "tuple": list, "dict": dict, "any": str}
_ITEM_TYPED = ("array", "tuple")
_SQUASHED = str.maketrans("", "", " ,./-_*^")


def check_calls(calls: list[dict[str, Any]] | None, expected: list[dict[str, Any]],
                functions: list[dict[str, Any]]) -> CallCheck:
    """Whether `calls` (from `parse_calls`; None when the reply was not calls) answer a BFCL entry
    whose possible answer is `expected` and whose function docs are `functions`."""
    if not expected:
        if calls:
            return CallCheck(False, "called_when_irrelevant", f"{len(calls)} call(s) where none applies")
        return _OK
    if calls is None:
        return CallCheck(False, "unparsable", "the reply is not calls in JSON or Python syntax")
    if len(calls) != len(expected):
        return CallCheck(False, "wrong_count", f"{len(calls)} call(s), {len(expected)} expected")
    verdicts = [[_check_one(call, want, functions) for call in calls] for want in expected]
    unmatched = _unmatched(verdicts)
    if unmatched is None:
        return _OK
    return _closest_failure(verdicts[unmatched], expected[unmatched], calls)


def _unmatched(verdicts: list[list[CallCheck]]) -> int | None:
    """An expected call left without a matching call by a maximum one-to-one matching, or None
    when every expected call gets its own (augmenting paths; BFCL's lists hold at most 8 calls)."""
    owner: dict[int, int] = {}  # call index -> expected index

    def assign(want: int, seen: set[int]) -> bool:
        for got, verdict in enumerate(verdicts[want]):
            if verdict.correct and got not in seen:
                seen.add(got)
                if got not in owner or assign(owner[got], seen):
                    owner[got] = want
                    return True
        return False

    for want in range(len(verdicts)):
        if not assign(want, set()):
            return want
    return None


def _closest_failure(row: list[CallCheck], want: dict[str, Any], calls: list[dict[str, Any]]) -> CallCheck:
    """For an expected call without a match, the failure against a call to the same function if
    there is one (its argument is what went wrong), else the first failure. With as many calls as
    expected ones, an unmatched expected call always has a failing call in its row."""
    name = _expected_name(want)
    failed = [v for v, c in zip(row, calls) if c.get("name") == name and not v.correct]
    return (failed or [v for v in row if not v.correct])[0]


def _expected_name(want: dict[str, Any]) -> str:
    if not isinstance(want, dict) or len(want) != 1:
        raise ConfigError(f"a possible answer must be {{function: {{parameter: [values]}}}}, got {want!r}")
    return next(iter(want))


def _find_doc(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    doc = next((f for f in functions if f.get("name") == name), None)
    if doc is None:
        raise ConfigError(f"the possible answer calls {name!r}, which the function docs do not define",
                          hint="the suite's target and fields['functions'] disagree")
    return doc


def _check_one(call: dict[str, Any], want: dict[str, Any], functions: list[dict[str, Any]]) -> CallCheck:
    """One call against one expected call, rule by rule in BFCL's order."""
    name = _expected_name(want)
    allowed: dict[str, list[Any]] = {k: _as_list(v) for k, v in want[name].items()}
    if call.get("name") != name:
        return CallCheck(False, "wrong_function", f"called {call.get('name')!r}, expected {name!r}")
    if call.get("positional"):
        return CallCheck(False, "positional_arguments", f"{name} was given arguments by position")
    schema = _find_doc(functions, name).get("parameters") or {}
    properties = schema.get("properties") or {}
    arguments = call.get("arguments") or {}
    missing = [p for p in schema.get("required") or [] if p not in arguments]
    if missing:
        return CallCheck(False, "missing_required", f"{name} lacks required {missing[0]!r}")
    for param, value in arguments.items():
        if param not in properties or param not in allowed:
            return CallCheck(False, "unexpected_parameter", f"{name} got {param!r}, which is not expected")
        verdict = _check_value(f"{name}.{param}", value, properties[param] or {}, allowed[param])
        if not verdict.correct:
            return verdict
    left_out = [p for p, values in allowed.items() if p not in arguments and "" not in values]
    if left_out:
        return CallCheck(False, "missing_parameter", f"{name} lacks {left_out[0]!r}, which the answer needs")
    return _OK


def _as_list(values: Any) -> list[Any]:
    return values if isinstance(values, list) else [values]


def _check_value(where: str, value: Any, spec: dict[str, Any], allowed: list[Any]) -> CallCheck:
    schema_type = str(spec.get("type", ""))
    expected_type = _TYPES.get(schema_type)
    if schema_type == "tuple" and type(value) is tuple:
        value = list(value)  # answers went through JSON, where a tuple is a list
    if schema_type == "float" and type(value) is int:
        value = float(value)
    if expected_type is None:  # a type BFCL's Python checker does not know: compare values only
        return _compare(where, value, allowed, None, None)
    item_type = _TYPES.get(str((spec.get("items") or {}).get("type", ""))) if schema_type in _ITEM_TYPED else None
    is_variable = _type_ok(value, expected_type, item_type, allowed)
    if is_variable is None:
        return CallCheck(False, "wrong_type", f"{where} is {type(value).__name__} {value!r}, "
                                               f"expected {schema_type}")
    if is_variable:
        return _in_allowed(where, value, allowed)
    return _compare(where, value, allowed, expected_type, item_type)


def _answer_type(allowed: list[Any]) -> type | None:
    """The type of the first allowed value that is not "" (the mark of an omissible parameter)."""
    return next((type(v) for v in allowed if v != ""), None)


def _type_ok(value: Any, expected: type, item_type: type | None, allowed: list[Any]) -> bool | None:
    """None when the type is wrong; else whether the value is taken as a variable (the answer lists
    a value of another type than the schema's, and the reply matches the answer's type)."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if item_type is None or _items_ok(value, item_type, allowed):
            return is_variable
        return None
    if answer_type is not None and type(value) is answer_type:
        return True
    return None


def _items_ok(value: list[Any], item_type: type, allowed: list[Any]) -> bool:
    """One level of item types: every item has the schema's item type or the type of the first
    item of an allowed list; an allowed value that is not a list (such as "") imposes nothing."""
    for option in allowed:
        if not isinstance(option, list):
            return True
        item_answer_type = _answer_type(option)
        if all(type(v) is item_type or (item_answer_type is not None and type(v) is item_answer_type)
               for v in value):
            return True
    return False


def _compare(where: str, value: Any, allowed: list[Any], expected: type | None,
             item_type: type | None) -> CallCheck:
    if expected is dict:
        ok = isinstance(value, dict) and _dict_ok(value, allowed)
    elif expected is list and item_type is dict:
        ok = isinstance(value, list) and _dict_list_ok(value, allowed)
    elif expected is str:
        ok = squash(value) in {squash(v) for v in allowed if isinstance(v, str)}
    elif expected is list:
        ok = _list_ok(value, allowed)
    else:
        return _in_allowed(where, value, allowed)
    return _OK if ok else _wrong_value(where, value, allowed)


def _in_allowed(where: str, value: Any, allowed: list[Any]) -> CallCheck:
    return _OK if value in allowed else _wrong_value(where, value, allowed)


def _wrong_value(where: str, value: Any, allowed: list[Any]) -> CallCheck:
    shown = [v for v in allowed if v != ""]
    return CallCheck(False, "wrong_value", f"{where} = {value!r}, expected one of {shown!r}"[:300])


def squash(text: str) -> str:
    """A string as BFCL compares it: no spaces or ",./-_*^", lower case, ' read as "."""
    return text.translate(_SQUASHED).lower().replace("'", '"')


def _squash_items(items: list[Any]) -> list[Any]:
    return [squash(v) if isinstance(v, str) else v for v in items]


def _list_ok(value: list[Any], allowed: list[Any]) -> bool:
    """The list equals an allowed list, its strings squashed; "" stands for the empty list, as in
    BFCL, so an omissible list parameter may also be given as []."""
    got = _squash_items(list(value))
    return any(got == _squash_items(option if isinstance(option, list) else [])
               for option in allowed if isinstance(option, list) or option == "")


def _dict_ok(value: dict[str, Any], allowed: list[Any]) -> bool:
    """Some allowed dict (each key mapping to its allowed values) accepts every key and value of
    `value`, and every key it lists but `value` lacks may be omitted."""
    for option in allowed:
        if not isinstance(option, dict):
            continue
        if all(k in option and _squash_one(v) in _squash_items(_as_list(option[k])) for k, v in value.items()) \
                and all(k in value or "" in _as_list(vs) for k, vs in option.items()):
            return True
    return False


def _squash_one(value: Any) -> Any:
    return squash(value) if isinstance(value, str) else value


def _dict_list_ok(value: list[Any], allowed: list[Any]) -> bool:
    """The list of dicts matches an allowed list of dicts position by position; "" stands for []."""
    for option in allowed:
        option = [] if option == "" else option
        if isinstance(option, list) and len(option) == len(value) \
                and all(isinstance(v, dict) and _dict_ok(v, [o]) for v, o in zip(value, option)):
            return True
    return False


def score_bfcl(answer: str, instance: Instance) -> CallCheck:
    """The checker's verdict on a harness's answer for a BFCL-shaped instance: the target is the
    possible answer's JSON, `fields["functions"]` the function docs."""
    functions = instance.fields.get("functions")
    if not isinstance(functions, list):
        raise ConfigError(f"instance {instance.id!r} has no fields['functions'] for the bfcl_ast scorer",
                          hint="give each instance its function docs in fields['functions']")
    try:
        expected = json.loads(instance.target)
    except ValueError:
        expected = None
    if not isinstance(expected, list):
        raise ConfigError(f"instance {instance.id!r}: the bfcl_ast target must be a JSON list of calls",
                          hint='e.g. [{"f": {"x": [1]}}], or [] when no function applies')
    return check_calls(parse_calls(answer), expected, functions)

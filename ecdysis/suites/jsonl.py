"""User suites in JSONL: `load_jsonl` turns a file into a `Suite` (pure: nothing is stored), and
`import_jsonl` validates the whole file first and only then hands the suite to `Store.save_suite`.

Format, one JSON object per line (blank lines are skipped but still counted):

    {"ecdysis_suite": {"name": "my-suite", "scorer": {"kind": "numeric", "options": {"tol": 0.01}},
                       "description": "...", "answer_form": "integer"}}   <- optional header, first line only
    {"id": "q1", "input": "2+2?", "target": "4", "category": "math", "split": "test",
     "choices": ["3", "4"], "fields": {"source": "..."}}

A line holds at most `MAX_LINE_BYTES` (256 KiB) of UTF-8: a task bigger than that is not a prompt
any model here takes, and it would be sent and stored whole. Integers have at most 4,300 digits
(Python's limit for converting them to text).

`input` (string) and `target` (string, or a number, which is kept as its JSON text) are required;
`id` defaults to `line-N` (N = line number). When `choices` are given the target must be one of
them. Any other key is an error, so a typo cannot silently drop data: put extras under `fields`.
`answer_form` (header, or a line's `fields`) declares the form of the answers: a kind from
`forms.KINDS`, a form object (`{"kind": "choice", "labels": [...]}`), or in the header a map
{category: form}; without it the form is inferred from the train split (see `forms`).
Every line is also checked against the suite's scorer (a numeric target for `numeric`, choices for
`multiple_choice`). Each problem raises `InputError` naming the file and the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any

from ecdysis.errors import ConfigError, InputError
from ecdysis.records import SPLITS, Instance, ScorerSpec, Suite
from ecdysis.store import Store
from ecdysis.suites import forms, scorers
from ecdysis.suites.builtin import builtin_suite_names

HEADER_KEY = "ecdysis_suite"
MAX_LINE_BYTES = 256 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024  # a suite file bigger than this is refused before it is read
INSTANCE_KEYS = ("id", "input", "target", "choices", "category", "split", "fields")
_HEADER_KEYS = ("name", "scorer", "description", "answer_form")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class _Header:
    name: str | None = None
    scorer: ScorerSpec | None = None
    description: str = ""
    answer_form: Any = None  # a kind, a form object, or {category: either}


def load_jsonl(path: str | Path, *, name: str | None = None, scorer: ScorerSpec | None = None) -> Suite:
    """The suite in `path`. `name` and `scorer` override the header; defaults: file stem, `exact`."""
    path = Path(path)
    header, seen_header = _Header(), False
    instances: list[Instance] = []
    first_line: dict[str, int] = {}
    for lineno, obj in _objects(path):
        if HEADER_KEY in obj:
            if instances or seen_header:
                raise InputError(f"the {HEADER_KEY!r} header must be the first line", path=str(path), line=lineno)
            header, seen_header = _parse_header(obj, path, lineno), True
            continue
        inst = _parse_instance(obj, path, lineno)
        if inst.id in first_line:
            raise InputError(f"duplicate id {inst.id!r} (first on line {first_line[inst.id]})",
                             path=str(path), line=lineno, hint="every instance needs its own id")
        first_line[inst.id] = lineno
        instances.append(inst)
    if not instances:
        raise InputError("no instances", path=str(path), hint='each line needs {"input": ..., "target": ...}')
    # A bad `scorer` argument stays a ConfigError: it is a caller's mistake, not a line of the file.
    spec = scorers.check_spec(scorer or header.scorer or ScorerSpec("exact"))
    for inst in instances:
        _check_scorable(inst, spec, path, first_line[inst.id])
    if header.answer_form is not None:
        instances = [_with_form(inst, header.answer_form) for inst in instances]
    return Suite(name=name or header.name or path.stem, instances=instances, scorer=spec,
                 description=header.description, source=f"jsonl:{path.resolve()}")


def _with_form(inst: Instance, declared: Any) -> Instance:
    """The instance with the header's answer form, unless its own fields declare one."""
    if forms.FIELD in inst.fields:
        return inst
    form = declared.get(inst.category) if _per_category(declared) else declared
    return inst if form is None else dc_replace(inst, fields={**inst.fields, forms.FIELD: form})


def _per_category(declared: Any) -> bool:
    return isinstance(declared, dict) and "kind" not in declared


def import_jsonl(path: str | Path, *, store: Store, name: str | None = None,
                 scorer: ScorerSpec | None = None, replace: bool = False) -> Suite:
    """Validate all of `path`, then store it as a named suite; nothing is stored if any line is bad.

    The name must not shadow a built-in suite, a `bigbench:` name or a file path, and an existing
    stored suite of that name is only replaced with `replace=True` (runs refer to its instance ids).
    """
    suite = load_jsonl(path, name=name, scorer=scorer)
    check_suite_name(suite.name, path=str(path))
    if not replace and store.get_suite(suite.name) is not None:
        raise InputError(f"a suite named {suite.name!r} is already stored", path=str(path),
                         hint="choose another name, or replace it on purpose: `ecdysis import-suite FILE --replace`, "
                              "or the box 'Replace a stored suite of this name' in the app")
    store.save_suite(suite)
    return suite


def check_suite_name(name: str, *, path: str | None = None) -> None:
    """Raise `InputError` unless `name` can be stored without shadowing or being shadowed."""
    if not _NAME.fullmatch(name) or name.endswith((".jsonl", ".json")):
        raise InputError(f"suite name {name!r} is not usable", path=path,
                         hint="use letters, digits, '.', '_' and '-', not ending in .json/.jsonl")
    if name in builtin_suite_names():
        raise InputError(f"suite name {name!r} is a built-in suite", path=path, hint="choose another name")


# ---------------------------------------------------------------- reading

def _objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise InputError("file not found", path=str(path)) from exc
    except OSError as exc:
        raise InputError(f"cannot read the file: {exc}", path=str(path)) from exc
    if size > MAX_FILE_BYTES:
        raise InputError(f"the file is {size / 2**20:.1f} MB; a suite file may hold at most "
                         f"{MAX_FILE_BYTES // 2**20} MB", path=str(path),
                         hint="split it into several suites, or keep fewer instances")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise InputError("file not found", path=str(path)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the file: {exc}", path=str(path)) from exc
    # Lines end at "\n" only: str.splitlines() would also cut at U+2028, U+0085 and other
    # separators that JSON allows unescaped inside a string, breaking valid lines in two.
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES or len(line.encode("utf-8", "surrogatepass")) > MAX_LINE_BYTES:
            raise InputError(f"the line is longer than {MAX_LINE_BYTES // 1024} KiB", path=str(path), line=lineno,
                             hint="a task must fit in a prompt; shorten it or split the instance")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", path=str(path),
                             line=lineno) from exc
        except RecursionError as exc:
            raise InputError("the JSON is nested too deeply", path=str(path), line=lineno) from exc
        except ValueError as exc:  # an integer beyond Python's int <-> str limit (4,300 digits)
            raise InputError("a number is too long (more than 4,300 digits)", path=str(path), line=lineno,
                             hint="write it as a string if it must be that long") from exc
        if not isinstance(obj, dict):
            raise InputError(f"expected a JSON object, got {type(obj).__name__}", path=str(path), line=lineno)
        if not _encodable(line, obj):
            # "\ud800" escapes decode to lone surrogates, which no store, pipe or model can carry.
            raise InputError("a string holds an unpaired surrogate escape (such as \\ud800)", path=str(path),
                             line=lineno, hint="JSON strings must decode to valid Unicode text")
        yield lineno, obj


def _encodable(line: str, obj: Any) -> bool:
    if "\\u" not in line:
        return True  # the line itself came from UTF-8, so only escapes can make surrogates
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_header(obj: dict[str, Any], path: Path, lineno: int) -> _Header:
    def bad(message: str) -> InputError:
        return InputError(message, path=str(path), line=lineno, hint=f"header keys: {', '.join(_HEADER_KEYS)}")

    body = obj[HEADER_KEY]
    if len(obj) != 1 or not isinstance(body, dict):
        raise bad(f"the header must be {{{HEADER_KEY!r}: {{...}}}} and nothing else")
    unknown = sorted(set(body) - set(_HEADER_KEYS))
    if unknown:
        raise bad(f"unknown header keys {unknown}")
    for key in ("name", "description"):
        if key in body and not isinstance(body[key], str):
            raise bad(f"header {key!r} must be a string")
    spec = None
    if "scorer" in body:
        try:
            spec = scorers.check_spec(scorers.spec_from_json(body["scorer"]))
        except ConfigError as exc:
            raise InputError(exc.message, path=str(path), line=lineno, hint=exc.hint) from exc
        except (TypeError, AttributeError, ValueError) as exc:  # e.g. by_category "categories": [...]
            raise bad(f"the header's scorer is malformed ({type(exc).__name__}: {exc})") from exc
    declared = body.get("answer_form")
    if declared is not None:
        try:
            for form in (declared.values() if _per_category(declared) else [declared]):
                forms.AnswerForm.from_json(form)
        except (ValueError, AttributeError) as exc:
            raise bad(f"the header's answer_form is malformed: {exc}") from exc
    return _Header(name=body.get("name"), scorer=spec, description=body.get("description", ""),
                   answer_form=declared)


def _parse_instance(obj: dict[str, Any], path: Path, lineno: int) -> Instance:
    def bad(message: str, hint: str | None = None) -> InputError:
        return InputError(message, path=str(path), line=lineno, hint=hint)

    unknown = sorted(set(obj) - set(INSTANCE_KEYS))
    if unknown:
        raise bad(f"unknown keys {unknown}", hint=f"allowed: {', '.join(INSTANCE_KEYS)}; put extra data under 'fields'")
    for key in ("input", "target"):
        if key not in obj:
            raise bad(f"missing {key!r}", hint='each line needs {"input": ..., "target": ...}')
    target = _target_text(obj["target"])
    if not isinstance(obj["input"], str) or target is None:
        raise bad("'input' must be a string and 'target' a string or a number")
    for key in ("id", "category", "split"):
        if key in obj and (not isinstance(obj[key], str) or not obj[key]):
            raise bad(f"{key!r} must be a non-empty string")
    if obj.get("split") is not None and obj["split"] not in SPLITS:
        raise bad(f"split {obj['split']!r} is not one of {', '.join(SPLITS)}")
    if "fields" in obj and not isinstance(obj["fields"], dict):
        raise bad("'fields' must be a JSON object")
    choices = _choices(obj.get("choices"), target, bad)
    return Instance(id=obj.get("id", f"line-{lineno}"), input=obj["input"], target=target,
                    category=obj.get("category", "default"), choices=choices, split=obj.get("split"),
                    fields=dict(obj.get("fields", {})))


def _target_text(raw: Any) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return json.dumps(raw)
    return None


def _choices(raw: Any, target: str, bad: Callable[..., InputError]) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(c, str) for c in raw):
        raise bad("'choices' must be a list of at least two strings")
    if len(set(raw)) != len(raw):
        raise bad("'choices' has duplicates")
    if target not in raw:
        raise bad(f"target {target!r} is not one of the choices", hint="the target is the text of the right choice")
    return tuple(raw)


# ---------------------------------------------------------------- scorer checks

def _check_scorable(inst: Instance, spec: ScorerSpec, path: Path, lineno: int) -> None:
    """Fail at import, not mid-run, when this line cannot be scored by the suite's scorer."""
    try:
        concrete = scorers.resolve(inst, spec)
    except ConfigError as exc:
        raise InputError(exc.message, path=str(path), line=lineno, hint=exc.hint) from exc
    if concrete.kind == "numeric" and scorers.parse_number(inst.target) is None:
        raise InputError(f"target {inst.target!r} is not a number, but the scorer is numeric",
                         path=str(path), line=lineno)
    if concrete.kind == "multiple_choice" and not inst.choices:
        raise InputError("the scorer is multiple_choice but this line has no 'choices'", path=str(path), line=lineno)
    if concrete.kind == "regex" and not isinstance(concrete.options.get("pattern"), str):
        raise InputError("the regex scorer needs a 'pattern' option", path=str(path), line=lineno)
    # Score the target and an empty answer once now: a bad option (a regex that does not compile,
    # a tolerance that is not a number, aliases that are not a map) fails the import, not the run.
    for probe in (inst.target, ""):
        try:
            scorers.score(probe, inst, spec)
        except ConfigError as exc:
            raise InputError(exc.message, path=str(path), line=lineno, hint=exc.hint) from exc
        except Exception as exc:  # noqa: BLE001 - any crash of the scorer is this line's problem
            raise InputError(f"the scorer cannot score this line ({type(exc).__name__}: {exc})",
                             path=str(path), line=lineno, hint="check the scorer's options") from exc

"""Answer forms: what shape a correct answer takes, as a property of a suite's category.

A form is declared (a JSONL header's or line's `answer_form`) or inferred once per category from
the train split: the options the instances list, the scorer's kind and the targets themselves.
`attach_forms` writes it into every instance's `fields["answer_form"]`, so harness code, the
failure taxonomy and the repair operators all read the same form instead of guessing it from the
wording of a question ("is 17 prime?" holds a digit but wants yes or no).

Kinds (`KINDS`):
- `choice` — one of the listed options (by letter or text), or, with `labels` and no options,
  one of a closed set of labels the targets use ("valid", "invalid");
- `yes_no`, `true_false` — those two words, as options or as free targets;
- `integer`, `decimal` — a number, with `unit` when every target carries the same one;
- `list` — several items: bracketed (`[1, 2]`, `bracketed`) or words separated by spaces;
- `json` — a JSON object;
- `text` — free text, compared exactly or normalised by the scorer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ecdysis.errors import InputError
from ecdysis.records import Instance, ScorerSpec
from ecdysis.suites.scorers import NUMBER_WORDS

KINDS = ("choice", "yes_no", "true_false", "integer", "decimal", "list", "json", "text")
FIELD = "answer_form"
MAX_LABELS = 12

_NUMBER_UNIT = re.compile(r"(?P<pre>[$\u20ac\u00a3]?)\s*(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+)"
                          r"\s*(?P<unit>%|[A-Za-z\u00b0][A-Za-z\u00b0/]{0,11})?\.?")
_WORDS = re.compile(r"[^\W\d_]+(?:['-][^\W\d_]+)*")


@dataclass(frozen=True)
class AnswerForm:
    kind: str = "text"
    labels: tuple[str, ...] = ()
    unit: str = ""
    bracketed: bool = False
    declared: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.labels:
            out["labels"] = list(self.labels)
        if self.unit:
            out["unit"] = self.unit
        if self.bracketed:
            out["bracketed"] = True
        if self.declared:
            out["declared"] = True
        return out

    @staticmethod
    def from_json(data: Any) -> "AnswerForm":
        """A form from its JSON (a dict) or a bare kind name, as a suite declares it."""
        if isinstance(data, str):
            data = {"kind": data}
        if not isinstance(data, Mapping) or data.get("kind") not in KINDS:
            raise ValueError(f"an answer form is one of {', '.join(KINDS)} (or {{'kind': ...}}), not {data!r}")
        labels = data.get("labels") or ()
        if not isinstance(labels, (list, tuple)) or not all(isinstance(x, str) for x in labels):
            raise ValueError("an answer form's labels must be a list of strings")
        return AnswerForm(kind=str(data["kind"]), labels=tuple(labels), unit=str(data.get("unit") or ""),
                          bracketed=bool(data.get("bracketed")), declared=bool(data.get("declared")))

    def describe(self) -> str:
        """A few words for listings: "choice (4 options)", "integer (km)", "yes_no"."""
        extra = f"{len(self.labels)} labels" if self.labels else self.unit or ("bracketed" if self.bracketed else "")
        return f"{self.kind} ({extra})" if extra else self.kind


def number_and_unit(text: str) -> tuple[float, str] | None:
    """(value, unit) when the whole text is one number with an optional unit ("$12", "7 km",
    "3.5%", "three"), else None; a currency sign counts as the unit."""
    word = text.strip().casefold().rstrip(".")
    if word in NUMBER_WORDS:
        return float(NUMBER_WORDS[word]), ""
    m = _NUMBER_UNIT.fullmatch(text.strip())
    if not m:
        return None
    try:
        value = float(m.group("num").replace(",", ""))
    except ValueError:
        return None
    return value, (m.group("pre") or m.group("unit") or "").lower()


def _json_value(text: str) -> Any:
    text = text.strip()
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except ValueError:
        try:  # BIG-bench writes lists the Python way: ['a', 'b']
            return json.loads(text.replace("'", '"'))
        except ValueError:
            return None


def infer_form(instances: Sequence[Instance], scorer_kind: str = "exact") -> AnswerForm:
    """The form of one category's answers, from its options, scorer kind and targets."""
    if not instances:
        return AnswerForm()
    options = {o.strip().casefold().rstrip(".") for i in instances for o in (i.choices or ())}
    if any(i.choices for i in instances):
        if options <= {"yes", "no"}:
            return AnswerForm("yes_no")
        if options <= {"true", "false"}:
            return AnswerForm("true_false")
        return AnswerForm("choice")
    targets = [i.target.strip() for i in instances]
    values = [_json_value(t) for t in targets]
    if all(isinstance(v, list) for v in values):
        return AnswerForm("list", bracketed=True)
    if all(isinstance(v, (list, dict)) for v in values):
        return AnswerForm("json")
    numbers = [number_and_unit(t) for t in targets]
    if scorer_kind == "numeric" or all(numbers):
        parsed = [n for n in numbers if n]
        units = {u for _, u in parsed}
        integral = all(v == int(v) for v, _ in parsed)
        return AnswerForm("integer" if integral else "decimal", unit=units.pop() if len(units) == 1 else "")
    lowered = {t.casefold().rstrip(".") for t in targets}
    if lowered <= {"yes", "no"}:
        return AnswerForm("yes_no")
    if lowered <= {"true", "false"}:
        return AnswerForm("true_false")
    if _drawn_from_input(instances):
        return AnswerForm("list")
    distinct = list(dict.fromkeys(targets))
    if (len(distinct) <= min(MAX_LABELS, max(2, len(targets) // 3))
            and all(len(t.split()) <= 3 and any(c.isalpha() for c in t) for t in distinct)):
        return AnswerForm("choice", labels=tuple(sorted(distinct, key=str.casefold)))
    return AnswerForm("text")


def _drawn_from_input(instances: Sequence[Instance]) -> bool:
    """Most targets are several words, each of them copied from the instance's input (a list to
    sort or filter), rather than prose of the target's own."""
    hits = 0
    for inst in instances:
        words = [w.casefold() for w in _WORDS.findall(inst.target)]
        given = {w.casefold() for w in _WORDS.findall(inst.input)}
        hits += len(words) >= 2 and all(w in given for w in words)
    return hits >= max(1, 0.8 * len(instances))


def declared_form(inst: Instance) -> AnswerForm | None:
    raw = inst.fields.get(FIELD)
    if raw is None:
        return None
    form = AnswerForm.from_json(raw)
    return replace(form, declared=True)


def attach_forms(instances: Iterable[Instance], scorer: ScorerSpec) -> list[Instance]:
    """The instances with `fields["answer_form"]` set per category: a declared form kept (checked),
    else the form inferred from the category's train instances (all of them when it has none)."""
    from ecdysis.suites.scorers import resolve

    items = list(instances)
    by_category: dict[str, list[Instance]] = {}
    for inst in items:
        by_category.setdefault(inst.category, []).append(inst)
    forms: dict[str, AnswerForm] = {}
    for category, members in by_category.items():
        try:
            declared = next((f for f in map(declared_form, members) if f is not None), None)
        except ValueError as exc:
            raise InputError(f"category {category!r}: {exc}") from exc
        if declared is not None:
            forms[category] = declared
            continue
        train = [i for i in members if i.split == "train"] or members
        forms[category] = infer_form(train, resolve(members[0], scorer).kind)
    return [replace(i, fields={**i.fields, FIELD: forms[i.category].to_json()}) for i in items]


def suite_forms(instances: Iterable[Instance]) -> dict[str, AnswerForm]:
    """category -> form of instances that went through `attach_forms`."""
    out: dict[str, AnswerForm] = {}
    for inst in instances:
        if inst.category not in out and FIELD in inst.fields:
            out[inst.category] = AnswerForm.from_json(inst.fields[FIELD])
    return out

"""The "Tool calls" view of an agent trajectory (an instance whose answer is function calls): the
calls read from the final answer, the calls the task expects and the checker's verdict, as rows.
No Streamlit here: the pages render these rows, and every value is the untrusted text it was."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ecdysis.failures import is_agent_instance
from ecdysis.records import Instance
from ecdysis.suites.bfcl import score_bfcl
from ecdysis.suites.calls import parse_calls


@dataclass(frozen=True)
class CallRow:
    """One call read from the answer: `listed` says whether the task offers that function (a
    name it does not list is one the model invented)."""

    function: str
    arguments: str   # the keyword arguments as JSON
    positional: str  # arguments given by position, as JSON ("" when none: the checker refuses them)
    listed: bool

    def to_row(self, number: int) -> dict[str, Any]:
        return {"#": number, "function": self.function, "listed by the task": "yes" if self.listed else "no",
                "arguments": self.arguments, "by position": self.positional}


@dataclass(frozen=True)
class ExpectedRow:
    """One parameter of one expected call and the values the checker accepts for it."""

    call: int        # 1-based: which expected call
    function: str
    parameter: str   # "" for a call that takes no parameter
    allowed: str     # the accepted values as JSON ("" among them means: may be left out)
    optional: bool

    def to_row(self) -> dict[str, Any]:
        return {"#": self.call, "function": self.function, "parameter": self.parameter or "—",
                "allowed values": self.allowed, "may be left out": "yes" if self.optional else "no"}


@dataclass(frozen=True)
class ToolCallsView:
    """What the checker saw in an agent's final answer and what it made of it.

    `calls` is None when the answer is not calls in JSON or Python syntax; `expected` is empty
    when no function applies (the right answer is then no call at all)."""

    calls: list[CallRow] | None
    expected: list[ExpectedRow]
    expected_calls: int
    correct: bool
    reason: str
    detail: str

    def call_rows(self) -> list[dict[str, Any]]:
        return [c.to_row(n) for n, c in enumerate(self.calls or [], 1)]

    def expected_rows(self) -> list[dict[str, Any]]:
        return [e.to_row() for e in self.expected]

    @property
    def positional(self) -> bool:
        return any(c.positional for c in self.calls or [])

    @property
    def verdict(self) -> str:
        """The checker's verdict in words: "correct", or its first broken rule and what broke it."""
        if self.correct:
            return "correct"
        rule = self.reason.replace("_", " ")
        return f"{rule}: {self.detail}" if self.detail else rule


def tool_calls_view(answer: str | None, instance: Instance) -> ToolCallsView | None:
    """The view of `answer` on `instance`, None when the instance is not an agent instance
    (`failures.is_agent_instance`). A suite whose target and function docs disagree raises the
    checker's `ConfigError`, as scoring did."""
    if not is_agent_instance(instance):
        return None
    text = answer or ""
    functions = [f for f in instance.fields.get("functions") or [] if isinstance(f, dict)]
    listed = {str(f.get("name")) for f in functions}
    read = parse_calls(text)
    calls = None if read is None else [
        CallRow(function=str(c.get("name")), arguments=as_json(c.get("arguments") or {}),
                positional=as_json(c["positional"]) if c.get("positional") else "",
                listed=str(c.get("name")) in listed)
        for c in read]
    expected = json.loads(instance.target)
    check = score_bfcl(text, instance)
    return ToolCallsView(calls=calls, expected=expected_rows(expected), expected_calls=len(expected),
                         correct=check.correct, reason=check.reason, detail=check.detail)


def expected_rows(expected: list[Any]) -> list[ExpectedRow]:
    """BFCL's possible answer ([{function: {parameter: [allowed values]}}]) one parameter a row."""
    rows: list[ExpectedRow] = []
    for number, want in enumerate(expected, 1):
        for function, parameters in (want.items() if isinstance(want, dict) else [("?", want)]):
            if not isinstance(parameters, dict) or not parameters:  # no parameter, or a shape BFCL never writes
                rows.append(ExpectedRow(number, str(function), "", "" if parameters == {} else as_json(parameters),
                                        False))
                continue
            for parameter, allowed in parameters.items():
                values = allowed if isinstance(allowed, list) else [allowed]
                rows.append(ExpectedRow(number, str(function), str(parameter),
                                        as_json([v for v in values if v != ""]), "" in values))
    return rows


def as_json(value: Any) -> str:
    """`value` as JSON text (characters kept as they are); what JSON cannot hold, such as a tuple as
    a dict key in a Python call, as its Python repr."""
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)

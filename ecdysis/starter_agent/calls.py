"""Function calls written by a model, read into plain data: `parse_calls` turns a reply into
[{"name": ..., "arguments": {...}}, ...] for the `bfcl_ast` scorer, and harness code may import it.

Standard library only and no engine imports, so a harness folder can carry a copy (the starter
agent's `calls.py` is one, kept equal by a test). Python call syntax is read with `ast` into
literal values and never evaluated: a reply is untrusted text.

What is read as calls (the whole reply, after stripping a surrounding ``` fence):

- JSON: a list of call objects, or one call object, or {"tool_calls": [...]}. A call object is
  {"name": N, "arguments": {...}} ("parameters" is read as "arguments"; arguments given as a JSON
  string are decoded; a "positional" list is kept), an OpenAI-style {"function": {"name": N,
  "arguments": ...}}, or BFCL's own shape {N: {...}}.
- One or more `<tool_call>{...}</tool_call>` blocks holding such objects (Qwen's chat format).
- Python: `f(a=1, b="x")`, `[f(a=1), g(b=2)]`, or calls separated by commas or newlines. Names may
  be dotted (`math.factorial`). Values are literals: numbers (a sign, and + - * / between numbers,
  as models write `2*60`), strings, True/False/None, lists, tuples and dicts of them. A bare name,
  an attribute or a nested call is kept as its source text, the way BFCL reads a value it cannot
  evaluate. Positional arguments are kept apart under "positional"; a checker decides what they mean.

`parse_calls` returns None for text that is not calls in one of these forms, [] for an empty
reply or an empty list. It never raises on any string.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

MAX_TEXT = 100_000   # longer replies are not read: the parser's cost grows with the text
MAX_DEPTH = 32       # nesting of values; deeper input is refused, not recursed into
MAX_NUMBER = 1e18    # arithmetic results past this are refused, so `9*9*9...` cannot grow without bound

_FENCE = re.compile(r"^```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)\n?```$", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
               ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


class _NotCalls(ValueError):
    """The text is not calls in any accepted form."""


def parse_calls(text: Any) -> list[dict[str, Any]] | None:
    """The calls in `text` as [{"name": str, "arguments": dict}] (plus "positional": list when a
    Python call passed arguments by position), [] when there are none, None when the text is not
    calls at all (prose, broken syntax, an unsupported expression, too long or too deep)."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        return None
    body = _unfenced(text.strip())
    if not body:
        return []
    try:
        return _parse(body)
    except (_NotCalls, SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        # Broken or hostile input of any shape is simply "not calls"; nothing in it ever runs.
        return None


def _unfenced(text: str) -> str:
    match = _FENCE.match(text)
    return match.group(1).strip() if match else text


def _parse(body: str) -> list[dict[str, Any]]:
    blocks = _TOOL_CALL.findall(body)
    if blocks:
        if _TOOL_CALL.sub("", body).strip():
            raise _NotCalls("text outside the <tool_call> blocks")
        return [call for block in blocks for call in _json_calls(json.loads(block))]
    if body[0] in "[{":
        try:
            data = json.loads(body)
        except ValueError:
            data = None  # "[f(a=1)]" starts like JSON but is Python
        if data is not None:
            return _json_calls(data)
    return _python_calls(body)


# ---------------------------------------------------------------- JSON

def _json_calls(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
        data = data["tool_calls"]
    items = data if isinstance(data, list) else [data]
    return [_json_call(item) for item in items]


def _json_call(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise _NotCalls("a call must be an object")
    if isinstance(item.get("function"), dict):
        item = item["function"]
    if isinstance(item.get("name"), str):
        raw = item.get("arguments", item.get("parameters", {}))
        if isinstance(raw, str):
            raw = json.loads(raw) if raw.strip() else {}
        if not isinstance(raw, dict):
            raise _NotCalls("arguments must be an object")
        _check_depth(raw, 0)
        call: dict[str, Any] = {"name": item["name"], "arguments": raw}
        if isinstance(item.get("positional"), list) and item["positional"]:
            _check_depth(item["positional"], 0)
            call["positional"] = item["positional"]  # as `calls_to_json` writes a Python call's
        return call
    if len(item) == 1:
        (name, raw), = item.items()
        if isinstance(raw, dict) and name not in ("name", "function", "arguments"):
            _check_depth(raw, 0)
            return {"name": name, "arguments": raw}
    raise _NotCalls("an object with no function name")


def _check_depth(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _NotCalls("nested too deeply")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        _check_depth(child, depth + 1)


# ---------------------------------------------------------------- Python syntax

def _python_calls(body: str) -> list[dict[str, Any]]:
    tree = ast.parse(body, mode="exec")
    calls: list[dict[str, Any]] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            raise _NotCalls("only expressions may appear")
        node = statement.value
        elements = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
        calls.extend(_python_call(e) for e in elements)
    return calls


def _python_call(node: ast.AST) -> dict[str, Any]:
    if not isinstance(node, ast.Call):
        raise _NotCalls("not a call")
    name = _dotted_name(node.func)
    if name is None:
        raise _NotCalls("the callee is not a plain or dotted name")
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _NotCalls("**arguments cannot be read")
        arguments[keyword.arg] = _value(keyword.value, 0)
    call: dict[str, Any] = {"name": name, "arguments": arguments}
    if node.args:
        call["positional"] = [_value(a, 0) for a in node.args]
    return call


def _dotted_name(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _value(node: ast.AST, depth: int) -> Any:
    """The literal a value node stands for; `_NotCalls` for anything that would need running."""
    if depth > MAX_DEPTH:
        raise _NotCalls("nested too deeply")
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, bool, int, float)):
            return node.value
        raise _NotCalls(f"unsupported constant {type(node.value).__name__}")
    if isinstance(node, ast.List):
        return [_value(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, depth + 1) for e in node.elts)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _NotCalls("**mapping cannot be read")
        keys = [_value(k, depth + 1) for k in node.keys]  # type: ignore[arg-type]
        if any(isinstance(k, (list, dict)) for k in keys):
            raise _NotCalls("unhashable dict key")
        return dict(zip(keys, (_value(v, depth + 1) for v in node.values)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _number(_value(node.operand, depth + 1))
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _arithmetic(node, depth)
    if isinstance(node, (ast.Name, ast.Attribute)) and _dotted_name(node) is not None:
        return _dotted_name(node)
    if isinstance(node, (ast.Call, ast.Subscript)):
        return ast.unparse(node)
    raise _NotCalls(f"unsupported expression {type(node).__name__}")


def _number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _NotCalls("arithmetic on something that is not a number")
    return value


def _arithmetic(node: ast.BinOp, depth: int) -> int | float:
    left = _number(_value(node.left, depth + 1))
    right = _number(_value(node.right, depth + 1))
    if abs(left) > MAX_NUMBER or abs(right) > MAX_NUMBER:
        raise _NotCalls("number too large")
    if isinstance(node.op, ast.Div) and right == 0:
        raise _NotCalls("division by zero")
    result = _ARITHMETIC[type(node.op)](left, right)
    if abs(result) > MAX_NUMBER:
        raise _NotCalls("number too large")
    return result


# ---------------------------------------------------------------- writing calls

def calls_to_json(calls: list[dict[str, Any]]) -> str:
    """The calls as a JSON list of {"name", "arguments"} objects (tuples become lists), with
    "positional" kept where a call has it, so reading the text back gives the same calls."""
    return json.dumps([{"name": c["name"], "arguments": c.get("arguments", {}),
                        **({"positional": c["positional"]} if c.get("positional") else {})} for c in calls],
                      ensure_ascii=False)


def calls_to_python(calls: list[dict[str, Any]]) -> str:
    """The calls as a Python list of keyword calls, `[f(a=1, b='x')]`, which `parse_calls` reads back."""
    rendered = []
    for call in calls:
        args = ", ".join(f"{k}={v!r}" for k, v in call.get("arguments", {}).items())
        rendered.append(f"{call['name']}({args})")
    return "[" + ", ".join(rendered) + "]"

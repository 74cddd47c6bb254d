"""Starter agent harness: present the function docs as tools, ask for the calls as a JSON list,
return the calls read from the reply as JSON text (the reply itself when it holds none).

Entry point: solve(task, model, harness) -> str. `task["fields"]["functions"]` holds the function
docs (name, description, parameters). `calls.py`, beside this file, reads calls written as JSON or
as Python calls; it is a copy of the engine's parser (ecdysis/suites/calls.py), so the scorer and
this harness read a reply the same way and the folder still runs on its own.
"""

import importlib.util
import json
import re

_FENCED = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)
_loaded = {}


def calls_module(harness):
    """calls.py from this harness's own folder (harness code is loaded from a file, not a package)."""
    path = harness.dir / "calls.py"
    if path not in _loaded:
        spec = importlib.util.spec_from_file_location("harness_calls", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[path] = module
    return _loaded[path]


def render_tools(functions):
    return "\n".join(json.dumps(f, ensure_ascii=False) for f in functions or [])


def build_messages(task, harness):
    variables = harness.task_variables(task)
    variables["tools"] = render_tools((task.get("fields") or {}).get("functions"))
    return [
        {"role": "system", "content": harness.render("system.md", **variables).strip()},
        {"role": "user", "content": harness.render("user.md", **variables).strip()},
    ]


def read_calls(text, calls):
    """The calls in the whole reply, else in a fenced block, else in the span from its first
    bracket to its last; None when no part of it reads as calls."""
    found = calls.parse_calls(text)
    if found is not None:
        return found
    candidates = _FENCED.findall(text)
    for opening, closing in (("[", "]"), ("{", "}")):
        start, end = text.find(opening), text.rfind(closing)
        if 0 <= start < end:
            candidates.append(text[start:end + 1])
    for candidate in candidates:
        found = calls.parse_calls(candidate)
        if found is not None:
            return found
    return None


def solve(task, model, harness):
    p = harness.params
    calls = calls_module(harness)
    messages = build_messages(task, harness)
    text = ""
    for attempt in range(1 + int(p.get("retries", 0))):
        reply = model.generate(messages, temperature=float(p.get("temperature", 0.0)),
                               max_tokens=int(p.get("max_tokens", 384)),
                               stop=list(p.get("stop", [])), seed=attempt)
        text = reply.text
        found = read_calls(text, calls)
        if found is not None:
            return calls.calls_to_json(found)
    return text.strip()

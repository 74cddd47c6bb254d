"""Starter agent harness: present the function docs as tools, ask for the calls as a JSON list,
return the calls read from the reply as JSON text (the reply itself when it holds none).

Entry point: solve(task, model, harness) -> str. `task["fields"]["functions"]` holds the function
docs (name, description, parameters). `calls.py`, beside this file, reads calls written as JSON or
as Python calls; it is a copy of the engine's parser (ecdysis/suites/calls.py), so the scorer and
this harness read a reply the same way and the folder still runs on its own.

A multi-turn task (its fields hold "turns" and "involved_classes", as in bfcl-multi_turn_base) is a
conversation: the environments are built from the task's initial state with `envs.py` (a copy of
ecdysis/suites/envs.py, which runs BFCL's classes from `fields["env_dir"]`), and each user turn is
answered in steps: the calls read from a reply run there, their results go back to the model, and
the turn ends when a reply holds no call or after `max_steps` replies. The answer is the record,
{"turns": [{"calls": [{"name", "arguments", "result", "status"}, ...], "steps", "stopped"}, ...],
"state"}, which the scorer replays.
"""

import importlib.util
import json
import re

_FENCED = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)
_loaded = {}


def own_module(harness, file_name):
    """A module from this harness's own folder (harness code is loaded from a file, not a package)."""
    path = harness.dir / file_name
    if path not in _loaded:
        spec = importlib.util.spec_from_file_location("harness_" + path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[path] = module
    return _loaded[path]


def calls_module(harness):
    """calls.py: reads the calls in a reply."""
    return own_module(harness, "calls.py")


def envs_module(harness):
    """envs.py: runs calls in BFCL's environments (multi-turn tasks)."""
    return own_module(harness, "envs.py")


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
    fields = task.get("fields") or {}
    if fields.get("turns") and fields.get("involved_classes"):
        return solve_turns(task, model, harness)
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


# ---------------------------------------------------------------- multi-turn tasks

def render_signatures(functions):
    """One line per function, `name(parameter: type, optional?: type): what it does`: the docs of
    a multi-turn task's classes as JSON would fill a small model's context on their own."""
    lines = []
    for doc in functions or []:
        parameters = doc.get("parameters") or {}
        required = set(parameters.get("required") or [])
        listed = ", ".join(f"{name}{'' if name in required else '?'}: {(spec or {}).get('type', 'any')}"
                           for name, spec in (parameters.get("properties") or {}).items())
        description = str(doc.get("description", "")).split("Tool description:", 1)[-1].strip()
        lines.append(f"{doc.get('name')}({listed}): {description}")
    return "\n".join(lines)


def turn_text(turn):
    return "\n\n".join(str(m.get("content", "")).strip() for m in turn
                        if isinstance(m, dict) and m.get("role") == "user")


def call_text(call):
    values = [repr(v) for v in call.get("positional") or []]
    values += [f"{k}={v!r}" for k, v in (call.get("arguments") or {}).items()]
    return f"{call['name']}({', '.join(values)})"


def solve_turns(task, model, harness):
    """A multi-turn task: per user turn, replies whose calls run in the environments and whose
    results go back, until one holds no call or `max_steps` replies; the record of it all."""
    p = harness.params
    calls, envs = calls_module(harness), envs_module(harness)
    fields = task["fields"]
    env = envs.Environment.create(fields["env_dir"], fields["involved_classes"], fields.get("initial_config"))
    variables = harness.task_variables(task)
    variables["tools"] = render_signatures(fields.get("functions"))
    messages = [{"role": "system", "content": harness.render("system_turns.md", **variables).strip()}]
    max_steps = int(p.get("max_steps", 8))
    shown = int(p.get("max_result_chars", 600))
    turns = []
    for turn in fields["turns"]:
        variables["input"] = turn_text(turn)
        messages.append({"role": "user", "content": harness.render("user.md", **variables).strip()})
        record = {"calls": [], "steps": 0, "stopped": "step_limit"}
        for _ in range(max_steps):
            reply = model.generate(messages, temperature=float(p.get("temperature", 0.0)),
                                   max_tokens=int(p.get("max_tokens", 384)), stop=list(p.get("stop", [])))
            record["steps"] += 1
            messages.append({"role": "assistant", "content": reply.text})
            found = read_calls(reply.text, calls)
            if not found:
                record["stopped"] = "no_call" if found == [] else "text"
                record["reply"] = reply.text.strip()[:300]
                break
            lines = []
            # The calls as the answer records them (JSON: tuples become lists), which is what the
            # scorer replays, so the run here and the replay there see the same values.
            for call in json.loads(calls.calls_to_json(found)):
                outcome = env.execute(call)
                record["calls"].append({**call, "result": outcome.result[:1000], "status": outcome.status})
                lines.append(f"{call_text(call)} -> {outcome.result[:shown]}")
            variables["results"] = "\n".join(lines)
            messages.append({"role": "user", "content": harness.render("results.md", **variables).strip()})
        turns.append(record)
    return json.dumps({"turns": turns, "state": env.state()}, ensure_ascii=False, default=str)

"""The generic repairs for agents that answer with function calls (the starter agent harness and any
harness built like it: `solve` returns the calls as JSON, `read_calls(text, calls)` reads a reply).

Each repair is general by construction: it reads the task's own function docs at run time, never an
instance, a function's name or a target, so it applies to any tool set.

- `call_format`: a strict reply format with one example, at the end of the user message;
- `call_parse_retry`: when a reply holds no readable calls, show the model its reply and ask again;
- `argument_coercion`: each argument converted to its declared type ("5" for an integer, a lone
  value for an array, "true" for a boolean);
- `no_tool_path`: say when to call nothing, and drop calls to functions the task does not list;
- `abstain_check`: a reply that calls nothing gets one second look against the listed functions;
- `step_budget`: a multi-turn agent's replies per user turn, doubled up to a ceiling;
- `call_schema`: a reply whose calls do not fit the docs is asked for again under a JSON schema made
  from them, which the embedded models decode as a grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ecdysis.roles.base import ModificationSpec
from ecdysis.roles.repairs import (CodeRepair, RepairInput, RepairResult, cluster_scope, marker, params_of,
                                  set_param)


def _append(code: str, name: str, block: str) -> str:
    return code.rstrip("\n") + "\n\n\n" + marker(name) + "\n" + block.strip("\n") + "\n"


def _for_calls(inp: RepairInput) -> str | None:
    """Why an agent repair does not fit the cluster (None when it does)."""
    if inp.cluster.failures and not any(f.shape == "calls" for f in inp.cluster.failures):
        return "the cluster's tasks are not answered with function calls"
    return None


@dataclass(frozen=True)
class _AgentCode(CodeRepair):
    """An agent repair that appends a block to harness.py rebinding `solve` around the previous one."""

    def unavailable(self, inp: RepairInput) -> str | None:
        return super().unavailable(inp) or _for_calls(inp)


@dataclass(frozen=True)
class CallFormat:
    name: str = "call_format"
    title: str = "Strict call format with one example"
    text: str = ("\n\nReply with one JSON list of calls and no other text, in this form (for an example "
                 "function with a text and a number parameter):\n"
                 '[{"name": "example_function", "arguments": {"city": "Paris", "days": 3}}]\n'
                 "Use only the functions listed above, with their exact names and parameter names. When the "
                 "request needs several calls, put them all in the list; when none of the functions does what "
                 "is asked, reply [].\n")

    def present(self, files: Mapping[str, str]) -> bool:
        return self.text.strip() in files.get("user.md", "")

    def unavailable(self, inp: RepairInput) -> str | None:
        if "user.md" not in inp.files:
            return "the harness has no user.md template to add the format to"
        return _for_calls(inp)

    def apply(self, inp: RepairInput) -> RepairResult:
        files = dict(inp.files)
        files["user.md"] = files["user.md"].rstrip("\n") + self.text
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("user.md",), operator=self.name,
            change="End the user message with the exact reply format: one JSON list of calls and nothing else, "
                   "one example of the form (an invented function), only the listed functions and parameter "
                   "names, every call the request needs in the one list, and [] when none applies.",
            root_cause=inp.root_cause or "Replies are not in a form the harness can read as calls.",
            expected_effect="More replies are a bare JSON list of calls; unparsable calls, invented parameter "
                            "names and missing further calls should drop.",
            risk="A small model may copy the example's function or values; a longer prompt.",
            scope=cluster_scope(inp.cluster) + "; the format and its example name no task and no listed function."))


@dataclass(frozen=True)
class CallParseRetry(_AgentCode):
    name: str = "call_parse_retry"
    title: str = "Re-ask when a reply holds no readable calls"
    needs: tuple[str, ...] = ("solve", "read_calls", "calls_module")

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# When a reply holds no readable calls, keep it in the conversation, say that it cannot be read as
# calls, and ask once more for the calls alone; `parse_retries` in harness.toml bounds it.
_ECD_CALL_REQUEST = ("That reply cannot be read as function calls. Reply again with only the JSON list of "
                     "calls, such as [{\\"name\\": \\"function_name\\", \\"arguments\\": {\\"parameter\\": \\"value\\"}}], "
                     "or [] when none of the functions applies.")


class _EcdCallRetryModel:
    def __init__(self, model, calls, retries):
        self._model, self._calls, self._retries = model, calls, retries

    def __getattr__(self, name):  # score and anything else it does not wrap
        return getattr(self._model, name)

    def generate(self, messages, **options):
        reply = self._model.generate(messages, **options)
        for _ in range(self._retries):
            if read_calls(reply.text, self._calls) is not None:
                break
            messages = list(messages) + [{"role": "assistant", "content": reply.text},
                                         {"role": "user", "content": _ECD_CALL_REQUEST}]
            reply = self._model.generate(messages, **options)
        return reply


_ecd_before_call_parse_retry = solve


def solve(task, model, harness):
    retries = int(harness.params.get("parse_retries", 1))
    wrapped = _EcdCallRetryModel(model, calls_module(harness), retries)
    return _ecd_before_call_parse_retry(task, wrapped, harness)
'''
        files = dict(inp.files)
        files["harness.py"] = _append(files["harness.py"], self.name, block)
        files["harness.toml"] = set_param(files["harness.toml"], "parse_retries", "1",
                                          "re-ask once when a reply holds no readable calls (call_parse_retry)")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py", "harness.toml"), operator=self.name,
            change="Wrap the model passed to solve: when a reply holds no readable calls, add it to the "
                   "conversation with a turn saying it cannot be read as calls and asking for the JSON list "
                   "alone, once.",
            root_cause=inp.root_cause or "A reply that is not calls is final; nothing asks again.",
            expected_effect="Prose or broken replies get a second, format-focused attempt; unparsable calls "
                            "should drop.",
            risk="One extra model call per unreadable reply; a model that cannot write the format fails twice.",
            scope=cluster_scope(inp.cluster) + "; the trigger is whether the reply reads as calls, for any task."))


@dataclass(frozen=True)
class ArgumentCoercion(_AgentCode):
    name: str = "argument_coercion"
    title: str = "Coerce arguments to their declared types"

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# Each argument of a listed function is converted to the type its schema declares, where the
# conversion is lossless: "5" -> 5 for an integer, 5.0 -> 5, "2.5" -> 2.5 for a float, "true" -> True,
# a number -> its text for a string, a JSON text -> the list or object, a lone value -> [value].
import json as _ecd_json

_ecd_before_argument_coercion = solve


def _ecd_coerce(value, spec):
    kind = str((spec or {}).get("type", ""))
    try:
        if kind == "integer":
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                return int(value.strip())
            if isinstance(value, float) and value.is_integer():
                return int(value)
        elif kind in ("float", "number"):
            if isinstance(value, str):
                return float(value.strip())
        elif kind == "boolean":
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
        elif kind == "string":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
        elif kind in ("array", "tuple"):
            if isinstance(value, str) and value.strip().startswith("["):
                value = _ecd_json.loads(value)
            if not isinstance(value, list):
                value = [value]
            return [_ecd_coerce(item, (spec or {}).get("items")) for item in value]
        elif kind in ("dict", "object"):
            if isinstance(value, str) and value.strip().startswith("{"):
                return _ecd_json.loads(value)
    except ValueError:
        pass
    return value


def solve(task, model, harness):
    answer = _ecd_before_argument_coercion(task, model, harness)
    try:
        calls = _ecd_json.loads(answer)
    except (TypeError, ValueError):
        return answer
    if not isinstance(calls, list):
        return answer
    docs = {f.get("name"): f for f in (task.get("fields") or {}).get("functions") or [] if isinstance(f, dict)}
    for call in calls:
        doc = docs.get(call.get("name")) if isinstance(call, dict) else None
        arguments = call.get("arguments") if doc else None
        if not isinstance(arguments, dict):
            continue
        properties = (doc.get("parameters") or {}).get("properties") or {}
        for parameter, value in list(arguments.items()):
            if parameter in properties:
                arguments[parameter] = _ecd_coerce(value, properties[parameter])
    return _ecd_json.dumps(calls, ensure_ascii=False)
'''
        files = dict(inp.files)
        files["harness.py"] = _append(files["harness.py"], self.name, block)
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py",), operator=self.name,
            change="Wrap solve: convert each argument of a listed function to its declared type where that "
                   "loses nothing (numbers written as text, a lone value for an array, JSON written as text).",
            root_cause=inp.root_cause or "Arguments arrive with the right value in the wrong type.",
            expected_effect="Wrong-type arguments whose value is right become right; values stay as written.",
            risk="A value the schema types loosely may be converted where the answer kept it as written.",
            scope=cluster_scope(inp.cluster) + "; the conversion reads only the task's own function schemas."))


@dataclass(frozen=True)
class NoToolPath(_AgentCode):
    name: str = "no_tool_path"
    title: str = "A path for when no function applies"
    text: str = ("\n\nBefore calling anything, check that one of the listed functions really does what is asked. "
                 "If none does, reply with [] alone: do not invent a function, and do not call one that "
                 "does something else.\n")

    def unavailable(self, inp: RepairInput) -> str | None:
        if "system.md" not in inp.files:
            return "the harness has no system.md prompt to add the rule to"
        return super().unavailable(inp)

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# Calls to a function the task does not list cannot be right: they are dropped, and a reply whose
# every call was invented becomes [] (no call).
import json as _ecd_json_tools

_ecd_before_no_tool_path = solve


def solve(task, model, harness):
    answer = _ecd_before_no_tool_path(task, model, harness)
    try:
        calls = _ecd_json_tools.loads(answer)
    except (TypeError, ValueError):
        return answer
    if not isinstance(calls, list):
        return answer
    listed = {f.get("name") for f in (task.get("fields") or {}).get("functions") or [] if isinstance(f, dict)}
    kept = [c for c in calls if isinstance(c, dict) and c.get("name") in listed]
    return answer if len(kept) == len(calls) else _ecd_json_tools.dumps(kept, ensure_ascii=False)
'''
        files = dict(inp.files)
        files["system.md"] = files["system.md"].rstrip("\n") + self.text
        files["harness.py"] = _append(files["harness.py"], self.name, block)
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("system.md", "harness.py"), operator=self.name,
            change="Tell the model to check that a listed function does what is asked and to reply [] when "
                   "none does; in solve, drop calls to functions the task does not list.",
            root_cause=inp.root_cause or "The model calls a function where none applies, or invents one.",
            expected_effect="Invented functions disappear from answers; more requests no function serves "
                            "get no call.",
            risk="A model told it may abstain may abstain where a call was needed.",
            scope=cluster_scope(inp.cluster) + "; the rule and the filter read only the task's own function list."))


@dataclass(frozen=True)
class AbstainCheck(_AgentCode):
    name: str = "abstain_check"
    title: str = "A second look before calling nothing"
    needs: tuple[str, ...] = ("solve", "read_calls", "calls_module")

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# A reply that calls nothing is kept in the conversation and the model is asked once to check it
# against the listed functions: it calls one if one does what is asked, else replies [] again.
_ECD_ABSTAIN_REQUEST = ("You called no function. Read the request and the listed functions again. If one of "
                        "them does what is asked, reply with the JSON list of calls; if none does, reply [] again.")


class _EcdAbstainCheckModel:
    def __init__(self, model, calls):
        self._model, self._calls = model, calls

    def __getattr__(self, name):  # score and anything else it does not wrap
        return getattr(self._model, name)

    def generate(self, messages, **options):
        reply = self._model.generate(messages, **options)
        if read_calls(reply.text, self._calls) == []:
            messages = list(messages) + [{"role": "assistant", "content": reply.text},
                                         {"role": "user", "content": _ECD_ABSTAIN_REQUEST}]
            reply = self._model.generate(messages, **options)
        return reply


_ecd_before_abstain_check = solve


def solve(task, model, harness):
    return _ecd_before_abstain_check(task, _EcdAbstainCheckModel(model, calls_module(harness)), harness)
'''
        files = dict(inp.files)
        files["harness.py"] = _append(files["harness.py"], self.name, block)
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py",), operator=self.name,
            change="Wrap the model passed to solve: when a reply calls no function, keep it in the conversation "
                   "and ask once to check it against the listed functions, calling one if one does what is "
                   "asked and replying [] again otherwise.",
            root_cause=inp.root_cause or "The model calls nothing where a listed function does what is asked.",
            expected_effect="Requests a listed function serves stop going unanswered; missing calls should drop.",
            risk="One extra model call per reply that calls nothing; a request no function serves may be "
                 "answered with a call on the second look (irrelevance), which the paired gate must weigh.",
            scope=cluster_scope(inp.cluster) + "; the trigger is an empty list of calls, for any task."))


@dataclass(frozen=True)
class CallSchema(_AgentCode):
    name: str = "call_schema"
    title: str = "Ask again under the functions' own schema"
    needs: tuple[str, ...] = ("solve", "read_calls", "calls_module")

    BLOCK = '''# A reply whose calls do not fit the task's own function docs (it reads as no calls at all, or calls
# a function the task does not list, or leaves out a required parameter, or names one the function
# does not have) is asked for once more, under a JSON schema made from those docs: a list of calls,
# each naming a listed function with its parameters typed as declared (BFCL's "dict" and "float"
# read as JSON's "object" and "number", enums kept). The embedded models turn the schema into a
# sampling grammar, so the second reply fits by construction; [] stays possible. A reply that fits
# is kept as written: the grammar allows less whitespace than a model writes when it lays a list
# out on several lines, and forced into one line Qwen 0.5B closed lists early. A backend that
# cannot follow a schema raises, and the first reply stands. Multi-turn tasks are left as they were.
# Before asking again, the model's own view of whether any call is due is read from its
# log-probabilities (`call_schema_judge` in harness.toml): how much the request raises "[]" as its
# whole reply, and the start of a call to each listed function, over the same prompt with the
# request replaced by "N/A". Where it raises "[]" more than any call, the reply is [] and nothing is
# generated again: a schema always yields a call's shape, so a reply that called nothing in its own
# words (prose where no function applies) would otherwise become a call. Uncalibrated, "[]" was
# likelier nearly everywhere: a call's start has more tokens.
import json as _ecd_json
import math as _ecd_math

import harness_runtime as _ecd_runtime

_ecd_before_call_schema = solve

_ECD_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_ECD_MAX_OPTIONS, _ECD_MAX_OPTION_CHARS = 64, 2000  # what one scoring call weighs


def _ecd_value_schema(spec, depth=0):
    if not isinstance(spec, dict) or depth > 6:
        return {}
    kind = _ECD_SCHEMA_TYPES.get(str(spec.get("type", "")), str(spec.get("type", "")))
    if kind not in ("object", "number", "array", "string", "integer", "boolean"):
        return {}  # "any", or a type JSON schema does not know: any value
    out = {"type": kind}
    if isinstance(spec.get("enum"), list) and spec["enum"] and kind in ("string", "integer", "number"):
        out["enum"] = list(spec["enum"])
    if kind == "array" and isinstance(spec.get("items"), dict):
        out["items"] = _ecd_value_schema(spec["items"], depth + 1)
    if kind == "object" and isinstance(spec.get("properties"), dict) and spec["properties"]:
        out["properties"] = {str(k): _ecd_value_schema(v, depth + 1) for k, v in spec["properties"].items()}
        out["required"] = [str(r) for r in spec.get("required") or [] if r in spec["properties"]]
    return out


def _ecd_listed(functions):
    return [doc for doc in functions or [] if isinstance(doc, dict) and doc.get("name")]


def ecd_call_schema(functions):
    """The schema of a reply that is a JSON list of calls to `functions`, or None when the task
    lists none."""
    kinds = []
    for doc in _ecd_listed(functions):
        parameters = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
        arguments = _ecd_value_schema({**parameters, "type": "dict"})
        arguments.setdefault("properties", {})
        arguments["additionalProperties"] = False
        kinds.append({"type": "object", "properties": {"name": {"const": str(doc["name"])}, "arguments": arguments},
                      "required": ["name", "arguments"], "additionalProperties": False})
    if not kinds:
        return None
    return {"type": "array", "items": kinds[0] if len(kinds) == 1 else {"anyOf": kinds}}


def ecd_calls_fit(found, functions):
    """Whether calls read from a reply (None: it held none) name listed functions with their
    required parameters and no others."""
    if found is None:
        return False
    docs = {str(doc["name"]): doc.get("parameters") or {} for doc in _ecd_listed(functions)}
    for call in found:
        parameters = docs.get(call.get("name"))
        arguments = call.get("arguments")
        if parameters is None or call.get("positional") or not isinstance(arguments, dict):
            return False
        declared = parameters.get("properties") or {}
        if any(k not in declared for k in arguments) or any(r not in arguments for r in parameters.get("required") or []):
            return False
    return True


def _ecd_blanked(messages, request):
    """`messages` with the task's request replaced by "N/A" in every user message that holds it, so
    that what a harness adds around it (a format instruction, a follow-up asking again) is on both
    sides of the comparison; where no user message holds it, the last user message whole. None
    without a user message."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return None
    request = request.strip() if isinstance(request, str) else ""
    holding = [i for i in users if request and isinstance(messages[i].get("content"), str)
               and request in messages[i]["content"]]
    if holding:
        return [dict(m, content=m["content"].replace(request, "N/A")) if i in holding else m
                for i, m in enumerate(messages)]
    return [dict(m, content="N/A") if i == users[-1] else m for i, m in enumerate(messages)]


def ecd_calls_nothing(model, messages, functions, request=None):
    """Whether the request moves the model towards calling nothing: "[]" as its whole reply, and the
    start of a call to each listed function ('[{"name": "<f>"'), scored on `messages` and again
    with the task's `request` replaced by "N/A" (`_ecd_blanked`). A model that starts a call
    whatever is asked (a call's start is likelier than "[]" for any request) says nothing by it;
    what counts is how much this request raises the likeliest call against calling nothing. False,
    so the schema decides, when the backend cannot score (remote chat APIs give no
    log-probabilities), when the functions are too many or their names too long to score
    (`_ECD_MAX_OPTIONS`, `_ECD_MAX_OPTION_CHARS`), or when a score is not a finite number."""
    starts = list(dict.fromkeys('[{"name": ' + _ecd_json.dumps(str(doc["name"]), ensure_ascii=False)
                                for doc in _ecd_listed(functions)))
    options = ["[]"] + starts
    if len(options) > _ECD_MAX_OPTIONS or any(len(o) > _ECD_MAX_OPTION_CHARS for o in options):
        return False
    blank = _ecd_blanked(messages, request)
    if blank is None:
        return False
    try:
        asked, prior = model.score(messages, options), model.score(blank, options)
        if len(asked.logprobs) != len(options) or len(prior.logprobs) != len(options):
            return False
        shift = [float(a) - float(b) for a, b in zip(asked.logprobs, prior.logprobs)]
    except (AttributeError, TypeError, ValueError, _ecd_runtime.ModelCallError):
        return False
    if not all(_ecd_math.isfinite(x) for x in shift):
        return False
    return shift[0] > max(shift[1:])


def _ecd_on(value):
    """A harness.toml switch: true, or a string an edit may have written ("true", "yes", "1")."""
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"))


class _EcdSchemaModel:
    def __init__(self, model, calls, functions, schema, judge, request):
        self._model, self._calls, self._functions, self._schema = model, calls, functions, schema
        self._judge, self._request = judge, request

    def __getattr__(self, name):  # score and anything else it does not wrap
        return getattr(self._model, name)

    def generate(self, messages, **options):
        reply = self._model.generate(messages, **options)
        if ecd_calls_fit(read_calls(reply.text, self._calls), self._functions):
            return reply
        if self._judge and ecd_calls_nothing(self._model, messages, self._functions, self._request):
            return _ecd_runtime.Reply(text="[]", finish_reason="stop",
                                      prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
        try:
            return self._model.generate(messages, schema=self._schema, **options)
        except (TypeError, _ecd_runtime.ModelCallError):  # no schemas here: the first reply stands
            return reply


def solve(task, model, harness):
    fields = task.get("fields") or {}
    schema = None if fields.get("turns") else ecd_call_schema(fields.get("functions"))
    if schema is None:
        return _ecd_before_call_schema(task, model, harness)
    judge = _ecd_on(harness.params.get("call_schema_judge", False))
    wrapped = _EcdSchemaModel(model, calls_module(harness), fields.get("functions"), schema, judge, task.get("input"))
    return _ecd_before_call_schema(task, wrapped, harness)
'''

    def apply(self, inp: RepairInput) -> RepairResult:
        files = dict(inp.files)
        files["harness.py"] = _append(files["harness.py"], self.name, self.BLOCK)
        files["harness.toml"] = set_param(files["harness.toml"], "call_schema_judge", "true",
                                          f"before asking again, [] if the request raises no call more than "
                                          f"calling nothing ({self.name})")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py", "harness.toml"), operator=self.name,
            change="Wrap the model passed to solve: a reply whose calls do not fit the task's function docs "
                   "(none readable, an unlisted function, a required parameter missing or an undeclared one) "
                   "is asked for once more under a JSON schema built from those docs (a list of calls to "
                   "listed functions with typed parameters; [] allowed), which the embedded models enforce "
                   "as a grammar, unless the model's log-probabilities say the request raises calling "
                   "nothing more than any call (then the reply is []). Replies that fit are kept as written.",
            root_cause=inp.root_cause or "Replies are not calls the harness can read: prose, broken JSON, "
                                         "invented functions or parameters.",
            expected_effect="Unparsable calls, invented functions and undeclared parameters give way to calls "
                            "that fit the docs; replies that already fit do not change.",
            risk="Up to three extra model calls per reply that does not fit (two scorings, one generation); "
                 "prose that rightly called nothing may still become a call, and a request a function serves "
                 "may be judged to need none.",
            scope=cluster_scope(inp.cluster) + "; the schema and the check are read from each task's own "
                  "function list at run time, never from an instance or a target."))


@dataclass(frozen=True)
class StepBudget:
    """A multi-turn agent's step limit (`max_steps` in harness.toml [params]: model replies per user
    turn), doubled up to a ceiling: the general repair for turns cut off while the calls go on."""

    name: str = "step_budget"
    title: str = "More steps per turn"
    ceiling: int = 16

    def present(self, files: Mapping[str, str]) -> bool:
        return f"({self.name})" in files.get("harness.toml", "")

    def unavailable(self, inp: RepairInput) -> str | None:
        steps = params_of(inp.files).get("max_steps")
        if not isinstance(steps, int):
            return "harness.toml [params] has no max_steps to raise"
        if steps >= self.ceiling:
            return f"max_steps is already at the ceiling of {self.ceiling}"
        return _for_calls(inp)

    def apply(self, inp: RepairInput) -> RepairResult:
        current = int(params_of(inp.files)["max_steps"])
        steps = min(self.ceiling, 2 * current)
        files = dict(inp.files)
        files["harness.toml"] = set_param(files["harness.toml"], "max_steps", str(steps),
                                          f"room for the calls a turn needs ({self.name})")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.toml",), operator=self.name,
            change=f"Raise max_steps, the model replies allowed per user turn, from {current} to {steps}.",
            root_cause=inp.root_cause or f"Turns are cut off at {current} steps while the model still calls.",
            expected_effect="Turns that needed more steps finish; step-limit failures should drop.",
            risk="A model that loops on a failing call loops longer, at one model call a step.",
            scope=cluster_scope(inp.cluster) + "; one limit for every turn of every task."))


AGENT_OPERATORS = (CallFormat(), CallParseRetry(), ArgumentCoercion(), NoToolPath(), AbstainCheck(), StepBudget(),
                   CallSchema())

# Which agent repairs address which agent failure type, best first.
AGENT_RANKING: dict[str, tuple[str, ...]] = {
    # A grammar made from the task's docs is the direct cure for a reply that is not calls: on 60
    # validation entries of bfcl-single_turn with Qwen 0.5B and SmolLM2, call_schema won 12 and lost
    # 2 (prose that rightly called nothing, made a call); call_format was screened out at net -9 on a
    # batch of the same suite (bench/results/bfcl_evolution.md).
    "unparsable_call": ("call_schema", "call_format", "call_parse_retry", "output_budget"),
    "wrong_argument": ("argument_coercion", "call_schema", "call_format"),
    "wrong_function": ("no_tool_path", "call_schema", "call_format"),
    "call_count": ("call_format", "abstain_check"),
    "irrelevant_call": ("no_tool_path", "call_format"),
    # Multi-turn tasks (the calls run in environments, turn by turn).
    "step_limit": ("step_budget", "call_format"),
    "stopped_early": ("call_format", "call_parse_retry", "abstain_check"),
    "env_error": ("call_format",),
}

"""Failure evidence: every failed instance of a run becomes one typed `Failure` with a short,
informative excerpt and a normalised signature text; aggregation (`aggregate.py`) clusters these.

The taxonomy is decided engine-side, where the target is known: the expected answer *shape*
(choice, number, boolean, word list, text) comes from the instance, never from harness code.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Sequence

from ecdysis.records import Instance, InstanceResult

FailureType = Literal["exception", "timeout", "crash", "model_error", "empty_output", "truncated",
                      "off_format", "invalid_choice", "wrong_answer",
                      "unparsable_call", "wrong_function", "call_count", "wrong_argument", "irrelevant_call",
                      "step_limit", "stopped_early", "env_error"]
# How an agent's function calls go wrong (instances that give function docs, scored by `bfcl_ast`):
# the checker's first broken rule (`suites.bfcl.CallCheck.reason`), folded into five types. Errors
# in harness code, timeouts and model-call errors keep the types above.
AGENT_TYPES: tuple[FailureType, ...] = ("unparsable_call", "wrong_function", "call_count", "wrong_argument",
                                        "irrelevant_call")
# What only a conversation of calls shows (multi-turn instances, scored by `bfcl_multi_turn`): a
# turn cut off at the harness's step limit, a turn ended before the task was done, a call the
# environment refused. Such an instance may also fail in the agent types above, where they fit.
MULTI_TURN_TYPES: tuple[FailureType, ...] = ("step_limit", "stopped_early", "env_error")
FAILURE_TYPES: tuple[FailureType, ...] = ("exception", "timeout", "crash", "model_error", "empty_output",
                                          "truncated", "off_format", "invalid_choice", "wrong_answer",
                                          *AGENT_TYPES, *MULTI_TURN_TYPES)
FAILURE_TITLES: dict[str, str] = {
    "exception": "harness exception", "timeout": "timeout", "crash": "harness process crash",
    "model_error": "model call error", "empty_output": "empty answer", "truncated": "truncated reply",
    "off_format": "off-format answer", "invalid_choice": "answer outside the choices",
    "wrong_answer": "wrong answer",
    "unparsable_call": "unparsable call", "wrong_function": "wrong or invented function",
    "call_count": "missing or extra call", "wrong_argument": "wrong argument value or type",
    "irrelevant_call": "a call where no function applies",
    "step_limit": "turn cut off at the step limit", "stopped_early": "turn ended before the task was done",
    "env_error": "a call the environment refused",
}
AnswerShape = Literal["choice", "number", "boolean", "word_list", "text", "calls"]

# The runner's error types, folded into the taxonomy: memory exhaustion kills the process like a
# crash does, and a wrong return type is an exception in harness code.
_ERROR_TO_TYPE: dict[str, FailureType] = {
    "exception": "exception", "bad_output": "exception", "timeout": "timeout", "memory": "crash",
    "crash": "crash", "model_error": "model_error",
}
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)?")
_NUMBER_FULL = re.compile(r"\s*[-+]?\$?\d[\d,]*(?:\.\d+)?\s*\.?\s*")
_BOOLEANS = {"true", "false", "yes", "no"}
_WORD = re.compile(r"[A-Za-z]+")
_TOKEN = re.compile(r"[A-Za-z]+|\d+")
# How many leading tokens make a signature: the opening of a reply carries its form ("Sure! Here
# is my answer:", "To solve this we"); later words are content, and with TF-IDF weighting a few
# rare content words would outweigh the shared opening and split one pattern into many clusters.
SIGNATURE_TOKENS = 6
_FRAME = re.compile(r'File "[^"]*?([^/"]+\.py)", line (\d+), in (\w+)')
EXCERPT_CHARS = 220
RAW_CHARS = 800  # of the reply kept with a failure; the full trajectory stays with the run


@dataclass(frozen=True)
class Failure:
    """One failed instance under one model and harness version: the unit that gets clustered.

    `excerpt` is what a human (or a role) reads first; `signature` is the normalised text that
    text similarity works on (numbers and words copied from the task input are masked, so two
    instances failing the same way look alike even though their questions differ)."""

    run_id: str
    suite: str
    instance_id: str
    category: str
    split: str | None
    model: str
    harness_version: str
    type: FailureType
    excerpt: str
    signature: str
    answer: str | None
    target: str
    shape: AnswerShape
    raw_output: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identifies the instance across models: the same question asked of two models."""
        return f"{self.suite}/{self.instance_id}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Failure":
        """Tolerant of reports stored by older versions: a field they lack takes a neutral value."""
        neutral: dict[str, Any] = {"run_id": "", "suite": "", "instance_id": "", "category": "", "split": None,
                                   "model": "", "harness_version": "", "type": "", "excerpt": "", "signature": "",
                                   "answer": None, "target": "", "shape": "text"}
        return Failure(**{**neutral, **{k: data[k] for k in Failure.__dataclass_fields__ if k in data}})


# The suite's answer form (`suites.forms`, in `fields["answer_form"]`) -> the taxonomy's shape.
_FORM_SHAPES: dict[str, AnswerShape] = {"choice": "choice", "yes_no": "boolean", "true_false": "boolean",
                                        "integer": "number", "decimal": "number", "list": "word_list",
                                        "json": "text", "text": "text"}


def answer_form(instance: Instance) -> dict[str, Any]:
    """The instance's declared or inferred answer form ({} when the suite was built without one)."""
    form = instance.fields.get("answer_form") or {}
    return {"kind": form} if isinstance(form, str) else dict(form)


def expected_shape(instance: Instance) -> AnswerShape:
    """The form a correct answer takes: the suite's answer form, else read off the instance."""
    if is_agent_instance(instance) or is_multi_turn_instance(instance):
        return "calls"
    kind = answer_form(instance).get("kind")
    if kind in _FORM_SHAPES:
        return "choice" if instance.choices else _FORM_SHAPES[kind]
    if instance.choices:
        return "choice"
    target = instance.target.strip()
    if _NUMBER_FULL.fullmatch(target):
        return "number"
    if target.lower() in _BOOLEANS:
        return "boolean"
    words = target.replace(",", " ").split()
    if len(words) >= 2 and all(_WORD.fullmatch(w) for w in words):
        return "word_list"
    return "text"


def mentions(text: str, phrase: str) -> bool:
    """Does `text` hold `phrase` as a whole: not inside a longer word or number ("plausible" is not
    in "implausible", 8 is not in "$288" or "8.5", "no" is not in "not")?"""
    phrase = phrase.strip()
    if not phrase:
        return False
    pattern = r"(?<![\w.])" if phrase[0].isalnum() else ""
    pattern += re.escape(phrase) + (r"(?!\w|[.,]\d)" if phrase[-1].isalnum() else "")
    return re.search(pattern, text, re.IGNORECASE) is not None


def _booleans(instance: Instance) -> set[str]:
    kind = answer_form(instance).get("kind")
    return {"yes", "no"} if kind == "yes_no" else {"true", "false"} if kind == "true_false" else _BOOLEANS


def letter_mentioned(text: str, letters: str) -> bool:
    """Is an option letter named as one: "(B)", "B.", "B)", "B:", a line of its own, or "answer is
    B"? A capital "A" used as an article ("A man walks") is not."""
    if not letters:
        return False
    span = f"[{letters}]"
    return re.search(rf"\({span}\)|\b{span}[.):](?!\w)|^\s*{span}\s*$|answer\W{{0,4}}(?:is\W{{0,3}})?{span}\b",
                     text, re.MULTILINE) is not None


def _letters(instance: Instance) -> list[str]:
    return [chr(ord("A") + i) for i in range(len(instance.choices or ()))]


def choice_index(answer: str, instance: Instance) -> int | None:
    """Which option an answer names: a letter ('B', '(B)', 'B.'), the option text, or 'B. text'."""
    text = answer.strip().strip(".").strip()
    options = [c.strip().lower() for c in instance.choices or ()]
    letter = re.fullmatch(r"\(?([A-Za-z])\)?[.):]?(?:\s+(.*))?", text)
    if letter:
        index = ord(letter.group(1).upper()) - ord("A")
        rest = (letter.group(2) or "").strip().lower().strip(".")
        if 0 <= index < len(options) and (not rest or rest == options[index]):
            return index
    lowered = text.lower()
    return options.index(lowered) if lowered in options else None


def conforms(answer: str, shape: AnswerShape, instance: Instance) -> bool:
    """Is the answer in the expected form (whether or not it is right)?"""
    text = answer.strip()
    if shape == "choice":
        return choice_index(text, instance) is not None
    if shape == "number":
        return bool(_NUMBER_FULL.fullmatch(text))
    if shape == "boolean":
        return text.lower().strip(".") in _booleans(instance)
    if shape == "word_list" and answer_form(instance).get("bracketed"):
        return bool(re.fullmatch(r"\[[^\[\]]*\]", text))
    if shape == "word_list":  # the same words, space-separated, in any order
        words = text.split()
        target_words = sorted(w.lower() for w in _WORD.findall(instance.target))
        return all(w.isalpha() for w in words) and sorted(w.lower() for w in words) == target_words
    # Free text: only an answer far longer than the target is off-format.
    return len(text.split()) <= 3 * len(instance.target.split()) + 5


def _shape_in_text(text: str, shape: AnswerShape, instance: Instance) -> bool:
    """Does a well-formed answer appear anywhere in the reply (so extraction could have found it)?"""
    if shape == "number":
        return bool(_NUMBER.search(text))
    if shape == "boolean":
        return any(mentions(text, word) for word in _booleans(instance))
    if shape == "choice":
        return letter_mentioned(text, "".join(_letters(instance))) or any(
            mentions(text, option) for option in instance.choices or ())
    if shape == "word_list":
        words = {w.lower() for w in _WORD.findall(instance.target)}
        return bool(words) and words <= {w.lower() for w in _WORD.findall(text)}
    return bool(text.strip())


def _squashed(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def prompt_omissions(result: InstanceResult, instance: Instance) -> list[str]:
    """What the suite states about the task that the first model call's prompt leaves out: its
    instruction (`task_prefix`), its options, its input."""
    if not result.calls:
        return []
    messages = (result.calls[0].request or {}).get("messages") or []
    prompt = _squashed(" ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict)))
    if not prompt:
        return []
    missing = []
    prefix = _squashed(instance.fields.get("task_prefix") or "")
    if prefix and prefix[:300] not in prompt:
        missing.append("the task's instruction (task_prefix)")
    if instance.choices and not all(_squashed(c) in prompt for c in instance.choices):
        missing.append("the options")
    if _squashed(instance.input)[:300] not in prompt:
        missing.append("the input")
    return missing


ECHO_SHARE = 0.6   # of a reply's word trigrams found in the task's own text: the reply echoes it
REPEATS = 3        # the same line (or 6-word phrase) this many times: the reply loops


def reply_mechanism(raw: str, instance: Instance) -> str:
    """How a reply that yields no answer goes wrong, read from its text alone: 'blank reply',
    'echoes the task' (most of its word trigrams are the task's input or options, copied back),
    'repeats itself' (one line or phrase over and over), else 'prose without an answer' (writing,
    reasoning or not, that stops before an answer). Two models cut at the same token limit for
    these different reasons need different repairs, so they are different clusters."""
    words = [w.lower() for w in _TOKEN.findall(raw)]
    if not words:
        return "blank reply"
    source = [w.lower() for w in _TOKEN.findall(" ".join([instance.input, *(instance.choices or ())]))]
    trigrams = list(zip(words, words[1:], words[2:]))
    known = set(zip(source, source[1:], source[2:]))
    if trigrams and sum(t in known for t in trigrams) / len(trigrams) >= ECHO_SHARE:
        return "echoes the task"
    lines = [" ".join(line.split()).lower() for line in raw.splitlines() if len(line.strip()) >= 8]
    phrases = [tuple(words[i:i + 6]) for i in range(0, max(0, len(words) - 5))]
    if any(n >= REPEATS for n in _counts(lines).values()) or any(n >= REPEATS for n in _counts(phrases).values()):
        return "repeats itself"
    return "prose without an answer"


def _counts(items: Sequence[Any]) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _clip(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def normalise(text: str, input_text: str, limit: int = SIGNATURE_TOKENS) -> str:
    """Signature text: the first `limit` lower-case tokens, with numbers -> `num`, a capital letter
    standing alone (an option letter) -> `letter`, other single characters dropped, and each run
    of words copied from the task input -> one `quoted` (they are the question's content, not the
    failure's form; that the reply copies them is form)."""
    content = {t.lower() for t in _TOKEN.findall(input_text)}
    out: list[str] = []
    for token in _TOKEN.findall(text):
        if token.isdigit():
            word = "num"
        elif len(token) == 1:
            if not token.isupper() or token == "I":  # "I" is the pronoun far more often than an option
                continue
            word = "letter"
        elif token.lower() in content:
            word = "quoted"
        else:
            word = token.lower()
        if not (word == "quoted" and out and out[-1] == "quoted"):
            out.append(word)
    return " ".join(out[:limit])


def _last_frame(trace: str) -> tuple[str, str, str] | None:
    """The innermost frame in harness code (file, line, function) from a traceback."""
    frames = [m for m in _FRAME.findall(trace) if m[0] not in ("harness_runtime.py", "harness_box.py")]
    return frames[-1] if frames else None


def classify(result: InstanceResult, instance: Instance) -> FailureType:
    """The failure type of a failed result (a correct result is not a failure)."""
    if result.error_type:
        return _ERROR_TO_TYPE.get(result.error_type, "exception")
    if is_multi_turn_instance(instance):
        return multi_turn_failure(result, instance).type
    if is_agent_instance(instance):
        return agent_failure(result, instance).type
    answer = (result.answer or "").strip()
    shape = expected_shape(instance)
    truncated = bool(result.calls) and result.calls[-1].finish_reason == "length"
    if not answer:
        return "truncated" if truncated else "empty_output"
    if conforms(answer, shape, instance):
        return "wrong_answer"
    if truncated:
        return "truncated"
    if shape == "choice" and len(answer.split()) <= 3 and not _shape_in_text(answer, shape, instance):
        return "invalid_choice"
    return "off_format"


def _error_evidence(result: InstanceResult, kind: FailureType) -> tuple[str, str, dict[str, Any]]:
    message = (result.error_message or kind).strip().splitlines()
    headline = message[-1] if message else kind
    frame = _last_frame(result.stdout_tail)
    where = f" at {frame[0]}:{frame[1]} in {frame[2]}()" if frame else ""
    excerpt = f"{_clip(headline, 140)}{where}; {len(result.calls)} model call(s) made"
    signature = normalise(f"{headline} in {frame[2]}" if frame else headline, "", limit=10) or kind
    detail = {"error_type": result.error_type, "error_message": (result.error_message or "")[:500],
              "location": list(frame) if frame else None}
    return excerpt, signature, detail


def _answer_evidence(result: InstanceResult, instance: Instance, kind: FailureType,
                     shape: AnswerShape) -> tuple[str, str, dict[str, Any]]:
    answer = (result.answer or "").strip()
    raw = result.raw_output
    last = result.calls[-1] if result.calls else None
    recoverable = _shape_in_text(raw, shape, instance)
    target_in_reply = mentions(raw, instance.target)
    detail: dict[str, Any] = {
        "finish_reason": last.finish_reason if last else None,
        "completion_tokens": last.completion_tokens if last else 0,
        "max_tokens": int((last.request or {}).get("max_tokens", 0)) if last else 0,
        "calls": len(result.calls), "shape_in_reply": recoverable, "target_in_reply": target_in_reply,
        "answer_words": len(answer.split()),
        "prompt_omits": prompt_omissions(result, instance),
    }
    if kind in ("truncated", "empty_output"):
        detail["mechanism"] = reply_mechanism(raw, instance)
    if kind == "wrong_answer":
        excerpt = f"answered {_clip(answer, 60)!r}, expected {_clip(instance.target, 60)!r}"
    elif kind == "empty_output":
        excerpt = f"empty answer from reply {_clip(raw, 100)!r}"
    elif kind == "truncated":
        excerpt = (f"reply cut at the token limit ({detail['completion_tokens']} tokens) before a "
                   f"{shape} answer: …{_clip(raw[-90:], 90)!r}")
    elif kind == "invalid_choice":
        excerpt = f"answer {_clip(answer, 40)!r} is not one of the options {', '.join(_letters(instance))}"
    else:
        found = "none appears in the reply"
        if recoverable:
            found = "the reply does contain one" + (" (the right one)" if target_in_reply else "")
        excerpt = f"answer {_clip(answer, 90)!r} is not a bare {shape}; {found}"
    basis = raw if kind in ("empty_output", "truncated") else answer
    signature = normalise(basis, instance.input) or "blank"
    return excerpt[:EXCERPT_CHARS], signature, detail


# ---------------------------------------------------------------- agent failures (function calls)

_AGENT_REASONS: dict[str, FailureType] = {
    "unparsable": "unparsable_call", "called_when_irrelevant": "irrelevant_call", "wrong_count": "call_count",
    "wrong_function": "wrong_function", "positional_arguments": "wrong_argument",
    "missing_required": "wrong_argument", "unexpected_parameter": "wrong_argument", "wrong_type": "wrong_argument",
    "wrong_value": "wrong_argument", "missing_parameter": "wrong_argument",
}
_CALL_START = re.compile(r"[\[{]|\b[A-Za-z_][\w.]*\(")
_FENCED = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)
_WRONG_TYPE = re.compile(r" is (\w+) .*, expected (\w+)$", re.DOTALL)


def is_agent_instance(instance: Instance) -> bool:
    """An instance whose answer is function calls: it gives function docs in fields["functions"]
    and its target is a JSON list of expected calls (the `bfcl_ast` scorer's contract). A
    multi-turn instance is not one (`is_multi_turn_instance`): its answer is a record of turns."""
    return (isinstance(instance.fields.get("functions"), list) and not is_multi_turn_instance(instance)
            and calls_target(instance.target))


def calls_target(target: str | None) -> bool:
    """Whether a target reads as a JSON list of expected calls (cheap enough to test on a stored
    result before any suite is loaded)."""
    text = (target or "").strip()
    if not text.startswith("["):
        return False
    try:
        return isinstance(json.loads(text), list)
    except ValueError:
        return False


@dataclass(frozen=True)
class AgentFailure:
    """How an agent's answer went wrong: the taxonomy type, the mechanism within it (what a
    repair works on), the checker's reason and detail, and the calls read from the answer."""

    type: FailureType
    mechanism: str
    reason: str
    check: str
    calls: list[dict[str, Any]] | None
    expected: int


def calls_in_text(text: str) -> bool:
    """Do readable calls appear in some part of the reply (a fenced block, or the span from its
    first bracket to its last), so that reading the reply harder would have found them?"""
    from ecdysis.suites.calls import parse_calls
    candidates = [text, *_FENCED.findall(text)]
    for opening, closing in (("[", "]"), ("{", "}")):
        start, end = text.find(opening), text.rfind(closing)
        if 0 <= start < end:
            candidates.append(text[start:end + 1])
    return any(parse_calls(c) for c in candidates)


def agent_failure(result: InstanceResult, instance: Instance) -> AgentFailure:
    """The agent failure type of an incorrect result on an agent instance (`is_agent_instance`)."""
    from ecdysis.suites.bfcl import score_bfcl
    from ecdysis.suites.calls import parse_calls
    answer = result.answer or ""
    calls = parse_calls(answer)
    check = score_bfcl(answer, instance)
    expected = len(json.loads(instance.target))
    functions = {str(f.get("name")) for f in instance.fields.get("functions") or [] if isinstance(f, dict)}
    kind = _AGENT_REASONS.get(check.reason, "wrong_argument" if not check.correct else "wrong_function")
    names = [str(c.get("name")) for c in calls or []]
    raw = result.raw_output
    if kind == "unparsable_call":
        truncated = bool(result.calls) and result.calls[-1].finish_reason == "length"
        if truncated:
            mechanism = "cut at the token limit"
        elif calls_in_text(raw):
            mechanism = "calls inside other text"
        elif _CALL_START.search(raw):
            mechanism = "broken call syntax"
        else:
            mechanism = reply_mechanism(raw, instance)
    elif kind in ("irrelevant_call", "wrong_function"):
        invented = [n for n in names if n not in functions]
        mechanism = "an invented function" if invented else "a listed function"
    elif kind == "call_count":
        mechanism = "no call" if not calls else "missing call" if len(calls) < expected else "extra call"
    else:
        mechanism = check.reason.replace("_", " ")
    return AgentFailure(kind, mechanism, check.reason, check.detail, calls, expected)


def _parameter_type(instance: Instance, where: str) -> str:
    """The schema type of "function.parameter" ("" when the docs do not say)."""
    name, _, param = where.rpartition(".")
    for doc in instance.fields.get("functions") or []:
        if isinstance(doc, dict) and doc.get("name") == name:
            spec = ((doc.get("parameters") or {}).get("properties") or {}).get(param) or {}
            return str(spec.get("type", "")) if isinstance(spec, dict) else ""
    return ""


def _agent_evidence(result: InstanceResult, instance: Instance) -> tuple[str, str, dict[str, Any]]:
    failure = agent_failure(result, instance)
    raw = result.raw_output
    last = result.calls[-1] if result.calls else None
    detail: dict[str, Any] = {
        "reason": failure.reason, "check": failure.check[:300], "mechanism": failure.mechanism,
        "calls_made": None if failure.calls is None else len(failure.calls), "calls_expected": failure.expected,
        "called": [str(c.get("name")) for c in failure.calls or []][:8],
        "finish_reason": last.finish_reason if last else None,
        "completion_tokens": last.completion_tokens if last else 0,
        "max_tokens": int((last.request or {}).get("max_tokens", 0)) if last else 0,
        "calls": len(result.calls), "shape_in_reply": calls_in_text(raw),
        "prompt_omits": prompt_omissions(result, instance),
    }
    # The signature says how the calls went wrong in words shared across tasks (never a function's
    # or a value's own name), so text similarity groups the same mechanism on different functions.
    words = [failure.mechanism]
    if failure.reason == "wrong_type":
        found = _WRONG_TYPE.search(failure.check)
        if found:
            words.append(f"{found.group(1)} given for {found.group(2)}")
    elif failure.reason == "wrong_value":
        where = failure.check.split(" = ", 1)[0]
        words.append(f"{_parameter_type(instance, where) or 'untyped'} parameter")
    elif failure.type == "unparsable_call":
        # The docs' words count as the task's own, so a function's name reads as `quoted`.
        words.append(normalise(raw, instance.input + " " + json.dumps(instance.fields.get("functions"))))
    signature = " ".join(w for w in words if w).strip() or failure.type
    shown = failure.check or failure.mechanism
    excerpt = f"{shown}; reply {_clip(raw, 100)!r}"
    return excerpt[:EXCERPT_CHARS], signature, detail


# ---------------------------------------------------------------- multi-turn agent failures

def is_multi_turn_instance(instance: Instance) -> bool:
    """An instance answered by a conversation of calls (the `bfcl_multi_turn` scorer's contract):
    its fields give the user turns and the environment classes the calls run in."""
    return isinstance(instance.fields.get("turns"), list) and isinstance(instance.fields.get("involved_classes"), list)


def _answer_turns(answer: str | None) -> list[dict[str, Any]]:
    """The harness's own record of each turn (how it stopped, its last reply), [] when unreadable."""
    try:
        data = json.loads(answer or "")
    except ValueError:
        return []
    turns = data.get("turns") if isinstance(data, dict) else None
    return [t if isinstance(t, dict) else {"calls": t} for t in turns] if isinstance(turns, list) else []


def _same_call(call: Any, written: str) -> bool:
    """Is a model's call the ground truth's call `written` (same name, same literal arguments)?"""
    from ecdysis.suites.calls import parse_calls
    want = (parse_calls(written) or [None])[0]
    if not isinstance(call, dict) or not isinstance(want, dict):
        return False
    norm = json.loads(json.dumps(want))
    return (call.get("name") == norm["name"] and (call.get("arguments") or {}) == norm.get("arguments", {})
            and list(call.get("positional") or []) == norm.get("positional", []))


def _call_names(written: Sequence[str]) -> list[str]:
    return [s.split("(", 1)[0].strip() for s in written]


def multi_turn_failure(result: InstanceResult, instance: Instance, check: Any = None) -> AgentFailure:
    """The failure type of an incorrect result on a multi-turn instance, read from the scorer's
    replay (`bfcl_multi_turn.score_multi_turn`) of the first turn that fails, in this order: the
    answer is no record of turns (unparsable_call); the replay did not finish (env_error); the turn
    ran into the harness's step limit (step_limit); a call named no function (wrong_function), took
    arguments its function does not (wrong_argument) or was refused by the environment (env_error);
    the turn holds no call (unparsable_call when the reply that ended it holds calls the harness
    could not read, else stopped_early); a call of the ground truth was never made (stopped_early),
    was made with other values (wrong_argument), or every one was made and an extra call changed
    the state (call_count). `check`: the scorer's verdict when the caller has it already."""
    if check is None:
        from ecdysis.suites.bfcl_multi_turn import score_multi_turn
        check = score_multi_turn(result.answer or "", instance)
    if check.correct:  # scored wrong before, right now: the environments or the scorer changed
        return AgentFailure("wrong_answer", "right on a second replay", "", "", [], 0)
    index = check.turn if check.turn is not None else 0
    replay = check.turns[index] if index < len(check.turns) else None
    calls = list(replay.calls) if replay else []
    written = list(replay.expected) if replay else []
    own = _answer_turns(result.answer)
    record = own[index] if index < len(own) else {}
    stopped = str(record.get("stopped", ""))
    statuses = list(replay.statuses) if replay else []

    def typed(kind: FailureType, mechanism: str) -> AgentFailure:
        return AgentFailure(kind, mechanism, check.reason, check.detail, calls, len(written))

    if check.reason == "unreadable_answer":
        return typed("unparsable_call", "the answer is no record of turns")
    if check.reason == "replay_failed":
        return typed("env_error", "the replay ran out of time or memory")
    erred = any(s != "ok" for s in statuses)
    if stopped == "step_limit":
        return typed("step_limit", "calls failing until the step limit" if erred else "calls until the step limit")
    for status, kind, mechanism in (("unknown", "wrong_function", "an invented function"),
                                    ("malformed", "wrong_function", "a call without a function"),
                                    ("bad_arguments", "wrong_argument", "arguments the function does not take"),
                                    ("raised", "env_error", "a call raised an error"),
                                    ("error", "env_error", "a call returned an error")):
        if status in statuses:
            return typed(kind, mechanism)
    if not calls and stopped == "text":  # the reply that ended the turn did not read as calls
        reply = str(record.get("reply", ""))
        if calls_in_text(reply):
            return typed("unparsable_call", "calls inside other text")
        if _CALL_START.search(reply):
            return typed("unparsable_call", "broken call syntax")
        return typed("stopped_early", "prose instead of calls")
    if not calls:
        return typed("stopped_early", "no call in the turn")
    names = [str(c.get("name")) if isinstance(c, dict) else "" for c in calls]
    if any(n not in names for n in _call_names(written)):
        return typed("stopped_early", "missing call")
    if not all(any(_same_call(c, w) for c in calls) for w in written):
        return typed("wrong_argument", "a value differs")
    return typed("call_count", "extra call")


def _multi_turn_evidence(result: InstanceResult, instance: Instance) -> tuple[str, str, dict[str, Any]]:
    from ecdysis.suites.bfcl_multi_turn import score_multi_turn
    check = score_multi_turn(result.answer or "", instance)
    failure = multi_turn_failure(result, instance, check)
    index = check.turn if check.turn is not None else 0
    replay = check.turns[index] if index < len(check.turns) else None
    own = _answer_turns(result.answer)
    record = own[index] if index < len(own) else {}
    errors = [r for r, s in zip(replay.results, replay.statuses) if s != "ok"] if replay else []
    last = result.calls[-1] if result.calls else None
    detail: dict[str, Any] = {
        "reason": failure.reason, "check": failure.check[:300], "mechanism": failure.mechanism,
        "turn": index, "turns": len(instance.fields.get("turns") or []), "turns_answered": len(own),
        "stopped": record.get("stopped"), "steps": record.get("steps"),
        "calls_made": len(failure.calls or []), "calls_expected": failure.expected,
        "called": [str(c.get("name")) if isinstance(c, dict) else "?" for c in failure.calls or []][:8],
        "errors": [e[:200] for e in errors[:3]],
        "finish_reason": last.finish_reason if last else None,
        "completion_tokens": last.completion_tokens if last else 0,
        "max_tokens": int((last.request or {}).get("max_tokens", 0)) if last else 0,
        "calls": len(result.calls), "shape_in_reply": calls_in_text(str(record.get("reply", ""))),
        "prompt_omits": prompt_omissions(result, instance),
    }
    # As for one-turn calls, the signature says how the turn went wrong in words shared across
    # tools; an environment's error reads with the task's words and the functions' names masked.
    words = [failure.mechanism]
    if failure.type == "env_error" and errors:
        names = " ".join(str(f.get("name")) for f in instance.fields.get("functions") or [] if isinstance(f, dict))
        words.append(normalise(errors[0].removeprefix("Error during execution: "), f"{instance.input} {names}"))
    signature = " ".join(w for w in words if w).strip() or failure.type
    where = f"turn {index + 1} of {detail['turns']}"
    excerpt = f"{where}: {failure.check or failure.mechanism}; {len(failure.calls or [])} call(s), stopped: " \
              f"{detail['stopped'] or '?'}"
    return excerpt[:EXCERPT_CHARS], signature, detail


def to_failure(result: InstanceResult, instance: Instance, *, suite: str, harness_version: str) -> Failure:
    kind = classify(result, instance)
    shape = expected_shape(instance)
    if kind in ("exception", "timeout", "crash", "model_error"):
        excerpt, signature, detail = _error_evidence(result, kind)
    elif is_multi_turn_instance(instance):
        excerpt, signature, detail = _multi_turn_evidence(result, instance)
    elif kind in AGENT_TYPES:
        excerpt, signature, detail = _agent_evidence(result, instance)
    else:
        excerpt, signature, detail = _answer_evidence(result, instance, kind, shape)
    return Failure(run_id=result.run_id, suite=suite, instance_id=result.instance_id, category=result.category,
                   split=instance.split, model=result.model, harness_version=harness_version, type=kind,
                   excerpt=excerpt, signature=signature, answer=result.answer, target=instance.target,
                   shape=shape, raw_output=result.raw_output[:RAW_CHARS], detail=detail)


def extract_failures(results: Sequence[InstanceResult], instances_by_id: Mapping[str, Instance],
                     harness_files: Mapping[str, str] | None = None, *, suite: str = "",
                     harness_version: str = "") -> list[Failure]:
    """One `Failure` per incorrect result, in input order. Results whose instance is unknown are
    skipped (a suite edited after the run cannot be scored honestly). `harness_files` is accepted
    so a caller can pass the version the run used; the version id is derived from it if not given."""
    if harness_files is not None and not harness_version:
        from ecdysis.harness import harness_id
        harness_version = harness_id(dict(harness_files))
    failures: list[Failure] = []
    for result in results:
        instance = instances_by_id.get(result.instance_id)
        if result.correct or instance is None:
            continue
        failures.append(to_failure(result, instance, suite=suite, harness_version=harness_version))
    return failures

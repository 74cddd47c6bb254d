"""The catalogue of generic repair operators the heuristic Proposer draws from: each is a small
named class that, given the harness files, a cluster and passing train exemplars, returns a
modification spec and the new files.

Operators are general by construction: they read the task's shape at run time (choices, a
True/False question, a list to sort, a quantity), never an instance id or a target. Code operators
append a marked block to harness.py that rebinds `extract_answer`, `build_messages` or `solve`
around the previous definition, so they compose in any order and each shows as one reviewable hunk.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from ecdysis.aggregate import Cluster
from ecdysis.roles.base import CaseFile, Draft, Exemplar, ModificationSpec

MARK = "# --- ecdysis operator: {name} ---"
HELPERS_MARK = "# --- ecdysis helpers: answer shapes ---"
FEWSHOT_FILE = "fewshot.jsonl"

# Shared by every code operator: what form the task's answer takes, whether a text already is a
# bare answer of that form, and where such an answer sits inside a longer reply.
HELPERS = HELPERS_MARK + r'''
# Read the answer's form from the task alone (choices, a list to sort, a True/False question,
# a quantity); a suite may also declare it as fields["answer_format"].
import re as _ecd_re

_ECD_SHAPES = ("choice", "word_list", "boolean", "number", "text")
_ECD_NUM = r"[-+]?\$?\d[\d,]*(?:\.\d+)?"


def ecd_answer_shape(task):
    declared = str((task.get("fields") or {}).get("answer_format", "")).lower()
    if declared in _ECD_SHAPES:
        return declared
    text = str(task.get("input", ""))
    if task.get("choices"):
        return "choice"
    if _ecd_re.search(r"\b(sort\w*|alphabeti\w*|dictionary order)\b", text, _ecd_re.I):
        return "word_list"
    if _ecd_re.search(r"\b(True|False)\b", text):
        return "boolean"
    if _ecd_re.search(r"\bhow (many|much|old|long|far)\b|\bnumber of\b|\d", text, _ecd_re.I):
        return "number"
    return "text"


def ecd_letters(task):
    return [chr(ord("A") + i) for i in range(len(task.get("choices") or []))]


def ecd_input_words(task):
    return {w.lower() for w in _ecd_re.findall(r"[A-Za-z]+", str(task.get("input", "")))}


def ecd_first_line(text):
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def ecd_bare(answer, task):
    """Is `answer` already nothing but an answer of the task's form?"""
    text = str(answer or "").strip()
    text = text[:-1].strip() if text.endswith(".") else text
    shape = ecd_answer_shape(task)
    if not text:
        return False
    if shape == "number":
        return bool(_ecd_re.fullmatch(_ECD_NUM + "%?", text))
    if shape == "boolean":
        return text.lower() in ("true", "false")
    if shape == "choice":
        letters = "".join(ecd_letters(task))
        options = [str(c).strip().lower() for c in task.get("choices") or []]
        return bool(_ecd_re.fullmatch(r"\(?[" + letters + r"]\)?[.):]?", text)) or text.lower() in options
    if shape == "word_list":
        words = text.split()
        return len(words) >= 2 and all(w.isalpha() and w.lower() in ecd_input_words(task) for w in words)
    return True


def _ecd_number(text):
    first = ecd_first_line(text)
    marked = _ecd_re.findall(r"answer\W{0,4}(?:is|=|:)?\W{0,3}(" + _ECD_NUM + ")", text, _ecd_re.I)
    numbers = _ecd_re.findall(_ECD_NUM, text)
    if _ecd_re.fullmatch(_ECD_NUM + r"\.?", first):
        found = first
    elif marked:
        found = marked[-1]
    elif numbers:
        found = numbers[-1]
    else:
        return ""
    return found.replace("$", "").rstrip(".,").replace(",", "")


def _ecd_boolean(text):
    marked = _ecd_re.findall(r"answer\W{0,4}(?:is|:)?\W{0,3}(true|false)\b", text, _ecd_re.I)
    found = marked or _ecd_re.findall(r"\b(true|false)\b", text, _ecd_re.I)
    return found[-1].capitalize() if found else ""


def _ecd_choice(text, task):
    letters = ecd_letters(task)
    if not letters:
        return ""
    span = "".join(letters)
    marked = _ecd_re.findall(r"answer\W{0,4}(?:is|:)?\W{0,3}\(?([" + span + r"])\b", text)
    if marked:
        return marked[-1]
    lowered, best, where = text.lower(), "", -1
    for letter, option in zip(letters, task.get("choices") or []):
        at = lowered.rfind(str(option).strip().lower()) if str(option).strip() else -1
        if at > where:
            best, where = letter, at
    if best:
        return best
    tagged = _ecd_re.findall(r"\(([" + span + r"])\)|^\s*([" + span + r"])[.):]", text, _ecd_re.M)
    return [a or b for a, b in tagged][-1] if tagged else ""


def _ecd_words(text, task):
    allowed = ecd_input_words(task)
    best = []
    for line in text.splitlines():
        words = _ecd_re.findall(r"[A-Za-z]+", line.rsplit(":", 1)[-1])
        if len(words) >= 2 and len(words) > len(best) and all(w.lower() in allowed for w in words):
            best = words
    items = [_ecd_re.sub(r"^\s*(\d+[.)]|[-*\u2022])\s*", "", line).strip().rstrip(".,")
             for line in text.splitlines()]
    listed = [w for w in items if w.isalpha() and w.lower() in allowed]
    return " ".join(listed if len(listed) > len(best) else best)


def ecd_find_answer(text, task):
    """The answer of the task's form found in a reply, or "" when there is none."""
    text = str(text or "")
    shape = ecd_answer_shape(task)
    if shape != "text" and ecd_bare(ecd_first_line(text), task):
        return ecd_first_line(text).rstrip(".").strip()
    if shape == "number":
        return _ecd_number(text)
    if shape == "boolean":
        return _ecd_boolean(text)
    if shape == "choice":
        return _ecd_choice(text, task)
    if shape == "word_list":
        return _ecd_words(text, task)
    return ""


def ecd_format_request(task):
    shape = ecd_answer_shape(task)
    wanted = {"number": "only the final number",
              "boolean": "only True or False",
              "choice": "only the letter of the correct option (" + ", ".join(ecd_letters(task)) + ")",
              "word_list": "only the words, in the required order, separated by single spaces",
              }.get(shape, "only the final answer")
    return "Reply with " + wanted + ", on one line, with no explanation."
'''


@dataclass(frozen=True)
class RepairInput:
    """What an operator sees: the current files, the cluster it repairs, the sanctioned exemplars,
    and the Investigator's root cause (quoted in the spec)."""

    files: Mapping[str, str]
    cluster: Cluster
    exemplars: Sequence[Exemplar] = ()
    root_cause: str = ""


@dataclass(frozen=True)
class RepairResult:
    operator: str
    files: dict[str, str]
    spec: ModificationSpec


class RepairOperator(Protocol):
    """A generic repair. `present(files)` says whether it is already in the harness;
    `unavailable(inp)` gives the reason it cannot apply (None when it can); `apply(inp)` returns
    the spec and the full new file set."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    def present(self, files: Mapping[str, str]) -> bool: ...

    def unavailable(self, inp: RepairInput) -> str | None: ...

    def apply(self, inp: RepairInput) -> RepairResult: ...


# ---------------------------------------------------------------- file editing helpers

def marker(name: str) -> str:
    return MARK.format(name=name)


def append_block(code: str, name: str, block: str) -> str:
    """harness.py with the shared helpers (once) and the operator's marked block at the end."""
    out = code.rstrip("\n") + "\n"
    if HELPERS_MARK not in out:
        out += "\n\n" + HELPERS.strip("\n") + "\n"
    return out + "\n\n" + marker(name) + "\n" + block.strip("\n") + "\n"


def set_param(toml_text: str, key: str, value: str, comment: str) -> str:
    """harness.toml with `key = value  # comment` in [params] (replaced or added), all else kept."""
    lines = toml_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "[params]"), None)
    entry = f"{key} = {value}  # {comment}"
    if start is None:
        return toml_text.rstrip("\n") + f"\n\n[params]\n{entry}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    for i in range(start + 1, end):
        if re.match(rf"\s*{re.escape(key)}\s*=", lines[i]):
            lines[i] = entry
            break
    else:
        insert_at = end
        while insert_at > start + 1 and not lines[insert_at - 1].strip():
            insert_at -= 1
        lines.insert(insert_at, entry)
    out = "\n".join(lines) + "\n"
    tomllib.loads(out)  # an operator must never write a harness.toml that does not parse
    return out


def params_of(files: Mapping[str, str]) -> dict[str, Any]:
    try:
        return dict(tomllib.loads(files.get("harness.toml", "")).get("params", {}))
    except tomllib.TOMLDecodeError:
        return {}


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^def {name}\(", code, re.M) is not None


def _cluster_scope(cluster: Cluster) -> str:
    cats = ", ".join(cluster.categories)
    models = ", ".join(cluster.models)
    return (f"The cluster spans {len(cluster.instances)} instances in {len(cluster.categories)} categories "
            f"({cats}) and {len(cluster.models)} model(s) ({models})")


@dataclass(frozen=True)
class _CodeOperator:
    """Base for operators that append a block to harness.py around one rebound function."""

    name: str = ""
    title: str = ""
    wraps: str = "extract_answer"

    def present(self, files: Mapping[str, str]) -> bool:
        return marker(self.name) in files.get("harness.py", "")

    def unavailable(self, inp: RepairInput) -> str | None:
        code = inp.files.get("harness.py", "")
        if not _defines(code, self.wraps):
            return f"harness.py defines no top-level {self.wraps}() to build on"
        return None


# ---------------------------------------------------------------- the operators

@dataclass(frozen=True)
class AnswerExtraction(_CodeOperator):
    name: str = "answer_extraction"
    title: str = "Shape-aware answer extraction"

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# Look for an answer of the task's form anywhere in the reply (an "answer is" phrase, the
# final number, an option letter or text, True/False, the listed words) and only then fall
# back to the previous extractor, instead of trusting the first line verbatim.
_ecd_before_answer_extraction = extract_answer


def extract_answer(text, task):
    return ecd_find_answer(text, task) or _ecd_before_answer_extraction(text, task)
'''
        files = dict(inp.files)
        files["harness.py"] = append_block(files["harness.py"], self.name, block)
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py",), operator=self.name,
            change="Wrap extract_answer: read the answer's form from the task (choices, list to sort, "
                   "True/False question, quantity) and pull an answer of that form from anywhere in the "
                   "reply before falling back to the first line.",
            root_cause=inp.root_cause or "The extractor returns the reply's first line verbatim.",
            expected_effect="Replies that contain a well-formed answer after some prose are scored on that "
                            "answer; off-format failures whose reply holds the answer should become correct.",
            risk="A reply that mentions several candidates may yield the wrong one (the last number, the "
                 "last option named); replies with no answer are unchanged.",
            scope=_cluster_scope(inp.cluster) + "; the rule reads only the task's form, never an instance "
                  "or its target, so it applies to unseen tasks of any suite."))


@dataclass(frozen=True)
class ChoiceMatching(_CodeOperator):
    name: str = "choice_matching"
    title: str = "Map free-text answers onto the options"

    def unavailable(self, inp: RepairInput) -> str | None:
        base = super().unavailable(inp)
        if base:
            return base
        if not any(f.shape == "choice" for f in inp.cluster.failures):
            return "none of the cluster's tasks has options to match"
        return None

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# On a multiple-choice task, an answer that is not an option letter is mapped to the option it
# is closest to (text similarity), or to the option the reply names; options are the only
# valid answers there.
from difflib import SequenceMatcher as _EcdMatcher

_ecd_before_choice_matching = extract_answer


def extract_answer(text, task):
    answer = _ecd_before_choice_matching(text, task)
    choices = [str(c) for c in task.get("choices") or []]
    if not choices or ecd_bare(answer, task):
        return answer
    scores = [_EcdMatcher(None, str(answer).lower(), c.lower()).ratio() for c in choices]
    best = max(range(len(choices)), key=lambda i: scores[i])
    if scores[best] >= 0.5:
        return ecd_letters(task)[best]
    return ecd_find_answer(text, task) or answer
'''
        files = dict(inp.files)
        files["harness.py"] = append_block(files["harness.py"], self.name, block)
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py",), operator=self.name,
            change="Wrap extract_answer: on tasks with options, map an answer that is not an option letter "
                   "to the most similar option (or the option the reply names) and return its letter.",
            root_cause=inp.root_cause or "Answers on multiple-choice tasks are passed through without being "
                                         "matched to the options.",
            expected_effect="Answers outside the allowed choices become one of the options; free-text "
                            "answers that paraphrase an option score as that option.",
            risk="A weak paraphrase may be mapped to the wrong option; tasks without options are unchanged.",
            scope=_cluster_scope(inp.cluster) + "; it applies to every task that has options, keyed on the "
                  "options the task itself lists."))


@dataclass(frozen=True)
class RetryOnUnparsable(_CodeOperator):
    name: str = "retry_unparsable"
    title: str = "Re-ask when the reply has no bare answer"
    wraps: str = "solve"

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# When a reply's first line is not a bare answer of the task's form, ask once more (the reply
# kept in the conversation) for the answer alone; `reask_retries` in harness.toml bounds it.
class _EcdReaskModel:
    def __init__(self, model, task, retries):
        self._model, self._task, self._retries = model, task, retries

    def generate(self, messages, **options):
        reply = self._model.generate(messages, **options)
        for _ in range(self._retries):
            if ecd_answer_shape(self._task) == "text" or ecd_bare(ecd_first_line(reply.text), self._task):
                break
            messages = list(messages) + [{"role": "assistant", "content": reply.text},
                                         {"role": "user", "content": ecd_format_request(self._task)}]
            reply = self._model.generate(messages, **options)
        return reply


_ecd_before_retry_unparsable = solve


def solve(task, model, harness):
    retries = int(harness.params.get("reask_retries", 1))
    return _ecd_before_retry_unparsable(task, _EcdReaskModel(model, task, retries), harness)
'''
        files = dict(inp.files)
        files["harness.py"] = append_block(files["harness.py"], self.name, block)
        files["harness.toml"] = set_param(files["harness.toml"], "reask_retries", "1",
                                          "re-ask once when a reply has no bare answer (retry_unparsable)")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py", "harness.toml"), operator=self.name,
            change="Wrap the model passed to solve: if a reply's first line is not a bare answer of the task's "
                   "form, send one follow-up turn asking for the answer alone in that form.",
            root_cause=inp.root_cause or "Unparsable replies are accepted as final; nothing asks again.",
            expected_effect="Off-format or empty replies get a second, format-focused attempt; most should "
                            "come back as a bare answer.",
            risk="Up to one extra model call per off-format reply (cost and latency); a second reply can be "
                 "wrong where the first was merely verbose.",
            scope=_cluster_scope(inp.cluster) + "; the trigger is the reply's form, checked against the "
                  "task's own form, so it is independent of any instance."))


@dataclass(frozen=True)
class FewShotExemplars(_CodeOperator):
    name: str = "few_shot"
    title: str = "Few-shot exemplars from passing train instances"
    wraps: str = "build_messages"
    per_category: int = 2
    max_total: int = 10

    def present(self, files: Mapping[str, str]) -> bool:
        return FEWSHOT_FILE in files or super().present(files)

    def unavailable(self, inp: RepairInput) -> str | None:
        base = super().unavailable(inp)
        if base:
            return base
        if not inp.exemplars:
            return "no train instance passed in every run of the batch, so there is nothing to quote"
        if "user.md" not in inp.files:
            return "the harness has no user.md to render the exemplars with"
        return None

    def pick(self, exemplars: Sequence[Exemplar]) -> list[Exemplar]:
        """Short exemplars, at most `per_category` per category: they show the form, not the content."""
        chosen: list[Exemplar] = []
        per: dict[str, int] = {}
        for ex in sorted(exemplars, key=lambda e: (len(e.input), e.key)):
            if per.get(ex.category, 0) < self.per_category and len(chosen) < self.max_total:
                chosen.append(ex)
                per[ex.category] = per.get(ex.category, 0) + 1
        return sorted(chosen, key=lambda e: (e.category, e.key))

    def apply(self, inp: RepairInput) -> RepairResult:
        chosen = self.pick(inp.exemplars)
        shots = "".join(json.dumps({"input": ex.input, "choices": list(ex.choices) if ex.choices else None,
                                    "answer": ex.answer}, ensure_ascii=False) + "\n" for ex in chosen)
        block = '''# Worked examples (passing training instances, in fewshot.jsonl) go before the question as
# earlier user/assistant turns; up to `few_shot_k` of the task's own answer form are used.
import json as _ecd_json

_ecd_before_few_shot = build_messages


def _ecd_shots(task, harness):
    examples = [_ecd_json.loads(line) for line in harness.read("fewshot.jsonl").splitlines() if line.strip()]
    for example in examples:
        example["task"] = {"input": example["input"], "choices": example.get("choices"),
                           "category": "", "fields": {}}
    same = [e for e in examples if ecd_answer_shape(e["task"]) == ecd_answer_shape(task)]
    return (same or examples)[: int(harness.params.get("few_shot_k", 3))]


def build_messages(task, harness):
    messages = _ecd_before_few_shot(task, harness)
    turns = []
    for example in _ecd_shots(task, harness):
        try:
            question = harness.render("user.md", **harness.task_variables(example["task"])).strip()
        except KeyError:
            question = example["input"]
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": example["answer"]}]
    head = 1 if messages and messages[0]["role"] == "system" else 0
    return messages[:head] + turns + messages[head:]
'''
        files = dict(inp.files)
        files["harness.py"] = append_block(files["harness.py"], self.name, block)
        files[FEWSHOT_FILE] = shots
        files["harness.toml"] = set_param(files["harness.toml"], "few_shot_k", "3",
                                          "worked examples per call (few_shot)")
        cats = sorted({ex.category for ex in chosen})
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.py", FEWSHOT_FILE, "harness.toml"), operator=self.name,
            change=f"Add {FEWSHOT_FILE} with {len(chosen)} short passing train instances ({', '.join(cats)}) "
                   "and wrap build_messages to put up to 3 of the task's answer form before the question.",
            root_cause=inp.root_cause or "The model is never shown what a finished answer looks like.",
            expected_effect="Replies imitate the exemplars' bare-answer form; format failures and some "
                            "wrong answers should drop.",
            risk="Longer prompts (more tokens, slower); a small model may copy an exemplar's answer.",
            scope=_cluster_scope(inp.cluster) + "; exemplars come only from train instances that passed in "
                  "every run, never from the failing ones, and are chosen by form, not by content.",
            exemplars=tuple(ex.key for ex in chosen)))


@dataclass(frozen=True)
class SelfConsistency:
    name: str = "self_consistency"
    title: str = "Self-consistency voting"
    samples: int = 5
    temperature: float = 0.7

    def present(self, files: Mapping[str, str]) -> bool:
        return int(params_of(files).get("samples", 1) or 1) > 1

    def unavailable(self, inp: RepairInput) -> str | None:
        if "samples" not in inp.files.get("harness.py", ""):
            return "harness.py has no sampling loop that reads the `samples` parameter"
        return None

    def apply(self, inp: RepairInput) -> RepairResult:
        files = dict(inp.files)
        toml_text = set_param(files["harness.toml"], "samples", str(self.samples),
                              "majority vote over samples (self_consistency)")
        files["harness.toml"] = set_param(toml_text, "temperature", str(self.temperature),
                                          "diverse samples for voting (self_consistency)")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.toml",), operator=self.name,
            change=f"Sample {self.samples} replies at temperature {self.temperature} and return the majority "
                   "answer (the harness's existing voting loop).",
            root_cause=inp.root_cause or "A single greedy sample carries the model's random slips straight "
                                         "into the answer.",
            expected_effect="Answers that the model gets right most of the time stop failing on one unlucky "
                            "sample.",
            risk=f"{self.samples}x model calls per task; no help where the model is consistently wrong.",
            scope=_cluster_scope(inp.cluster) + "; voting changes no prompt and no instance-specific rule."))


@dataclass(frozen=True)
class OutputBudget:
    name: str = "output_budget"
    title: str = "Output-length budget"
    ceiling: int = 512
    floor: int = 192

    def present(self, files: Mapping[str, str]) -> bool:
        return f"({self.name})" in files.get("harness.toml", "")

    def unavailable(self, inp: RepairInput) -> str | None:
        if int(params_of(inp.files).get("max_tokens", 0) or 0) >= self.ceiling:
            return f"max_tokens is already at the ceiling of {self.ceiling}"
        return None

    def apply(self, inp: RepairInput) -> RepairResult:
        current = int(params_of(inp.files).get("max_tokens", 96) or 96)
        budget = min(self.ceiling, max(self.floor, 2 * current))
        files = dict(inp.files)
        files["harness.toml"] = set_param(files["harness.toml"], "max_tokens", str(budget),
                                          f"room for the answer after the reasoning ({self.name})")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("harness.toml",), operator=self.name,
            change=f"Raise max_tokens from {current} to {budget}.",
            root_cause=inp.root_cause or f"Replies hit the {current}-token limit before the answer.",
            expected_effect="Replies that were cut off reach their answer; truncated failures should drop.",
            risk="Longer replies cost more tokens and time; rambling replies stay rambling.",
            scope=_cluster_scope(inp.cluster) + "; one budget for every task, no instance-specific rule."))


@dataclass(frozen=True)
class AnswerFormatInstruction:
    name: str = "answer_format_instruction"
    title: str = "Answer-format instruction"
    system_text: str = ("Put the final answer alone on the first line of your reply, with nothing before it: "
                        "a number for a quantity, True or False for a truth value, the option letter for a "
                        "multiple-choice question, the words themselves for a list. Any explanation comes "
                        "after that line.")
    user_text: str = "{{#choices_text}}\nAnswer with the letter of the correct option ({{letters}}).\n{{/choices_text}}"

    def present(self, files: Mapping[str, str]) -> bool:
        return self.system_text in files.get("system.md", "")

    def unavailable(self, inp: RepairInput) -> str | None:
        if "system.md" not in inp.files:
            return "the harness has no system.md prompt to add the instruction to"
        return None

    def apply(self, inp: RepairInput) -> RepairResult:
        files = dict(inp.files)
        files["system.md"] = files["system.md"].rstrip("\n") + "\n\n" + self.system_text + "\n"
        targets = ["system.md"]
        if "user.md" in files and "{{letters}}" not in files["user.md"]:
            files["user.md"] = files["user.md"].rstrip("\n") + "\n" + self.user_text + "\n"
            targets.append("user.md")
        return RepairResult(self.name, files, ModificationSpec(
            target_files=tuple(targets), operator=self.name,
            change="Tell the model, in the system prompt, to put the bare answer (number, True/False, option "
                   "letter or the words) alone on the first line; on tasks with options, ask for the letter.",
            root_cause=inp.root_cause or "The prompt never says what form the answer must take or where.",
            expected_effect="More replies open with a bare answer, which the first-line extractor returns; "
                            "off-format and out-of-choice failures should drop.",
            risk="Small models may follow the instruction only partly; skipping the reasoning can cost "
                 "accuracy on multi-step tasks.",
            scope=_cluster_scope(inp.cluster) + "; the instruction names answer forms, not tasks or answers."))


OPERATORS: dict[str, RepairOperator] = {op.name: op for op in (
    AnswerExtraction(), AnswerFormatInstruction(), RetryOnUnparsable(), FewShotExemplars(),
    SelfConsistency(), ChoiceMatching(), OutputBudget())}

# Which operators address which failure type, best first. Errors in harness code, timeouts and
# model-call errors have no generic repair: they need a hand-written (LLM or human) change.
RANKING: dict[str, tuple[str, ...]] = {
    "off_format": ("answer_extraction", "answer_format_instruction", "retry_unparsable", "few_shot",
                   "choice_matching"),
    "invalid_choice": ("choice_matching", "answer_format_instruction", "answer_extraction", "few_shot"),
    "truncated": ("output_budget", "answer_format_instruction", "answer_extraction", "retry_unparsable"),
    "empty_output": ("retry_unparsable", "answer_format_instruction", "output_budget", "few_shot"),
    "wrong_answer": ("few_shot", "self_consistency", "answer_format_instruction"),
}


@dataclass
class Ranking:
    """The operators to try for a cluster, best first, adjusted by its evidence."""

    names: list[str] = field(default_factory=list)

    @staticmethod
    def for_cluster(cluster: Cluster) -> "Ranking":
        names = list(RANKING.get(cluster.type, ()))
        if cluster.type == "off_format" and names:
            found = sum(1 for f in cluster.failures if f.detail.get("shape_in_reply"))
            # Extraction cannot find an answer the reply does not contain; then ask for the form first.
            if found * 2 < len(cluster.failures):
                names.remove("answer_format_instruction")
                names.insert(0, "answer_format_instruction")
        if cluster.type == "truncated" and names:
            short = sum(1 for f in cluster.failures if f.shape in ("number", "boolean", "choice"))
            # A reply cut off before a one-word answer is prose, not a long answer: a bigger
            # budget buys more prose (and doubles the cost); asking for the answer's form first
            # is the general repair. Long answers (word lists, text) do need the budget.
            if short * 2 > len(cluster.failures):
                names.remove("answer_format_instruction")
                names.insert(0, "answer_format_instruction")
        return Ranking(names)


# ---------------------------------------------------------------- proposer output -> files

class ProposalError(ValueError):
    """A Proposer output that cannot become harness files (unknown operator, edit that misses)."""


def _apply_edits(files: dict[str, str], edits: Sequence[Mapping[str, str]]) -> dict[str, str]:
    out = dict(files)
    for edit in edits:
        path, find, replace = str(edit["path"]), str(edit["find"]), str(edit["replace"])
        if path not in out:
            if find:
                raise ProposalError(f"edit targets {path}, which the harness does not have")
            out[path] = replace  # an empty `find` on a new path creates the file
            continue
        count = out[path].count(find) if find else 0
        if count != 1:
            raise ProposalError(f"edit on {path}: the text to find occurs {count} times (it must occur once)")
        out[path] = out[path].replace(find, replace, 1)
    return out


def materialize(output: Mapping[str, Any], case: CaseFile) -> Draft:
    """Turn a schema-valid Proposer output into a `Draft`: explicit `files` win, then `edits`, then
    the named catalogue `operator` (whose own spec fills any field the output leaves out)."""
    from ecdysis.harness import check_name

    spec_data = dict(output.get("spec") or {})
    name = output.get("operator")
    files = dict(case.files)
    if output.get("files"):
        for path, text in dict(output["files"]).items():
            files[check_name(str(path))] = str(text)
    elif output.get("edits"):
        files = _apply_edits(files, list(output["edits"]))
    elif name:
        op = OPERATORS.get(str(name))
        if op is None:
            raise ProposalError(f"unknown operator {name!r}; the catalogue has {', '.join(OPERATORS)}")
        inp = RepairInput(case.files, case.cluster, case.exemplars,
                          str((case.investigation or {}).get("root_cause", "")))
        reason = op.unavailable(inp)
        if reason:
            raise ProposalError(f"operator {name} cannot apply: {reason}")
        result = op.apply(inp)
        files = result.files
        spec_data = {**result.spec.to_json(), **{k: v for k, v in spec_data.items() if v}}
        spec_data["exemplars"] = list(result.spec.exemplars)
    else:
        raise ProposalError("the proposal names no operator and gives no edits or files")
    spec_data["operator"] = str(name) if name else None
    return Draft(spec=ModificationSpec.from_json(spec_data), files=files,
                 replies=[str(r) for r in output.get("replies") or []])

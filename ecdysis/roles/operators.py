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
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ecdysis.roles.agent_operators import AGENT_OPERATORS
from ecdysis.roles.answer_helpers import ecd_answer_shape
from ecdysis.roles.base import Exemplar, ModificationSpec
from ecdysis.roles.repairs import (CodeRepair, RepairInput, RepairOperator, RepairResult, cluster_scope,
                                   marker, params_of, set_param)

HELPERS_MARK = "# --- ecdysis helpers: answer shapes ---"
FEWSHOT_FILE = "fewshot.jsonl"
# Answer forms with a small closed set of answers, where a worked example can teach a label.
CLOSED_FORMS = ("choice", "boolean")

# Shared by every code operator: what form the task's answer takes, whether a text already is a
# bare answer of that form, and where such an answer sits inside a longer reply. They live in
# `answer_helpers.py`, a module of their own (imported and tested as one), whose text is what an
# operator appends to harness.py, once.
HELPERS = HELPERS_MARK + "\n" + (Path(__file__).with_name("answer_helpers.py")).read_text(encoding="utf-8")


def append_block(code: str, name: str, block: str) -> str:
    """harness.py with the shared helpers (once) and the operator's marked block at the end."""
    out = code.rstrip("\n") + "\n"
    if HELPERS_MARK not in out:
        out += "\n\n" + HELPERS.strip("\n") + "\n"
    return out + "\n\n" + marker(name) + "\n" + block.strip("\n") + "\n"


def answered_in_text(inp: RepairInput) -> str | None:
    """Why a repair of written answers does not fit a cluster of function-call answers (whose
    targets are possible calls, not replies, and whose form is not a bare answer)."""
    if inp.cluster.failures and all(f.shape == "calls" for f in inp.cluster.failures):
        return "the cluster's tasks are answered with function calls, not a written answer"
    return None


# ---------------------------------------------------------------- the operators

@dataclass(frozen=True)
class AnswerExtraction(CodeRepair):
    name: str = "answer_extraction"
    title: str = "Shape-aware answer extraction"
    needs: tuple[str, ...] = ("extract_answer",)

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
            scope=cluster_scope(inp.cluster) + "; the rule reads only the task's form, never an instance "
                  "or its target, so it applies to unseen tasks of any suite."))


@dataclass(frozen=True)
class ChoiceMatching(CodeRepair):
    name: str = "choice_matching"
    title: str = "Map free-text answers onto the options"
    needs: tuple[str, ...] = ("extract_answer",)

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
            scope=cluster_scope(inp.cluster) + "; it applies to every task that has options, keyed on the "
                  "options the task itself lists."))


@dataclass(frozen=True)
class RetryOnUnparsable(CodeRepair):
    name: str = "retry_unparsable"
    title: str = "Re-ask when the reply has no bare answer"
    needs: tuple[str, ...] = ("solve",)

    def apply(self, inp: RepairInput) -> RepairResult:
        block = '''# When a reply's first line is not a bare answer of the task's form, ask once more (the reply
# kept in the conversation) for the answer alone; `reask_retries` in harness.toml bounds it.
class _EcdReaskModel:
    def __init__(self, model, task, retries):
        self._model, self._task, self._retries = model, task, retries

    def __getattr__(self, name):  # score and anything else it does not wrap
        return getattr(self._model, name)

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
            scope=cluster_scope(inp.cluster) + "; the trigger is the reply's form, checked against the "
                  "task's own form, so it is independent of any instance."))


def _as_task(ex: Exemplar) -> dict[str, object]:
    """An exemplar as the harness code sees it (see `_ecd_shots`), so forms are read the same way."""
    return {"input": ex.input, "choices": list(ex.choices) if ex.choices else None, "category": "", "fields": {}}


@dataclass(frozen=True)
class FewShotExemplars(CodeRepair):
    name: str = "few_shot"
    title: str = "Few-shot exemplars from passing train instances"
    needs: tuple[str, ...] = ("build_messages",)
    per_category: int = 2
    max_total: int = 10

    def present(self, files: Mapping[str, str]) -> bool:
        return FEWSHOT_FILE in files or super().present(files)

    def unavailable(self, inp: RepairInput) -> str | None:
        base = super().unavailable(inp)
        if base:
            return base
        if answered_in_text(inp):
            return answered_in_text(inp)
        if not inp.exemplars:
            return "no train instance passed in every run of the batch, so there is nothing to quote"
        if not self.pick(inp.exemplars):
            labels = sorted({ex.answer.strip() for ex in inp.exemplars})
            return (f"the batch's passing train instances all answer {', '.join(labels[:3])}: worked examples "
                    "of one answer would teach the model that answer, not the task")
        if "user.md" not in inp.files:
            return "the harness has no user.md to render the exemplars with"
        return None

    def pick(self, exemplars: Sequence[Exemplar]) -> list[Exemplar]:
        """Short exemplars, at most `per_category` per category, balanced over the answers.

        A task with a closed set of answers (options, yes/no, true/false) is shown every answer
        equally often, so a worked example carries no prior for one label: such a form gets
        exemplars only when the passing instances give at least two different answers, and then
        the same number of each. One passing "B" shown before every multiple-choice question
        teaches "B" (it won 16 to 7 on one validation split and lost on the sealed test). An open
        form (a number, a list, free text) takes its answers in turn, shortest first, and may show
        just one."""
        by_form: dict[str, dict[str, list[Exemplar]]] = {}
        for ex in sorted(exemplars, key=lambda e: (len(e.input), e.key)):
            form = ecd_answer_shape(_as_task(ex))
            by_form.setdefault(form, {}).setdefault(ex.answer.strip().casefold(), []).append(ex)
        chosen: list[Exemplar] = []
        for form in sorted(by_form):
            answers = by_form[form]
            if form not in CLOSED_FORMS:  # in turn over the answers, so none repeats before the others show
                turns = [q[i] for i in range(max(len(q) for q in answers.values())) for q in answers.values()
                         if i < len(q)]
                chosen += self._spread(turns, self.max_total - len(chosen))
                continue
            if len(answers) < 2:
                continue
            queues = [self._spread(q, len(q)) for q in answers.values()]
            each = min(min(len(q) for q in queues), self.per_category,
                       (self.max_total - len(chosen)) // len(queues))
            chosen += [q[i] for i in range(each) for q in queues]
        return sorted(chosen, key=lambda e: (e.category, e.key))

    def _spread(self, queue: Sequence[Exemplar], room: int) -> list[Exemplar]:
        """Up to `room` of a queue (shortest first), at most `per_category` from any one category."""
        taken: dict[str, int] = {}
        out: list[Exemplar] = []
        for ex in queue:
            if len(out) >= room:
                break
            if taken.get(ex.category, 0) < self.per_category:
                taken[ex.category] = taken.get(ex.category, 0) + 1
                out.append(ex)
        return out

    def apply(self, inp: RepairInput) -> RepairResult:
        chosen = self.pick(inp.exemplars)
        shots = "".join(json.dumps({"input": ex.input, "choices": list(ex.choices) if ex.choices else None,
                                    "answer": ex.answer}, ensure_ascii=False) + "\n" for ex in chosen)
        block = '''# Worked examples (passing training instances, in fewshot.jsonl) go before the question as
# earlier user/assistant turns; up to `few_shot_k` of the task's own answer form are used, and a
# form with a closed set of answers (options, yes/no) is shown each answer equally often.
import json as _ecd_json

_ecd_before_few_shot = build_messages


def _ecd_shots(task, harness):
    examples = [_ecd_json.loads(line) for line in harness.read("fewshot.jsonl").splitlines() if line.strip()]
    for example in examples:
        example["task"] = {"input": example["input"], "choices": example.get("choices"),
                           "category": "", "fields": {}}
    # Never the question being asked: an exemplar that is this very task would hand over its answer.
    form = ecd_answer_shape(task)
    same = [e for e in examples if e["input"] != task.get("input") and ecd_answer_shape(e["task"]) == form]
    k = int(harness.params.get("few_shot_k", 3))
    if form not in ("choice", "boolean"):
        return same[:k]
    # A closed set of answers: each answer shown equally often (in turn), or no examples at all,
    # so the examples carry no prior for one label.
    by_answer = {}
    for example in same:
        by_answer.setdefault(str(example["answer"]).strip().lower(), []).append(example)
    if len(by_answer) < 2:
        return []
    queues = list(by_answer.values())
    each = max(1, min(min(len(q) for q in queues), k // len(queues)))
    return [queue[i] for i in range(each) for queue in queues]


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
            scope=cluster_scope(inp.cluster) + "; exemplars come only from train instances that passed in "
                  "every run, never from the failing ones, and are chosen by form, not by content.",
            exemplars=tuple(ex.key for ex in chosen)))


CALIBRATE = True  # option_scoring's default for score_calibrate: bench/option_scoring.py measures both
# Calibrate only where the blanked prompt prefers one option by more than this many nats: chosen on
# five of the nine benchmark tasks and checked on the other four (bench/option_scoring_margin.py).
CALIBRATE_MARGIN = 2.0


@dataclass(frozen=True)
class OptionScoring(CodeRepair):
    """On a task with a closed answer space (options, or yes/no and true/false), the model scores
    each answer as its reply instead of writing one. Measured on nine real BIG-bench tasks before it
    joined the catalogue (`bench/results/option_scoring.md`)."""

    name: str = "option_scoring"
    title: str = "Score the options instead of generating"
    needs: tuple[str, ...] = ("solve", "build_messages")  # the options are scored against its prompt

    def unavailable(self, inp: RepairInput) -> str | None:
        base = super().unavailable(inp)
        if base:
            return base
        if not any(f.shape in ("choice", "boolean") for f in inp.cluster.failures):
            return "none of the cluster's tasks has a closed set of answers to score"
        return None

    def patched(self, files: Mapping[str, str], score_by: str = "total", calibrate: bool = CALIBRATE,
                margin: float | None = CALIBRATE_MARGIN) -> dict[str, str]:
        """`files` with the block and its parameters (the benchmark builds its variants so)."""
        out = dict(files)
        out["harness.py"] = append_block(out["harness.py"], self.name, self.BLOCK)
        toml_text = set_param(out["harness.toml"], "score_prefix", '"Answer: "',
                              "each option is scored as this plus its text (option_scoring)")
        toml_text = set_param(toml_text, "score_by", f'"{score_by}"',
                              "total or per_token log-probability (option_scoring)")
        toml_text = set_param(toml_text, "score_calibrate", "true" if calibrate else "false",
                              "subtract each option's score with the input blanked (option_scoring)")
        if calibrate and margin is not None:
            toml_text = set_param(toml_text, "score_calibrate_margin", f"{margin:g}",
                                  "only when the blanked prompt prefers one option by more nats (option_scoring)")
        out["harness.toml"] = toml_text
        return out

    BLOCK = '''# On a task whose answer is one of a closed set (its options, or Yes/No, True/False), ask the
# model how likely each answer is as its reply, "Answer: <option>", instead of letting it write
# one: the answer is always a valid option, and no reply is cut off or off-format. A backend that
# cannot score (a remote chat API) raises, and the previous solve generates as before.
_ecd_before_option_scoring = solve


def ecd_closed_answers(task):
    # (the answers to return, the text each is scored as), or ([], []) for an open answer.
    options = ecd_options(task)
    letters = ecd_letters(task)
    if not options and ecd_answer_shape(task) == "boolean":
        options = list(ecd_booleans(task))
    if len(options) < 2:
        return [], []
    return (letters or options), options


def solve(task, model, harness):
    answers, texts = ecd_closed_answers(task)
    score = getattr(model, "score", None)
    if not answers or score is None:
        return _ecd_before_option_scoring(task, model, harness)
    prefix = str(harness.params.get("score_prefix", "Answer: "))
    try:
        scored = score(build_messages(task, harness), [prefix + t for t in texts])
    except Exception:  # no scores from this backend: generate
        return _ecd_before_option_scoring(task, model, harness)
    by_total = harness.params.get("score_by", "total") == "total"
    totals = scored.logprobs if by_total else scored.per_token
    if harness.params.get("score_calibrate", False):
        # What the prompt alone makes of each option (the input replaced by "N/A"; the same
        # call, so cached, for every task that shares a prompt and options): a label the model
        # prefers whatever the question is does not win by that preference. Only a strong
        # preference (more than `score_calibrate_margin` nats over the next option) is taken away.
        blank = dict(task, input="N/A")
        prior = score(build_messages(blank, harness), [prefix + t for t in texts])
        base = prior.logprobs if by_total else prior.per_token
        ranked = sorted(base, reverse=True)
        margin = harness.params.get("score_calibrate_margin")
        if margin is None or len(ranked) < 2 or ranked[0] - ranked[1] > float(margin):
            totals = [a - b for a, b in zip(totals, base)]
    return answers[max(range(len(answers)), key=lambda i: totals[i])]
'''

    def apply(self, inp: RepairInput) -> RepairResult:
        return RepairResult(self.name, self.patched(inp.files), ModificationSpec(
            target_files=("harness.py", "harness.toml"), operator=self.name,
            change="Wrap solve: on a task with options (or a yes/no or true/false question), score each "
                   "option as the reply 'Answer: <option>' with the model's log-probabilities and return the "
                   "best-scored one; other tasks, and backends that cannot score, generate as before.",
            root_cause=inp.root_cause or "On closed-answer tasks the model's written reply misses the options "
                                         "(off-format, cut off or invalid) although it ranks them.",
            expected_effect="Every closed-answer task gets a valid option, so format, truncation and invalid-choice "
                            "failures there vanish; fewer tokens per task (no generated reasoning).",
            risk="No written reasoning: a model that needs to think before answering may lose accuracy; "
                 "remote chat backends cannot score and keep generating.",
            scope=cluster_scope(inp.cluster) + "; it applies to every task by its answer form (options or "
                  "a yes/no or true/false form), never to an instance or its content."))


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
            scope=cluster_scope(inp.cluster) + "; voting changes no prompt and no instance-specific rule."))


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
            scope=cluster_scope(inp.cluster) + "; one budget for every task, no instance-specific rule."))


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
        return answered_in_text(inp)

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
            scope=cluster_scope(inp.cluster) + "; the instruction names answer forms, not tasks or answers."))


@dataclass(frozen=True)
class WholeTaskInPrompt:
    """Put what the suite states about the task into user.md: its instruction (`task_prefix`), its
    options and the form of the answer, each only where the template leaves it out."""

    name: str = "whole_task_in_prompt"
    title: str = "Ask the whole task: instruction, options, answer form"
    head: str = "{{#task_prefix}}{{task_prefix}}\n\n{{/task_prefix}}"
    options: str = "{{#choices_text}}\nOptions:\n{{choices_text}}\n{{/choices_text}}"
    form: str = "{{#answer_instruction}}\n{{answer_instruction}}{{/answer_instruction}}"

    def _missing(self, user: str) -> list[str]:
        return [name for name, var in (("instruction", "task_prefix"), ("options", "choices_text"),
                                       ("answer form", "answer_instruction")) if "{{" + var not in user
                and "{{#" + var not in user]

    def present(self, files: Mapping[str, str]) -> bool:
        return "user.md" in files and not self._missing(files["user.md"])

    def unavailable(self, inp: RepairInput) -> str | None:
        if "user.md" not in inp.files:
            return "the harness has no user.md template to add the task's text to"
        if not self._missing(inp.files["user.md"]):
            return "user.md already renders the instruction, the options and the answer form"
        return None

    def apply(self, inp: RepairInput) -> RepairResult:
        user = inp.files["user.md"]
        missing = self._missing(user)
        if "instruction" in missing:
            user = self.head + user
        user = user.rstrip("\n")
        if "options" in missing:
            user += "\n" + self.options
        if "answer form" in missing:
            user += self.form
        files = dict(inp.files)
        files["user.md"] = user + "\n"
        return RepairResult(self.name, files, ModificationSpec(
            target_files=("user.md",), operator=self.name,
            change=f"Render the task's {', '.join(missing)} in user.md (each only when the task has one).",
            root_cause=inp.root_cause or "The prompt leaves out part of what the suite states about the task.",
            expected_effect="The model is asked the question the suite asks, with its options and answer form; "
                            "replies that invented a question or an answer format should drop.",
            risk="Longer prompts; a prefix written for few-shot use may read oddly on its own.",
            scope=cluster_scope(inp.cluster) + "; it renders the suite's own task fields for every task, "
                  "whatever its content."))


OPERATORS: dict[str, RepairOperator] = {op.name: op for op in (
    WholeTaskInPrompt(), AnswerExtraction(), AnswerFormatInstruction(), RetryOnUnparsable(), FewShotExemplars(),
    SelfConsistency(), ChoiceMatching(), OutputBudget(), OptionScoring(), *AGENT_OPERATORS)}

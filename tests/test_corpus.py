"""A generalisation corpus: real BIG-bench tasks, which no one here wrote, of different answer
forms. For each, the form read from the data, the starter prompt (it must ask the whole task), and
real replies of the embedded models with what a careful reader takes them to answer, hand-checked
and copied into `data/bigbench_replies.json`. The built-in suites stay out: behaviour on data we
wrote proves little."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from ecdysis.failures import classify
from ecdysis.harness import STARTER_DIR
from ecdysis.harness_runtime import Harness
from ecdysis.records import Instance, InstanceResult, ModelCall, Suite
from ecdysis.roles.operators import HELPERS
from ecdysis.suites import builtin_suite_names, load_suite

from bigbench_files import needs_bigbench

pytestmark = needs_bigbench

# task -> the answer form its data implies (kind, and extras that must be there)
CORPUS: dict[str, dict] = {
    "navigate": {"kind": "true_false"},
    "causal_judgment": {"kind": "yes_no"},
    "strategyqa": {"kind": "yes_no"},
    "sports_understanding": {"kind": "choice"},
    "date_understanding": {"kind": "choice"},
    "temporal_sequences": {"kind": "choice"},
    "logical_deduction": {"kind": "choice"},
    "disambiguation_qa": {"kind": "choice"},
    "formal_fallacies_syllogisms_negation": {"kind": "choice"},
    "object_counting": {"kind": "integer"},  # targets are number words: "three"
    "operators": {"kind": "integer"},
    "word_sorting": {"kind": "list"},
    "list_functions": {"kind": "list", "bracketed": True},
    "penguins_in_a_table": {"kind": "text"},
}
REPLIES = json.loads((Path(__file__).parent / "data" / "bigbench_replies.json").read_text(encoding="utf-8"))["replies"]


@lru_cache(maxsize=None)
def suite(name: str) -> Suite:
    return load_suite(name)


def _squashed(text: str) -> str:
    return " ".join(str(text).split())


def test_the_corpus_is_real_bigbench_and_spans_the_forms():
    assert len(CORPUS) >= 12
    assert not set(CORPUS) & set(builtin_suite_names())
    assert {f["kind"] for f in CORPUS.values()} >= {"choice", "yes_no", "true_false", "integer", "list", "text"}


@pytest.mark.parametrize("task", sorted(CORPUS))
def test_the_form_comes_from_the_data_and_the_prompt_asks_the_whole_task(task: str):
    loaded = suite(f"bigbench:{task}")
    for inst in loaded.instances:
        form = inst.fields["answer_form"]
        assert {k: form.get(k) for k in CORPUS[task]} == CORPUS[task], (inst.category, form)
    harness = Harness(STARTER_DIR)
    for inst in loaded.split("train")[:5]:
        prompt = _squashed(harness.render("user.md", **harness.task_variables(inst.task_view())))
        prefix = _squashed(inst.fields.get("task_prefix") or "")
        assert prefix in prompt and _squashed(inst.input) in prompt
        assert prompt.index(prefix) <= prompt.index(_squashed(inst.input))
        for letter, option in zip("ABCDEFGHIJ", inst.choices or ()):
            assert f"{letter}. {_squashed(option)}" in prompt
        if CORPUS[task]["kind"] != "text":  # free text has no form to state
            assert "Answer with" in prompt


@pytest.fixture(scope="module")
def helpers() -> dict:
    namespace: dict = {}
    exec(HELPERS, namespace)  # the block the code operators add to harness.py
    return namespace


def _case_id(case: dict) -> str:
    return f"{case['instance']}:{case['model']}"


def _as_shown(case: dict) -> Instance:
    """The instance as the model saw it: a reply is read against the options in the order they were
    shown, which was the task file's before choices were shuffled per example."""
    instance = next(i for i in suite(case["suite"]).instances if i.id == case["instance"])
    shown = case.get("choices_shown")
    if shown:
        assert sorted(shown) == sorted(instance.choices or ())
        return replace(instance, choices=tuple(shown))
    return instance


@pytest.mark.parametrize("case", REPLIES, ids=_case_id)
def test_real_replies_are_read_as_a_careful_reader_reads_them(case: dict, helpers: dict):
    instance = _as_shown(case)
    assert helpers["ecd_find_answer"](case["reply"], instance.task_view()) == case["answer_in_reply"]


@pytest.mark.parametrize("case", [c for c in REPLIES if c["failure_type"]], ids=_case_id)
def test_real_failures_get_sensible_types(case: dict):
    instance = _as_shown(case)
    call = ModelCall(0, case["model"], {"max_tokens": 96}, case["reply"], 100, 96, 1.0, case["finish_reason"], False)
    result = InstanceResult("r", instance.id, instance.category, case["model"], case["harness_answer"],
                            instance.target, False, 0.0, calls=[call])
    assert classify(result, instance) == case["failure_type"]


def test_the_replies_cover_several_tasks_models_and_outcomes():
    assert len({c["suite"] for c in REPLIES}) >= 8
    assert {c["model"] for c in REPLIES} == {"qwen2.5-coder-0.5b", "smollm2"}
    assert any(c["answer_in_reply"] == "" for c in REPLIES)  # replies that answer nothing stay unanswered
    assert {c["failure_type"] for c in REPLIES} >= {"wrong_answer", "off_format", "truncated"}

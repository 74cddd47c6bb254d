"""Answer forms: declared or inferred once per category, attached to every instance, rendered into
the starter's prompt, and read by the failure taxonomy and the operators' extraction helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecdysis.errors import InputError
from ecdysis.failures import classify, expected_shape, letter_mentioned, mentions
from ecdysis.harness import STARTER_DIR
from ecdysis.harness_runtime import Harness, answer_instruction
from ecdysis.records import Instance, InstanceResult, ModelCall, ScorerSpec
from ecdysis.roles.operators import HELPERS
from ecdysis.suites import load_jsonl, load_suite
from ecdysis.suites.forms import AnswerForm, attach_forms, infer_form, number_and_unit


def _insts(targets: list[str], inputs: list[str] | None = None, choices=None) -> list[Instance]:
    inputs = inputs or [f"question {i}" for i in range(len(targets))]
    return [Instance(id=f"q{i}", input=inputs[i], target=t, choices=choices, split="train")
            for i, t in enumerate(targets)]


@pytest.mark.parametrize("targets,kind,extra", [
    (["Yes", "No", "no", "Yes."], "yes_no", {}),
    (["True", "False", "True"], "true_false", {}),
    (["12", "7", "1,000"], "integer", {}),
    (["3.5", "2", "0.25"], "decimal", {}),
    (["$12", "$7.50", "$3"], "decimal", {"unit": "$"}),
    (["12 km", "7 km", "3 km"], "integer", {"unit": "km"}),
    (["three", "nine", "eighteen"], "integer", {}),  # BIG-bench object_counting writes numbers as words
    (["[1, 2]", "[]", "[9, 4, 7]"], "list", {"bracketed": True}),
    (['{"a": 1}', '{"b": [2]}'], "json", {}),
    (["valid", "invalid", "valid", "invalid", "valid", "valid"], "choice", {"labels": ("invalid", "valid")}),
    (["The cat sat on a mat near the door", "Paris is the capital", "Blue whales are large"], "text", {}),
])
def test_a_category_form_is_inferred_from_its_targets(targets, kind, extra):
    form = infer_form(_insts(targets))
    assert form.kind == kind
    for key, value in extra.items():
        assert getattr(form, key) == value


def test_options_decide_the_form_before_the_targets():
    assert infer_form(_insts(["Yes", "No"], choices=("Yes", "No"))).kind == "yes_no"
    assert infer_form(_insts(["plausible"], choices=("plausible", "implausible"))).kind == "choice"
    # A list of words copied from the input (a list to sort) is a list, not free text.
    sort = _insts(["apple pear zebra", "ant bee cow"], ["Sort: zebra apple pear", "Sort: cow bee ant"])
    assert infer_form(sort).kind == "list"


def test_a_numeric_scorer_makes_a_number_form_even_with_odd_targets():
    assert infer_form(_insts(["12", "about 3"]), "numeric").kind == "integer"


def test_declared_forms_win_and_bad_ones_are_refused(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    lines = [{"ecdysis_suite": {"name": "s", "answer_form": {"math": "decimal", "words": "text"}}},
             {"input": "1+1", "target": "2", "category": "math"},
             {"input": "say hi", "target": "hi", "category": "words"},
             {"input": "3+4", "target": "7", "category": "other", "fields": {"answer_form": "integer"}}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    suite = load_suite(str(path))
    forms = {i.category: i.fields["answer_form"] for i in suite.instances}
    assert forms == {"math": {"kind": "decimal", "declared": True}, "words": {"kind": "text", "declared": True},
                     "other": {"kind": "integer", "declared": True}}
    lines[0] = {"ecdysis_suite": {"answer_form": "number-ish"}}
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(InputError, match="answer_form is malformed"):
        load_jsonl(path)
    bad = [Instance(id="a", input="x", target="1", fields={"answer_form": {"kind": "prose"}})]
    with pytest.raises(InputError, match="category 'default'"):
        attach_forms(bad, ScorerSpec())


def test_the_form_comes_from_the_train_split_only():
    """Validation and test targets never shape the form (they are sealed): a category whose train
    targets are all numbers is a number category even if a held-out target is a word."""
    insts = _insts(["1", "2", "3"]) + [Instance(id="t", input="q", target="many", split="test")]
    attached = attach_forms(insts, ScorerSpec())
    assert {i.fields["answer_form"]["kind"] for i in attached} == {"integer"}


def test_number_and_unit():
    assert number_and_unit("$1,200") == (1200.0, "$")
    assert number_and_unit("7 km.") == (7.0, "km")
    assert number_and_unit("-3.5%") == (-3.5, "%")
    assert number_and_unit("I think 42") is None
    assert number_and_unit("Rg5#") is None


def test_the_starter_prompt_carries_prefix_options_and_form():
    h = Harness(STARTER_DIR)
    task = {"input": "Take 3 steps. Turn around. Take 3 steps.", "choices": ["True", "False"], "category": "nav",
            "fields": {"task_prefix": "If you follow these instructions, do you return to the starting point?\n",
                       "answer_form": {"kind": "true_false"}}}
    prompt = h.render("user.md", **h.task_variables(task))
    assert prompt.startswith("If you follow these instructions, do you return to the starting point?\n\nTake 3")
    assert "A. True\nB. False" in prompt and prompt.rstrip().endswith("Answer with True or False.")
    plain = h.render("user.md", **h.task_variables({"input": "Hi", "choices": None, "fields": {}}))
    assert plain.strip() == "Hi"  # no prefix, no options, no form: nothing but the input


@pytest.mark.parametrize("form,choices,wanted", [
    ({"kind": "choice"}, ["a", "b", "c"], "Answer with the letter of one option (A, B or C)."),
    ({"kind": "choice", "labels": ["invalid", "valid"]}, None, "Answer with one of: invalid, valid."),
    ({"kind": "yes_no"}, ["Yes", "No"], "Answer with Yes or No."),
    ({"kind": "integer", "unit": "km"}, None, "Answer with a whole number (in km)."),
    ({"kind": "decimal", "unit": "$"}, None, "Answer with a number ($)."),
    ({"kind": "list", "bracketed": True}, None, "Answer with a list in square brackets, such as [1, 2, 3]."),
    ({"kind": "text"}, None, ""),
])
def test_answer_instruction(form, choices, wanted):
    assert answer_instruction({"input": "q", "choices": choices, "fields": {"answer_form": form}}) == wanted


def test_matching_respects_word_and_number_boundaries():
    assert not mentions("The statement is implausible.", "plausible")
    assert mentions("It is plausible, I think.", "plausible")
    assert not mentions("It is not clear", "no")
    assert not mentions("That costs $288 in all", "8")
    assert not mentions("about 8.5 apples", "8")
    assert mentions("so the answer is 8.", "8")
    assert not letter_mentioned("A man walks into a bar.", "ABC")
    assert letter_mentioned("A. Yes", "AB") and letter_mentioned("The answer is (B).", "AB")


def _result(answer: str, reply: str, finish: str = "stop") -> InstanceResult:
    call = ModelCall(0, "m", {"max_tokens": 96}, reply, 10, len(reply.split()), 0.1, finish, False)
    return InstanceResult(run_id="r", instance_id="q", category="c", model="m", answer=answer, target="Yes",
                          correct=False, score=0.0, calls=[call])


def test_the_taxonomy_reads_the_declared_form():
    yes_no = Instance(id="q", input="Is 17 prime?", target="Yes", fields={"answer_form": {"kind": "yes_no"}})
    assert expected_shape(yes_no) == "boolean"
    # "No" is a bare yes/no answer, only wrong; "True" is not of this task's form.
    assert classify(_result("No", "No"), yes_no) == "wrong_answer"
    assert classify(_result("True", "True"), yes_no) == "off_format"
    number = Instance(id="q", input="Is 17 prime?", target="17", fields={"answer_form": {"kind": "integer"}})
    assert expected_shape(number) == "number"


@pytest.fixture(scope="module")
def helpers() -> dict:
    namespace: dict = {}
    exec(HELPERS, namespace)  # the block the code operators add to harness.py
    return namespace


YES_NO = {"input": "Answer yes or no: is 17 prime?", "choices": None, "fields": {"answer_form": {"kind": "yes_no"}}}
SPORTS = {"input": "Is the following sentence plausible?", "choices": ["plausible", "implausible"],
          "fields": {"answer_form": {"kind": "choice"}}}
LABELS = {"input": "Is the argument valid?", "choices": None,
          "fields": {"answer_form": {"kind": "choice", "labels": ["invalid", "valid"]}}}
COUNT = {"input": "How many fruits do I have?", "choices": None, "fields": {"answer_form": {"kind": "integer"}}}
LISTS = {"input": "[3, 1, 2]", "choices": None, "fields": {"answer_form": {"kind": "list", "bracketed": True}}}


@pytest.mark.parametrize("reply,task,answer", [
    ("Yes, 17 is prime.", YES_NO, "Yes"),          # was read as the number 17
    ("It is not divisible by anything. No.", YES_NO, "No"),
    ("The statement is implausible.", SPORTS, "B"),  # "plausible" inside "implausible"
    ("B. implausible", SPORTS, "B"),               # letter plus option text is bare
    ("A man could do that, so the answer is B.", SPORTS, "B"),  # "A" as an article
    ("\\boxed{B}", SPORTS, "B"),
    ("The options are A. plausible and B. implausible.", SPORTS, ""),  # an echo names both: no guess
    ("The argument is invalid.", LABELS, "invalid"),
    ("Step 1: 3 apples. Step 2: 2 pears.\nThe answer is 5.", COUNT, "5"),
    ("That costs $288 in all, so I have 8 fruits", COUNT, "8"),
    ("The output is [1, 2, 3].", LISTS, "[1, 2, 3]"),
])
def test_extraction_understands_the_common_forms(helpers, reply, task, answer):
    assert helpers["ecd_find_answer"](reply, task) == answer


def test_builtin_suite_forms():
    forms = {i.category: i.fields["answer_form"]["kind"] for i in load_suite("reasoning-mix").instances}
    assert forms == {"arithmetic": "integer", "boolean": "true_false", "dates": "choice",
                     "object-counting": "integer", "word-sorting": "list"}
    assert AnswerForm.from_json(forms["arithmetic"]).describe() == "integer"

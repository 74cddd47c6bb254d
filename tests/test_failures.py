"""Typed failure evidence: every way an instance can fail gets its own type and an excerpt that
says what went wrong; signatures mask the question's content so equal failures look alike."""

from __future__ import annotations

import pytest

from ecdysis.failures import Failure, classify, expected_shape, extract_failures, normalise
from ecdysis.records import Instance, InstanceResult, ModelCall

NUM = Instance("arith-1", "Maria has 12 pens and buys 7 more. How many pens?", "19", "arithmetic", split="train")
MC = Instance("dates-1", "Today is 04/02/2021. What is the date tomorrow?", "04/03/2021", "dates",
              choices=("04/03/2021", "04/04/2021", "05/03/2021", "03/03/2021"), split="train")
WORDS = Instance("sort-1", "Sort the following words alphabetically: pear apple fig", "apple fig pear", "word-sorting")
BOOL = Instance("bool-1", "not True and False is", "False", "boolean")


def result(inst: Instance, reply: str | None, *, answer: str | None = None, finish: str = "stop",
           error_type: str | None = None, error_message: str | None = None, tail: str = "",
           correct: bool = False) -> InstanceResult:
    calls = [] if reply is None else [ModelCall(0, "m", {"max_tokens": 96}, reply, 10, len(reply.split()), 0.1,
                                                 finish, False)]
    if answer is None and reply is not None and error_type is None:
        answer = next((line.strip() for line in reply.splitlines() if line.strip()), "")
    return InstanceResult("r1", inst.id, inst.category, "m", answer, inst.target, correct, float(correct),
                          error_type=error_type, error_message=error_message, stdout_tail=tail, calls=calls)  # type: ignore[arg-type]


def test_expected_shapes_come_from_choices_and_target() -> None:
    assert [expected_shape(i) for i in (NUM, MC, WORDS, BOOL)] == ["number", "choice", "word_list", "boolean"]
    assert expected_shape(Instance("t", "Capital of France?", "Paris")) == "text"


@pytest.mark.parametrize("inst, kwargs, kind", [
    (NUM, {"reply": None, "error_type": "exception", "error_message": "ValueError: boom"}, "exception"),
    (NUM, {"reply": None, "error_type": "bad_output", "error_message": "TypeError: solve() returned object"},
     "exception"),
    (NUM, {"reply": None, "error_type": "timeout", "error_message": "harness exceeded 3s"}, "timeout"),
    (NUM, {"reply": None, "error_type": "memory", "error_message": "MemoryError"}, "crash"),
    (NUM, {"reply": "", "error_type": "model_error", "error_message": "rate limited"}, "model_error"),
    (NUM, {"reply": "\n\n"}, "empty_output"),
    (NUM, {"reply": "To solve this we first add twelve", "finish": "length"}, "truncated"),
    (NUM, {"reply": "", "finish": "length"}, "truncated"),
    (NUM, {"reply": "The answer is 19 because 12 + 7 = 19."}, "off_format"),
    (MC, {"reply": "F"}, "invalid_choice"),
    (MC, {"reply": "Paris"}, "invalid_choice"),
    (MC, {"reply": "I think the date tomorrow is (A) because April has 30 days."}, "off_format"),
    (MC, {"reply": "B"}, "wrong_answer"),
    (WORDS, {"reply": "fig apple pear"}, "wrong_answer"),
    (WORDS, {"reply": "Sorted: apple, fig, pear"}, "off_format"),
    (WORDS, {"reply": "apple, fig, pear"}, "off_format"),
    (BOOL, {"reply": "True"}, "wrong_answer"),
    (BOOL, {"reply": "It evaluates to False"}, "off_format"),
    (NUM, {"reply": "20"}, "wrong_answer"),
])
def test_every_failure_gets_its_type(inst: Instance, kwargs: dict, kind: str) -> None:
    reply = kwargs.pop("reply")
    assert classify(result(inst, reply, **kwargs), inst) == kind


def test_excerpts_say_what_went_wrong() -> None:
    trace = ('Traceback (most recent call last):\n  File "/tmp/x/harness_runtime.py", line 200, in serve\n'
             '  File "/tmp/x/harness/harness.py", line 12, in extract_answer\nValueError: boom')
    crash = extract_failures([result(NUM, None, error_type="exception", error_message="ValueError: boom",
                                     tail=trace)], {NUM.id: NUM}, suite="s")[0]
    assert "ValueError: boom at harness.py:12 in extract_answer()" in crash.excerpt
    assert crash.detail["location"] == ["harness.py", "12", "extract_answer"]
    prose = extract_failures([result(NUM, "The answer is 19 because 12 + 7 = 19.")], {NUM.id: NUM}, suite="s")[0]
    assert "is not a bare number" in prose.excerpt and "(the right one)" in prose.excerpt
    assert prose.detail["shape_in_reply"] and prose.detail["target_in_reply"]
    wrong = extract_failures([result(NUM, "20")], {NUM.id: NUM}, suite="s")[0]
    assert wrong.excerpt == "answered '20', expected '19'"
    cut = extract_failures([result(NUM, "Let us think about the pens " * 5, finish="length")], {NUM.id: NUM},
                           suite="s")[0]
    assert cut.type == "truncated" and "token limit" in cut.excerpt


def test_signature_masks_numbers_and_question_words() -> None:
    a = normalise("Sure! Here is my answer: 19", NUM.input)
    b = normalise("Sure! Here is my answer: apple fig pear", WORDS.input)
    assert a == "sure here is my answer num"
    assert b == "sure here is my answer quoted"  # the words to sort are the question's content
    assert normalise("B", MC.input) == "letter"


def test_correct_and_unknown_results_are_not_failures() -> None:
    ok = result(NUM, "19", correct=True)
    stranger = InstanceResult("r1", "gone", "x", "m", "1", "2", False, 0.0)
    bad = result(NUM, "20")
    failures = extract_failures([ok, stranger, bad], {NUM.id: NUM}, {"harness.toml": "x"}, suite="s")
    assert [f.instance_id for f in failures] == [NUM.id]
    assert failures[0].key == "s/arith-1" and failures[0].harness_version  # derived from the files
    assert Failure.from_json(failures[0].to_json()) == failures[0]

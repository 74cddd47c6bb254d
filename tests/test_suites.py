"""Suites: built-in generation (deterministic across loads and processes, well-defined targets),
split assignment (stratified, disjoint, stable), name resolution, and user JSONL (errors name file
and line, and a bad file stores nothing).

The store is `storage.open_store` on SQLite in tmp_path when `storage` exists; until then a
dictionary-backed stand-in with the same three suite methods (it only stands in for the seam)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest

from ecdysis.errors import ConfigError, InputError, NotFound
from ecdysis.records import SPLITS, Instance, ScorerSpec, Suite
from ecdysis.suites import (assign_splits, builtin_suite_names, describe_suites, import_jsonl, load_jsonl,
                            load_suite)
from ecdysis.suites.scorers import resolve, score
from ecdysis.suites.splits import quotas

CATEGORY_SUITES = ["arithmetic", "dates", "word-sorting", "object-counting", "boolean"]
EXPECTED_SCORER = {"arithmetic": "numeric", "dates": "multiple_choice", "word-sorting": "exact",
                   "object-counting": "numeric", "boolean": "exact"}


class _DictStore:
    """Stand-in for the suite part of `ecdysis.store.Store`, used only while `storage` is missing."""

    def __init__(self) -> None:
        self.suites: dict[str, Suite] = {}

    def save_suite(self, suite: Suite) -> None:
        self.suites[suite.name] = suite

    def get_suite(self, name: str) -> Suite | None:
        return self.suites.get(name)

    def list_suites(self) -> list[Suite]:
        return list(self.suites.values())


@pytest.fixture
def suite_store(tmp_path: Path) -> Iterator[Any]:
    try:
        from storage import open_store  # type: ignore[attr-defined]
    except ImportError:
        yield _DictStore()
        return
    store = open_store(f"sqlite:///{tmp_path / 'suites.db'}")
    yield store
    store.close()


def fingerprint(suite: Suite) -> list[tuple[Any, ...]]:
    return [(i.id, i.input, i.target, i.category, i.choices, i.split) for i in suite.instances]


# ---------------------------------------------------------------- built-in suites

def test_builtin_names_and_sizes() -> None:
    assert builtin_suite_names() == ["reasoning-mix", *CATEGORY_SUITES]
    mix = load_suite("reasoning-mix")
    assert len(mix.instances) == 300
    assert mix.categories == {c: 60 for c in sorted(CATEGORY_SUITES)}
    for name in CATEGORY_SUITES:
        suite = load_suite(name)
        assert len(suite.instances) == 60
        assert [i.id for i in suite.instances] == [f"{name}-{n:04d}" for n in range(60)]


def test_builtin_suites_are_identical_across_loads() -> None:
    for name in builtin_suite_names():
        assert fingerprint(load_suite(name)) == fingerprint(load_suite(name))


def test_builtin_suites_are_identical_across_processes() -> None:
    code = ("import json; from ecdysis.suites import load_suite; s = load_suite('reasoning-mix'); "
            "print(json.dumps([[i.id, i.input, i.target, i.split, i.choices] for i in s.instances]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout
    here = [[i.id, i.input, i.target, i.split, list(i.choices) if i.choices else None]
            for i in load_suite("reasoning-mix").instances]
    assert json.loads(out) == here


def test_mix_holds_exactly_the_category_suites_with_the_same_splits() -> None:
    mix = {i.id: i for i in load_suite("reasoning-mix").instances}
    single = {i.id: i for name in CATEGORY_SUITES for i in load_suite(name).instances}
    assert mix == single


def test_every_instance_has_the_scorer_of_its_category() -> None:
    mix = load_suite("reasoning-mix")
    for instance in mix.instances:
        assert resolve(instance, mix.scorer).kind == EXPECTED_SCORER[instance.category]
        assert load_suite(instance.category).scorer.kind == EXPECTED_SCORER[instance.category]
        assert score(instance.target, instance, mix.scorer), instance.id


def test_task_view_hides_target_and_id_and_carries_no_answers() -> None:
    for instance in load_suite("reasoning-mix").instances:
        view = instance.task_view()
        assert "target" not in view and "id" not in view
        assert instance.target not in json.dumps(view["fields"])


def test_templates_vary_within_each_category() -> None:
    for name in CATEGORY_SUITES:
        openings = Counter(" ".join(i.input.split()[:2]) for i in load_suite(name).instances)
        assert len(openings) >= 3, (name, openings)
        assert len({i.input for i in load_suite(name).instances}) == 60


def test_arithmetic_targets_are_whole_numbers() -> None:
    targets = [i.target for i in load_suite("arithmetic").instances]
    assert all(re.fullmatch(r"\d+", t) for t in targets)
    assert len(set(targets)) > 20


def test_dates_have_four_distinct_dates_with_the_target_among_them() -> None:
    for instance in load_suite("dates").instances:
        assert instance.choices is not None and len(set(instance.choices)) == 4
        assert all(re.fullmatch(r"\d\d/\d\d/\d{4}", c) for c in instance.choices)
        assert instance.target in instance.choices
        assert "MM/DD/YYYY" in instance.input
    positions = Counter(i.choices.index(i.target) for i in load_suite("dates").instances if i.choices)
    assert len(positions) == 4  # the right answer is not always in the same place


MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DAY = r"(\d\d/\d\d/\d{4}|[A-Z][a-z]+ \d{1,2}, \d{4})"


def parse_day(text: str) -> date:
    if "/" in text:
        month, day, year = (int(x) for x in text.split("/"))
        return date(year, month, day)
    month_name, day_text, year_text = text.replace(",", "").split()
    return date(int(year_text), MONTHS.index(month_name) + 1, int(day_text))


def expected_date(question: str) -> date:
    """An independent reading of each date template (a new template must be added here)."""
    if m := re.fullmatch(rf"Today is {DAY}\. What is the date (\d+) days from now in MM/DD/YYYY\?", question):
        return parse_day(m[1]) + timedelta(days=int(m[2]))
    if m := re.fullmatch(rf"Today is {DAY}\. What was the date (\d+) days ago in MM/DD/YYYY\?", question):
        return parse_day(m[1]) - timedelta(days=int(m[2]))
    if m := re.fullmatch(rf"Yesterday was {DAY}\. What is the date tomorrow in MM/DD/YYYY\?", question):
        return parse_day(m[1]) + timedelta(days=2)
    if m := re.fullmatch(rf"The day before yesterday was {DAY}\. What is the date today in MM/DD/YYYY\?", question):
        return parse_day(m[1]) + timedelta(days=2)
    if m := re.fullmatch(rf".* is on {DAY}, which is exactly (\d) weeks? from today\. What is the date today in "
                         rf"MM/DD/YYYY\?", question):
        return parse_day(m[1]) - timedelta(weeks=int(m[2]))
    if m := re.fullmatch(r"Today is the last day of February (\d{4})\. What is the date (\d+) days? later in "
                         r"MM/DD/YYYY\?", question):
        return date(int(m[1]), 3, 1) + timedelta(days=int(m[2]) - 1)
    if m := re.fullmatch(rf"\w+ was born on {DAY}\. What is the date of (?:his|her) (\d+)\w\w birthday in "
                         rf"MM/DD/YYYY\?", question):
        born = parse_day(m[1])
        return born.replace(year=born.year + int(m[2]))
    if m := re.fullmatch(rf"Today is {DAY}\. What is the date one month ago in MM/DD/YYYY\?", question):
        today = parse_day(m[1])
        return date(today.year - (today.month == 1), (today.month - 2) % 12 + 1, today.day)
    raise AssertionError(f"no reading for {question!r}")


def test_dates_targets_follow_the_calendar() -> None:
    instances = load_suite("dates").instances
    for instance in instances:
        day = expected_date(instance.input)
        assert instance.target == f"{day.month:02d}/{day.day:02d}/{day.year}", instance.input
    leap_years = {m[1] for i in instances if (m := re.search(r"February (\d{4})", i.input))}
    assert any(int(y) % 4 == 0 for y in leap_years) and any(int(y) % 4 for y in leap_years)


def test_word_sorting_target_is_the_input_words_sorted() -> None:
    for instance in load_suite("word-sorting").instances:
        words = instance.target.split(" ")
        assert words == sorted(words) and len(words) == len(set(words)) >= 4
        for word in words:
            assert re.search(rf"\b{word}\b", instance.input)


KIND_WORDS = {
    "fruits": r"apples?|bananas?|peach(?:es)?|plums?|oranges?|strawberr(?:y|ies)|nectarines?|raspberr(?:y|ies)|grapes?",
    "vegetables": r"carrots?|potato(?:es)?|onions?|cabbages?|yams?|cauliflowers?|stalks? of celery|lettuce heads?",
    "animals": r"cats?|dogs?|rabbits?|goats?|mouse|mice|fish|donkeys?|snails?|frogs?|chickens?",
    "musical instruments": r"pianos?|violins?|flutes?|drums?|trumpets?|clarinets?|accordions?|trombones?",
}
QUANTITY = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def test_object_counting_targets_count_the_asked_kind() -> None:
    checked = 0
    for instance in load_suite("object-counting").instances:
        kind = re.search(r"How many (fruits|vegetables|animals|musical instruments)", instance.input)
        assert kind is not None and int(instance.target) >= 1
        listing, _, rest = instance.input.partition(". ")
        found = re.findall(rf"\b(an?|two|three|four|five) ({KIND_WORDS[kind[1]]})\b", listing)
        count = sum(QUANTITY[n] for n, _ in found)
        if change := re.match(r"(Then I give away one|Later I get (two|three|four) more)", rest):
            count += -1 if "give away" in change[1] else QUANTITY[change[2]]
        assert count == int(instance.target), instance.input
        checked += 1
    assert checked == 60


BOOLEAN_FRAMES = [r"(.*) is", r"Evaluate the boolean expression: (.*)",
                  r"What is the value of the Python expression `(.*)`\? Answer True or False\.",
                  r"Is the following expression True or False\? (.*)"]


def test_boolean_targets_match_python_and_are_balanced() -> None:
    suite = load_suite("boolean")
    for instance in suite.instances:
        text = next(m[1] for f in BOOLEAN_FRAMES if (m := re.fullmatch(f, instance.input)))
        tree = ast.parse(text, mode="eval")
        # Only constants and boolean operators, so evaluating it is safe.
        assert all(isinstance(n, (ast.Expression, ast.BoolOp, ast.UnaryOp, ast.Constant, ast.And, ast.Or, ast.Not))
                   for n in ast.walk(tree)), text
        assert str(eval(compile(tree, "<bool>", "eval"))) == instance.target, instance.input
    assert Counter(i.target for i in suite.instances) == {"True": 30, "False": 30}
    assert len({len(re.findall(r"\b(?:and|or|not)\b", i.input)) for i in suite.instances}) >= 3


# ---------------------------------------------------------------- splits

def test_builtin_splits_are_disjoint_cover_and_stratified() -> None:
    mix = load_suite("reasoning-mix")
    parts = {s: {i.id for i in mix.split(s)} for s in SPLITS}
    assert sum(len(p) for p in parts.values()) == len(mix.instances)
    assert set.union(*parts.values()) == {i.id for i in mix.instances}
    for category in mix.categories:
        counts = Counter(i.split for i in mix.instances if i.category == category)
        assert counts == {"train": 30, "validation": 15, "test": 15}


def test_splits_depend_on_the_seed_but_not_on_the_call() -> None:
    a, b, c = load_suite("arithmetic", seed=0), load_suite("arithmetic", seed=0), load_suite("arithmetic", seed=1)
    assert [i.split for i in a.instances] == [i.split for i in b.instances]
    assert [i.split for i in a.instances] != [i.split for i in c.instances]
    assert Counter(i.split for i in c.instances) == Counter(i.split for i in a.instances)


def make(n: int, category: str = "c", split: Any = None, prefix: str = "x") -> list[Instance]:
    return [Instance(id=f"{prefix}{category}{k}", input="q", target="a", category=category, split=split)
            for k in range(n)]


def test_small_categories_still_reach_every_split() -> None:
    instances = make(3, "three") + make(4, "four") + make(1, "one") + make(2, "two")
    result = assign_splits(instances)
    assert [i.id for i in result] == [i.id for i in instances]  # order kept
    by_cat: dict[str, Counter[str]] = {}
    for i in result:
        by_cat.setdefault(i.category, Counter())[str(i.split)] += 1
    assert by_cat["three"] == {"train": 1, "validation": 1, "test": 1}
    assert by_cat["four"] == {"train": 2, "validation": 1, "test": 1}
    assert by_cat["one"] == {"train": 1}
    assert sum(by_cat["two"].values()) == 2


def test_preassigned_splits_are_kept_and_the_rest_fills_the_quota() -> None:
    instances = make(2, split="test", prefix="p") + make(10)
    result = {i.id: i.split for i in assign_splits(instances)}
    assert result["pc0"] == result["pc1"] == "test"
    assert Counter(result.values()) == dict(zip(SPLITS, quotas(12, (0.5, 0.25, 0.25))))


def test_assignment_is_by_id_not_by_position() -> None:
    instances = make(20)
    forward = {i.id: i.split for i in assign_splits(instances, seed=3)}
    backward = {i.id: i.split for i in assign_splits(list(reversed(instances)), seed=3)}
    assert forward == backward


def test_bad_fractions_and_duplicate_ids_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        assign_splits(make(4), fractions=(0.5, 0.5, -0.1))
    with pytest.raises(ConfigError):
        assign_splits(make(4), fractions=(0.0, 0.0, 0.0))
    with pytest.raises(ConfigError, match="twice"):
        assign_splits(make(2) + make(1))


def test_custom_fractions() -> None:
    result = assign_splits(make(10), fractions=(0.8, 0.2, 0.0))
    assert Counter(i.split for i in result) == {"train": 8, "validation": 2}


# ---------------------------------------------------------------- resolution and listing

def test_unknown_names_raise_not_found_with_what_exists() -> None:
    with pytest.raises(NotFound) as err:
        load_suite("no-such-suite")
    assert "reasoning-mix" in str(err.value.hint) and "bigbench:" in str(err.value.hint)
    with pytest.raises(NotFound, match="no file"):
        load_suite("missing/file.jsonl")


def test_describe_lists_builtins_and_stored_suites(tmp_path: Path, suite_store: Any) -> None:
    rows = {r["name"]: r for r in describe_suites(bigbench=False, bfcl=False)}
    assert set(rows) == set(builtin_suite_names())
    mix = rows["reasoning-mix"]
    assert mix["size"] == 300 and mix["categories"]["dates"] == 60
    assert mix["scorer"] == "by_category" and mix["scorers"] == EXPECTED_SCORER
    assert mix["source"] == "builtin" and mix["description"]
    path = write(tmp_path / "mine.jsonl", [{"input": "1+1", "target": "2"}, {"input": "2+2", "target": "4"}])
    import_jsonl(path, store=suite_store)
    stored = {r["name"]: r for r in describe_suites(store=suite_store, bigbench=False)}["mine"]
    assert stored["size"] == 2 and stored["scorer"] == "exact" and stored["source"].startswith("jsonl:")
    assert stored["answer_forms"] == {"default": {"kind": "integer"}}


# ---------------------------------------------------------------- JSONL

def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = [
    {"ecdysis_suite": {"name": "capitals", "scorer": {"kind": "multiple_choice"}, "description": "Capitals."}},
    {"id": "fr", "input": "Capital of France?", "target": "Paris", "choices": ["Lyon", "Paris"], "category": "eu"},
    {"input": "Capital of Japan?", "target": "Tokyo", "choices": ["Tokyo", "Osaka"], "split": "test",
     "fields": {"region": "asia"}},
    "",
    {"input": "Capital of Peru?", "target": "Lima", "choices": ["Lima", "Cusco", "Quito"]},
]


def test_jsonl_loads_header_defaults_and_fields(tmp_path: Path) -> None:
    suite = load_jsonl(write(tmp_path / "caps.jsonl", GOOD))
    assert suite.name == "capitals" and suite.description == "Capitals."
    assert suite.scorer == ScorerSpec("multiple_choice")
    assert [i.id for i in suite.instances] == ["fr", "line-3", "line-5"]
    japan = suite.instances[1]
    assert japan.split == "test" and japan.fields == {"region": "asia"} and japan.category == "default"
    assert suite.instances[0].choices == ("Lyon", "Paris")
    assert score("B", suite.instances[0], suite.scorer)


def test_jsonl_by_path_gets_splits_and_reloads_by_its_name(tmp_path: Path) -> None:
    path = write(tmp_path / "caps.jsonl", GOOD)
    suite = load_suite(str(path))
    assert suite.name == str(path)
    assert all(i.split in SPLITS for i in suite.instances)
    assert suite.instances[1].split == "test"  # given in the file
    assert fingerprint(load_suite(suite.name)) == fingerprint(suite)


def test_jsonl_scorer_argument_and_numeric_targets(tmp_path: Path) -> None:
    path = write(tmp_path / "math.jsonl", [{"input": "2+2", "target": 4}, {"input": "half of 5", "target": 2.5}])
    suite = load_jsonl(path, scorer=ScorerSpec("numeric"), name="math")
    assert [i.target for i in suite.instances] == ["4", "2.5"] and suite.name == "math"
    with pytest.raises(ConfigError):
        load_jsonl(path, scorer=ScorerSpec("fuzzy"))


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ({"target": "x"}, "missing 'input'"),
    ({"input": "x"}, "missing 'target'"),
    ({"input": 3, "target": "x"}, "must be a string"),
    ({"input": "x", "target": ["a"]}, "must be a string"),
    ({"input": "x", "target": "a", "choices": "a b"}, "'choices' must be a list"),
    ({"input": "x", "target": "c", "choices": ["a", "b"]}, "not one of the choices"),
    ({"input": "x", "target": "a", "fields": [1]}, "'fields' must be a JSON object"),
    ({"input": "x", "target": "a", "split": "dev"}, "split 'dev'"),
    ({"input": "x", "target": "a", "category": 7}, "'category' must be a non-empty string"),
    ({"input": "x", "target": "a", "answer": "a"}, "unknown keys"),
    ({"id": "one", "input": "again", "target": "b"}, "duplicate id 'one' (first on line 2)"),
    ({"ecdysis_suite": {"name": "late"}}, "header must be the first line"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_LINES)
def test_jsonl_errors_name_the_file_and_line_and_store_nothing(tmp_path: Path, suite_store: Any, bad: Any,
                                                                 message: str) -> None:
    path = write(tmp_path / "broken.jsonl", [{"ecdysis_suite": {"name": "broken"}},
                                             {"id": "one", "input": "q", "target": "a"}, bad,
                                             {"input": "fine", "target": "z"}])
    with pytest.raises(InputError) as err:
        import_jsonl(path, store=suite_store)
    assert err.value.path == str(path) and err.value.line == 3
    assert f"{path}:3" in str(err.value) and message in str(err.value)
    assert suite_store.get_suite("broken") is None and suite_store.list_suites() == []


@pytest.mark.parametrize(("header", "body", "line", "message"), [
    ({"scorer": {"kind": "fuzzy"}}, {"input": "q", "target": "a"}, 1, "unknown scorer kind"),
    ({"colour": "red"}, {"input": "q", "target": "a"}, 1, "unknown header keys"),
    ({"scorer": {"kind": "numeric"}}, {"input": "q", "target": "many"}, 2, "is not a number"),
    ({"scorer": {"kind": "multiple_choice"}}, {"input": "q", "target": "a"}, 2, "no 'choices'"),
    ({"scorer": {"kind": "by_category", "options": {"categories": {"m": {"kind": "numeric"}}}}},
     {"input": "q", "target": "1", "category": "other"}, 2, "no entry for category"),
])
def test_jsonl_lines_are_checked_against_the_scorer(tmp_path: Path, header: dict[str, Any], body: dict[str, Any],
                                                    line: int, message: str) -> None:
    path = write(tmp_path / "s.jsonl", [{"ecdysis_suite": header}, body])
    with pytest.raises(InputError) as err:
        load_jsonl(path)
    assert err.value.line == line and message in str(err.value)


def test_jsonl_empty_or_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no instances"):
        load_jsonl(write(tmp_path / "empty.jsonl", ["", {"ecdysis_suite": {}}]))
    with pytest.raises(InputError, match="file not found"):
        load_jsonl(tmp_path / "absent.jsonl")


def test_import_stores_then_loads_by_name_with_splits(tmp_path: Path, suite_store: Any) -> None:
    path = write(tmp_path / "caps.jsonl", GOOD)
    saved = import_jsonl(path, store=suite_store)
    assert saved.name == "capitals" and suite_store.get_suite("capitals") is not None
    loaded = load_suite("capitals", store=suite_store)
    assert [i.id for i in loaded.instances] == ["fr", "line-3", "line-5"]
    assert all(i.split in SPLITS for i in loaded.instances) and loaded.instances[1].split == "test"
    with pytest.raises(NotFound) as err:
        load_suite("capitalz", store=suite_store)
    assert "capitals" in str(err.value.hint)


def test_import_refuses_builtin_names_and_silent_replacement(tmp_path: Path, suite_store: Any) -> None:
    path = write(tmp_path / "caps.jsonl", GOOD)
    with pytest.raises(InputError, match="built-in"):
        import_jsonl(path, store=suite_store, name="arithmetic")
    with pytest.raises(InputError, match="not usable"):
        import_jsonl(path, store=suite_store, name="bigbench:date_understanding")
    assert suite_store.list_suites() == []
    import_jsonl(path, store=suite_store)
    with pytest.raises(InputError, match="already stored"):
        import_jsonl(path, store=suite_store)
    smaller = write(tmp_path / "one.jsonl", [{"input": "q", "target": "a"}])
    import_jsonl(smaller, store=suite_store, name="capitals", replace=True)
    assert len(load_suite("capitals", store=suite_store).instances) == 1


def test_an_uploaded_suite_is_capped_checked_and_refused_naming_the_upload(tmp_path: Path, suite_store: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from ecdysis.service import Service
    from ecdysis.suites import jsonl as jsonl_mod
    svc = Service(suite_store)
    good = b'{"input": "1+1", "target": "2"}\n{"input": "2+2", "target": "4"}\n'
    assert len(svc.import_suite(good, name="sums", filename="sums.jsonl").instances) == 2
    with pytest.raises(InputError, match=r"^mine\.jsonl:2: missing 'target'"):
        svc.import_suite(good.splitlines()[0] + b'\n{"input": "x"}\n', name="other", filename="mine.jsonl")
    assert suite_store.get_suite("other") is None  # nothing stored from a bad file
    with pytest.raises(InputError, match="already stored"):
        svc.import_suite(good, name="sums", filename="sums.jsonl")
    monkeypatch.setattr(jsonl_mod, "MAX_FILE_BYTES", 40)
    with pytest.raises(InputError, match=r"big\.jsonl: the file is 0\.0 MB; a suite file may hold at most 0 MB"):
        svc.import_suite(good, name="big", filename="big.jsonl")
    path = tmp_path / "big.jsonl"
    path.write_bytes(good)
    with pytest.raises(InputError, match="a suite file may hold at most"):
        load_jsonl(path)

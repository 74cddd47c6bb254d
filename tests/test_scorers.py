"""Scorers: for each kind, answers that must be accepted and near misses that must be rejected;
unknown kinds and unusable specs are `ConfigError`s, and a new kind is one registry entry."""

from __future__ import annotations

import pytest

from ecdysis.errors import ConfigError
from ecdysis.records import Instance, ScorerSpec
from ecdysis.suites import scorers
from ecdysis.suites.scorers import normalize, parse_number, resolve, score

DATES = ("05/01/2021", "02/23/2021", "03/11/2021", "04/29/2021")


def inst(target: str, *, choices: tuple[str, ...] | None = None, category: str = "default",
         id: str = "i-0001") -> Instance:
    return Instance(id=id, input="question", target=target, category=category, choices=choices)


# ---------------------------------------------------------------- exact

@pytest.mark.parametrize("answer", ["gelatine stick", "  Gelatine   STICK. ", '"gelatine stick"',
                                    "'gelatine stick'.", "GELATINE\nstick", "\u201cgelatine stick\u201d"])
def test_exact_accepts_after_normalisation(answer: str) -> None:
    assert score(answer, inst("gelatine stick"), ScorerSpec("exact"))


@pytest.mark.parametrize("answer", ["stick gelatine", "gelatine, stick", "gelatine stick and more", "",
                                    "gelatinestick"])
def test_exact_rejects_other_text(answer: str) -> None:
    assert not score(answer, inst("gelatine stick"), ScorerSpec("exact"))


def test_normalize_keeps_inner_punctuation_and_ellipsis() -> None:
    assert normalize("  'Paris'. ") == "paris"
    assert normalize("e.g. this") == "e.g. this"
    assert normalize("wait...") == "wait..."


def test_exact_accepts_aliases_from_the_spec_only_for_that_instance() -> None:
    spec = ScorerSpec("exact", {"aliases": {"i-0001": ["3"]}})
    assert score("3", inst("three"), spec)
    assert score("Three.", inst("three"), spec)
    assert not score("3", inst("three", id="i-0002"), spec)


# ---------------------------------------------------------------- numeric

@pytest.mark.parametrize("answer", ["42", "42.0", "$42", " 42 ", "42.", "$ 42.00", "+42"])
def test_numeric_accepts_a_bare_number(answer: str) -> None:
    assert score(answer, inst("42"), ScorerSpec("numeric"))


@pytest.mark.parametrize("answer", ["I think 42 or 43", "42 or 43", "42 apples", "4 2", "", "$", "43",
                                    "-42", "42/1", "about 42", "The answer is 42"])
def test_numeric_rejects_prose_and_wrong_numbers(answer: str) -> None:
    assert not score(answer, inst("42"), ScorerSpec("numeric"))


def test_numeric_thousands_negatives_percent_and_number_words() -> None:
    assert score("1,000", inst("1000"), ScorerSpec("numeric"))
    assert not score("1,00", inst("100"), ScorerSpec("numeric"))
    assert score("-3.5", inst("-3.5"), ScorerSpec("numeric"))
    assert score("25%", inst("25"), ScorerSpec("numeric"))
    assert score("Three.", inst("3"), ScorerSpec("numeric"))
    assert parse_number("twenty") == 20.0
    assert parse_number("twenty one") is None


def test_numeric_tolerance_option() -> None:
    target = inst("3.14159")
    assert not score("3.14", target, ScorerSpec("numeric"))
    assert score("3.14", target, ScorerSpec("numeric", {"tol": 0.01}))
    assert score("3.1415900000001", target, ScorerSpec("numeric"))  # within the default 1e-6


def test_numeric_target_that_is_not_a_number_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="non-numeric target"):
        score("3", inst("many"), ScorerSpec("numeric"))


# ---------------------------------------------------------------- multiple choice

@pytest.mark.parametrize("answer", ["05/01/2021", " 05/01/2021. ", "A", "(A)", "A.", "a)", "A:",
                                    "(A) 05/01/2021", "A. 05/01/2021"])
def test_multiple_choice_accepts_text_or_letter_of_the_target(answer: str) -> None:
    assert score(answer, inst("05/01/2021", choices=DATES), ScorerSpec("multiple_choice"))


@pytest.mark.parametrize("answer", ["B", "(B)", "02/23/2021", "(A) 02/23/2021", "E", "A or B", "AB",
                                    "05/01/2021 or 02/23/2021", ""])
def test_multiple_choice_rejects_other_choices_and_mixtures(answer: str) -> None:
    assert not score(answer, inst("05/01/2021", choices=DATES), ScorerSpec("multiple_choice"))


def test_multiple_choice_letter_follows_choice_order() -> None:
    instance = inst("03/11/2021", choices=DATES)
    assert score("C", instance, ScorerSpec("multiple_choice"))
    assert not score("A", instance, ScorerSpec("multiple_choice"))


def test_multiple_choice_needs_choices() -> None:
    with pytest.raises(ConfigError, match="no choices"):
        score("A", inst("05/01/2021"), ScorerSpec("multiple_choice"))


# ---------------------------------------------------------------- regex

def test_regex_fullmatches_the_stripped_answer() -> None:
    spec = ScorerSpec("regex", {"pattern": r"\d+"})
    assert score("  123 ", inst("ignored"), spec)
    assert not score("123a", inst("ignored"), spec)
    assert not score("x123", inst("ignored"), spec)
    assert score("YES", inst(""), ScorerSpec("regex", {"pattern": "yes", "ignore_case": True}))
    assert not score("YES", inst(""), ScorerSpec("regex", {"pattern": "yes"}))


@pytest.mark.parametrize("options", [{}, {"pattern": ""}, {"pattern": "("}])
def test_regex_without_a_usable_pattern_is_a_config_error(options: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        score("1", inst("1"), ScorerSpec("regex", options))


# ---------------------------------------------------------------- mixed suites and the registry

MIXED = ScorerSpec("by_category", {"categories": {"math": {"kind": "numeric"},
                                                  "dates": {"kind": "multiple_choice"}},
                                   "default": {"kind": "exact"}})


def test_by_category_scores_each_instance_with_its_category_scorer() -> None:
    assert score("$7", inst("7", category="math"), MIXED)
    assert not score("$7", inst("7", category="other"), MIXED)  # default: exact
    assert score("B", inst("02/23/2021", choices=DATES, category="dates"), MIXED)
    assert resolve(inst("7", category="math"), MIXED).kind == "numeric"
    assert resolve(inst("7", category="other"), MIXED).kind == "exact"


def test_by_category_without_entry_or_default_is_a_config_error() -> None:
    spec = ScorerSpec("by_category", {"categories": {"math": {"kind": "numeric"}}})
    with pytest.raises(ConfigError, match="no entry for category"):
        score("1", inst("1", category="poetry"), spec)


def test_unknown_kind_is_a_config_error_listing_known_kinds() -> None:
    with pytest.raises(ConfigError) as err:
        score("1", inst("1"), ScorerSpec("fuzzy"))
    assert "numeric" in str(err.value.hint)
    with pytest.raises(ConfigError):
        scorers.check_spec(ScorerSpec("by_category", {"categories": {"x": {"kind": "fuzzy"}}}))


def test_a_new_kind_is_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(scorers.SCORERS, "prefix", lambda answer, instance, options: answer.startswith(instance.target))
    assert score("Paris, France", inst("Paris"), ScorerSpec("prefix"))
    assert not score("Lyon", inst("Paris"), ScorerSpec("prefix"))
    assert "prefix" in scorers.scorer_kinds()

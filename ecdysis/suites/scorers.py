"""Scoring: the runner hands each extracted answer, its instance and the suite's `ScorerSpec` to
`score`, whose boolean becomes `InstanceResult.correct`; nothing here sees a model or a store.

Kinds (`SCORERS`; adding one is a function plus a line in that dict):

- `exact` — equal after `normalize` (strip, casefold, collapsed whitespace, no surrounding quotes,
  no trailing period).
- `numeric` — the answer must *be* a number ("42", "42.0", "$42", "1,000", "-3.5", "7%", or a
  number word up to twenty); "I think 42 or 43" is wrong, not parsed. Option `tol` (absolute,
  default 1e-6).
- `multiple_choice` — the answer is the target choice's text, its letter ("B", "(B)", "B.", "B)")
  or the letter followed by the text ("(B) 05/01/2021"); needs `instance.choices`.
- `regex` — option `pattern` fullmatches the stripped answer; option `ignore_case` (bool). A
  pattern that can backtrack exponentially is refused (`check_pattern`): a quantifier over a part
  that holds another quantifier, such as `^(a+)+$`, must be possessive (`(a+)++`) or atomic
  (`(?>(a+)+)`), which Python's `re` supports since 3.11.
- `bfcl_ast` — the answer holds function calls (JSON or Python syntax, see `calls.parse_calls`),
  checked by BFCL's AST rules against the possible answer in the target, with the function docs
  in `instance.fields["functions"]` (see `bfcl.check_calls`); a target of [] means "call nothing".
- `bfcl_multi_turn` — the answer records a multi-turn conversation's calls per turn; they are
  replayed in BFCL's environments beside the ground truth in the target, and each turn's state and
  results must match (see `bfcl_multi_turn.score_multi_turn`).
- `by_category` — a mixed suite: option `categories` maps category -> {"kind", "options"}, and
  option `default` (same shape) covers any other category. `resolve` gives the spec actually used.

Every kind also accepts option `aliases`: {instance id: [other accepted targets]}. It lives in the
spec, not in `Instance.fields`, because fields reach the harness and aliases are answers.
"""

from __future__ import annotations

import functools
import math
import re
import re._constants as _sre  # the parse tree's opcodes: how `check_pattern` reads a pattern
import re._parser as _sre_parser
from collections.abc import Callable, Mapping
from typing import Any

from ecdysis.errors import ConfigError
from ecdysis.records import Instance, ScorerSpec
from ecdysis.suites.bfcl import score_bfcl
from ecdysis.suites.bfcl_multi_turn import score_multi_turn

Scorer = Callable[[str, Instance, Mapping[str, Any]], bool]

_QUOTES = (("\"", "\""), ("'", "'"), ("`", "`"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))
_CURRENCY = ("$", "\u20ac", "\u00a3")
_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?")
NUMBER_WORDS = {word: i for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
# "(B)", "B", "B.", "B)", "B:", optionally followed by the choice text.
_LETTER = re.compile(r"(?:\(([a-z])\)|([a-z])[.):]?)(?:\s+(.*))?", re.DOTALL | re.IGNORECASE)


def normalize(text: str) -> str:
    """The comparable form of an answer or target for `exact` and `multiple_choice`."""
    out = " ".join(text.split()).casefold()
    previous = None
    while out != previous:  # "'Paris.'" and "'Paris'." both reduce to "paris"
        previous = out
        out = out.strip()
        if out.endswith(".") and not out.endswith(".."):
            out = out[:-1]
        out = _strip_quotes(out)
    return out


def _strip_quotes(text: str) -> str:
    for left, right in _QUOTES:
        if len(text) >= 2 and text.startswith(left) and text.endswith(right):
            return text[1:-1]
    return text


def accepted_targets(instance: Instance, options: Mapping[str, Any]) -> list[str]:
    """The target plus any aliases the spec lists for this instance id."""
    aliases = options.get("aliases") or {}
    return [instance.target, *[str(a) for a in aliases.get(instance.id, ())]]


def parse_number(text: str) -> float | None:
    """The value of `text` if the whole text is one number, else None (never a number inside prose)."""
    body = normalize(text)
    sign = ""
    if body[:1] in ("-", "+"):
        sign, body = body[0], body[1:].lstrip()
    if body[:1] in _CURRENCY:
        body = body[1:].lstrip()
    body = body.removesuffix("%").rstrip()
    if body in NUMBER_WORDS and not sign:
        return float(NUMBER_WORDS[body])
    if not any(c.isdigit() for c in body) or not _NUMBER.fullmatch(body):
        return None
    return float(sign + body.replace(",", ""))


def exact(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    got = normalize(answer)
    return any(got == normalize(t) for t in accepted_targets(instance, options))


def numeric(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    tol = float(options.get("tol", 1e-6))
    got = parse_number(answer)
    if got is None:
        return False
    for target in accepted_targets(instance, options):
        want = parse_number(target)
        if want is None:
            raise ConfigError(f"instance {instance.id!r} has a non-numeric target {target!r}",
                              hint="use the exact scorer for this suite or fix the target")
        if math.isclose(got, want, rel_tol=0.0, abs_tol=tol):
            return True
    return False


def multiple_choice(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    if not instance.choices:
        raise ConfigError(f"instance {instance.id!r} has no choices for the multiple_choice scorer",
                          hint="give the instance choices or use the exact scorer")
    choices = [normalize(c) for c in instance.choices]
    got = normalize(answer)
    wanted = {normalize(t) for t in accepted_targets(instance, options)}
    if got in choices:  # a choice's own text wins over reading it as a letter
        return got in wanted
    letter = _LETTER.fullmatch(answer.strip())
    if not letter:
        return False
    index = ord((letter.group(1) or letter.group(2)).upper()) - ord("A")
    if not 0 <= index < len(choices) or choices[index] not in wanted:
        return False
    rest = letter.group(3)
    return rest is None or normalize(rest) == choices[index]


def regex(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    pattern = options.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("the regex scorer needs a `pattern` option", hint='e.g. {"pattern": "\\\\d+"}')
    flags = re.IGNORECASE if options.get("ignore_case") else 0
    return _compiled(pattern, flags).fullmatch(answer.strip()) is not None


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str, flags: int) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern, flags)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ConfigError(f"regex scorer pattern {pattern!r} does not compile: {exc}") from exc
    check_pattern(pattern, flags)
    return compiled


# sre parse-tree opcodes of a backtracking repeat, and of the constructs that never backtrack into.
_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT}
_NO_BACKTRACK = {_sre.POSSESSIVE_REPEAT, _sre.ATOMIC_GROUP}


def check_pattern(pattern: str, flags: int = 0) -> None:
    """Raise `ConfigError` for a pattern that can take exponential time (Python's `re` cannot be
    stopped once it matches): a repeat that can run more than once over a subpattern that holds
    another such repeat, neither possessive nor atomic. `(ab+)+` and `(a+)+` are refused; `\\d+`,
    `(ab)+`, `(?:a|b)+`, `(a++)+`, `(?>(a+)+)` and `\\d{1,3}(,\\d{3})*` pass. Overlapping
    alternatives under a repeat (`(a|aa)+`) are not detected."""
    try:
        tree = _sre_parser.parse(pattern, flags)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ConfigError(f"regex scorer pattern {pattern!r} does not compile: {exc}") from exc
    if _nested_repeat(list(tree), inside_repeat=False):
        raise ConfigError(f"regex scorer pattern {pattern!r} nests quantifiers, which can backtrack for minutes",
                          hint="make the outer or inner quantifier possessive (`++`, `*+`) or the group atomic "
                               "(`(?>...)`), or drop the nesting")


def _nested_repeat(items: list[Any], *, inside_repeat: bool) -> bool:
    for op, arg in items:
        if op in _NO_BACKTRACK:
            continue
        if op in _REPEATS:
            low, high, body = arg
            repeats = high > 1 and low != high  # a fixed count ({3}) leaves nothing to backtrack over
            if repeats and inside_repeat:
                return True
            if _nested_repeat(list(body), inside_repeat=inside_repeat or repeats):
                return True
        elif op == _sre.SUBPATTERN:
            if _nested_repeat(list(arg[-1]), inside_repeat=inside_repeat):
                return True
        elif op == _sre.BRANCH:
            if any(_nested_repeat(list(branch), inside_repeat=inside_repeat) for branch in arg[1]):
                return True
        elif op == _sre.GROUPREF_EXISTS:
            if any(b is not None and _nested_repeat(list(b), inside_repeat=inside_repeat) for b in arg[1:]):
                return True
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            if _nested_repeat(list(arg[1]), inside_repeat=inside_repeat):
                return True
    return False


def bfcl_ast(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    return score_bfcl(answer, instance).correct


def bfcl_multi_turn(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    return score_multi_turn(answer, instance).correct


def by_category(answer: str, instance: Instance, options: Mapping[str, Any]) -> bool:
    return score(answer, instance, _category_spec(instance, options))


SCORERS: dict[str, Scorer] = {
    "exact": exact,
    "numeric": numeric,
    "multiple_choice": multiple_choice,
    "regex": regex,
    "bfcl_ast": bfcl_ast,
    "bfcl_multi_turn": bfcl_multi_turn,
    "by_category": by_category,
}


def scorer_kinds() -> list[str]:
    return sorted(SCORERS)


def check_spec(spec: ScorerSpec) -> ScorerSpec:
    """Raise `ConfigError` unless `spec` (and, for `by_category`, each inner spec) names a known kind."""
    if spec.kind not in SCORERS:
        raise _unknown_kind(spec.kind)
    if spec.kind == "regex" and isinstance(spec.options.get("pattern"), str):
        _compiled(spec.options["pattern"], re.IGNORECASE if spec.options.get("ignore_case") else 0)
    if spec.kind == "by_category":
        inner = list((spec.options.get("categories") or {}).values())
        if spec.options.get("default") is not None:
            inner.append(spec.options["default"])
        for raw in inner:
            check_spec(spec_from_json(raw))
    return spec


def _unknown_kind(kind: str) -> ConfigError:
    return ConfigError(f"unknown scorer kind {kind!r}", hint=f"known kinds: {', '.join(scorer_kinds())}")


def spec_from_json(raw: Any) -> ScorerSpec:
    """A `ScorerSpec` from its JSON shape {"kind": ..., "options": {...}} (or a bare kind string)."""
    if isinstance(raw, ScorerSpec):
        return raw
    if isinstance(raw, str):
        return ScorerSpec(kind=raw)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("kind"), str):
        raise ConfigError(f"a scorer must be an object with a string `kind`, got {raw!r}",
                          hint='e.g. {"kind": "numeric", "options": {"tol": 0.01}}')
    options = raw.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"scorer options must be an object, got {options!r}")
    return ScorerSpec(kind=raw["kind"], options=dict(options))


def spec_to_json(spec: ScorerSpec) -> dict[str, Any]:
    return {"kind": spec.kind, "options": dict(spec.options)}


def resolve(instance: Instance, spec: ScorerSpec) -> ScorerSpec:
    """The non-mixed spec that scores `instance` (follows `by_category` down to a concrete kind)."""
    while spec.kind == "by_category":
        spec = _category_spec(instance, spec.options)
    return spec


def _category_spec(instance: Instance, options: Mapping[str, Any]) -> ScorerSpec:
    per_category = options.get("categories") or {}
    raw = per_category.get(instance.category, options.get("default"))
    if raw is None:
        raise ConfigError(f"the by_category scorer has no entry for category {instance.category!r}",
                          hint=f"known categories: {', '.join(sorted(per_category))}; or set `default`")
    return spec_from_json(raw)


def score(answer: str, instance: Instance, spec: ScorerSpec) -> bool:
    """True when `answer` is correct for `instance` under `spec`; `ConfigError` for an unknown kind."""
    fn = SCORERS.get(spec.kind)
    if fn is None:
        raise _unknown_kind(spec.kind)
    return fn(answer, instance, spec.options)

"""The ways an evolution turns a train batch into kept harness changes, one class each.

An iteration always runs: train batch -> diagnoses -> human gate -> (screening) -> composition
and paired validation -> record. The strategies differ in four choices:

| strategy        | train batch                 | what is diagnosed                 | screened alone | composed and gated |
|-----------------|-----------------------------|-----------------------------------|----------------|--------------------|
| ecdysis         | curated (failed first)      | the whole batch, clustered        | yes            | one change at a time |
| per-instance    | the k-th window             | one failing instance              | no             | one change at a time |
| self-evolution  | the k-th window             | each failing instance, one edit each | no          | all edits together |

`ecdysis` is the paper's method (batch aggregation, failure-aware curation) with our screening;
`per-instance` is the iterative per-instance search we compared against first; `self-evolution`
is the paper's own baseline (one coding edit per failing task, applied one after another, the
result kept only if it improves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ecdysis.errors import ConfigError
from ecdysis.records import Instance

# A diagnosis scope: None is the whole batch, a list is "only these instances' failures".
Scope = list[str] | None


def window(train: Sequence[Instance], size: int, iteration: int) -> list[Instance]:
    """Iteration k's slice of the train split (wrapping): the same for every strategy, so none sees
    more data than another."""
    size = min(size, len(train))
    start = ((iteration - 1) * size) % len(train)
    return [train[(start + i) % len(train)] for i in range(size)]


@dataclass(frozen=True)
class Strategy:
    name: str = ""
    screens: bool = False        # each approved change is first measured alone on its own cluster
    one_at_a_time: bool = True   # changes are validated one by one (else all together, once)

    def batch(self, train: Sequence[Instance], size: int, iteration: int,
              failed_before: Sequence[str]) -> list[Instance]:
        return window(train, size, iteration)

    def scopes(self, failing: Sequence[str], tried: Sequence[str]) -> list[Scope]:
        """What to diagnose this iteration, given the batch's failing instance ids (in order) and the
        ones an earlier iteration already diagnosed alone."""
        raise NotImplementedError

    def max_proposals(self, scope: Scope) -> int | None:
        return None if scope is None else 1


@dataclass(frozen=True)
class EcdysisBatch(Strategy):
    """Diagnose the batch as a whole; screen each change alone; keep changes one at a time.

    Failure-aware curation (the paper's third component): from the second iteration on, up to
    `failed_share` of the batch are train instances that failed in an earlier batch (the most
    recent first), the rest comes from the iteration's own window, whose passing instances guard
    against regressions."""

    name: str = "ecdysis"
    screens: bool = True
    one_at_a_time: bool = True
    failed_share: float = 0.5

    def batch(self, train: Sequence[Instance], size: int, iteration: int,
              failed_before: Sequence[str]) -> list[Instance]:
        fresh = window(train, size, iteration)
        if iteration == 1 or not failed_before:
            return fresh
        by_id = {i.id: i for i in train}
        size = len(fresh)
        chosen: list[Instance] = []
        for iid in reversed(list(dict.fromkeys(failed_before))):  # most recent failures first
            if len(chosen) >= int(self.failed_share * size):
                break
            if iid in by_id:
                chosen.append(by_id[iid])
        seen = {i.id for i in chosen}
        chosen += [i for i in fresh if i.id not in seen][:size - len(chosen)]
        return chosen

    def scopes(self, failing: Sequence[str], tried: Sequence[str]) -> list[Scope]:
        return [None]


@dataclass(frozen=True)
class PerInstanceSearch(Strategy):
    """One failing instance per iteration (the first not tried before), one repair of it, gated."""

    name: str = "per-instance"

    def scopes(self, failing: Sequence[str], tried: Sequence[str]) -> list[Scope]:
        fresh = [i for i in failing if i not in set(tried)]
        return [[fresh[0]]] if fresh else []


@dataclass(frozen=True)
class SelfEvolution(Strategy):
    """The paper's baseline: one edit per failing instance not tried before, applied one after
    another onto one candidate, which is kept only if the paired gate finds it better.

    Every failing instance gets its edit, as in the paper's code (one coding-agent call per
    failure). Until round 5 of our benchmark this was capped at 5 an iteration, which made the
    baseline's diagnoses about a third as dear as the paper's: nothing with heuristic roles, but
    most of its cost with LLM roles. `max_edits` keeps that cap available, off by default."""

    name: str = "self-evolution"
    one_at_a_time: bool = False
    max_edits: int | None = None

    def scopes(self, failing: Sequence[str], tried: Sequence[str]) -> list[Scope]:
        fresh = [i for i in failing if i not in set(tried)]
        return [[i] for i in fresh[:self.max_edits]]


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (EcdysisBatch(), PerInstanceSearch(), SelfEvolution())}


def strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}", hint=f"use one of {', '.join(STRATEGIES)}") from None

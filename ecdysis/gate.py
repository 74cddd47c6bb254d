"""The gates a harness change passes: the human decision on each proposal (approve, edit,
reject — every decision stored) and the paired acceptance policy that keeps a new version only if
it beats its parent on the same validation instances by more than the noise."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from ecdysis.errors import Conflict, InputError, NotFound
from ecdysis.evolution_log import GateVerdict
from ecdysis.harness import validate_files
from ecdysis.lifecycle import DECIDED, can_move
from ecdysis.records import InstanceResult
from ecdysis.store import DecisionKind, DecisionRecord, ProposalRecord, Store

PairKey = tuple[str, str]  # (model, instance_id)


def paired(parent: dict[PairKey, bool], candidate: dict[PairKey, bool]) -> tuple[list[PairKey], int, int]:
    keys = sorted(set(parent) & set(candidate))
    wins = sum(1 for k in keys if candidate[k] and not parent[k])
    losses = sum(1 for k in keys if parent[k] and not candidate[k])
    return keys, wins, losses


def spread(parent: dict[PairKey, bool], candidate: dict[PairKey, bool]) -> float:
    """The standard error of the net gain (wins - losses) if the change did nothing, with the
    instance as the unit: under no change each instance's net (its models' wins minus losses on
    it) is as likely negated, so the variance is the sum of their squares. With one model that is
    wins + losses, the sign test's. With several, the models' outcomes on one question are not
    independent draws: a change that wins a question for both models counts 2 in the net and 4 in
    the variance (not 2), and a win and a loss on one question cancel in both."""
    by_instance: dict[str, int] = {}
    for key in set(parent) & set(candidate):
        by_instance[key[1]] = by_instance.get(key[1], 0) + int(bool(candidate[key])) - int(bool(parent[key]))
    return math.sqrt(sum(d * d for d in by_instance.values()))


def calls_per_instance(results: Sequence[InstanceResult]) -> float | None:
    """The model calls these results made (cached ones included: the harness made them), per
    result; None for no results."""
    return sum(len(r.calls) for r in results) / len(results) if results else None


def call_cost(parent: Mapping[PairKey, InstanceResult], candidate: Mapping[PairKey, InstanceResult],
              keys: Sequence[PairKey]) -> dict[str, float]:
    """Model calls per instance of the parent and the candidate on the same instances (cached
    calls included: the harness made them), and the extra the candidate adds."""
    if not keys:
        return {"parent_calls": 0.0, "candidate_calls": 0.0, "extra_calls": 0.0}
    before = calls_per_instance([parent[k] for k in keys]) or 0.0
    after = calls_per_instance([candidate[k] for k in keys]) or 0.0
    return {"parent_calls": round(before, 3), "candidate_calls": round(after, 3),
            "extra_calls": round(max(0.0, after - before), 3)}


def cost_shortfall(gain: float, extra_calls: float, min_gain_per_call: float) -> str | None:
    """Why a change that adds calls per instance does not pay for them, or None when it does (or
    adds none). `gain` is the accuracy gained, as a fraction."""
    if extra_calls <= 0.05:
        return None
    needed = min_gain_per_call * extra_calls
    if gain >= needed:
        return None
    return (f"it adds {extra_calls:.2f} model calls per instance and gains {100 * gain:+.1f} points, less than "
            f"the {100 * needed:.1f} points that many calls must buy ({100 * min_gain_per_call:g} a call)")


def errors_said(k: float, se: float) -> str:
    """`k` standard errors of no change, with what they come to: "2 standard errors (2 x 1.41 =
    2.83)" (said as "(1.41)" alone, the figure read as the two errors' bound)."""
    if k == 1:
        return f"1 standard error ({se:.2f})"
    return f"{k:g} standard errors ({k:g} x {se:.2f} = {k * se:.2f})"


class AcceptancePolicy(Protocol):
    name: str

    def judge(self, parent: dict[PairKey, bool], candidate: dict[PairKey, bool]) -> GateVerdict: ...


def _verdict(policy: str, passed: bool, reason: str, parent: dict[PairKey, bool],
             candidate: dict[PairKey, bool]) -> GateVerdict:
    keys, wins, losses = paired(parent, candidate)
    n = len(keys)
    return GateVerdict(passed, reason, wins, losses, n,
                       round(sum(parent[k] for k in keys) / n, 4) if n else 0.0,
                       round(sum(candidate[k] for k in keys) / n, 4) if n else 0.0, policy,
                       round(spread(parent, candidate), 4))


# Standard errors of a no-change sign test that a net gain must exceed. One (a one-sided p of about
# 0.16) kept about one null change in six, and an evolution validates several: on BIG-bench it kept
# a few-shot change at +9 of 120 (16 won, 7 lost) that lost 6 points on the sealed test. Two is a
# one-sided p of about 0.02; a real repair clears it (option scoring won 22 to 5, 3.3 errors).
DEFAULT_K = 2.0


@dataclass(frozen=True)
class PairedSignGate:
    """Accept when net gains (wins - losses) on the same instances reach `min_net` AND exceed
    `k` (default `DEFAULT_K`) standard errors of no change (`spread`: sqrt(wins + losses) with one
    model, each question one unit with several), with at most
    `max_losses_fraction` of the parent's correct instances lost, or of the wins when there are
    more wins than the parent had right. Small models flip answers from run to run; only a gain
    larger than those flips is evidence. The regression budget keeps a change from trading what
    works for as much again; scaled by the wins too, it does not refuse a weak parent a change
    that wins far more than it loses (18 won and 6 lost against a parent with 6 right)."""

    min_net: int = 2
    k: float = DEFAULT_K
    max_losses_fraction: float = 0.5
    name: str = "paired-sign"

    def judge(self, parent: dict[PairKey, bool], candidate: dict[PairKey, bool]) -> GateVerdict:
        keys, wins, losses = paired(parent, candidate)
        if not keys:
            return _verdict(self.name, False, "no paired instances to compare", parent, candidate)
        net = wins - losses
        se = spread(parent, candidate)
        parent_right = sum(parent[k] for k in keys)
        base, of = (parent_right, "correct") if parent_right >= wins else (wins, "won")
        if parent_right and losses > self.max_losses_fraction * base:
            return _verdict(self.name, False, f"{losses} regressions exceed the budget of "
                            f"{self.max_losses_fraction:.0%} of {base} {of}", parent, candidate)
        if net < self.min_net:
            return _verdict(self.name, False, f"net gain {net:+d} ({wins} won, {losses} lost) is below "
                            f"the minimum of {self.min_net}", parent, candidate)
        errors = errors_said(self.k, se)
        if net <= self.k * se:
            return _verdict(self.name, False, f"net gain {net:+d} ({wins} won, {losses} lost) is within {errors} "
                            f"of no change", parent, candidate)
        return _verdict(self.name, True, f"net gain {net:+d} ({wins} won, {losses} lost) exceeds {errors}",
                        parent, candidate)


@dataclass(frozen=True)
class AnyImprovementGate:
    """The naive gate (accept any higher validation accuracy). Kept to show, in benchmarks, what
    chasing noise does; never the default."""

    name: str = "any-improvement"

    def judge(self, parent: dict[PairKey, bool], candidate: dict[PairKey, bool]) -> GateVerdict:
        keys, wins, losses = paired(parent, candidate)
        ok = wins > losses
        return _verdict(self.name, ok, f"{wins} won, {losses} lost", parent, candidate)


POLICIES = {"paired-sign": PairedSignGate, "any-improvement": AnyImprovementGate}


def decide(store: Store, proposal_id: str, decision: DecisionKind, *, who: str, reason: str = "",
           files: dict[str, str] | None = None) -> DecisionRecord:
    """Record one human (or auto) decision. `edit` needs the edited files, which must still form a
    loadable harness together with the unchanged ones; `reject` needs a reason."""
    proposal = store.get_proposal(proposal_id)
    if proposal is None:
        raise NotFound(f"no proposal {proposal_id!r}")
    if not can_move(proposal.status, DECIDED.get(decision, "approved")):  # decided once, when pending
        raise Conflict(f"proposal {proposal_id} was already decided ({proposal.status}); nothing was recorded",
                       hint=f"`ecdysis proposals --status {proposal.status}` shows it")
    if decision not in ("approve", "edit", "reject"):
        raise InputError(f"unknown decision {decision!r}", hint="approve, edit or reject")
    applied: dict[str, str] | None = None
    if decision == "reject":
        if not reason.strip():
            raise InputError("a rejection needs a reason", hint="say why: `ecdysis decide ID --decision reject "
                             "--reason TEXT`, or the reason box on the Review page")
    elif decision == "edit":
        if not files:
            raise InputError("an edit needs the edited files")
        applied = dict(files)
        base = store.get_harness(proposal.harness_version)
        validate_files({**(base.files if base else {}), **applied}, origin=f"edit of {proposal_id}")
    else:
        applied = dict(proposal.files)
    record = DecisionRecord(proposal_id=proposal_id, decision=decision, who=who, reason=reason,
                            files_as_applied=applied, at=time.time())
    # One transaction, conditional on the proposal still being pending: of two deciders at once,
    # one records, the other gets Conflict and stores nothing.
    return store.decide_proposal(record, DECIDED[decision])


def approved_files(store: Store, proposal: ProposalRecord) -> dict[str, str] | None:
    """The files to apply for a decided proposal (the edited text for an edit), or None."""
    decisions = [d for d in store.list_decisions(proposal.id) if d.decision in ("approve", "edit")]
    return decisions[-1].files_as_applied if decisions else None

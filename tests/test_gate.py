"""The acceptance gates, branch by branch: each row is a paired world (how many instances the
candidate won, lost, and left right or wrong as the parent had them) and the verdict it must get,
with the words of the reason that say which rule decided."""

from __future__ import annotations

import pytest

from ecdysis.gate import AnyImprovementGate, PairedSignGate, cost_shortfall, paired, spread


def world(wins: int, losses: int, both_right: int, both_wrong: int) -> tuple[dict, dict]:
    """Parent and candidate outcomes keyed (model, instance) with these paired counts."""
    parent: dict[tuple[str, str], bool] = {}
    candidate: dict[tuple[str, str], bool] = {}
    for n, (before, after) in enumerate([(False, True)] * wins + [(True, False)] * losses
                                        + [(True, True)] * both_right + [(False, False)] * both_wrong):
        key = ("m", f"i{n:03d}")
        parent[key], candidate[key] = before, after
    return parent, candidate


# (wins, losses, both right, both wrong) -> passed, words of the reason
PAIRED_SIGN = [
    ((0, 0, 0, 0), False, "no paired instances"),
    # the regression budget: half the parent's correct ...
    ((8, 6, 4, 20), False, "6 regressions exceed the budget of 50% of 10 correct"),
    ((10, 2, 8, 20), True, "net gain +8 (10 won, 2 lost)"),
    # ... or half the wins, when the candidate won more than the parent had right
    ((18, 6, 0, 36), True, "net gain +12 (18 won, 6 lost)"),
    ((18, 10, 0, 32), False, "10 regressions exceed the budget of 50% of 18 won"),
    # the minimum net gain
    ((1, 0, 10, 10), False, "net gain +1 (1 won, 0 lost) is below the minimum of 2"),
    ((5, 5, 10, 10), False, "net gain +0 (5 won, 5 lost) is below the minimum of 2"),
    # a gain within two standard errors of no change: sqrt(6 + 3) = 3
    ((6, 3, 10, 10), False, "net gain +3 (6 won, 3 lost) is within 2 standard errors (2 x 3.00 = 6.00) of no change"),
    ((7, 3, 10, 10), False, "net gain +4 (7 won, 3 lost) is within 2 standard errors (2 x 3.16 = 6.32)"),
    ((9, 1, 10, 10), True, "net gain +8 (9 won, 1 lost) exceeds 2 standard errors (2 x 3.16 = 6.32)"),
    ((2, 0, 10, 10), False, "net gain +2 (2 won, 0 lost) is within 2 standard errors (2 x 1.41 = 2.83)"),
    ((4, 0, 10, 10), False, "net gain +4 (4 won, 0 lost) is within 2 standard errors (2 x 2.00 = 4.00)"),  # at the bound is within
    ((5, 0, 10, 10), True, "net gain +5 (5 won, 0 lost) exceeds 2 standard errors (2 x 2.24 = 4.47)"),
    # a parent with nothing right has no regression budget to break
    ((5, 0, 0, 10), True, "net gain +5"),
]


@pytest.mark.parametrize(("counts", "passed", "words"), PAIRED_SIGN)
def test_paired_sign_gate_branch_by_branch(counts: tuple[int, int, int, int], passed: bool, words: str) -> None:
    parent, candidate = world(*counts)
    verdict = PairedSignGate().judge(parent, candidate)
    assert verdict.passed is passed and words in verdict.reason, verdict.reason
    wins, losses, both_right, both_wrong = counts
    assert (verdict.wins, verdict.losses, verdict.n) == (wins, losses, sum(counts))
    if verdict.n:
        assert verdict.parent_accuracy == round((losses + both_right) / verdict.n, 4)
        assert verdict.candidate_accuracy == round((wins + both_right) / verdict.n, 4)


def test_paired_sign_gate_thresholds_are_its_parameters() -> None:
    parent, candidate = world(3, 1, 10, 10)
    assert not PairedSignGate().judge(parent, candidate).passed  # +2 within sqrt(4) = 2
    assert PairedSignGate(k=0.5).judge(parent, candidate).passed
    assert not PairedSignGate(min_net=3, k=0.5).judge(parent, candidate).passed
    parent, candidate = world(11, 6, 5, 20)
    assert "6 regressions exceed the budget of 50% of 11 correct" in PairedSignGate().judge(parent, candidate).reason
    assert PairedSignGate(max_losses_fraction=0.6, k=1).judge(parent, candidate).passed
    assert "net gain +5 (11 won, 6 lost) is within 1.5 standard errors (1.5 x 4.12 = 6.18)" in PairedSignGate(max_losses_fraction=0.6, k=1.5).judge(
        parent, candidate).reason
    assert "net gain +3 (6 won, 3 lost) is within 1 standard error (3.00)" in PairedSignGate(k=1).judge(*world(6, 3, 10, 10)).reason


def two_models(both: list[tuple[bool, bool]], each: list[tuple[bool, bool]]) -> tuple[dict, dict]:
    """Outcomes of models "a" and "b": a (parent, candidate) pair per question alike for both
    models (`both`), then per question one model's pair and the other model's reversed (`each`)."""
    parent: dict[tuple[str, str], bool] = {}
    candidate: dict[tuple[str, str], bool] = {}
    for n, (before, after) in enumerate(both):
        for model in ("a", "b"):
            parent[(model, f"q{n:03d}")], candidate[(model, f"q{n:03d}")] = before, after
    for n, (before, after) in enumerate(each):
        key = f"x{n:03d}"
        parent[("a", key)], candidate[("a", key)] = before, after
        parent[("b", key)], candidate[("b", key)] = after, before
    return parent, candidate


def test_two_models_winning_the_same_questions_are_one_piece_of_evidence_each() -> None:
    """The gate's unit is the question: its models' outcomes on it move together (a format repair
    reads both models' answers to a question it reads, or neither), so counting them as separate
    draws would pass noise with two models that one model's gate refuses."""
    won, lost, right = (False, True), (True, False), (True, True)
    # 8 questions won for both models, 2 lost for both, 10 right for both: net +12 of 40 outcomes.
    parent, candidate = two_models([won] * 8 + [lost] * 2 + [right] * 10, [])
    assert spread(parent, candidate) == pytest.approx((8 * 4 + 2 * 4) ** 0.5)  # 6.32, not sqrt(20) = 4.47
    verdict = PairedSignGate().judge(parent, candidate)
    assert (verdict.wins, verdict.losses, verdict.n) == (16, 4, 40)
    assert not verdict.passed and "net gain +12 (16 won, 4 lost) is within 2 standard errors (2 x 6.32 = 12.65)" in verdict.reason
    assert verdict.se == pytest.approx(6.3246) and verdict.error == verdict.se
    # The same counts on questions of their own (one model each) are independent draws, and pass.
    spread_out = {("a" if n % 2 else "b", f"i{n:03d}"): v for n, v in enumerate(world(16, 4, 20, 0)[0].values())}, \
        {("a" if n % 2 else "b", f"i{n:03d}"): v for n, v in enumerate(world(16, 4, 20, 0)[1].values())}
    assert spread(*spread_out) == pytest.approx(20 ** 0.5)
    assert PairedSignGate().judge(*spread_out).passed
    # A question won for one model and lost for the other nets 0 and adds no noise: 9 won for
    # both, 6 split, is +18 against sqrt(36) = 6, not sqrt(30) = 5.48 ...
    parent, candidate = two_models([won] * 9 + [right] * 10, [won] * 6)
    verdict = PairedSignGate().judge(parent, candidate)
    assert (verdict.wins, verdict.losses) == (24, 6) and verdict.passed
    assert "net gain +18 (24 won, 6 lost) exceeds 2 standard errors (2 x 6.00 = 12.00)" in verdict.reason
    # ... and one model alone is the sign test it always was.
    parent, candidate = world(9, 1, 10, 10)
    assert spread(parent, candidate) == pytest.approx(10 ** 0.5)
    # A verdict stored before the error was (no "se") reads back with the one-model figure.
    from ecdysis.evolution_log import GateVerdict
    old = GateVerdict.parse({"passed": False, "reason": "", "wins": 16, "losses": 4, "n": 40})
    assert old.se is None and old.error == pytest.approx(20 ** 0.5)
    from ecdysis.evolution_log import Screening  # a screen too, as the screening order reads it
    assert Screening.parse({"wins": 7, "losses": 3, "net": 4}).error == pytest.approx(10 ** 0.5)
    assert Screening.parse({"wins": 7, "losses": 3, "net": 4, "se": 4.0}).error == 4.0
    assert GateVerdict.parse(verdict.to_json()) == verdict


def test_only_instances_both_sides_ran_are_paired() -> None:
    parent, candidate = world(4, 0, 2, 2)
    candidate.pop(("m", "i000"))
    parent[("m", "extra")] = True
    keys, wins, losses = paired(parent, candidate)
    assert len(keys) == 7 and (wins, losses) == (3, 0)


@pytest.mark.parametrize(("counts", "passed"), [((1, 0, 0, 0), True), ((1, 1, 5, 5), False),
                                                  ((0, 1, 5, 5), False), ((0, 0, 0, 0), False)])
def test_any_improvement_gate_takes_any_net_win(counts: tuple[int, int, int, int], passed: bool) -> None:
    verdict = AnyImprovementGate().judge(*world(*counts))
    assert verdict.passed is passed and verdict.reason == f"{counts[0]} won, {counts[1]} lost"


@pytest.mark.parametrize(("gain", "extra", "per_call", "short"), [
    (0.0, 0.0, 0.05, None),      # adds no call: nothing to pay for
    (0.0, 0.05, 0.05, None),     # rounding noise in the call count is not a cost
    (0.20, 4.0, 0.05, None),     # 5-sample voting that buys 20 points pays
    (0.19, 4.0, 0.05, "less than the 20.0 points"),
    (0.30, 1.0, 0.6, "less than the 60.0 points"),
])
def test_a_change_that_adds_calls_must_buy_points_with_them(gain: float, extra: float, per_call: float,
                                                            short: str | None) -> None:
    why = cost_shortfall(gain, extra, per_call)
    assert (why is None) if short is None else (short in (why or "")), why


@pytest.mark.parametrize("current", ["pending", "approved", "edited", "rejected", "applied", "superseded"])
def test_the_proposal_lifecycle_allows_exactly_its_moves(current: str) -> None:
    """Decided once, from pending; applied or superseded only once a person approved; rejected
    for good. The table is the one every status change goes through (`lifecycle.move`)."""
    from ecdysis.lifecycle import STATUSES, can_move
    allowed = {to for to in STATUSES if can_move(current, to)}
    expected = {"pending": {"approved", "edited", "rejected"}, "rejected": set()}.get(current, {"applied", "superseded"})
    assert allowed == expected


def test_a_move_the_lifecycle_refuses_writes_nothing() -> None:
    from diagnosis_fixtures import MemoryStore
    from ecdysis.errors import Conflict
    from ecdysis.lifecycle import move
    from ecdysis.store import ProposalRecord
    store = MemoryStore()
    store.save_proposal(ProposalRecord(id="p1", diagnosis_id="d", cluster_id="c1", harness_version="h",
                                       spec={}, files={}, status="rejected", created_at=1.0))
    with pytest.raises(Conflict, match="p1 is rejected; it cannot become applied"):
        move(store, "p1", "applied")
    assert store.get_proposal("p1").status == "rejected"

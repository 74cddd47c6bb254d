"""How the embedded backend cuts a prompt into evaluation batches and how much of the previous
prompt's cache it may keep. The property that matters: a kept prefix was evaluated in exactly the
batches a full evaluation of the new prompt uses, so the reply cannot depend on the call before.
The real-model check that replies equal a full evaluation is in test_models_local.py (slow)."""

from __future__ import annotations

import random

from ecdysis.models.llamacpp import MIN_BATCH, PROMPT_BATCH, prompt_cuts, reusable_prefix

TURN, NL, BLANK, ROLE = 1, 2, 3, 4  # stand-ins for <|im_start|>, "\n", "\n\n" and a role name


def opens_turn(token: int) -> bool:
    return token == TURN


def ends_line(token: int, blank: bool = False) -> bool:
    return token == BLANK or (token == NL and not blank)


def cuts_of(tokens: list[int]) -> list[int]:
    return prompt_cuts(tokens, opens_turn, ends_line)


def turn(body: list[int]) -> list[int]:
    return [TURN, ROLE, NL, *body]


SYSTEM = turn(list(range(10, 50)))                   # 43 tokens
ASSISTANT = [TURN, ROLE, NL]                           # the generation prompt that ends every request


def test_a_reply_needs_one_batch_past_the_system_turn() -> None:
    prompt = SYSTEM + turn([*range(100, 140), BLANK, *range(200, 205)]) + ASSISTANT
    # The user turn starts a batch after its role line; the short closing paragraph and the
    # assistant's role line stay in that batch instead of costing two batches more.
    assert cuts_of(prompt) == [0, len(SYSTEM) + 3]


def test_paragraphs_and_long_text_get_their_own_batches() -> None:
    lead = list(range(100, 130))
    prompt = SYSTEM + turn([*lead, BLANK, *range(300, 600)]) + ASSISTANT
    user = len(SYSTEM) + 3
    cuts = cuts_of(prompt)
    assert cuts[:3] == [0, user, user + len(lead) + 1]    # after the instruction paragraph
    assert all(b - a <= PROMPT_BATCH for a, b in zip(cuts, [*cuts[1:], len(prompt)]))
    assert all(b - a >= MIN_BATCH for a, b in zip(cuts, cuts[1:]))


def test_a_single_newline_is_not_a_paragraph_but_two_are() -> None:
    body = list(range(10, 10 + MIN_BATCH))
    tail = list(range(60, 60 + MIN_BATCH))
    assert cuts_of([*body, NL, *tail]) == [0]
    assert cuts_of([*body, NL, NL, *tail]) == [0, MIN_BATCH + 2]


def test_the_kept_prefix_ends_where_both_prompts_cut_alike_within_what_they_share() -> None:
    before = SYSTEM + turn(list(range(100, 130))) + ASSISTANT
    after = SYSTEM + turn(list(range(100, 125)) + [9] * 10) + ASSISTANT
    shared = len(SYSTEM) + 3 + 25
    user = len(SYSTEM) + 3
    assert reusable_prefix(cuts_of(after), tuple(cuts_of(before)), shared) == user
    assert reusable_prefix(cuts_of(after), tuple(cuts_of(before)), user - 1) == 0  # the user role line not shared
    assert reusable_prefix(cuts_of(after), (), shared) == 0                          # nothing cached


def test_every_kept_prefix_was_evaluated_in_the_batches_of_a_full_evaluation() -> None:
    rng = random.Random(7)
    vocab = [TURN, NL, BLANK, ROLE, *range(10, 30)]
    weights = [1, 4, 2, 1, *[3] * 20]
    stem = rng.choices(vocab, weights, k=400)
    kept = []
    for _ in range(400):
        a = stem[:rng.randrange(1, 400)] + rng.choices(vocab, weights, k=rng.randrange(1, 80))
        b = stem[:rng.randrange(1, 400)] + rng.choices(vocab, weights, k=rng.randrange(1, 80))
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        cuts_a, cuts_b = cuts_of(a), cuts_of(b)
        keep = reusable_prefix(cuts_b, tuple(cuts_a), shared)
        assert keep <= shared
        # Both prompts start a batch at `keep`, and their batches below it are the same ones.
        assert keep in cuts_a and keep in cuts_b
        assert [c for c in cuts_a if c <= keep] == [c for c in cuts_b if c <= keep]
        kept.append(keep)
    assert sum(k > 0 for k in kept) > 100  # the property was tested on real reuse, not on empty prefixes

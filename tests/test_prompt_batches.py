"""How the embedded backend cuts a prompt into evaluation batches and how much of the previous
prompt's cache it may keep. The property that matters: a kept prefix was evaluated in exactly the
batches a full evaluation of the new prompt uses, so the reply cannot depend on the call before.
The real-model check that replies equal a full evaluation is in test_models_local.py (slow)."""

from __future__ import annotations

import random

from ecdysis.models.llamacpp import MIN_PARAGRAPH, PROMPT_BATCH, prompt_cuts, reusable_prefix

TURN, NL, BLANK = 1, 2, 3  # token ids standing for <|im_start|>, "\n" and "\n\n"


def opens_turn(token: int) -> bool:
    return token == TURN


def ends_line(token: int, blank: bool = False) -> bool:
    return token == BLANK or (token == NL and not blank)


def test_batches_start_at_turns_paragraphs_and_every_batch_size() -> None:
    system = [TURN, *range(10, 50)]                      # 41 tokens
    user = [TURN, *range(100, 120), BLANK, *range(200, 205), BLANK, *range(300, 440)]
    cuts = prompt_cuts(system + user, opens_turn, ends_line)
    assert cuts[:3] == [0, 41, 41 + 21 + 1]               # the user turn; its first paragraph (21 tokens + break)
    assert 41 + 21 + 1 + 6 not in cuts                    # a 6-token paragraph does not get a batch of its own
    assert all(b - a <= PROMPT_BATCH for a, b in zip(cuts, cuts[1:]))
    assert prompt_cuts([5] * 300, opens_turn, ends_line) == [0, 128, 256]


def test_a_single_newline_is_not_a_paragraph_but_two_are() -> None:
    body = list(range(10, 10 + MIN_PARAGRAPH))
    assert prompt_cuts([*body, NL, 7, 8], opens_turn, ends_line) == [0]
    assert prompt_cuts([*body, NL, NL, 7, 8], opens_turn, ends_line) == [0, MIN_PARAGRAPH + 2]


def test_the_kept_prefix_is_a_cut_of_both_prompts_within_what_they_share() -> None:
    before = [TURN, *range(10, 50), TURN, *range(100, 130), 7, 8]
    after = [TURN, *range(10, 50), TURN, *range(100, 130), 9]
    shared = 41 + 1 + 30
    cuts_before = frozenset(prompt_cuts(before, opens_turn, ends_line))
    cuts_after = prompt_cuts(after, opens_turn, ends_line)
    assert reusable_prefix(cuts_after, cuts_before, shared) == 41
    assert reusable_prefix(cuts_after, cuts_before, 40) == 0       # the system turn not wholly shared
    assert reusable_prefix(cuts_after, frozenset(), shared) == 0    # nothing cached


def test_every_kept_prefix_was_evaluated_in_the_batches_of_a_full_evaluation() -> None:
    rng = random.Random(7)
    vocab = [TURN, NL, BLANK, *range(10, 30)]
    weights = [1, 4, 2, *[3] * 20]
    stem = rng.choices(vocab, weights, k=400)
    kept = []
    for _ in range(300):
        a = stem[:rng.randrange(1, 400)] + rng.choices(vocab, weights, k=rng.randrange(1, 80))
        b = stem[:rng.randrange(1, 400)] + rng.choices(vocab, weights, k=rng.randrange(1, 80))
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        cuts_a, cuts_b = prompt_cuts(a, opens_turn, ends_line), prompt_cuts(b, opens_turn, ends_line)
        keep = reusable_prefix(cuts_b, frozenset(cuts_a), shared)
        assert keep <= shared
        # Both prompts start a batch at `keep`, and their batches below it are the same ones.
        assert keep in cuts_a and keep in cuts_b
        assert [c for c in cuts_a if c <= keep] == [c for c in cuts_b if c <= keep]
        kept.append(keep)
    assert sum(k > 0 for k in kept) > 100  # the property was tested on real reuse, not on empty prefixes

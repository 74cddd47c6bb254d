"""Train / validation / test assignment: every suite loader passes its instances through
`assign_splits` before the suite reaches the runner, so evolution never sees validation or test data.

The assignment depends only on the seed and the ids within each category: instances are ranked by a
SHA-256 of "seed:id" and, in that order, each goes to the split furthest below its quota. So the same
category splits the same way in a mixed suite and in a suite of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

from ecdysis.errors import ConfigError
from ecdysis.records import SPLITS, Instance, Split


def assign_splits(instances: Sequence[Instance], *, seed: int = 0,
                  fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)) -> list[Instance]:
    """Copies of `instances` (same order) with `split` set; instances that carry a split keep it.

    Stratified per category: a category with at least 3 instances gets at least one in every split
    whose fraction is positive (unless its pre-assigned instances make that impossible).
    """
    weights = _check_fractions(fractions)
    chosen: dict[str, Split] = {}
    for group in _by_category(instances).values():
        chosen.update(_assign_group(group, seed, weights))
    return [inst if inst.split is not None else replace(inst, split=chosen[inst.id]) for inst in instances]


def quotas(n: int, fractions: Sequence[float]) -> list[int]:
    """How many of `n` instances each split gets: largest remainder, at least 1 each when n >= 3."""
    exact = [f * n for f in fractions]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    if n >= 3:
        for i, f in enumerate(fractions):
            if f > 0 and counts[i] == 0:
                donor = max(range(len(counts)), key=lambda j: (counts[j], -j))
                counts[donor] -= 1
                counts[i] += 1
    return counts


def split_rank(seed: int, instance_id: str) -> str:
    """The order key of an instance within its category: stable across processes and platforms."""
    return hashlib.sha256(f"{seed}:{instance_id}".encode()).hexdigest()


def _check_fractions(fractions: Sequence[float]) -> list[float]:
    if len(fractions) != len(SPLITS) or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ConfigError(f"split fractions must be three non-negative numbers, got {tuple(fractions)!r}",
                          hint="e.g. (0.5, 0.25, 0.25) for train, validation, test")
    total = float(sum(fractions))
    return [f / total for f in fractions]


def _by_category(instances: Sequence[Instance]) -> dict[str, list[Instance]]:
    groups: dict[str, list[Instance]] = {}
    seen: set[str] = set()
    for inst in instances:
        if inst.id in seen:
            raise ConfigError(f"instance id {inst.id!r} appears twice", hint="instance ids must be unique")
        if inst.split is not None and inst.split not in SPLITS:
            raise ConfigError(f"instance {inst.id!r} has split {inst.split!r}", hint=f"use one of {SPLITS}")
        seen.add(inst.id)
        groups.setdefault(inst.category, []).append(inst)
    return groups


def _assign_group(group: list[Instance], seed: int, weights: list[float]) -> dict[str, Split]:
    """Each unassigned instance, in rank order, goes to the split furthest below its quota."""
    counts = {s: 0 for s in SPLITS}
    for inst in group:
        if inst.split is not None:
            counts[inst.split] += 1
    target = dict(zip(SPLITS, quotas(len(group), weights)))
    open_splits = [s for s, w in zip(SPLITS, weights) if w > 0]
    chosen: dict[str, Split] = {}
    for inst in sorted((i for i in group if i.split is None), key=lambda i: split_rank(seed, i.id)):
        split = max(open_splits, key=lambda s: (target[s] - counts[s], -SPLITS.index(s)))
        counts[split] += 1
        chosen[inst.id] = split
    return chosen

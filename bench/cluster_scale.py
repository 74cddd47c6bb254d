"""Benchmark: how long cross-instance aggregation takes on a large synthetic batch (default 10,000
failures from 3 models x 5 categories x 4,000 instances), per clustering policy.

Run: `.venv/bin/python bench/cluster_scale.py [--n 10000] [--policy agglomerative|hdbscan|all]`.
Prints one JSON line per policy (seconds, clusters, verdict counts, distinct signatures).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ecdysis.aggregate import CLUSTERING_POLICIES, BatchContext, aggregate  # noqa: E402
from ecdysis.failures import Failure, normalise  # noqa: E402

MODELS = ("smollm2", "gemma3-270m", "other-model")
CATEGORIES = ("arithmetic", "dates", "word-sorting", "object-counting", "boolean")
# Filler vocabulary: realistic variety, so most failures have a distinct signature text.
VOCAB = [f"{a}{b}" for a in ("re", "con", "pro", "de", "in", "ex", "sub", "trans", "inter", "over")
         for b in ("ply", "tend", "vert", "mit", "form", "pose", "duce", "sist", "fer", "gress",
                   "lect", "pel", "scribe", "spect", "struct", "tain", "tract", "vene", "volve", "cede")]


def _filler(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def _failure(rng: random.Random, n_instances: int, noise: float) -> Failure:
    inst = rng.randrange(n_instances)
    category = CATEGORIES[inst % len(CATEGORIES)]
    model = rng.choice(MODELS)
    # The structured patterns share the first (1 - noise) of the unit interval in fixed proportions.
    roll = rng.random() * 0.70 / max(1e-9, 1.0 - noise) if rng.random() >= noise else 1.0
    if roll < 0.25:  # shared harness-level pattern: prose before the answer, worded a few ways
        lead = rng.choice(["Sure! Here is my answer:", "Sure, here is my answer:", "Sure! Here is the answer:",
                           "Okay! Here is my answer"])
        kind, text = "off_format", f"{lead} {rng.randint(1, 500)} {_filler(rng, 3)}"
    elif roll < 0.33:  # one model's quirk
        model, kind, text = "other-model", "off_format", f"As an AI language model I believe {_filler(rng, 2)}"
    elif roll < 0.45:
        kind, text = "truncated", f"Let me work through this {rng.choice(['step by', 'one'])} {_filler(rng, 6)}"
    elif roll < 0.57:
        kind, text = "wrong_answer", str(rng.randint(1, 500))
    elif roll < 0.61:
        kind, text = "empty_output", ""
    elif roll < 0.65:
        kind, text = "exception", f"ValueError could not convert string to float {_filler(rng, 1)}"
    elif roll < 0.70:
        kind, text = "invalid_choice", _filler(rng, 1)
    else:  # unstructured noise: random prose, nearly all distinct
        kind, text = rng.choice(["off_format", "truncated", "wrong_answer"]), _filler(rng, 8)
    return Failure(run_id=f"run-{model}", suite="synthetic", instance_id=f"{category}-{inst:05d}",
                   category=category, split="train", model=model, harness_version="h0", type=kind,  # type: ignore[arg-type]
                   excerpt=text[:80], signature=normalise(text, "") or "blank", answer=text, target="0",
                   shape="number")


def synthetic_batch(n: int = 10_000, *, seed: int = 0, n_instances: int = 4000,
                    noise: float = 0.3) -> tuple[list[Failure], BatchContext]:
    """`n` failures (a `noise` share of them unstructured, nearly all distinct) plus the passes of
    the instances each model ran without failing."""
    rng = random.Random(seed)
    failures = [_failure(rng, n_instances, noise) for _ in range(n)]
    failed = {(f.model, f.key) for f in failures}
    passes = [(m, f"synthetic/{c}-{i:05d}", c) for m in MODELS for i in range(n_instances)
              for c in [CATEGORIES[i % len(CATEGORIES)]] if (m, f"synthetic/{c}-{i:05d}") not in failed]
    return failures, BatchContext.from_failures(failures, passes)


def measure(policy_name: str, n: int, seed: int, noise: float) -> dict[str, object]:
    failures, batch = synthetic_batch(n, seed=seed, noise=noise)
    policy = CLUSTERING_POLICIES[policy_name]()
    started = time.perf_counter()
    clusters = aggregate(failures, batch, clustering=policy)
    seconds = time.perf_counter() - started
    return {"policy": policy.name, "failures": n, "noise": noise,
            "distinct_signatures": len({f.signature for f in failures}),
            "seconds": round(seconds, 2), "clusters": len(clusters),
            "verdicts": dict(Counter(c.verdict for c in clusters)),
            "largest": [(c.label, c.size, c.verdict) for c in clusters[:3]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.3, help="share of unstructured failures")
    parser.add_argument("--policy", default="all", choices=["all", *CLUSTERING_POLICIES])
    args = parser.parse_args(argv)
    names = list(CLUSTERING_POLICIES) if args.policy == "all" else [args.policy]
    for name in names:
        print(json.dumps(measure(name, args.n, args.seed, args.noise), ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

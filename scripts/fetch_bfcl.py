#!/usr/bin/env python3
"""Fetch the BFCL data once, for the `bfcl-*` suites (see ecdysis/suites/bfcl.py): download the
`bfcl-eval==2026.3.23` wheel from the package index, check its pinned sha256, keep only its data
files and the multi-turn environments' source.

    python scripts/fetch_bfcl.py                   # into bfcl_dir(), from PyPI (or PIP_INDEX_URL)
    python scripts/fetch_bfcl.py --wheel FILE.whl --dest DIR

What lands in the folder keeps the wheel's layout below `bfcl_eval/`: `data/**` (the questions,
`possible_answer/`, `multi_turn_func_doc/`) and `eval_checker/multi_turn_eval/func_source_code/**`.
The package is never installed or imported: it pins numpy 1.26 and pulls in many SDKs.

Idempotent: a folder whose stamp names the pinned wheel is left alone. Files land in a temporary
sibling folder first and are moved into place at the end, so an interrupted fetch leaves no
half-filled folder. A wheel whose sha256 is not the pinned one is refused before anything is
read from it, and so is an archive with a member whose path is absolute or climbs out with "..".
"""

from __future__ import annotations

import argparse
import shutil
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ecdysis.suites.fetching import checked_member, fill_from_wheel  # noqa: E402

NAME, VERSION = "bfcl-eval", "2026.3.23"
WHEEL = "bfcl_eval-2026.3.23-py3-none-any.whl"
SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
PACKAGE = "bfcl_eval"
KEEP = (("data",), ("eval_checker", "multi_turn_eval", "func_source_code"))  # below bfcl_eval/
MAX_MEMBER_BYTES = 64 << 20  # the largest file in the pinned wheel is under 4 MB


def default_dest() -> Path:
    from ecdysis.suites.bfcl import bfcl_dir
    return bfcl_dir()


def member_path(name: str) -> PurePosixPath | None:
    """Where a wheel member goes below the destination, None when it is not kept. A member with an
    absolute path or a ".." part stops the fetch: the pinned wheel has none."""
    path = checked_member(name)
    if name.endswith("/") or not path.parts or path.parts[0] != PACKAGE:
        return None
    rest = path.parts[1:]
    if not any(rest[:len(keep)] == keep and len(rest) > len(keep) for keep in KEEP):
        return None
    if "__pycache__" in rest or path.suffix == ".pyc":
        return None
    return PurePosixPath(*rest)


def extract(wheel: Path, staging: Path) -> int:
    """Copy the kept members into `staging` as plain files (never links); how many were written."""
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        kept = [(info, member_path(info.filename)) for info in archive.infolist()]  # every path checked first
        for info, target in kept:
            if target is None or info.is_dir():
                continue
            if info.file_size > MAX_MEMBER_BYTES:
                raise SystemExit(f"error: {info.filename} is {info.file_size} bytes; refusing a member over "
                                 f"{MAX_MEMBER_BYTES} bytes")
            out = staging.joinpath(*target.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, open(out, "wb") as sink:
                shutil.copyfileobj(source, sink)
            count += 1
    return count


def fetch(dest: Path, wheel: Path | None, *, sha256: str = SHA256) -> int:
    """Fill `dest` from `wheel` (downloaded when None) unless it is already filled; how many
    files were written (0 when there was nothing to do)."""
    def fill(archive: Path, staging: Path) -> dict[str, Any]:
        count = extract(archive, staging)
        if not (staging / "data").is_dir():
            raise SystemExit(f"error: {archive} holds no {PACKAGE}/data/ files")
        return {"requirement": f"{NAME}=={VERSION}", "files": count}

    stamp = fill_from_wheel(dest, wheel, project=NAME, filename=WHEEL, sha256=sha256, fill=fill)
    if stamp is None:
        print(f"BFCL data already in {dest}: nothing to do")
        return 0
    print(f"extracted {stamp['files']} BFCL files from {WHEEL} into {dest}")
    return stamp["files"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder for the data (default: bfcl_dir())")
    parser.add_argument("--wheel", type=Path, default=None, help=f"use this {WHEEL} instead of downloading it")
    args = parser.parse_args(argv)
    if args.wheel is not None and not args.wheel.is_file():
        parser.error(f"--wheel {args.wheel} is not a file")
    fetch(args.dest or default_dest(), args.wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())

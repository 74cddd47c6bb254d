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
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ecdysis.suites.fetching import checked_member, download_from_index, file_sha256  # noqa: E402

NAME, VERSION = "bfcl-eval", "2026.3.23"
WHEEL = "bfcl_eval-2026.3.23-py3-none-any.whl"
SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
PACKAGE = "bfcl_eval"
KEEP = (("data",), ("eval_checker", "multi_turn_eval", "func_source_code"))  # below bfcl_eval/
STAMP = "ecdysis-fetch.json"
MAX_MEMBER_BYTES = 64 << 20  # the largest file in the pinned wheel is under 4 MB


def default_dest() -> Path:
    from ecdysis.suites.bfcl import bfcl_dir
    return bfcl_dir()


def is_done(dest: Path, sha256: str) -> bool:
    """True when `dest` was filled from the wheel with this digest (its stamp is written last)."""
    try:
        stamp = json.loads((dest / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("sha256") == sha256


def download_wheel(workdir: Path) -> Path:
    """The pinned wheel from the package index's JSON listing, written to `workdir`; its digest is
    checked by the caller."""
    return download_from_index(NAME, WHEEL, workdir)


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


def install(staging: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)  # only reached when its stamp is not the pinned wheel's (is_done was False)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(dest)


def fetch(dest: Path, wheel: Path | None, *, sha256: str = SHA256) -> int:
    """Fill `dest` from `wheel` (downloaded when None) unless it is already filled; how many
    files were written (0 when there was nothing to do)."""
    if is_done(dest, sha256):
        print(f"BFCL data already in {dest}: nothing to do")
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bfcl-dl-") as tmp:
        archive = wheel if wheel is not None else download_wheel(Path(tmp))
        got = file_sha256(archive)
        if got != sha256:
            raise SystemExit(f"error: {archive} has sha256 {got}, not the pinned {sha256} of {WHEEL}; "
                             "nothing was extracted")
        staging = Path(tempfile.mkdtemp(prefix=".bfcl-partial-", dir=dest.parent))
        try:
            count = extract(archive, staging)
            if not (staging / "data").is_dir():
                raise SystemExit(f"error: {archive} holds no {PACKAGE}/data/ files")
            stamp = {"requirement": f"{NAME}=={VERSION}", "wheel": WHEEL, "sha256": sha256, "files": count}
            (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
            os.chmod(staging, 0o755)  # mkdtemp makes it private; the data is for every user
            install(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    print(f"extracted {count} BFCL files from {archive.name} into {dest}")
    return count


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

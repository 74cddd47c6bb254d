#!/usr/bin/env python3
"""Fetch the BIG-bench task files once, for `bigbench:TASK` suites (see ecdysis/suites/bigbench.py):
download the `bigbench==1.0.0` sdist from the package index, keep only its benchmark_tasks/**/task.json files.

    python scripts/fetch_bigbench.py                   # into bigbench_dir(), from PyPI (or PIP_INDEX_URL)
    python scripts/fetch_bigbench.py --sdist FILE.tar.gz --dest DIR
    python scripts/fetch_bigbench.py --source DIR      # a checkout of the BIG-bench repository

Idempotent: when the folder already holds task files it does nothing. The package is never
installed or imported, and no archive member outside benchmark_tasks/ (or with an absolute path or
"..") is written. Files land in a temporary sibling folder first and are moved into place at the
end, so an interrupted fetch leaves no half-filled folder behind.

Exit status 3 (`UNAVAILABLE`) means the package index does not serve the release: the index said
no, so the set-up goes on without the BIG-bench suites and says so, rather than failing on a
machine where they cannot be had. Any other failure (a network error, a digest that does not
match) exits non-zero otherwise and stops the set-up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import urllib.parse
import urllib.request
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

REQUIREMENT = "bigbench==1.0.0"
MARKER = ("bigbench", "benchmark_tasks")
UNAVAILABLE = 3


class Unavailable(Exception):
    """The package index lists no such release: not a fault of this machine, and not one a retry mends."""


def default_dest() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ecdysis.suites.bigbench import bigbench_dir
    return bigbench_dir()


def has_tasks(dest: Path) -> bool:
    return dest.is_dir() and any(dest.glob("*/task.json"))


def download_sdist(workdir: Path) -> Path:
    """The sdist from the package index, its sha256 checked against the index's. Not with
    `pip download`: pip 26 prepares the package's metadata even with --no-deps and refuses it
    (bigbench declares a direct-URL dependency), so a fresh machine's set-up failed here."""
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    name, version = REQUIREMENT.split("==")
    filename = f"{name}-{version}.tar.gz"
    listing = f"{index.rstrip('/')}/{name}/"
    print(f"downloading: {filename} from {listing}", flush=True)
    request = urllib.request.Request(listing, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        files = json.loads(resp.read()).get("files", [])
    entry = next((f for f in files if f.get("filename") == filename), None)
    if entry is None or not entry.get("hashes", {}).get("sha256"):
        listed = ", ".join(sorted(str(f.get("filename")) for f in files)) or "nothing"
        raise Unavailable(f"{listing} lists no {filename} with a sha256 (it lists {listed})")
    url = urllib.parse.urljoin(listing, entry["url"])
    target = workdir / filename
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as resp, target.open("wb") as out:
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != entry["hashes"]["sha256"]:
        target.unlink()
        raise SystemExit(f"error: {filename} from {url} does not match the index's sha256")
    return target


def task_path(member: tarfile.TarInfo) -> PurePosixPath | None:
    """Where a member goes under the destination, or None if it is not a benchmark task.json."""
    return relative_task_path(member.name) if member.isfile() else None


def relative_task_path(name: str) -> PurePosixPath | None:
    """`.../bigbench/benchmark_tasks/TASK[/SUBTASK]/task.json` as `TASK[/SUBTASK]/task.json`, or None
    for any other path (absolute, with "..", or outside benchmark_tasks/)."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or path.name != "task.json":
        return None
    parts = path.parts
    for i in range(len(parts) - len(MARKER)):
        if parts[i:i + len(MARKER)] == MARKER:
            rest = parts[i + len(MARKER):]
            return PurePosixPath(*rest) if len(rest) >= 2 else None
    return None


def extract_tasks(sdist: Path, staging: Path) -> int:
    count = 0
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive:
            target = task_path(member)
            if target is None:
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            out = staging.joinpath(*target.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            with source, open(out, "wb") as sink:
                shutil.copyfileobj(source, sink)
            count += 1
    return count


def copy_tasks(source: Path, staging: Path) -> int:
    """The task.json files of a BIG-bench checkout (or an unpacked sdist) under `source`: regular
    files only, symbolic links neither followed nor copied."""
    count = 0
    for folder, dirs, files in os.walk(source, followlinks=False):
        here = Path(folder)
        if "task.json" not in files:
            continue
        found = here / "task.json"
        target = relative_task_path(found.relative_to(source).as_posix())
        if target is None or found.is_symlink() or not found.is_file():
            continue
        out = staging.joinpath(*target.parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, out)
        count += 1
    return count


def install(staging: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)  # only reached when it holds no task files (has_tasks was False)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(dest)


def fetch(dest: Path, sdist: Path | None, source: Path | None = None) -> int:
    if has_tasks(dest):
        print(f"BIG-bench task files already in {dest}: nothing to do")
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bigbench-dl-") as tmp:
        origin = source if source is not None else sdist if sdist is not None else download_sdist(Path(tmp))
        staging = Path(tempfile.mkdtemp(prefix=".bigbench-partial-", dir=dest.parent))
        try:
            count = copy_tasks(origin, staging) if source is not None else extract_tasks(origin, staging)
            if count == 0:
                raise SystemExit(f"error: {origin} holds no bigbench/benchmark_tasks/**/task.json")
            install(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    print(f"{'copied' if source is not None else 'extracted'} {count} task.json files from {origin.name} "
          f"into {dest}")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder for the tasks (default: bigbench_dir())")
    parser.add_argument("--sdist", type=Path, default=None, help="use this bigbench-1.0.0.tar.gz instead of pip")
    parser.add_argument("--source", type=Path, default=None,
                        help="copy the task files of this folder: a checkout of the BIG-bench repository")
    parser.add_argument("--no-catalogue", action="store_true",
                        help="skip listing the tasks (size, answer forms) for `ecdysis suites`")
    args = parser.parse_args(argv)
    if args.sdist is not None and not args.sdist.is_file():
        parser.error(f"--sdist {args.sdist} is not a file")
    if args.source is not None and not args.source.is_dir():
        parser.error(f"--source {args.source} is not a folder")
    if args.sdist is not None and args.source is not None:
        parser.error("give --sdist or --source, not both")
    dest = args.dest or default_dest()
    try:
        fetch(dest, args.sdist, args.source)
    except Unavailable as exc:
        print(f"BIG-bench is not set up on this machine: the package index does not serve {REQUIREMENT}.\n"
              f"  {exc}\n"
              f"  The bigbench:TASK suites are unavailable here; the built-in, imported, BFCL and BIG-Bench Hard\n"
              f"  (bbh:TASK) suites are not affected. With the task files at hand: scripts/fetch_bigbench.py\n"
              f"  --sdist bigbench-1.0.0.tar.gz,"
              f" or --source DIR with a checkout of the BIG-bench repository.", file=sys.stderr)
        return UNAVAILABLE
    if not args.no_catalogue:
        build_catalogue(dest)
    return 0


def build_catalogue(dest: Path) -> None:
    """Load every task once and keep its row (size, scorer, answer forms) for `ecdysis suites`;
    a later run only reloads tasks whose files changed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ecdysis.suites import bigbench_catalogue

    def progress(n: int, total: int, task: str) -> None:
        print(f"cataloguing BIG-bench task {n}/{total}: {task}", flush=True)

    started = time.perf_counter()
    rows = bigbench_catalogue(dest, progress=progress)
    failed = [r for r in rows if "error" in r]
    print(f"BIG-bench catalogue: {len(rows) - len(failed)} tasks listed, {len(failed)} that do not load "
          f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

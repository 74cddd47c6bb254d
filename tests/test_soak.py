"""Concurrency soak: the app's job manager, two CLI runs, a kill and two resumes racing for the
killed run, all on one database (a SQLite file, then PostgreSQL), against one OpenAI-compatible
stub that counts every model call. Each instance is asked once, apart from the calls in flight at
the kill; exactly one of the two resumes executes, the other is refused in one line naming the
holder; every run ends done with one result per instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ecdysis.service import RunRequest, Service
from servers.openai_stub import MisbehavingOpenAI
from storage import open_store
from test_storage import pg_schema_url  # noqa: F401 - the PostgreSQL schema fixture

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LEASE_TTL_S = 1.0
N = 14
CONCURRENCY = 2


@pytest.fixture(params=["sqlite", "postgresql"])
def soak_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_schema_url"))
    return f"sqlite:///{tmp_path / 'soak.db'}"


def _suite(path: Path, tag: str) -> Path:
    with path.open("w") as fh:
        for k in range(N):
            fh.write(json.dumps({"id": f"{tag}{k:02d}", "input": f"Statement {tag}-{k:02d}: water is wet. mode=ok",
                                 "target": "True", "category": "c"}) + "\n")
    return path


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ecdysis.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(predicate, what: str, timeout: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_app_jobs_cli_runs_a_kill_and_racing_resumes_ask_each_instance_once(
        soak_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suites = {tag: _suite(tmp_path / f"{tag}.jsonl", tag) for tag in ("A", "B", "C")}
    with MisbehavingOpenAI(delay_s=0.3, max_requests=10 * N) as server:
        for key, value in (("OPENAI_BASE_URL", server.base_url), ("ECDYSIS_DATABASE_URL", soak_url),
                           ("ECDYSIS_LEASE_TTL", str(LEASE_TTL_S)), ("ECDYSIS_MAX_RETRIES", "0")):
            monkeypatch.setenv(key, value)
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        env.update(PYTHONPATH=str(ROOT))
        common = ["--split", "all", "--model", "openai:stub", "--concurrency", str(CONCURRENCY), "--no-cache", "--json"]
        app = Service(open_store(soak_url))  # the app's process: its job manager runs batch C
        try:
            run_a = _cli("run", "--suite", str(suites["A"]), *common, env=env)
            run_b = _cli("run", "--suite", str(suites["B"]), *common, env=env)
            job = app.start_run_job(RunRequest(suite=str(suites["C"]), model="openai:stub", split="all",
                                               concurrency=CONCURRENCY, use_cache=False))

            def a_results() -> int:
                return sum(len(app.store.done_instance_ids(r.id)) for r in app.runs() if Path(r.suite).stem == "A")
            _wait(lambda: a_results() >= 4, "4 results of batch A")
            run_a.kill()
            run_a.wait(30)
            hits_at_kill = {h.prompt for h in server.snapshot()}
            (a_id,) = [r.id for r in app.runs() if Path(r.suite).stem == "A"]
            time.sleep(LEASE_TTL_S + 0.2)  # the killed process's lease lapses
            resumes = [_cli("run", "--resume", a_id, "--no-cache", "--json", env=env) for _ in range(2)]
            outcomes = [p.communicate(timeout=300) + (p.returncode,) for p in resumes]
            b_out, b_err = run_b.communicate(timeout=300)
            app.jobs.wait(job, timeout=300)
            hits = server.snapshot()
            runs = {Path(r.suite).stem: r for r in app.runs()}
            results = {tag: app.store.get_results(run.id) for tag, run in runs.items()}
        finally:
            app.store.close()  # type: ignore[attr-defined]

    assert run_b.returncode == 0, b_err[-2000:]
    assert sorted(code for _, _, code in outcomes) == [0, 2], outcomes
    refused = next(err for _, err, code in outcomes if code == 2)
    assert f"run {a_id} is running elsewhere: held by pid" in refused and len(refused.strip().splitlines()) == 1
    assert {tag: (run.status, len(results[tag])) for tag, run in runs.items()} == {
        "A": ("done", N), "B": ("done", N), "C": ("done", N)}
    per_prompt = Counter(h.prompt for h in hits)
    assert len(per_prompt) == 3 * N, "every instance of every batch was asked"
    repeated = {prompt: count for prompt, count in per_prompt.items() if count > 1}
    # Only batch A's calls in flight at the kill may be asked again, and only once more.
    assert all("Statement A-" in p and p in hits_at_kill and c == 2 for p, c in repeated.items()), repeated
    assert len(repeated) <= CONCURRENCY, repeated
    print(f"{len(hits)} calls for {3 * N} instances; {len(repeated)} in flight at the kill asked again")

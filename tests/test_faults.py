"""Faults: the engine killed with SIGKILL mid-batch, mid-diagnosis and mid-evolution, then resumed;
two processes writing one SQLite file; a model server that answers 429, 500, garbage or nothing.

What "nothing lost, nothing done twice" means here, and how it is counted honestly:
- model calls are counted by the model server itself (`tests/servers/openai_stub.py`, real HTTP in
  the test process), so the count spans every engine process; a prompt whose answer was stored
  (as a result or a cache entry) before a kill is never requested again after it, and the only
  prompts asked twice are the ones in flight when the process died;
- a stored instance result is never redone: its `saved_at` and its calls are the same after the
  resume; stored diagnoses (with every role message), proposals and decisions are unchanged;
- nothing is half-stored and nothing is duplicated: no diagnosis without its proposals, one
  decision per proposal, one diagnosis per evolution iteration, no run created twice;
- an evolution killed in every phase ends exactly where a fault-free one ends.

The in-process tests at the end kill the evolution at precise write boundaries (the process "dies"
right after a chosen store write): the windows a timed SIGKILL cannot aim at.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from servers.openai_stub import MisbehavingOpenAI
from servers.proc_tree import alive, descendants

ROOT = Path(__file__).resolve().parent.parent
LEASE_TTL_S = 1.0


# ---------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def short_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process engines too: a "dead" one's lease lapses after LEASE_TTL_S."""
    monkeypatch.setenv("ECDYSIS_LEASE_TTL", str(LEASE_TTL_S))


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith(("ECDYSIS_", "OPENAI_", "ANTHROPIC_"))}
    # A killed engine's lease lapses after this long; a resume before that is refused (test_exactly_once).
    env.update(ECDYSIS_HOME=str(home), PYTHONPATH=str(ROOT), ECDYSIS_LEASE_TTL=str(LEASE_TTL_S), **extra)
    return env


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ecdysis.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> Any:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    assert "database is locked" not in err
    return json.loads(out)


def _query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the engine's database from outside (it may be mid-write: WAL gives us a snapshot)."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        con.close()


def _wait(predicate: Callable[[], Any], proc: subprocess.Popen[str] | None = None, timeout: float = 120,
          what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            raise AssertionError(f"the engine ended (exit {proc.returncode}) before {what}: {err}")
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what}")


def _kill(proc: subprocess.Popen[str]) -> list[int]:
    """SIGKILL the engine; return its sandbox processes, which must die with it."""
    sandboxes = descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in sandboxes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in sandboxes if alive(p)], "a harness process outlived the killed engine"
    time.sleep(LEASE_TTL_S + 0.1)  # the dead engine's lease lapses: only then may a resume take over
    return sandboxes


def _results(db: Path) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = _query(db, "select run_id, instance_id, answer, correct, error_type, saved_at from instance_result")
    calls = Counter((r[0], r[1]) for r in _query(db, "select run_id, instance_id from model_call"))
    return {(r[0], r[1]): (*r[2:], calls[(r[0], r[1])]) for r in rows}


def _cached_prompts(db: Path) -> set[str]:
    """The last message of every cached request: what the model server saw as the prompt."""
    return {json.loads(r[0])["messages"][-1]["content"] for r in _query(db, "select request from cache_entry")}


def _suite(path: Path, n: int, mode: str = "ok") -> Path:
    with path.open("w") as fh:
        for k in range(n):
            fh.write(json.dumps({"id": f"s{k:02d}", "input": f"Statement {k:02d}: water is wet. mode={mode}",
                                 "target": "True", "category": "c"}) + "\n")
    return path


# ---------------------------------------------------------------- (a) a batch


@pytest.mark.slow
def test_batch_killed_mid_run_resumes_without_losing_or_redoing_work(tmp_path: Path) -> None:
    n, concurrency = 12, 3
    home = tmp_path / "home"
    suite = _suite(tmp_path / "s.jsonl", n)
    with MisbehavingOpenAI(delay_s=0.4) as server:
        env = _env(home, OPENAI_BASE_URL=server.base_url, ECDYSIS_MAX_RETRIES="0", ECDYSIS_MODEL_TIMEOUT="20")
        proc = _cli("run", "--suite", str(suite), "--split", "all", "--model", "openai:stub",
                    "--concurrency", str(concurrency), "--json", env=env)
        db = home / "ecdysis.db"
        _wait(lambda: len(_results(db)) >= 4, proc, what="4 stored results")
        _kill(proc)
        killed_at = time.monotonic()
        before, cached_before, hits_before = _results(db), _cached_prompts(db), server.snapshot()
        (run_id, status), = _query(db, "select id, status from run")
        assert status == "running" and 4 <= len(before) < n

        summary = _finish(_cli("run", "--resume", run_id, "--json", env=env))
        after, hits = _results(db), server.snapshot()

    assert summary["n"] == n and summary["accuracy"] == 1.0
    assert _query(db, "select status from run") == [("done",)]
    assert len(after) == n and all(row[-1] == 1 for row in after.values())  # one call per instance
    for key, row in before.items():
        assert after[key] == row, f"{key} was redone or changed by the resume"
    stored_prompts = {f"Statement {iid[1:]}" for _, iid in before}
    late = [h for h in hits if h.at > killed_at]
    assert not [h for h in late if any(p in h.prompt for p in stored_prompts)], "a stored instance was asked again"
    assert not [h for h in late if h.prompt in cached_before], "a cached answer was asked for again"
    per_prompt = Counter(h.prompt for h in hits)
    in_flight = {h.prompt for h in hits_before} - {p for p in per_prompt if any(s in p for s in stored_prompts)}
    assert all(count == 1 or prompt in in_flight for prompt, count in per_prompt.items())
    assert len(hits) <= n + concurrency
    print(f"killed with {len(before)}/{n} stored; {len(hits) - n} in-flight call(s) redone; "
          f"{len(late)} calls after the kill")


# ---------------------------------------------------------------- (b) a diagnosis


SLOW_WHEN_PATCHED = '''

import time as _time
_starter_solve = solve


def solve(task, model, harness):
    """The starter, made slow once a patch has added the answer-format instruction: so the Critic's
    smoke run of a patched harness is a window in which the test kills the engine."""
    answer = _starter_solve(task, model, harness)
    if "alone on the first line" in harness.read("system.md"):
        _time.sleep(4)
    return answer
'''


def _slow_harness(tmp_path: Path) -> Path:
    from ecdysis.harness import starter_files, write_dir
    files = starter_files()
    files["harness.py"] += SLOW_WHEN_PATCHED
    return write_dir(files, tmp_path / "slow-harness")


def _review_trail(db: Path) -> dict[str, Any]:
    return {"diagnoses": _query(db, "select id, run_ids, report from diagnosis order by id"),
            "proposals": _query(db, "select id, diagnosis_id, files, spec, data from proposal order by id"),
            "decisions": _query(db, "select id, proposal_id, decision, who, at from decision order by id"),
            "results": _results(db)}


@pytest.mark.slow
def test_diagnosis_killed_midway_leaves_nothing_half_stored(tmp_path: Path) -> None:
    from ecdysis.gate import decide
    from storage import open_store
    home, db = tmp_path / "home", tmp_path / "home" / "ecdysis.db"
    with MisbehavingOpenAI(answer="I am not sure.") as server:
        env = _env(home, OPENAI_BASE_URL=server.base_url, ECDYSIS_MAX_RETRIES="0")
        run = _finish(_cli("run", "--suite", "boolean", "--limit", "8", "--model", "openai:stub",
                           "--harness", str(_slow_harness(tmp_path)), "--concurrency", "4", "--json", env=env))
        first = _finish(_cli("diagnose", run["run_id"], "--json", env=env))
        assert first["proposals"], "the batch should yield a proposal (answer-format instruction)"
        store = open_store(f"sqlite:///{db}")
        try:  # a human approves it, as the app would
            decide(store, first["proposals"][0]["id"], "approve", who="reviewer")
        finally:
            store.close()
        trail, calls_so_far = _review_trail(db), len(server.snapshot())

        second = _cli("diagnose", run["run_id"], "--json", env=env)
        # The Critic smoke-runs the patched harness in a sandbox: kill the engine while it runs.
        _wait(lambda: descendants(second.pid), second, what="the Critic's smoke run")
        time.sleep(0.5)
        _kill(second)
        assert _review_trail(db) == trail, "a killed diagnosis changed or half-stored the review trail"

        third = _finish(_cli("diagnose", run["run_id"], "--json", env=env))
        calls_after = len(server.snapshot())
    now = _review_trail(db)
    assert set(trail["diagnoses"]) < set(now["diagnoses"])  # the first one, every role message intact
    assert [d for d in now["diagnoses"] if d[0] == third["id"]]
    assert {p[0] for p in now["proposals"] if p[1] == third["id"]} == {p["id"] for p in third["proposals"]}
    assert now["decisions"] == trail["decisions"] and now["results"] == trail["results"]
    assert len(now["diagnoses"]) == 2  # the killed one left nothing
    # Every model call of the two later diagnoses (the smoke runs) came from the cache.
    assert calls_after == calls_so_far


# ---------------------------------------------------------------- (c) an evolution


EVOLVE = ["evolve", "--suite", "boolean", "--model", "openai:stub", "--iterations", "2", "--batch-size", "6",
          "--val-limit", "6", "--test-limit", "10", "--concurrency", "2", "--auto-approve", "--json"]


def _phase(db: Path) -> tuple[str, dict[str, Any]] | None:
    rows = _query(db, "select id, result from evolution")
    if not rows:
        return None
    return rows[0][0], json.loads(rows[0][1])["cursor"]


# What differs between two evolutions that did the same work: generated ids, times and the calls a
# resume was spared by the cache.
VARYING = {"wall_seconds", "diagnosis_id", "diagnosis_ids", "model_calls", "tokens", "model_seconds",
           "calls_by_phase", "review_wait_seconds", "proposal_id", "spent"}


def _same_work(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _same_work(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [_same_work(v) for v in value]
    return value


def _evolution_facts(db: Path) -> dict[str, Any]:
    (row,) = _query(db, "select iterations, result, status from evolution")
    iterations = [_same_work(it) for it in json.loads(row[0])]
    result = json.loads(row[1])
    return {"iterations": iterations, "status": row[2], "test": result.get("test_accuracy"),
            "base_test": result.get("base_test_accuracy"), "final": result.get("final_version"),
            "runs": sorted((r[0], r[1], len(json.loads(r[2]))) for r in
                           _query(db, "select harness_version, split, instance_ids from run")),
            "diagnoses": len(_query(db, "select id from diagnosis")),
            "proposals": sorted(r[0] for r in _query(db, "select status from proposal")),
            "decisions_per_proposal": sorted(Counter(r[0] for r in _query(db, "select proposal_id from decision"))
                                             .values()),
            "harnesses": sorted(r[0] for r in _query(db, "select id from harness_version"))}


@pytest.mark.slow
def test_evolution_killed_in_every_phase_ends_where_a_clean_one_ends(tmp_path: Path) -> None:
    golden_home, home = tmp_path / "golden", tmp_path / "chaos"
    with MisbehavingOpenAI(answer="I am not sure.") as golden_server:
        _finish(_cli(*EVOLVE, env=_env(golden_home, OPENAI_BASE_URL=golden_server.base_url)))
        golden_calls = len(golden_server.snapshot())
    golden = _evolution_facts(golden_home / "ecdysis.db")
    # two iterations, and a second screening round where the first left nothing
    assert golden["status"] == "done" and golden["diagnoses"] >= 2

    db = home / "ecdysis.db"

    def results_in(slot: str) -> int:
        got = _phase(db)
        ids = list((got[1].get(slot) or {}).values()) if got else []
        return len(_query(db, "select 1 from instance_result where run_id = ?", ids[0])) if ids else 0

    def screened() -> int:
        got = _phase(db)
        ids = [rid for slot, runs in (got[1].items() if got else []) if slot.startswith("screen_runs:")
               for rid in runs.values()]
        return sum(len(_query(db, "select 1 from instance_result where run_id = ?", rid)) for rid in ids)

    kill_points: list[tuple[str, Callable[[], bool]]] = [
        ("train batch", lambda: results_in("train_runs") >= 2),
        ("diagnosis", lambda: bool((got := _phase(db)) and got[1]["phase"] == "diagnose")),
        # (no change of this world repairs anything, so none passes screening to a validation)
        ("screening batch", lambda: screened() >= 1),
        ("test batch", lambda: results_in("test_final_runs") >= 1 or results_in("test_base_runs") >= 1),
    ]
    kills: list[str] = []
    with MisbehavingOpenAI(answer="I am not sure.", delay_s=0.25) as server:
        env = _env(home, OPENAI_BASE_URL=server.base_url)
        proc = _cli(*EVOLVE, env=env)
        for name, reached in kill_points:
            _wait(reached, proc, what=f"the {name}")
            _kill(proc)
            kills.append(f"{name} ({_phase(db)[1]['phase']} of iteration {_phase(db)[1]['iteration']})")
            before = _review_trail(db)
            evolution_id = _phase(db)[0]
            proc = _cli("evolve", "--resume", evolution_id, "--json", env=env)
            # Whatever was stored before the kill is still there, unchanged, once work goes on.
            time.sleep(0.3)
            now = _review_trail(db)
            assert set(before["diagnoses"]) <= set(now["diagnoses"])
            assert set(before["decisions"]) <= set(now["decisions"])
            assert all(now["results"].get(k) == v for k, v in before["results"].items())
        final = _finish(proc)
        calls = len(server.snapshot())

    assert final["status"] == "done", final
    facts = _evolution_facts(db)
    assert facts == golden, f"killed in {kills}, the evolution ended elsewhere"
    assert set(facts["decisions_per_proposal"]) == {1}
    # Each kill may cost the calls in flight (concurrency 2) and nothing else.
    assert golden_calls <= calls <= golden_calls + 2 * len(kills)
    print(f"evolution survived {len(kills)} kills: {kills}; {calls} model calls vs {golden_calls} fault-free")


# ---------------------------------------------------------------- (c') exact crash points, in process


class Killed(BaseException):
    """The process died (BaseException: no engine code may catch it)."""


class DyingStore:
    """A `Store` that dies right after the `nth` call of `method` commits (counting only calls
    whose arguments `when` accepts, if given): every later call, read or write, raises `Killed`,
    as if the process had received SIGKILL there."""

    def __init__(self, store: Any, method: str, nth: int = 1, when: Callable[..., bool] | None = None) -> None:
        self._store, self._method, self._nth, self._when = store, method, nth, when
        self.dead = False
        self._seen = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise Killed(name)
            out = target(*args, **kwargs)
            if name == self._method and (self._when is None or self._when(*args, **kwargs)):
                self._seen += 1
                if self._seen == self._nth:
                    self.dead = True
                    raise Killed(name)
            return out
        return call


def _in_process_evolution(db: Path, backend: Any, method: str | None = None, nth: int = 1) -> tuple[str, bool]:
    from ecdysis.evolve import EvolveConfig, Evolver
    from ecdysis.service import Service
    from storage import open_store
    real = open_store(f"sqlite:///{db}")
    store = DyingStore(real, method, nth) if method else real
    cfg = EvolveConfig(suite="boolean", models=[backend.model_id], iterations=2, batch_size=5, val_limit=5,
                       test_limit=4, auto_approve=True)
    svc = Service(store)  # type: ignore[arg-type]
    died = False
    try:
        evo = Evolver(svc, poll_s=0).create(cfg)
        try:
            Evolver(svc, poll_s=0).run(evo.id)
        except Killed:
            died = True
    finally:
        real.close()
    return evo.id, died


def _resume(db: Path, evolution_id: str) -> None:
    from ecdysis.evolve import Evolver
    from ecdysis.service import Service
    from storage import open_store
    time.sleep(LEASE_TTL_S + 0.1)  # the "dead" evolution's lease lapses first
    store = open_store(f"sqlite:///{db}")
    try:
        assert Evolver(Service(store), poll_s=0).run(evolution_id).status == "done"
    finally:
        store.close()


CRASH_POINTS = [
    ("create_run", 1),          # a run exists that no cursor names yet
    ("save_results", 3),        # mid-batch
    ("save_report", 1),         # a diagnosis with its proposals, the cursor still in "diagnose"
    ("decide_proposal", 1),     # a decision recorded, the cursor still in "gate"
    ("put_harness", 2),         # the composed candidate, before its proposals read "applied"
    ("set_proposal_status", 1), # a proposal "applied", the cursor still in "apply"
    ("update_harness", 1),      # the gate's verdict on the candidate, before the iteration row
]


def _scripted_faults() -> Any:
    from ecdysis.models.registry import register_backend
    from ecdysis.models.scripted import ScriptedBackend
    backend = ScriptedBackend(model_id="scripted-faults", default="I am not sure.")
    register_backend(backend)
    return backend


@pytest.fixture(scope="module")
def clean_evolution(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], int]:
    """The fault-free evolution every crash point must end at, and its model calls."""
    backend = _scripted_faults()
    db = tmp_path_factory.mktemp("golden") / "golden.db"
    _in_process_evolution(db, backend)
    return _evolution_facts(db), len(backend.history)


@pytest.mark.slow
@pytest.mark.parametrize("method, nth", CRASH_POINTS, ids=[f"{m}#{n}" for m, n in CRASH_POINTS])
def test_evolution_dying_right_after_a_write_resumes_to_the_clean_result(
        tmp_path: Path, method: str, nth: int, clean_evolution: tuple[dict[str, Any], int]) -> None:
    golden, golden_calls = clean_evolution
    backend = _scripted_faults()
    db = tmp_path / "faulty.db"
    evolution_id, died = _in_process_evolution(db, backend, method, nth)
    assert died, f"the evolution never called {method} {nth} time(s)"
    _resume(db, evolution_id)
    assert _evolution_facts(db) == golden
    assert set(_evolution_facts(db)["decisions_per_proposal"]) == {1}
    # The scripted backend lives in this process, so here it counts calls across the "death":
    # at most the one call whose answer the dying write was about to store is made again.
    assert golden_calls <= len(backend.history) <= golden_calls + 1


# ---------------------------------------------------------------- 2. two processes, one SQLite file


APP_PROCESS = textwrap.dedent('''
    import json, sys
    from ecdysis.service import RunRequest, Service
    from storage import open_store
    svc = Service(open_store())
    jobs = [svc.start_run_job(RunRequest(suite="reasoning-mix", model="openai:stub", limit=int(sys.argv[1]),
                                         concurrency=4, use_cache=False, label=f"app-{k}")) for k in range(2)]
    done = [svc.jobs.wait(j, timeout=300) for j in jobs]
    print(json.dumps([{"status": j.status, "error": j.error, "result": j.result} for j in done]))
''')


@pytest.mark.slow
def test_the_app_and_the_cli_write_one_database_at_once(tmp_path: Path) -> None:
    """Two CLI batches and an app-like process (Service + JobManager, two jobs in threads) start on
    one fresh SQLite file; the model server holds every request until all three processes have
    calls in flight, then lets them go at once. Migrations, results, calls, cache entries and job
    progress all land, and nobody sees "database is locked"."""
    import threading
    home, n = tmp_path / "home", 40
    gate = threading.Event()
    # Calls of 0.1 s keep each run storing for over a second, so the overlap checked below does not
    # hang on scheduling jitter (with 10 ms calls a run could finish in half a second, before another began).
    with MisbehavingOpenAI(delay_s=0.1, gate=gate) as server:
        env = _env(home, OPENAI_BASE_URL=server.base_url, ECDYSIS_MAX_RETRIES="0")
        app = subprocess.Popen([sys.executable, "-c", APP_PROCESS, str(n)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        clis = [_cli("run", "--suite", "reasoning-mix", "--model", "openai:stub", "--limit", str(n),
                     "--concurrency", "4", "--json", *(["--no-cache"] if k else []), env=env) for k in range(2)]
        # 4 + 4 calls from the CLIs, 8 from the app's two jobs: 13 held calls mean all three are in.
        _wait(lambda: server.waiting >= 13, timeout=180, what="all three writers")
        gate.set()
        summaries = [_finish(c) for c in clis]
        out, err = app.communicate(timeout=300)
    assert app.returncode == 0, err[-3000:]
    assert "locked" not in err
    jobs = json.loads(out)
    assert [j["status"] for j in jobs] == ["done", "done"], jobs
    db = home / "ecdysis.db"
    runs = _query(db, "select id, status, label from run")
    assert len(runs) == 4 and all(status == "done" for _, status, _ in runs)
    for run_id, _, _ in runs:
        assert len(_query(db, "select 1 from instance_result where run_id = ? and error_type is null", run_id)) == n
        assert len(_query(db, "select 1 from model_call where run_id = ?", run_id)) == n
    assert {s["n"] for s in summaries} == {n}
    assert _query(db, "select count(*) from schema_migrations")[0][0] == len(__import__("storage").MIGRATIONS)
    assert len(_cached_prompts(db)) == n  # the cached CLI run's answers, each once
    job_rows = _query(db, "select status, done, total from job")
    assert len(job_rows) == 2 and all(r == ("done", n, n) for r in job_rows)
    # The writers really overlapped: each run's results were being stored while the others' were.
    spans = _query(db, "select run.label, min(saved_at), max(saved_at) from instance_result "
                       "join run on run.id = run_id group by run_id")
    for label, lo, hi in spans:
        others = [(o_lo, o_hi) for o_label, o_lo, o_hi in spans if (o_label, o_lo) != (label, lo)]
        assert sum(lo < o_hi and o_lo < hi for o_lo, o_hi in others) == 3, spans


# ---------------------------------------------------------------- 3. a model server that misbehaves


MODES = {"ok": (True, 1), "flaky-429": (True, 2), "flaky-500": (True, 3),
         "429": (False, 3), "500": (False, 3), "garbage": (False, 3), "empty": (False, 3),
         "hang": (False, 3), "drop": (False, 3)}


@pytest.mark.slow
def test_a_misbehaving_model_server_costs_typed_failures_and_the_batch_completes(tmp_path: Path) -> None:
    """ECDYSIS_MAX_RETRIES=2 and ECDYSIS_MODEL_TIMEOUT=1 through the environment of a real CLI run:
    every prompt is tried exactly 3 times at most (the SDK's own retries are off), a 429's
    Retry-After is waited out, a transient failure becomes a right answer, a persistent one becomes
    that instance's `model_error`, no error is cached, and the batch finishes."""
    home = tmp_path / "home"
    suite = tmp_path / "modes.jsonl"
    with suite.open("w") as fh:
        for mode in MODES:
            fh.write(json.dumps({"id": mode, "input": f"Is water wet? mode={mode}", "target": "True",
                                 "category": "c"}) + "\n")
    with MisbehavingOpenAI(max_requests=60, hang_s=30, retry_after=0.3) as server:
        env = _env(home, OPENAI_BASE_URL=server.base_url, ECDYSIS_MAX_RETRIES="2", ECDYSIS_MODEL_TIMEOUT="1")
        summary = _finish(_cli("run", "--suite", str(suite), "--split", "all", "--model", "openai:stub",
                               "--concurrency", str(len(MODES)), "--json", env=env), timeout=120)
        hits = {mode: server.attempts(f"mode={mode}") for mode in MODES}
    db = home / "ecdysis.db"
    rows = {r[0]: r[1:] for r in _query(db, "select instance_id, correct, error_type, error_message from instance_result")}
    assert summary["n"] == len(MODES) and _query(db, "select status from run") == [("done",)]
    for mode, (succeeds, attempts) in MODES.items():
        correct, error_type, message = rows[mode]
        assert len(hits[mode]) == attempts, (mode, len(hits[mode]))
        if succeeds:
            assert correct == 1 and error_type is None, (mode, message)
        else:
            assert correct == 0 and error_type == "model_error", (mode, error_type, message)
            assert "gave up after 3 attempts" in message, message
    gaps = [b.at - a.at for a, b in zip(hits["429"], hits["429"][1:])]
    assert all(g >= 0.3 for g in gaps), gaps  # Retry-After honoured
    cached = _cached_prompts(db)
    assert {m for m in MODES if any(f"mode={m}" in c for c in cached)} == {"ok", "flaky-429", "flaky-500"}
    errors = _query(db, "select instance_id, finish_reason, error from model_call where error is not null")
    assert {r[0] for r in errors} == {m for m, (ok, _) in MODES.items() if not ok}
    assert summary["errors"] == {"model_error": 6}
    # The hanging server is cut off by the 1 s model timeout, each attempt: not waited out for 30 s.
    assert "timeout" in rows["hang"][2].lower() or "timed out" in rows["hang"][2].lower(), rows["hang"][2]

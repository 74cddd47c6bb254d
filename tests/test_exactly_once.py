"""Exactly once under concurrency, on SQLite and (slow) PostgreSQL, with real stores and processes:

- two deciders of one proposal at once: one decision is recorded, the other gets one clear line
  (`Conflict`) and stores nothing; the status agrees with the decision on record;
- a diagnosis is stored with its proposals or not at all;
- a run, an evolution or a diagnosis has one executor at a time (a lease): a second is refused
  naming the holder, a crashed holder's lease lapses and a resume then works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ecdysis import diagnosis
from ecdysis.errors import Conflict
from ecdysis.gate import decide
from ecdysis.harness import ensure_starter
from ecdysis.models.registry import register_backend
from ecdysis.models.scripted import ScriptedBackend
from ecdysis.service import RunRequest, Service
from ecdysis.store import ProposalRecord
from storage import SQLStore, open_store
from test_storage import fresh_url, pg_schema_url  # noqa: F401 - the SQLite/PostgreSQL fixtures

ROOT = Path(__file__).resolve().parent.parent
SURE = "Sure! Here is my answer: 42\nI hope this helps."


def _proposals(store: SQLStore, n: int) -> list[str]:
    base = ensure_starter(store)
    ids = []
    for k in range(n):
        patched = {"system.md": base.files["system.md"] + f"\nAnswer with the answer only ({k}).\n"}
        store.save_proposal(ProposalRecord(id=f"p{k:03d}", diagnosis_id="d0", cluster_id="c1",
                                           harness_version=base.id, spec={"change": "answer only"},
                                           files=patched, created_at=time.time()))
        ids.append(f"p{k:03d}")
    return ids


def test_two_deciders_at_once_record_exactly_one_decision(fresh_url: str) -> None:
    setup = open_store(fresh_url)
    ids = _proposals(setup, 6)
    stores = [open_store(fresh_url), open_store(fresh_url)]
    outcomes: dict[str, list[Any]] = {pid: [] for pid in ids}

    def decider(k: int, barrier: threading.Barrier, pid: str) -> None:
        barrier.wait()
        try:
            if k == 0:
                outcomes[pid].append(decide(stores[k], pid, "approve", who="alice"))
            else:
                outcomes[pid].append(decide(stores[k], pid, "reject", who="bob", reason="too narrow"))
        except Conflict as exc:
            outcomes[pid].append(exc)

    try:
        for pid in ids:
            barrier = threading.Barrier(2)
            threads = [threading.Thread(target=decider, args=(k, barrier, pid)) for k in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        for pid in ids:
            won = [o for o in outcomes[pid] if not isinstance(o, Conflict)]
            lost = [o for o in outcomes[pid] if isinstance(o, Conflict)]
            assert len(won) == 1 and len(lost) == 1, outcomes[pid]
            assert "already decided" in str(lost[0])
            stored = setup.list_decisions(pid)
            assert [d.decision for d in stored] == [won[0].decision]
            status = setup.get_proposal(pid).status  # type: ignore[union-attr]
            assert status == {"approve": "approved", "reject": "rejected"}[won[0].decision]
    finally:
        for s in (setup, *stores):
            s.close()


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ecdysis.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("ECDYSIS_")}
    env.update(ECDYSIS_HOME=str(home), PYTHONPATH=str(ROOT), **extra)
    return env


def test_two_cli_decides_at_once_one_records_the_other_says_so_in_one_line(ecdysis_home: Path) -> None:
    store = open_store()
    (pid,) = _proposals(store, 1)
    store.close()
    env = _env(ecdysis_home)
    procs = [_cli("decide", pid, "--decision", "approve", env=env),
             _cli("decide", pid, "--decision", "reject", "--reason", "too narrow", env=env)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, 2], results
    loser = next(r for r in results if r[2] == 2)
    assert "already decided" in loser[1] and "Traceback" not in loser[1]
    assert len(loser[1].strip().splitlines()) == 1, loser[1]
    store = open_store()
    try:
        assert len(store.list_decisions(pid)) == 1
    finally:
        store.close()


class Killed(BaseException):
    """The process died here (BaseException: no engine code catches it)."""


def test_a_diagnosis_dying_before_its_proposals_are_stored_leaves_nothing(
        store: SQLStore, monkeypatch: pytest.MonkeyPatch) -> None:
    register_backend(ScriptedBackend(model_id="sure", default=SURE))
    svc = Service(store)
    run_id = svc.run(RunRequest(suite="reasoning-mix", model="sure", limit=10)).run_id
    report = diagnosis.diagnose(store, [run_id], suite_loader=svc.suite, backend_factory=svc.backend,
                                limits=svc.limits())
    assert report.proposals, "the world must produce proposals for this test to mean anything"
    import storage.sql_store as sql_store

    def die(**_kwargs: Any) -> None:
        raise Killed("after the diagnosis row, before its first proposal")
    monkeypatch.setattr(sql_store, "upsert_proposal", die)
    with pytest.raises(Killed):
        diagnosis.store_report(store, report)
    monkeypatch.undo()
    assert store.list_diagnoses() == [] and store.list_proposals() == []
    rec = diagnosis.store_report(store, report)  # the next start stores it whole
    assert {p.id for p in store.list_proposals(diagnosis_id=rec.id)} == {p.id for p in report.proposals}


# ---------------------------------------------------------------- leases

def test_a_run_held_elsewhere_is_refused_naming_the_holder_and_untouched(store: SQLStore) -> None:
    register_backend(ScriptedBackend(model_id="sure", default=SURE))
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="sure", limit=4))
    store.acquire_lease(f"run:{run.id}", "pid 4242 on build-7 (run) #c0ffee", 60.0)
    with pytest.raises(Conflict, match=r"run \S+ is running elsewhere: held by pid 4242 on build-7"):
        svc.execute_run(run.id)
    assert store.get_run(run.id) == run and store.get_results(run.id) == []
    store.release_lease(f"run:{run.id}", "pid 4242 on build-7 (run) #c0ffee")
    assert svc.execute_run(run.id).n == 4
    assert store.list_leases() == [], "the executor gave its lease back"


def test_a_crashed_holders_lease_lapses_and_resume_then_works(store: SQLStore) -> None:
    register_backend(ScriptedBackend(model_id="sure", default=SURE))
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="sure", limit=3))
    store.acquire_lease(f"run:{run.id}", "pid 4242 on build-7 (run) #dead00", 0.5)  # then it "died"
    with pytest.raises(Conflict):
        svc.execute_run(run.id)
    time.sleep(0.6)
    assert svc.execute_run(run.id).n == 3


def test_an_evolution_and_a_diagnosis_held_elsewhere_are_refused(store: SQLStore) -> None:
    from ecdysis.evolve import EvolveConfig, Evolver
    register_backend(ScriptedBackend(model_id="sure", default=SURE))
    svc = Service(store)
    evo = Evolver(svc, poll_s=0).create(EvolveConfig(suite="boolean", models=["sure"], iterations=1, batch_size=3,
                                                     val_limit=3, test_limit=2, auto_approve=True))
    store.acquire_lease(f"evolution:{evo.id}", "pid 4242 on build-7 (evolve) #c0ffee", 60.0)
    with pytest.raises(Conflict, match="is running elsewhere: held by pid 4242"):
        Evolver(svc, poll_s=0).run(evo.id)
    assert store.get_evolution(evo.id) == evo and store.list_runs() == []
    run_id = svc.run(RunRequest(suite="reasoning-mix", model="sure", limit=4)).run_id
    store.acquire_lease(f"diagnosis:{run_id}", "pid 4242 on build-7 (diagnose) #c0ffee", 60.0)
    with pytest.raises(Conflict, match="running elsewhere"):
        svc.diagnose([run_id])
    assert store.list_diagnoses() == []


def test_a_lease_has_one_owner_when_many_take_it_at_once(fresh_url: str) -> None:
    stores = [open_store(fresh_url) for _ in range(4)]
    won: list[str] = []
    barrier = threading.Barrier(len(stores))

    def take(k: int) -> None:
        barrier.wait()
        try:
            stores[k].acquire_lease("run:r1", f"owner-{k}", 30.0)
            won.append(f"owner-{k}")
        except Conflict:
            pass
    try:
        threads = [threading.Thread(target=take, args=(k,)) for k in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(won) == 1
        assert [lease.owner for lease in stores[0].list_leases()] == won
        assert not stores[1].renew_lease("run:r1", "someone-else", 30.0)
        assert stores[1].renew_lease("run:r1", won[0], 30.0)
    finally:
        for s in stores:
            s.close()


def _suite_file(path: Path, n: int) -> Path:
    import json
    with path.open("w") as fh:
        for k in range(n):
            fh.write(json.dumps({"id": f"s{k:02d}", "input": f"Statement {k:02d}: water is wet. mode=ok",
                                 "target": "True", "category": "c"}) + "\n")
    return path


def _one_run(db: Path) -> str:
    import sqlite3
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if db.exists():
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
            try:
                rows = con.execute("select id from run").fetchall()
            except sqlite3.OperationalError:
                rows = []
            finally:
                con.close()
            if rows:
                return str(rows[0][0])
        time.sleep(0.05)
    raise AssertionError("no run was created")


def test_two_cli_executors_of_one_run_one_refused_calls_counted_at_the_server(tmp_path: Path) -> None:
    """The issue's probe: `run --resume RID` while RID runs elsewhere made 32 calls for 20 instances."""
    from servers.openai_stub import MisbehavingOpenAI
    n = 6
    home = tmp_path / "home"
    gate = threading.Event()
    with MisbehavingOpenAI(gate=gate) as server:
        env = _env(home, OPENAI_BASE_URL=server.base_url, ECDYSIS_MAX_RETRIES="0")
        first = _cli("run", "--suite", str(_suite_file(tmp_path / "s.jsonl", n)), "--split", "all",
                     "--model", "openai:stub", "--json", env=env)
        run_id = _one_run(home / "ecdysis.db")
        deadline = time.monotonic() + 60
        while server.waiting == 0:  # the first executor is at work (its first call held at the gate)
            assert time.monotonic() < deadline and first.poll() is None, "the first run never called the model"
            time.sleep(0.05)
        second = _cli("run", "--resume", run_id, "--json", env=env)
        out, err = second.communicate(timeout=120)
        gate.set()
        first_out, first_err = first.communicate(timeout=120)
        hits = server.snapshot()
    assert second.returncode == 2 and "Traceback" not in err, err
    assert f"run {run_id} is running elsewhere: held by pid {first.pid} on" in err
    assert len(err.strip().splitlines()) == 1, err
    assert first.returncode == 0, first_err
    assert len(hits) == n, f"{len(hits)} model calls for {n} instances"

"""Exactly once under concurrency, on SQLite and (slow) PostgreSQL, with real stores and processes:

- two deciders of one proposal at once: one decision is recorded, the other gets one clear line
  (`Conflict`) and stores nothing; the status agrees with the decision on record;
- a diagnosis is stored with its proposals or not at all.
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


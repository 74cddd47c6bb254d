"""Tests of `storage`, the SQL implementation of `ecdysis.store.Store`, on real SQLite files and,
when ECDYSIS_TEST_PG_URL is set (`scripts/start_postgres.sh`), on a real PostgreSQL server.

Invariants checked: every record type reads back equal to what was written; `save_result` is an
upsert per (run_id, instance_id) that replaces the calls too; `put_harness` and `cache_put` keep the
first write; proposals list in the order first saved and decisions only append; `update_job` sets
only the fields it names; threads and processes writing one SQLite file at once lose no row and
never see "database is locked"; each migration is applied once, even by two processes starting
together; the SQLite pragmas and BEGIN IMMEDIATE are really in force."""

from __future__ import annotations

import multiprocessing
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from inspect import signature
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.engine import Connection, make_url
from sqlmodel import SQLModel

from ecdysis.errors import ConfigError, EcdysisError, NotFound
from ecdysis.records import Completion, Instance, InstanceResult, ModelCall, RunRecord, ScorerSpec, Suite
from ecdysis.store import (DecisionRecord, DiagnosisRecord, EvolutionRecord, HarnessVersion, JobRecord,
                           ProposalRecord, Store)
from storage import MIGRATIONS, SQLStore, make_engine, migrate, open_store
from storage.migrations import add_column, applied_migrations, table_of
from storage.tables import CacheEntryRow, InstanceResultRow, ModelCallRow

PG_URL = os.environ.get("ECDYSIS_TEST_PG_URL")
PG_SKIP_REASON = ("ECDYSIS_TEST_PG_URL is not set: run `bash scripts/start_postgres.sh` and export its "
                  "last line as ECDYSIS_TEST_PG_URL")
SPAWN = multiprocessing.get_context("spawn")


# ---- stores under test

def sqlite_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'store.db'}"


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL schema, dropped afterwards, so tests never see each other."""
    if not PG_URL:
        pytest.skip(PG_SKIP_REASON)
    schema = f"ecdysis_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a SQLite file that does not exist yet, or a new PostgreSQL schema."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_schema_url"))
    return sqlite_url(tmp_path)


@pytest.fixture
def any_store(fresh_url: str) -> Iterator[SQLStore]:
    """The same test on a SQLite file and on PostgreSQL."""
    store = open_store(fresh_url)
    try:
        yield store
    finally:
        store.close()


def count(store: SQLStore, model: type[SQLModel]) -> int:
    with store.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(table_of(model))) or 0)


# ---- small real records

def make_suite(name: str = "arith", description: str = "sums") -> Suite:
    return Suite(name=name, description=description, source="import:arith.jsonl",
                 scorer=ScorerSpec(kind="regex", options={"pattern": r"\d+", "flags": ["I"]}),
                 instances=[
                     Instance(id="a1", input="2+2?", target="4", category="add", split="train",
                              fields={"difficulty": 1, "tags": ["easy"]}),
                     Instance(id="a2", input="Pick", target="B", category="mc", choices=("A", "B"),
                              split="validation"),
                     Instance(id="a3", input="é ∑ 🙂", target="x"),
                 ])


def make_harness(vid: str, parent: str | None = None, created_at: float = 1.0,
                 note: str = "") -> HarnessVersion:
    return HarnessVersion(id=vid, files={"harness.py": f"# {vid}\n", "prompts/system.txt": "Be terse."},
                          parent=parent, note=note or f"version {vid}", created_at=created_at,
                          status="candidate", metrics={"train_accuracy": 0.5, "per_category": {"add": 1.0}})


def make_run(run_id: str = "run-1", instance_ids: list[str] | None = None,
             created_at: float = 10.0) -> RunRecord:
    return RunRecord(id=run_id, suite="arith", model="scripted:x", harness_version="h1", split="train",
                     instance_ids=instance_ids or ["a1", "a2", "a3"], concurrency=4,
                     created_at=created_at, label="baseline")


def make_call(seq: int, text_out: str = "4", error: str | None = None) -> ModelCall:
    return ModelCall(seq=seq, model="scripted:x", text=text_out, prompt_tokens=10 + seq,
                     completion_tokens=2, latency_s=0.25, finish_reason="error" if error else "stop",
                     cache_hit=seq % 2 == 1, error=error,
                     request={"messages": [{"role": "user", "content": f"q{seq}"}], "temperature": 0.0,
                              "max_tokens": 64, "stop": ["\n"], "seed": 0})


def make_result(run_id: str, instance_id: str, n_calls: int = 2, answer: str | None = "4") -> InstanceResult:
    return InstanceResult(run_id=run_id, instance_id=instance_id, category="add", model="scripted:x",
                          answer=answer, target="4", correct=answer == "4",
                          score=1.0 if answer == "4" else 0.0, stdout_tail="thinking...\n",
                          calls=[make_call(i) for i in range(n_calls)], wall_seconds=0.125)


# ---- round trips of every record type (SQLite and PostgreSQL)

def test_suite_round_trip(any_store: SQLStore) -> None:
    suite = make_suite()
    any_store.save_suite(suite)
    any_store.save_suite(make_suite("other"))
    assert any_store.get_suite("arith") == suite
    assert [s.name for s in any_store.list_suites()] == ["arith", "other"]
    assert any_store.get_suite("missing") is None

    any_store.save_suite(make_suite(description="replaced"))
    assert any_store.get_suite("arith") == make_suite(description="replaced")
    assert len(any_store.list_suites()) == 2


def test_harness_round_trip_lineage_and_update(any_store: SQLStore) -> None:
    root, child = make_harness("h1", created_at=1.0), make_harness("h2", parent="h1", created_at=2.0)
    assert any_store.put_harness(root) == root
    assert any_store.put_harness(child) == child
    assert any_store.get_harness("h2") == child
    assert [v.id for v in any_store.list_harnesses()] == ["h1", "h2"]
    assert any_store.get_harness("nope") is None

    any_store.update_harness("h2", status="kept")
    any_store.update_harness("h2", metrics={"validation_accuracy": 0.75})
    stored = any_store.get_harness("h2")
    assert stored is not None
    assert (stored.status, stored.metrics) == ("kept", {"validation_accuracy": 0.75})
    assert stored.files == child.files

    with pytest.raises(NotFound):
        any_store.update_harness("nope", status="kept")
    with pytest.raises(NotFound, match="parent"):
        any_store.put_harness(make_harness("h3", parent="not-stored"))
    assert any_store.get_harness("h3") is None


def test_put_harness_is_idempotent(any_store: SQLStore) -> None:
    first = make_harness("h1", note="first")
    assert any_store.put_harness(first) == first
    again = any_store.put_harness(make_harness("h1", note="second", created_at=99.0))
    assert again == first
    assert any_store.list_harnesses() == [first]


def test_run_round_trip_and_update(any_store: SQLStore) -> None:
    run = make_run()
    any_store.create_run(run)
    assert any_store.get_run("run-1") == run

    run.status, run.finished_at, run.error = "done", 20.5, None
    run.summary = {"accuracy": 0.5, "accuracy_by_category": {"add": 1.0}, "errors": {}}
    any_store.update_run(run)
    assert any_store.get_run("run-1") == run

    any_store.create_run(make_run("run-2", created_at=30.0))
    any_store.create_run(make_run("run-0", created_at=5.0))
    assert [r.id for r in any_store.list_runs()] == ["run-2", "run-1", "run-0"]
    assert [r.id for r in any_store.list_runs(limit=1)] == ["run-2"]
    assert any_store.get_run("missing") is None

    with pytest.raises(EcdysisError, match="already exists"):
        any_store.create_run(make_run())
    with pytest.raises(NotFound):
        any_store.update_run(make_run("never-created"))


def test_result_round_trip_in_run_order(any_store: SQLStore) -> None:
    any_store.create_run(make_run(instance_ids=["a1", "a2", "a3"]))
    failed = InstanceResult(run_id="run-1", instance_id="a2", category="mc", model="scripted:x",
                            answer=None, target="B", correct=False, score=0.0, error_type="model_error",
                            error_message="rate limited", stdout_tail="",
                            calls=[make_call(0, "", error="429 Too Many Requests")], wall_seconds=3.0)
    results = [make_result("run-1", "a1", n_calls=3), failed, make_result("run-1", "a3", n_calls=0)]
    for result in reversed(results):  # saved out of order, read back in the run's order
        any_store.save_result(result)

    assert any_store.get_results("run-1") == results
    assert any_store.done_instance_ids("run-1") == {"a1", "a2", "a3"}
    assert any_store.get_results("missing") == []
    assert any_store.done_instance_ids("missing") == set()

    # The scalar columns let later stages aggregate in SQL without reading trajectories.
    with any_store.engine.connect() as conn:
        ir = table_of(InstanceResultRow)
        tokens = conn.execute(select(func.sum(ir.c.prompt_tokens), func.sum(ir.c.model_calls))).one()
        errors = conn.execute(select(ir.c.error_type, func.count()).where(ir.c.error_type.is_not(None))
                              .group_by(ir.c.error_type)).all()
    assert tuple(tokens) == (10 + 11 + 12 + 10, 4)
    assert [tuple(e) for e in errors] == [("model_error", 1)]


def test_save_result_is_an_upsert(any_store: SQLStore) -> None:
    any_store.create_run(make_run())
    any_store.save_result(make_result("run-1", "a1", n_calls=3, answer="5"))
    replacement = make_result("run-1", "a1", n_calls=1, answer="4")
    any_store.save_result(replacement)
    any_store.save_result(replacement)

    assert any_store.get_results("run-1") == [replacement]
    assert count(any_store, InstanceResultRow) == 1
    assert count(any_store, ModelCallRow) == 1  # the three old calls are gone, not merged


def test_save_result_for_unknown_run_raises(any_store: SQLStore) -> None:
    with pytest.raises(NotFound, match="create_run"):
        any_store.save_result(make_result("no-such-run", "a1"))
    assert count(any_store, InstanceResultRow) == 0


def test_cache_keeps_the_first_completion(any_store: SQLStore) -> None:
    request = {"messages": [{"role": "user", "content": "2+2?"}], "temperature": 0.0}
    first = Completion(text="4", prompt_tokens=7, completion_tokens=1, latency_s=0.5, finish_reason="stop")
    assert any_store.cache_get("k1") is None
    any_store.cache_put("k1", "scripted:x", request, first)
    any_store.cache_put("k1", "scripted:x", request, Completion(text="five"))  # no error, no change
    assert any_store.cache_get("k1") == first
    assert count(any_store, CacheEntryRow) == 1


def test_job_round_trip_and_partial_updates(any_store: SQLStore) -> None:
    job = JobRecord(id="j1", kind="batch", params={"suite": "arith", "pid": 7}, created_at=1.0,
                    updated_at=1.0)
    any_store.create_job(job)
    assert any_store.get_job("j1") == job

    any_store.update_job("j1", status="running", done=3, total=10, message="3/10", updated_at=2.0)
    any_store.update_job("j1", cancel_requested=True)  # a Stop must not undo the progress, nor vice versa
    any_store.update_job("j1", done=4, updated_at=3.0)
    stored = any_store.get_job("j1")
    assert stored is not None
    assert (stored.status, stored.done, stored.total, stored.message, stored.cancel_requested,
            stored.updated_at) == ("running", 4, 10, "3/10", True, 3.0)
    any_store.update_job("j1", status="done", result={"run_id": "run-1"}, error=None)
    assert any_store.get_job("j1") == JobRecord(
        id="j1", kind="batch", params=job.params, status="done", done=4, total=10, message="3/10",
        result={"run_id": "run-1"}, cancel_requested=True, created_at=1.0, updated_at=3.0)

    any_store.create_job(JobRecord(id="j2", kind="evolve", created_at=5.0))
    assert [j.id for j in any_store.list_jobs()] == ["j2", "j1"]
    assert [j.id for j in any_store.list_jobs(limit=1)] == ["j2"]
    assert any_store.get_job("nope") is None
    with pytest.raises(NotFound):
        any_store.update_job("nope", status="failed")
    with pytest.raises(TypeError, match="colour"):
        any_store.update_job("j1", colour="red")
    with pytest.raises(EcdysisError, match="already exists"):
        any_store.create_job(job)


def test_diagnosis_round_trip(any_store: SQLStore) -> None:
    report = {"clusters": [{"id": "c1", "verdict": "harness-level", "members": ["a1", "a2"]}],
              "transcript": [{"role": "investigator", "text": "root cause: format"}]}
    first = DiagnosisRecord(id="d1", run_ids=["run-1", "run-2"], harness_version="h1", report=report,
                            created_at=1.0)
    any_store.save_diagnosis(first)
    any_store.save_diagnosis(DiagnosisRecord(id="d2", run_ids=[], harness_version="h2", report={},
                                             created_at=2.0))
    assert any_store.get_diagnosis("d1") == first
    assert [d.id for d in any_store.list_diagnoses()] == ["d2", "d1"]
    assert [d.id for d in any_store.list_diagnoses(limit=1)] == ["d2"]
    first.report = {"clusters": []}
    any_store.save_diagnosis(first)
    assert any_store.get_diagnosis("d1") == first
    assert any_store.get_diagnosis("nope") is None


def make_proposal(pid: str, diagnosis_id: str = "d1", status: str = "pending") -> ProposalRecord:
    return ProposalRecord(id=pid, diagnosis_id=diagnosis_id, cluster_id=f"c-{pid}", harness_version="h1",
                          spec={"operator": "answer_extraction", "expected_effect": "+2 on c1"},
                          files={"harness.py": f"# patched by {pid}\n"}, status=status,
                          data={"diffs": [{"path": "harness.py", "diff": "@@ -1 +1 @@"}]}, created_at=1.0)


def test_proposals_keep_their_first_save_order_and_filter(any_store: SQLStore) -> None:
    for pid in ("p2", "p1", "p3"):  # priority order, not id order
        any_store.save_proposal(make_proposal(pid))
    any_store.save_proposal(make_proposal("q1", diagnosis_id="d2", status="rejected"))
    any_store.save_proposal(make_proposal("p2", status="superseded"))  # re-saved: keeps its place

    assert [p.id for p in any_store.list_proposals(diagnosis_id="d1")] == ["p2", "p1", "p3"]
    assert [p.id for p in any_store.list_proposals()] == ["p2", "p1", "p3", "q1"]
    assert [p.id for p in any_store.list_proposals(status="pending")] == ["p1", "p3"]
    assert [p.id for p in any_store.list_proposals(diagnosis_id="d2", status="pending")] == []
    assert any_store.get_proposal("p1") == make_proposal("p1")

    any_store.set_proposal_status("p1", "approved")
    stored = any_store.get_proposal("p1")
    assert stored is not None and stored.status == "approved"
    with pytest.raises(NotFound):
        any_store.set_proposal_status("nope", "approved")
    assert any_store.get_proposal("nope") is None


def test_decisions_are_appended_with_ids(any_store: SQLStore) -> None:
    edit = DecisionRecord(proposal_id="p1", decision="edit", who="ana", reason="tighter regex",
                          files_as_applied={"harness.py": "# edited\n"}, at=2.0)
    reject = DecisionRecord(proposal_id="p2", decision="reject", who="bo", reason="leaks targets", at=1.0)
    saved_edit, saved_reject = any_store.save_decision(edit), any_store.save_decision(reject)
    assert isinstance(saved_edit.id, int) and isinstance(saved_reject.id, int)
    assert saved_edit.id != saved_reject.id
    assert saved_edit == replace(edit, id=saved_edit.id)
    assert any_store.list_decisions() == [saved_reject, saved_edit]  # oldest first
    assert any_store.list_decisions("p2") == [saved_reject]
    assert any_store.list_decisions("p2")[0].files_as_applied is None
    assert any_store.list_decisions("nope") == []
    with pytest.raises(EcdysisError, match="already exists"):
        any_store.save_decision(saved_edit)


def test_evolution_round_trip(any_store: SQLStore) -> None:
    evo = EvolutionRecord(id="e1", strategy="batch", suite="arith", models=["smollm2", "gemma3-270m"],
                          config={"iterations": 3, "auto_approve": False}, base_version="h1",
                          current_version="h1", result={"cursor": {"iteration": 1, "phase": "train"}},
                          created_at=1.0, updated_at=1.0)
    any_store.save_evolution(evo)
    assert any_store.get_evolution("e1") == evo
    evo.status, evo.current_version, evo.updated_at = "waiting", "h2", 5.0
    evo.iterations.append({"iteration": 1, "accepted": True, "validation_delta": 0.2})
    any_store.save_evolution(evo)
    assert any_store.get_evolution("e1") == evo
    any_store.save_evolution(replace(evo, id="e2", created_at=2.0, iterations=[]))
    assert [e.id for e in any_store.list_evolutions()] == ["e2", "e1"]
    assert [e.id for e in any_store.list_evolutions(limit=1)] == ["e2"]
    assert any_store.get_evolution("nope") is None


def test_nul_in_harness_output_is_stored_the_same_on_every_backend(any_store: SQLStore) -> None:
    any_store.create_run(make_run())
    result = make_result("run-1", "a1")
    result.stdout_tail, result.answer = "bin\x00ary", "4\x00"
    result.calls[0].request["messages"][0]["content"] = "nul \x00 in json"
    any_store.save_result(result)
    [stored] = any_store.get_results("run-1")
    assert (stored.stdout_tail, stored.answer) == ("bin\ufffdary", "4\ufffd")
    assert stored.calls[0].request["messages"][0]["content"] == "nul \x00 in json"  # JSON keeps it


def test_migrated_schema_has_every_declared_table_and_column(any_store: SQLStore) -> None:
    """A table class without a migration creating it (or a column without `add_column`) fails here."""
    with any_store.engine.connect() as conn:
        inspector = inspect(conn)
        for table in SQLModel.metadata.sorted_tables:
            assert inspector.has_table(table.name), f"no migration creates table {table.name}"
            present = {c["name"] for c in inspector.get_columns(table.name)}
            assert set(table.c.keys()) <= present, f"{table.name} lacks {set(table.c.keys()) - present}"


def test_add_column_restores_a_missing_column_and_its_index_once(any_store: SQLStore) -> None:
    with any_store.engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_instance_result_error_type"))
        conn.execute(text("ALTER TABLE instance_result DROP COLUMN error_type"))
    for _ in range(2):
        with any_store.engine.begin() as conn:
            add_column(conn, InstanceResultRow, "error_type")
    with any_store.engine.connect() as conn:
        inspector = inspect(conn)
        assert "error_type" in {c["name"] for c in inspector.get_columns("instance_result")}
        indexes = {i["name"] for i in inspector.get_indexes("instance_result")}
        assert "ix_instance_result_error_type" in indexes
    any_store.create_run(make_run())
    any_store.save_result(make_result("run-1", "a1"))
    assert len(any_store.get_results("run-1")) == 1


# ---- concurrency

def _hammer(store: SQLStore, run_id: str, worker: int, n: int) -> None:
    """What a runner thread does: results, cache traffic on shared keys, reads, a shared harness."""
    for i in range(n):
        store.save_result(make_result(run_id, f"w{worker}-{i}", n_calls=2))
        store.save_result(make_result(run_id, f"shared-{i % 5}", n_calls=1))  # contested upsert
        store.cache_put(f"key-{i % 7}", "scripted:x", {"i": i}, Completion(text=str(i)))
        store.cache_get(f"key-{i % 7}")
        store.done_instance_ids(run_id)
    store.put_harness(make_harness("shared-harness"))


def _run_threads(target: Callable[[int], None], n_threads: int) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def body(worker: int) -> None:
        try:
            start.wait()
            target(worker)
        except BaseException as exc:  # collected: an exception in a thread would otherwise vanish
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_eight_threads_write_one_store_at_once(any_store: SQLStore) -> None:
    any_store.create_run(make_run(instance_ids=[]))
    errors = _run_threads(lambda w: _hammer(any_store, "run-1", w, 25), n_threads=8)
    assert errors == []
    assert count(any_store, InstanceResultRow) == 8 * 25 + 5
    assert count(any_store, ModelCallRow) == 8 * 25 * 2 + 5
    assert count(any_store, CacheEntryRow) == 7
    assert [v.id for v in any_store.list_harnesses()] == ["shared-harness"]


def test_eight_threads_with_a_store_each_on_one_file(tmp_path: Path) -> None:
    """Separate engines, like separate processes: only SQLite's locks keep them apart."""
    url = sqlite_url(tmp_path)
    stores = [open_store(url) for _ in range(8)]
    try:
        stores[0].create_run(make_run(instance_ids=[]))
        errors = _run_threads(lambda w: _hammer(stores[w], "run-1", w, 20), n_threads=8)
        assert errors == []
        assert count(stores[0], InstanceResultRow) == 8 * 20 + 5
    finally:
        for store in stores:
            store.close()


def test_a_stop_from_another_store_survives_the_progress_writes(tmp_path: Path) -> None:
    """The worker writes progress while a page in another process presses Stop: neither write may
    undo the other (`update_job` sets only the fields it is given)."""
    url = sqlite_url(tmp_path)
    with open_store(url) as worker, open_store(url) as page:
        worker.create_job(JobRecord(id="j1", kind="batch", status="running"))
        halfway = threading.Event()

        def act(who: int) -> None:
            if who == 0:
                for i in range(200):
                    worker.update_job("j1", done=i + 1, total=200, updated_at=float(i))
                    if i == 100:
                        halfway.set()
            else:
                assert halfway.wait(30)
                page.update_job("j1", cancel_requested=True)

        assert _run_threads(act, n_threads=2) == []
        job = page.get_job("j1")
        assert job is not None and (job.cancel_requested, job.done, job.status) == (True, 200, "running")


def _process_writer(url: str, run_id: str, worker: int, n: int, start: Any) -> None:
    store = open_store(url)
    start.wait()
    # Two threads per process, so locks are contested inside and across processes.
    errors = _run_threads(lambda t: _hammer(store, run_id, worker * 10 + t, n), n_threads=2)
    store.close()
    if errors:
        raise errors[0]


def _run_processes(target: Callable[..., None], *args: Any, n: int = 2) -> list[int | None]:
    start = SPAWN.Barrier(n)
    procs = [SPAWN.Process(target=target, args=(*args, w, start)) for w in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    return [p.exitcode for p in procs]


def test_two_processes_write_one_sqlite_file_at_once(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    with open_store(url) as store:
        store.create_run(make_run(instance_ids=[]))
    exitcodes = _run_processes(_spawned_writer, url, "run-1", 30)
    assert exitcodes == [0, 0]
    with open_store(url) as store:
        assert count(store, InstanceResultRow) == 2 * 2 * 30 + 5
        assert count(store, ModelCallRow) == 2 * 2 * 30 * 2 + 5
        assert store.done_instance_ids("run-1") >= {"w0-29", "w1-29", "w10-29", "w11-29"}


def _spawned_writer(url: str, run_id: str, n: int, worker: int, start: Any) -> None:
    _process_writer(url, run_id, worker, n, start)


# ---- migrations

def m900_slow_probe(conn: Connection) -> None:
    """Test-only migration: holds the lock long enough that the other process must wait for it,
    and leaves one probe row per application."""
    conn.execute(text("CREATE TABLE IF NOT EXISTS migration_probe (pid INTEGER NOT NULL)"))
    conn.execute(text("INSERT INTO migration_probe (pid) VALUES (:pid)"), {"pid": os.getpid()})
    time.sleep(1.0)


def _spawned_migrator(url: str, results: Any, worker: int, start: Any) -> None:
    engine = make_engine(url)
    start.wait()
    results.put((worker, migrate(engine, [*MIGRATIONS, m900_slow_probe])))
    engine.dispose()


def test_two_processes_opening_a_fresh_database_apply_migrations_once(fresh_url: str) -> None:
    url = fresh_url
    results = SPAWN.Queue()
    assert _run_processes(_spawned_migrator, url, results) == [0, 0]
    applied = sorted((results.get(timeout=5) for _ in range(2)), key=lambda r: len(r[1]))
    names = [m.__name__ for m in MIGRATIONS] + ["m900_slow_probe"]
    assert [a for _, a in applied] == [[], names]  # one applied all, the other waited and found them
    engine = make_engine(url)
    try:
        assert applied_migrations(engine) == names
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM migration_probe")) == 1
    finally:
        engine.dispose()


def test_migrate_again_applies_nothing(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    with open_store(url) as store:
        assert migrate(store.engine) == []
        assert applied_migrations(store.engine) == [m.__name__ for m in MIGRATIONS]


def test_versions_the_gate_kept_under_the_old_name_read_as_kept(tmp_path: Path) -> None:
    """m005: a database from before the rename holds `accepted` versions; they open as `kept`."""
    url = sqlite_url(tmp_path)
    with open_store(url) as store:
        store.put_harness(make_harness("old"))
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE harness_version SET status = 'accepted' WHERE id = 'old'"))
            conn.execute(text("DELETE FROM schema_migrations WHERE name = 'm005_kept_versions'"))
    with open_store(url) as store:
        assert store.get_harness("old").status == "kept"


def test_migration_names_are_unique_numbered_and_in_order() -> None:
    names = [m.__name__ for m in MIGRATIONS]
    assert all(re.fullmatch(r"m\d{3}_[a-z0-9_]+", n) for n in names), names
    assert names == sorted(set(names))


# ---- SQLite specifics

def test_sqlite_pragmas_are_set_on_every_connection(tmp_path: Path) -> None:
    with open_store(sqlite_url(tmp_path)) as store:
        with store.writing() as session:
            conn = session.connection()
            pragmas = {p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                       for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")}
        assert pragmas == {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1, "busy_timeout": 30000}
    # WAL is a property of the file: a plain sqlite3 connection sees it too.
    with sqlite3.connect(tmp_path / "store.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_write_sessions_take_the_write_lock_at_begin_and_reads_do_not(tmp_path: Path) -> None:
    with open_store(sqlite_url(tmp_path)) as store:
        other = sqlite3.connect(tmp_path / "store.db", timeout=0, isolation_level=None)
        try:
            with store.writing() as session:
                session.connection()  # begins the transaction; no statement has run yet
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("BEGIN IMMEDIATE")
            with store.reading() as session:
                session.connection()
                other.execute("BEGIN IMMEDIATE")  # a reader holds no write lock
                other.execute("ROLLBACK")
        finally:
            other.close()


def test_in_memory_store_works_across_threads() -> None:
    with open_store("sqlite://") as store:
        store.save_suite(make_suite())
        assert store.get_suite("arith") == make_suite()
        store.create_run(make_run(instance_ids=[]))
        assert _run_threads(lambda w: _hammer(store, "run-1", w, 5), n_threads=8) == []
        assert count(store, InstanceResultRow) == 8 * 5 + 5


def test_open_store_defaults_to_the_data_folder(ecdysis_home: Path) -> None:
    assert not ecdysis_home.exists()
    with open_store() as store:
        store.save_suite(make_suite())
    assert (ecdysis_home / "ecdysis.db").is_file()
    with open_store() as store:
        assert store.get_suite("arith") == make_suite()


def test_conftest_store_fixture_is_a_migrated_store(store: SQLStore) -> None:
    as_protocol: Store = store  # the type checker holds SQLStore to the protocol here
    assert applied_migrations(store.engine) == [m.__name__ for m in MIGRATIONS]
    assert as_protocol.list_runs() == []


def test_sql_store_has_every_store_method_with_its_signature() -> None:
    names = [n for n in vars(Store) if not n.startswith("_")]
    assert "save_result" in names and "save_evolution" in names
    for name in names:
        assert signature(getattr(SQLStore, name)) == signature(getattr(Store, name)), name


@pytest.mark.parametrize("url", ["not a url", "postgresql+psycopg2://u:secret@127.0.0.1:1/none"])
def test_open_store_turns_bad_urls_into_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store(url)
    assert "secret" not in str(caught.value)

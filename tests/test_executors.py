"""Executors on a small real world: the `boolean` suite, the starter harness, a SQLite store in a
temp folder, the scripted model (from a file, so Ray workers can build it from its name).

Invariants checked: an executor never runs more than the run's concurrency at once; a result is
stored before its progress event; `should_stop` stops new instances and nothing else; the group
writer stores every result and hands a store failure to every saver it concerns; the Ray executor
gives the same answers as the local one on the same cached calls, its workers write the results
into the shared database themselves, and cancel / budget / resume behave as they do locally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from ecdysis.errors import ConfigError
from ecdysis.executors import create_executor, executor_names
from ecdysis.models.registry import create_backend, get_backend, register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.records import Completion, CompletionRequest, InstanceResult, RunRecord
from ecdysis.executors.instance import GroupWriter
from ecdysis.runner import CallBudget
from ecdysis.service import RunRequest, Service
from ecdysis.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("ECDYSIS_TEST_PG_URL")


@pytest.fixture
def script(tmp_path: Path) -> str:
    """A scripted model as a file: `scripted:PATH` names the same model in every process."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [{"match": "True and True", "text": "True\nbecause"},
                                          {"match": "not False", "text": "True"}],
                                "default": "False"}))
    return f"scripted:{path}"


class SlowBackend(ScriptedBackend):
    """Scripted replies after `delay` seconds, recording how many calls overlapped."""

    max_concurrency = 16

    def __init__(self, delay: float = 0.05) -> None:
        super().__init__([Rule(text="True", match="True and True")], model_id="slow-test", default="False")
        self.delay = delay
        self.active = 0
        self.peak = 0
        self._count = threading.Lock()

    def complete(self, request: CompletionRequest) -> Completion:
        with self._count:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(self.delay)
            return super().complete(request)
        finally:
            with self._count:
                self.active -= 1


# ---- the registry and settings

def test_executor_names_and_unknown_executor_is_a_config_error() -> None:
    settings = Settings.from_env()
    assert executor_names() == ["local", "ray"]
    assert create_executor(None, settings).name == "local"
    assert create_executor("RAY", settings).name == "ray"  # built lazily: ray is not imported yet
    with pytest.raises(ConfigError) as caught:
        create_executor("dask", settings)
    assert "unknown executor 'dask'" in caught.value.message and "local or ray" in str(caught.value.hint)


def test_executor_and_openai_concurrency_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert create_backend("openai:m", Settings.from_env()).max_concurrency == 64
    monkeypatch.setenv("ECDYSIS_OPENAI_CONCURRENCY", "8")
    monkeypatch.setenv("ECDYSIS_EXECUTOR", "ray")
    monkeypatch.setenv("ECDYSIS_RAY_ADDRESS", "ray://head:10001")
    settings = Settings.from_env()
    assert create_backend("openai:m", settings).max_concurrency == 8
    assert (settings.executor, settings.ray_address) == ("ray", "ray://head:10001")
    assert create_executor(None, settings).name == "ray"


def test_cli_rejects_an_unknown_executor_in_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "ecdysis.cli", "run", "--suite", "boolean", "--executor", "dask"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown executor 'dask'" in proc.stderr and "Traceback" not in proc.stderr


def test_ray_executor_refuses_an_in_memory_database(store) -> None:
    svc = Service(store)
    executor = create_executor("ray", svc.settings, database_url="sqlite://")
    with pytest.raises(ConfigError, match="in-memory"):
        executor.run(None, [], on_result=lambda r: None, should_stop=lambda: None)  # type: ignore[arg-type]


# ---- the local executor

def test_local_executor_keeps_to_the_concurrency_and_stores_before_reporting(store) -> None:
    backend = SlowBackend(delay=0.25)
    register_backend(backend)
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="boolean", model="slow-test", limit=12, concurrency=4, use_cache=False))
    seen: list[tuple[int, bool]] = []

    def events(e: dict) -> None:
        if e["type"] == "instance_done":
            seen.append((threading.get_ident(), e["instance_id"] in store.done_instance_ids(run.id)))

    summary = svc.execute_run(run.id, use_cache=False, events=events, executor="local")
    assert summary.n == 12 and summary.model_calls == 12
    assert 2 <= backend.peak <= 4  # in parallel, never more than four at a time
    assert len(seen) == 12 and all(stored for _, stored in seen)
    assert {ident for ident, _ in seen} == {threading.get_ident()}  # progress comes on the caller's thread


class UnevenBackend(SlowBackend):
    """Calls of uneven length, so threads run out of work at different moments; records the
    threads that made them."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[threading.Thread] = set()

    def complete(self, request: CompletionRequest) -> Completion:
        with self._lock:
            self.delay = 0.02 + 0.08 * (len(self.history) % 6)
            self.threads.add(threading.current_thread())
        return super().complete(request)


def test_threads_outlive_the_harness_workers_they_started(store) -> None:
    # Harness workers die with the thread that started them (PR_SET_PDEATHSIG) and are lent to
    # other threads: a thread that ended as soon as the queue was empty killed a borrowed worker
    # in the middle of another thread's instance (seen as "killed by SIGKILL" at concurrency 32).
    backend = UnevenBackend()
    register_backend(backend)
    svc = Service(store)
    alive_at_end: list[bool] = []

    def events(e: dict) -> None:
        if e["type"] == "instance_done" and e["done"] == e["total"]:
            alive_at_end.extend(t.is_alive() for t in backend.threads)

    run = svc.create_run(RunRequest(suite="boolean", model="slow-test", limit=20, concurrency=5, use_cache=False))
    summary = svc.execute_run(run.id, use_cache=False, events=events)
    assert summary.n == 20 and summary.errors == {}
    assert len(alive_at_end) == 5 and all(alive_at_end)  # no thread ended before the last instance


def test_a_store_that_cannot_write_stops_the_run_with_its_error(store, monkeypatch: pytest.MonkeyPatch) -> None:
    register_backend(SlowBackend(delay=0.01))
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="boolean", model="slow-test", limit=12, concurrency=3, use_cache=False))

    def broken(results: list[InstanceResult]) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(store, "save_results", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        svc.execute_run(run.id, use_cache=False)
    monkeypatch.undo()
    assert svc.results(run.id) == [] and svc.resume(run.id).n == 12


def test_should_stop_stops_new_instances_only(store) -> None:
    register_backend(SlowBackend(delay=0.0))
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="boolean", model="slow-test", limit=10, concurrency=2, use_cache=False))
    asked = {"n": 0}

    def cancelled() -> bool:
        asked["n"] += 1
        return asked["n"] > 5

    partial = svc.execute_run(run.id, use_cache=False, cancelled=cancelled)
    assert partial.n == 5  # the five started all finished and were stored
    assert svc.get_run(run.id).status == "cancelled"
    assert svc.resume(run.id).n == 10


# ---- the group writer

class _RecordingStore:
    def __init__(self, delay: float = 0.02, fail: bool = False) -> None:
        self.groups: list[list[str]] = []
        self.delay = delay
        self.fail = fail

    def save_results(self, results: list[InstanceResult]) -> None:
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("disk full")
        self.groups.append([r.instance_id for r in results])


def _result(i: int) -> InstanceResult:
    return InstanceResult(run_id="r", instance_id=f"i{i}", category="c", model="m", answer="x", target="x",
                          correct=True, score=1.0)


def test_group_writer_stores_everything_in_fewer_transactions() -> None:
    fake = _RecordingStore()
    writer = GroupWriter(fake)  # type: ignore[arg-type]
    threads = [threading.Thread(target=writer.save, args=(_result(i),)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    saved = [iid for group in fake.groups for iid in group]
    assert sorted(saved) == sorted(f"i{i}" for i in range(24))
    assert len(fake.groups) < 24 and writer.transactions == len(fake.groups)


def test_group_writer_raises_a_store_failure_in_every_saver_of_the_group() -> None:
    writer = GroupWriter(_RecordingStore(fail=True))  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def save(i: int) -> None:
        try:
            writer.save(_result(i))
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(errors) == 6 and all("disk full" in str(e) for e in errors)


def test_store_saves_a_group_in_one_transaction_and_replaces_repeats(store) -> None:
    run = RunRecord(id="rg", suite="s", model="m", harness_version="h", split="all",
                    instance_ids=["i0", "i1", "i2"], concurrency=1, status="running", created_at=0.0)
    store.create_run(run)
    first, again = _result(0), _result(0)
    first.run_id = again.run_id = "rg"
    again.answer = "second"
    others = [_result(1), _result(2)]
    for r in others:
        r.run_id = "rg"
    store.save_results([first, *others, again])
    stored = {r.instance_id: r.answer for r in store.get_results("rg")}
    assert stored == {"i0": "second", "i1": "x", "i2": "x"}


# ---- Ray (a local instance with two workers, all on the loopback interface)

@pytest.fixture(scope="module")
def ray_local() -> Iterator[object]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path):
    """The database the driver and the Ray workers share: a SQLite file, or a PostgreSQL schema."""
    from storage import open_store
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'shared.db'}")
        yield store
        store.close()
        return
    if not PG_URL:
        pytest.skip("ECDYSIS_TEST_PG_URL is not set: run `bash scripts/start_postgres.sh`")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    schema = f"ecdysis_x_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    store = open_store(url.render_as_string(hide_password=False))
    try:
        yield store
    finally:
        store.close()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _answers(svc: Service, run_id: str) -> dict[str, tuple[str | None, bool, str | None]]:
    return {r.instance_id: (r.answer, r.correct, r.error_type) for r in svc.results(run_id)}


@pytest.mark.slow
def test_ray_gives_the_local_answers_from_the_same_cache(ray_local, shared_store, script,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    svc = Service(shared_store)
    local = svc.run(RunRequest(suite="boolean", model=script, limit=12, concurrency=3, executor="local"))
    assert local.cache_hits == 0 and local.model_calls == 12
    monkeypatch.setenv("ECDYSIS_EXECUTOR", "ray")  # chosen by configuration, not by the call
    svc = Service(shared_store)
    events: list[dict] = []
    remote = svc.run(RunRequest(suite="boolean", model=script, limit=12, concurrency=4), events=events.append)
    assert remote.n == 12
    assert remote.cache_hits == remote.model_calls == local.model_calls  # every call served from the cache
    assert remote.accuracy == local.accuracy and remote.accuracy_by_category == local.accuracy_by_category
    assert _answers(svc, remote.run_id) == _answers(svc, local.run_id)
    assert all(c.cache_hit for r in svc.results(remote.run_id) for c in r.calls)
    done = [e for e in events if e["type"] == "instance_done"]
    assert [e["done"] for e in done] == list(range(1, 13)) and done[-1]["total"] == 12
    assert svc.get_run(remote.run_id).status == "done"


@pytest.mark.slow
def test_ray_workers_make_the_calls_and_write_the_results(ray_local, store, script) -> None:
    svc = Service(store)
    driver_backend = get_backend(script)
    summary = svc.run(RunRequest(suite="boolean", model=script, limit=8, concurrency=4, use_cache=False,
                                 executor="ray"))
    assert summary.n == 8 and summary.model_calls == 8 and summary.cache_hits == 0
    assert driver_backend.history == []  # not one call was made in this process
    local = svc.run(RunRequest(suite="boolean", model=script, limit=8, concurrency=2, use_cache=False))
    assert _answers(svc, summary.run_id) == _answers(svc, local.run_id)


@pytest.mark.slow
def test_ray_cancel_budget_and_resume(ray_local, store, script) -> None:
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="boolean", model=script, limit=10, concurrency=2, use_cache=False))
    asked = {"n": 0}

    def cancelled() -> bool:
        asked["n"] += 1
        return asked["n"] > 3

    partial = svc.execute_run(run.id, use_cache=False, cancelled=cancelled, executor="ray")
    assert partial.n == 3 and svc.get_run(run.id).status == "cancelled"
    budget = CallBudget(max_calls=2)
    limited = svc.execute_run(run.id, use_cache=False, budget=budget, executor="ray")
    assert budget.calls >= 2 and limited.n < 10 and svc.get_run(run.id).status == "pending"
    final = svc.execute_run(run.id, use_cache=False, executor="ray")
    assert final.n == 10 and len(svc.results(run.id)) == 10 and svc.get_run(run.id).status == "done"


@pytest.mark.slow
def test_ray_worker_that_cannot_start_is_one_clear_error(ray_local, store) -> None:
    svc = Service(store)
    # Registered in this process only: the driver can build it, a Ray worker cannot.
    register_backend(ScriptedBackend(model_id="driver-only", default="x"))
    run = svc.create_run(RunRequest(suite="boolean", model="driver-only", limit=2, concurrency=2))
    with pytest.raises(ConfigError, match="could not start: unknown model 'driver-only'"):
        svc.execute_run(run.id, executor="ray")
    assert svc.results(run.id) == []


@pytest.mark.slow
def test_cli_run_with_executor_ray_after_a_local_run(tmp_path: Path, script: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(ECDYSIS_HOME=str(tmp_path / "home"), RAY_USAGE_STATS_ENABLED="0")

    def run(*extra: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "ecdysis.cli", "run", "--suite", "boolean", "--model", script,
                               "--limit", "6", "--concurrency", "3", "--json", *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    local = run()
    remote = run("--executor", "ray")  # starts a local Ray instance of its own
    assert remote["cache_hits"] == remote["model_calls"] == local["model_calls"] == 6
    assert remote["accuracy"] == local["accuracy"]

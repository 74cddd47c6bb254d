"""The Ray executor: the same batch fanned out over the workers of a Ray cluster (an existing
local instance, `ECDYSIS_RAY_ADDRESS`, or a local instance started here), results written by the
workers straight into the shared database.

Each worker is a Ray actor (a *lane*) that builds, once, what the local executor builds in this
process: the store opened from the database URL, the backend from the model name and settings,
the gateway (response cache, backend limit) and a pool of sandboxed harness workers. Lanes run
several instances at once on threads; the driver hands out instances to the least busy lane,
keeps at most the run's concurrency in flight, and turns each returned result into progress.

Secrets stay where they are: API keys are never sent to the cluster; a lane takes them from its
own environment (a local instance inherits this one). The database URL is sent, so on a real
cluster prefer a password from the workers' `PGPASSWORD` or `~/.pgpass` to one inside the URL."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from ecdysis.errors import ConfigError, EcdysisError, ExecutorError
from ecdysis.executors.base import Batch, OnResult, ShouldStop
from ecdysis.records import Instance, InstanceResult, ScorerSpec
from ecdysis.sandbox import SandboxLimits
from ecdysis.settings import Settings

# Seconds the driver waits for every lane to be placed and built before it gives up.
LANE_START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class LaneConfig:
    """Everything a lane needs to run instances of one run; plain data, sent to the cluster."""

    database_url: str
    run_id: str
    model: str
    scorer: ScorerSpec
    harness_files: dict[str, str]
    limits: SandboxLimits
    use_cache: bool
    settings: Settings          # without API keys: a lane reads its own


class Lane:
    """One Ray actor: a store, a backend, a gateway and a harness pool, serving `run(instance)`
    from several threads until `close()`. Results are stored here, before `run` returns."""

    def __init__(self, config: LaneConfig) -> None:
        # A lane that cannot build its parts reports why through `ready` (a failed actor
        # constructor reaches the driver only as an untyped "actor died").
        self.failure: tuple[str, str | None] | None = None
        try:
            self._build(config)
        except EcdysisError as exc:
            self.failure = (exc.message, exc.hint)

    def _build(self, config: LaneConfig) -> None:
        from ecdysis.models.gateway import ModelGateway
        from ecdysis.models.registry import create_backend
        from ecdysis.executors.instance import GroupWriter, InstanceRunner
        from ecdysis.sandbox import WorkerPool
        from storage import open_store  # the lane is a composition root of its own

        own = Settings.from_env()
        settings = replace(config.settings, openai_api_key=own.openai_api_key,
                           anthropic_api_key=own.anthropic_api_key)
        self.store = open_store(config.database_url)
        self.backend = create_backend(config.model, settings)
        self.pool = WorkerPool(config.harness_files, config.limits)
        self.instance = InstanceRunner(
            run_id=config.run_id, model=config.model, scorer=config.scorer,
            gateway=ModelGateway(self.backend, self.store, use_cache=config.use_cache),
            pool=self.pool, save=GroupWriter(self.store).save, budget=None)

    def ready(self) -> dict[str, Any]:
        """Where the lane runs, or why it could not start (`error`, `hint`)."""
        import socket
        where = f"{socket.gethostname()}:{os.getpid()}"
        if self.failure is not None:
            return {"where": where, "error": self.failure[0], "hint": self.failure[1]}
        return {"where": where, "error": None, "hint": None}

    def run(self, instance: Instance) -> InstanceResult:
        return self.instance(instance)

    def close(self) -> None:
        for part in ("pool", "backend", "store"):
            if hasattr(self, part):
                getattr(self, part).close()


def import_ray(*, local: bool = False) -> Any:
    """`ray`, imported with usage statistics off unless the user chose otherwise (the engine must
    work offline, and a run should not report to anyone). `local`: a Ray instance of this machine
    only, whose traffic then stays on the loopback interface (Ray's own switch for that, read at
    import, carries a Windows/macOS name but works on Linux too)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray executor needs the `ray` package",
                          hint="pip install 'ecdysis[ray]' (on the driver and on every worker)") from None
    return ray


class RayExecutor:
    """Runs a batch on Ray. `address`: None starts (or reuses) a Ray instance in this process;
    `auto`, `HOST:PORT` or `ray://HOST:10001` joins an existing cluster. `workers`: lanes to
    start, 0 = one per CPU of the cluster; never more than the run's concurrency."""

    name = "ray"

    def __init__(self, settings: Settings, *, database_url: str, address: str | None = None,
                 workers: int | None = None) -> None:
        self.settings = settings
        self.database_url = database_url
        self.address = address if address is not None else settings.ray_address
        self.workers = workers if workers is not None else settings.ray_workers

    def run(self, batch: Batch, todo: list[Instance], *, on_result: OnResult,
            should_stop: ShouldStop) -> str | None:
        self._check_database()
        if not todo:
            return None
        ray = import_ray(local=not self.address)
        self._connect(ray)
        self._check_sqlite_is_local(ray)
        lanes = self._start_lanes(ray, batch, min(len(todo), batch.concurrency))
        try:
            return self._dispatch(ray, lanes, batch, todo, on_result, should_stop)
        finally:
            self._stop_lanes(ray, lanes)

    # ---- set-up
    def _check_database(self) -> None:
        from sqlalchemy.engine import make_url
        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite" and (url.database or "") in ("", ":memory:"):
            raise ConfigError("the ray executor needs a database its workers can open, not an in-memory one",
                              hint="set ECDYSIS_DATABASE_URL to a SQLite file (one machine) or PostgreSQL")

    def _connect(self, ray: Any) -> None:
        if ray.is_initialized():
            return
        try:
            if self.address:
                ray.init(address=self.address, log_to_driver=False, logging_level="WARNING")
            else:
                ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
            where = self.address or "a local Ray instance"
            raise ConfigError(f"cannot start or reach {where}: {type(exc).__name__}: {_last_line(exc)}",
                              hint="check ECDYSIS_RAY_ADDRESS (e.g. ray://HEAD:10001) and `ray status`") from None

    def _check_sqlite_is_local(self, ray: Any) -> None:
        from sqlalchemy.engine import make_url
        if make_url(self.database_url).get_backend_name() != "sqlite":
            return
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) > 1:
            raise ConfigError(f"the Ray cluster has {len(alive)} nodes but the database is a SQLite file "
                              "on one machine", hint="set ECDYSIS_DATABASE_URL to a PostgreSQL URL every node can reach")

    def _lane_count(self, ray: Any, concurrency: int) -> int:
        if self.workers:
            return max(1, min(self.workers, concurrency))
        cpus = int(ray.cluster_resources().get("CPU", 1))
        return max(1, min(cpus, concurrency))

    def _start_lanes(self, ray: Any, batch: Batch, concurrency: int) -> list[Any]:
        count = self._lane_count(ray, concurrency)
        config = LaneConfig(
            database_url=self.database_url, run_id=batch.run.id, model=batch.run.model, scorer=batch.scorer,
            harness_files=dict(batch.harness.files), limits=batch.limits, use_cache=batch.use_cache,
            settings=replace(self.settings, openai_api_key=None, anthropic_api_key=None,
                             database_url=self.database_url))
        # Restarts and task retries: a lane lost with its node is rebuilt and its instances run
        # again (saving a result replaces an earlier one, so a rerun never duplicates).
        remote_lane = ray.remote(num_cpus=1, max_restarts=2, max_task_retries=2)(Lane)
        threads = math.ceil(concurrency / count)
        lanes = [remote_lane.options(max_concurrency=threads).remote(config) for _ in range(count)]
        try:
            replies = ray.get([lane.ready.remote() for lane in lanes], timeout=LANE_START_TIMEOUT_S)
        except Exception as exc:
            self._stop_lanes(ray, lanes)
            if type(exc).__name__ == "GetTimeoutError":
                raise ConfigError(f"Ray did not start {count} workers within {LANE_START_TIMEOUT_S:g}s",
                                  hint="each needs a free CPU: see `ray status`, or set ECDYSIS_RAY_WORKERS") from None
            raise ConfigError(f"a Ray worker could not start: {_last_line(exc)}",
                              hint="install the ecdysis package on every Ray worker, with its extras") from None
        failed = next((r for r in replies if r["error"]), None)
        if failed is not None:
            self._stop_lanes(ray, lanes)
            raise ConfigError(f"a Ray worker ({failed['where']}) could not start: {failed['error']}",
                              hint=failed["hint"])
        return lanes

    # ---- the batch
    def _dispatch(self, ray: Any, lanes: list[Any], batch: Batch, todo: list[Instance],
                  on_result: OnResult, should_stop: ShouldStop) -> str | None:
        pending = list(reversed(todo))
        load = [0] * len(lanes)
        in_flight: dict[Any, int] = {}  # object ref -> lane index
        stop_reason: str | None = None
        while pending or in_flight:
            while pending and len(in_flight) < batch.concurrency and stop_reason is None:
                stop_reason = should_stop()
                if stop_reason is not None:
                    break
                lane = min(range(len(lanes)), key=load.__getitem__)
                in_flight[lanes[lane].run.remote(pending.pop())] = lane
                load[lane] += 1
            if stop_reason is not None:
                pending.clear()
            if not in_flight:
                break
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                load[in_flight.pop(ref)] -= 1
                result = self._result(ray, ref)
                if batch.budget is not None:
                    fresh = [c for c in result.calls if not c.cache_hit and c.error is None]
                    batch.budget.charge(len(fresh), sum(c.prompt_tokens + c.completion_tokens for c in fresh))
                on_result(result)
        return stop_reason

    def _result(self, ray: Any, ref: Any) -> InstanceResult:
        try:
            return ray.get(ref)
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, EcdysisError):
                raise cause from None  # a systemic fault inside the lane: the store, a config error
            raise ExecutorError(f"a Ray worker failed: {type(exc).__name__}: {_last_line(exc)}",
                                hint="what finished is stored: `ecdysis run --resume RUN_ID` does the rest") from None

    def _stop_lanes(self, ray: Any, lanes: list[Any]) -> None:
        closing = [lane.close.remote() for lane in lanes]
        try:
            ray.get(closing, timeout=60)
        except Exception:  # a lane that is already gone has nothing left to close
            pass
        for lane in lanes:
            try:
                ray.kill(lane, no_restart=True)
            except Exception:
                pass


def _last_line(exc: BaseException) -> str:
    """Ray's messages end with the error itself, after the remote traceback."""
    text = str(exc).strip()
    return text.splitlines()[-1][:300] if text else type(exc).__name__


"""Batch execution: suite instances x one harness version x one model, in parallel within the
backend's limit, on an executor (threads here, or a Ray cluster). Each instance's result and
every model call are stored before the instance counts as finished, so a killed run loses nothing
finished, and `resume` re-runs only what has no stored result."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from ecdysis.budget import CallBudget
from ecdysis.errors import BudgetExceeded, InputError, ModelError, NotFound
from ecdysis.executors import Batch, Executor
from ecdysis.models.base import ModelBackend
from ecdysis.models.gateway import (CALL_LIMIT_MESSAGE, MAX_CALLS_PER_SOLVE, ModelGateway, harness_reply,
                                    harness_request)
from ecdysis.events import EventSink
from ecdysis.records import (Instance, InstanceResult, ModelCall, RunRecord, RunSummary,
                             ScorerSpec, Suite)
from ecdysis.sandbox import SandboxLimits, WorkerPool, isolation
from ecdysis.store import HarnessVersion, Store
from ecdysis.suites.scorers import score



def check_limit(option: str, limit: int | None) -> None:
    """A limit is a positive count or None (everything): 0 used to mean "all" and -5 "all but 5"."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"{option} must be at least 1, not {limit!r}", hint=f"leave {option} out for the whole split")


def pick_instances(suite: Suite, split: str, limit: int | None) -> list[Instance]:
    """The first `limit` instances of a split, taken round-robin over categories so a small
    batch still spans every category (a failure must be able to recur across categories)."""
    check_limit("the limit", limit)
    pool = suite.instances if split == "all" else suite.split(split)  # type: ignore[arg-type]
    by_cat: dict[str, list[Instance]] = {}
    for inst in pool:
        by_cat.setdefault(inst.category, []).append(inst)
    ordered: list[Instance] = []
    queues = [list(v) for _, v in sorted(by_cat.items())]
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop(0))
    return ordered[:limit] if limit is not None else ordered


def new_run_id() -> str:
    return "r" + uuid.uuid4().hex[:11]


class GroupWriter:
    """Group commit for results: `save(result)` returns once the result is stored, as
    `Store.save_result` does, but results that finish while one transaction is being written go
    together into the next. With dozens of instance threads a transaction per result, each
    waiting for SQLite's write lock, was the runner's largest cost; now the busier the store, the
    larger the groups. Thread-safe; no thread of its own (the first waiting saver writes)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cv = threading.Condition()
        self._pending: list[tuple[InstanceResult, _Slot]] = []
        self._writing = False
        self.transactions = 0

    def save(self, result: InstanceResult) -> None:
        slot = _Slot()
        with self._cv:
            self._pending.append((result, slot))
            while not slot.done:
                if self._writing:
                    self._cv.wait()
                    continue
                group, self._pending = self._pending, []
                self._writing = True
                self._cv.release()
                error: BaseException | None = None
                try:
                    self.store.save_results([r for r, _ in group])
                except BaseException as exc:  # handed to every saver of the group, then re-raised
                    error = exc
                finally:
                    self._cv.acquire()
                    self._writing = False
                    self.transactions += 1
                    for _, waiting in group:
                        waiting.done, waiting.error = True, error
                    self._cv.notify_all()
        if slot.error is not None:
            raise slot.error


@dataclass
class _Slot:
    done: bool = False
    error: BaseException | None = None


class ResultWriter:
    """Stores results on a thread of its own: `submit(result)` returns at once, so an instance's
    slot never waits for the database, and every `linger_s` the results submitted meanwhile are
    committed as one group, after which `on_stored(group)` is called (on the writer's thread).
    A result counts as finished only then. A failing commit goes to `on_failed(error)` and stops
    the writer; `close()` commits what is left and ends the thread.

    At concurrency 32 a group holds about eight results: a third of the CPU per result of one
    transaction each, and one SQLite write lock taken where there were eight."""

    def __init__(self, store: Store, *, on_stored: Callable[[list[InstanceResult]], None],
                 on_failed: Callable[[BaseException], None], linger_s: float = 0.05,
                 max_group: int = 256) -> None:
        self.store = store
        self.on_stored = on_stored
        self.on_failed = on_failed
        self.linger_s = linger_s
        self.max_group = max_group
        self.transactions = 0
        self._cv = threading.Condition()
        self._queue: list[InstanceResult] = []
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="ecd-writer", daemon=True)
        self._thread.start()

    def submit(self, result: InstanceResult) -> None:
        with self._cv:
            self._queue.append(result)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                closing = self._closing
            if not closing:
                time.sleep(self.linger_s)  # let the group fill
            with self._cv:
                group, self._queue = self._queue[:self.max_group], self._queue[self.max_group:]
            try:
                self.store.save_results(group)
            except BaseException as exc:  # systemic: the run stops, what was stored stays
                self.on_failed(exc)
                return
            self.transactions += 1
            self.on_stored(group)


class InstanceRunner:
    """One instance end to end in this process: the harness in a sandboxed worker, its model calls
    through the gateway (cache, concurrency limit, budget), scoring, and the result handed to
    `save`. Every executor runs instances with this, in whichever process it runs them."""

    def __init__(self, *, run_id: str, model: str, scorer: ScorerSpec, gateway: ModelGateway,
                 pool: WorkerPool, save: Callable[[InstanceResult], None],
                 budget: CallBudget | None = None) -> None:
        self.run_id = run_id
        self.model = model
        self.scorer = scorer
        self.gateway = gateway
        self.pool = pool
        self.save = save  # `GroupWriter.save` (stored on return) or `ResultWriter.submit`
        self.budget = budget

    def __call__(self, inst: Instance) -> InstanceResult:
        calls: list[ModelCall] = []
        model_errors: list[str] = []
        started = time.perf_counter()
        gateway, budget = self.gateway, self.budget

        def on_generate(req: dict[str, Any]) -> dict[str, Any]:
            try:
                request = harness_request(req)
            except (KeyError, TypeError, ValueError) as exc:
                model_errors.append(f"bad request: {exc}")
                return {"op": "model_error", "message": f"bad request: {exc}"}
            try:
                if len(calls) >= MAX_CALLS_PER_SOLVE:
                    raise ModelError(CALL_LIMIT_MESSAGE, kind="call_limit")
                if budget is not None:
                    budget.check()
                completion = gateway.complete(request)
            except (ModelError, BudgetExceeded) as exc:
                model_errors.append(str(exc))
                calls.append(ModelCall(seq=len(calls), model=gateway.model_id, request=request.to_json(),
                                       text="", prompt_tokens=0, completion_tokens=0, latency_s=0.0,
                                       finish_reason="error", cache_hit=False, error=str(exc)))
                return {"op": "model_error", "message": str(exc)}
            if budget is not None:
                budget.charge_completion(completion)
            calls.append(ModelCall(seq=len(calls), model=gateway.model_id, request=request.to_json(),
                                   text=completion.text, prompt_tokens=completion.prompt_tokens,
                                   completion_tokens=completion.completion_tokens,
                                   latency_s=completion.latency_s, finish_reason=completion.finish_reason,
                                   cache_hit=completion.cache_hit, option_logprobs=completion.option_logprobs))
            return harness_reply(completion)

        outcome = self.pool.solve(inst.task_view(), on_generate)
        error_type, error_message = outcome.error_type, outcome.error_message
        if error_type == "exception" and model_errors:
            error_type, error_message = "model_error", model_errors[-1]
        correct = outcome.answer is not None and score(outcome.answer, inst, self.scorer)
        result = InstanceResult(
            run_id=self.run_id, instance_id=inst.id, category=inst.category, model=self.model,
            answer=outcome.answer, target=inst.target, correct=bool(correct), score=1.0 if correct else 0.0,
            error_type=error_type, error_message=(error_message or "")[:4000] or None,  # type: ignore[arg-type]
            stdout_tail=(outcome.output_tail + ("\n" + outcome.traceback if outcome.traceback else ""))[-6000:],
            calls=calls, wall_seconds=time.perf_counter() - started)
        self.save(result)
        return result


class Runner:
    def __init__(self, store: Store, *, limits: SandboxLimits | None = None,
                 events: EventSink | None = None) -> None:
        self.store = store
        self.limits = limits or SandboxLimits()
        self.events = events or (lambda e: None)

    def create(self, suite: Suite, model: str, harness: HarnessVersion, *, split: str = "train",
               limit: int | None = None, concurrency: int = 1, label: str = "",
               instances: list[Instance] | None = None) -> RunRecord:
        chosen = instances if instances is not None else pick_instances(suite, split, limit)
        if not chosen:
            raise NotFound(f"suite {suite.name!r} has no instances in split {split!r}")
        run = RunRecord(id=new_run_id(), suite=suite.name, model=model, harness_version=harness.id,
                        split=split, instance_ids=[i.id for i in chosen], concurrency=concurrency,
                        status="pending", created_at=time.time(), label=label)
        self.store.create_run(run)
        return run

    def execute(self, run: RunRecord, suite: Suite, backend: ModelBackend, harness: HarnessVersion, *,
                use_cache: bool = True, budget: CallBudget | None = None,
                cancelled: Callable[[], bool] | None = None,
                executor: Executor | None = None) -> RunSummary:
        """Run every instance of `run` that has no stored result yet, on `executor` (default: threads
        of this process); idempotent."""
        by_id = {i.id: i for i in suite.instances}
        missing = [iid for iid in run.instance_ids if iid not in by_id]
        if missing:
            raise NotFound(f"run {run.id} names instances {missing[:3]} that suite {suite.name!r} lacks")
        boundary = isolation(self.limits.isolation)  # ConfigError now, not per instance, if bwrap is required
        done = self.store.done_instance_ids(run.id)
        todo = [by_id[iid] for iid in run.instance_ids if iid not in done]
        run.status = "running"
        self.store.update_run(run)
        batch = Batch(run=run, scorer=suite.scorer, harness=harness, backend=backend, store=self.store,
                      limits=self.limits, use_cache=use_cache, budget=budget)
        started = time.perf_counter()
        total = len(run.instance_ids)
        finished = len(done)
        self.events({"type": "run_started", "run_id": run.id, "total": total, "done": finished})

        def should_stop() -> str | None:
            if cancelled and cancelled():
                return "cancelled"
            if budget is not None and budget.exhausted:
                return "budget"
            return None

        stored: list[InstanceResult] = []  # this execution's results, each stored before it arrives

        def on_result(result: InstanceResult) -> None:
            nonlocal finished
            finished += 1
            stored.append(result)
            self.events({"type": "instance_done", "run_id": run.id, "done": finished, "total": total,
                         "instance_id": result.instance_id, "correct": result.correct,
                         "error_type": result.error_type})

        if executor is None:
            from ecdysis.executors.local import LocalExecutor  # it builds on this module
            executor = LocalExecutor()
        stop_reason = executor.run(batch, todo, on_result=on_result, should_stop=should_stop)
        wall = time.perf_counter() - started
        previous_wall = float(run.summary.get("wall_seconds_total", 0.0)) if run.summary else 0.0
        # A fresh run's results are all here already; reading 2,000 back cost a quarter second.
        results = stored if not done else self.store.get_results(run.id)
        summary = summarize(run, suite, results, wall)
        run.summary = {**summary.to_json(), "wall_seconds_total": previous_wall + wall,
                       "isolation": boundary.to_json()}
        complete = len(self.store.done_instance_ids(run.id)) >= total
        run.status = "done" if complete else ("cancelled" if stop_reason == "cancelled" else "pending")
        run.error = None if complete else f"stopped: {stop_reason}; resume to finish"
        run.finished_at = time.time() if complete else None
        self.store.update_run(run)
        self.events({"type": "run_finished", "run_id": run.id, "status": run.status,
                     "accuracy": summary.accuracy})
        return summary


def summarize(run: RunRecord, suite: Suite, results: list[InstanceResult], wall: float) -> RunSummary:
    by_cat: dict[str, list[bool]] = {}
    errors: dict[str, int] = {}
    for r in results:
        by_cat.setdefault(r.category, []).append(r.correct)
        if r.error_type:
            errors[r.error_type] = errors.get(r.error_type, 0) + 1
    calls = [c for r in results for c in r.calls]
    n = len(results)
    return RunSummary(
        run_id=run.id, suite=suite.name, model=run.model, harness_version=run.harness_version, n=n,
        accuracy=round(sum(r.correct for r in results) / n, 4) if n else 0.0,
        accuracy_by_category={c: round(sum(v) / len(v), 4) for c, v in sorted(by_cat.items())},
        model_calls=len(calls), cache_hits=sum(1 for c in calls if c.cache_hit),
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        wall_seconds=round(wall, 3), errors=errors)

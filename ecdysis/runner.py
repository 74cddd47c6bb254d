"""Batch execution: suite instances x one harness version x one model, in parallel within the
backend's limit, on an executor (threads here, or a Ray cluster). Each instance's result and
every model call are stored before the instance counts as finished, so a killed run loses nothing
finished, and `resume` re-runs only what has no stored result."""

from __future__ import annotations

import time
import uuid
from typing import Callable

from ecdysis.budget import CallBudget
from ecdysis.errors import InputError, NotFound
from ecdysis.executors import Batch, Executor
from ecdysis.executors.local import LocalExecutor
from ecdysis.models.base import ModelBackend
from ecdysis.events import EventSink
from ecdysis.records import Instance, InstanceResult, RunRecord, RunSummary, Suite, in_turn
from ecdysis.sandbox import SandboxLimits, isolation
from ecdysis.store import HarnessVersion, Store



def check_limit(option: str, limit: int | None) -> None:
    """A limit is a positive count or None (everything): 0 used to mean "all" and -5 "all but 5"."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"{option} must be at least 1, not {limit!r}", hint=f"leave {option} out for the whole split")


def pick_instances(suite: Suite, split: str, limit: int | None, *, window: int = 0) -> list[Instance]:
    """The first `limit` instances of a split, taken round-robin over categories so a small
    batch still spans every category (a failure must be able to recur across categories); with
    `window` n, the n-th `limit` after them instead, which must be there in full."""
    check_limit("the limit", limit)
    pool = suite.instances if split == "all" else suite.split(split)  # type: ignore[arg-type]
    by_cat: dict[str, list[Instance]] = {}
    for inst in pool:
        by_cat.setdefault(inst.category, []).append(inst)
    ordered = in_turn(v for _, v in sorted(by_cat.items()))
    if window:
        if limit is None:
            raise InputError(f"window {window} of the {split} split needs a limit: a window is counted in it")
        if len(ordered) < (window + 1) * limit:
            raise InputError(f"window {window} of {limit} instances of the {split} split needs "
                             f"{(window + 1) * limit}; {suite.name} has {len(ordered)}",
                             hint="use a smaller window or limit")
        return ordered[window * limit:(window + 1) * limit]
    return ordered[:limit] if limit is not None else ordered


def new_run_id() -> str:
    return "r" + uuid.uuid4().hex[:11]


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
        previous_wall = float(run.summary.get("wall_seconds_total", run.summary.get("wall_seconds", 0.0))
                              if run.summary else 0.0)
        if not todo and run.status == "done" and run.summary:
            # Resuming a finished run changes nothing: its record (status, time, finish) stays as stored.
            return summarize(run, suite, self.store.get_results(run.id), previous_wall)
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
            executor = LocalExecutor()
        stop_reason = executor.run(batch, todo, on_result=on_result, should_stop=should_stop)
        # The run's time is the sum of its executions': a resumed run's summary counts the earlier ones too.
        wall = previous_wall + time.perf_counter() - started
        # A fresh run's results are all here already; reading 2,000 back cost a quarter second.
        results = stored if not done else self.store.get_results(run.id)
        summary = summarize(run, suite, results, wall)
        run.summary = {**summary.to_json(), "wall_seconds_total": wall,
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

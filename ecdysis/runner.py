"""Batch execution: suite instances x one harness version x one model, in parallel within the
backend's limit. Each instance's result and every model call are stored the moment it finishes,
so a killed run loses nothing finished, and `resume` re-runs only what has no stored result."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

from ecdysis.errors import BudgetExceeded, ModelError, NotFound
from ecdysis.models.base import ModelBackend
from ecdysis.models.gateway import ModelGateway
from ecdysis.records import CompletionRequest, Instance, InstanceResult, ModelCall, RunRecord, RunSummary, Suite
from ecdysis.sandbox import SandboxLimits, WorkerPool
from ecdysis.store import HarnessVersion, Store
from ecdysis.suites.scorers import score

Event = dict[str, Any]
EventSink = Callable[[Event], None]


class CallBudget:
    """Shared limits on model calls and tokens across everything one job runs (thread-safe).
    `None` means unlimited. Cache hits are free and are not charged."""

    def __init__(self, max_calls: int | None = None, max_tokens: int | None = None,
                 deadline: float | None = None) -> None:
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.deadline = deadline
        self.calls = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def check(self) -> None:
        with self._lock:
            if self.max_calls is not None and self.calls >= self.max_calls:
                raise BudgetExceeded(f"model-call budget of {self.max_calls} spent")
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                raise BudgetExceeded(f"token budget of {self.max_tokens} spent")
            if self.deadline is not None and time.time() >= self.deadline:
                raise BudgetExceeded("wall-time budget spent")

    def charge(self, calls: int, tokens: int) -> None:
        with self._lock:
            self.calls += calls
            self.tokens += tokens

    @property
    def exhausted(self) -> bool:
        try:
            self.check()
        except BudgetExceeded:
            return True
        return False


def pick_instances(suite: Suite, split: str, limit: int | None) -> list[Instance]:
    """The first `limit` instances of a split, taken round-robin over categories so a small
    batch still spans every category (a failure must be able to recur across categories)."""
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
    return ordered[:limit] if limit else ordered


def new_run_id() -> str:
    return "r" + uuid.uuid4().hex[:11]


@dataclass
class _Context:
    run: RunRecord
    suite: Suite
    gateway: ModelGateway
    pool: WorkerPool
    budget: CallBudget | None


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
                cancelled: Callable[[], bool] | None = None) -> RunSummary:
        """Run every instance of `run` that has no stored result yet; idempotent."""
        by_id = {i.id: i for i in suite.instances}
        missing = [iid for iid in run.instance_ids if iid not in by_id]
        if missing:
            raise NotFound(f"run {run.id} names instances {missing[:3]} that suite {suite.name!r} lacks")
        done = self.store.done_instance_ids(run.id)
        todo = [by_id[iid] for iid in run.instance_ids if iid not in done]
        run.status = "running"
        self.store.update_run(run)
        ctx = _Context(run, suite, ModelGateway(backend, self.store, use_cache=use_cache),
                       WorkerPool(harness.files, self.limits), budget)
        started = time.perf_counter()
        total, finished = len(run.instance_ids), len(done)
        self.events({"type": "run_started", "run_id": run.id, "total": total, "done": finished})
        stop_reason: str | None = None
        try:
            with ThreadPoolExecutor(max_workers=max(1, run.concurrency), thread_name_prefix="ecd-run") as ex:
                queue = list(todo)
                running: set[Future[InstanceResult]] = set()
                while queue or running:
                    while queue and len(running) < max(1, run.concurrency) and stop_reason is None:
                        if cancelled and cancelled():
                            stop_reason = "cancelled"
                            break
                        if budget is not None and budget.exhausted:
                            stop_reason = "budget"
                            break
                        running.add(ex.submit(self._one, ctx, queue.pop(0)))
                    if stop_reason is not None:
                        queue.clear()
                    if not running:
                        break
                    finished_now, running = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished_now:
                        result = fut.result()
                        finished += 1
                        self.events({"type": "instance_done", "run_id": run.id, "done": finished,
                                     "total": total, "instance_id": result.instance_id,
                                     "correct": result.correct, "error_type": result.error_type})
        finally:
            ctx.pool.close()
        wall = time.perf_counter() - started
        previous_wall = float(run.summary.get("wall_seconds_total", 0.0)) if run.summary else 0.0
        summary = summarize(run, suite, self.store.get_results(run.id), wall)
        run.summary = {**summary.to_json(), "wall_seconds_total": previous_wall + wall}
        complete = len(self.store.done_instance_ids(run.id)) >= total
        run.status = "done" if complete else ("cancelled" if stop_reason == "cancelled" else "pending")
        run.error = None if complete else f"stopped: {stop_reason}; resume to finish"
        run.finished_at = time.time() if complete else None
        self.store.update_run(run)
        self.events({"type": "run_finished", "run_id": run.id, "status": run.status,
                     "accuracy": summary.accuracy})
        return summary

    def _one(self, ctx: _Context, inst: Instance) -> InstanceResult:
        calls: list[ModelCall] = []
        model_errors: list[str] = []
        started = time.perf_counter()

        def on_generate(req: dict[str, Any]) -> dict[str, Any]:
            try:
                request = CompletionRequest.make(
                    list(req.get("messages") or []), temperature=req.get("temperature", 0.0),
                    max_tokens=min(int(req.get("max_tokens", 256)), 4096), stop=req.get("stop"),
                    seed=req.get("seed", 0))
            except (KeyError, TypeError, ValueError) as exc:
                model_errors.append(f"bad request: {exc}")
                return {"op": "model_error", "message": f"bad request: {exc}"}
            try:
                if ctx.budget is not None:
                    ctx.budget.check()
                completion = ctx.gateway.complete(request)
            except (ModelError, BudgetExceeded) as exc:
                model_errors.append(str(exc))
                calls.append(ModelCall(seq=len(calls), model=ctx.gateway.model_id, request=request.to_json(),
                                       text="", prompt_tokens=0, completion_tokens=0, latency_s=0.0,
                                       finish_reason="error", cache_hit=False, error=str(exc)))
                return {"op": "model_error", "message": str(exc)}
            if ctx.budget is not None and not completion.cache_hit:
                ctx.budget.charge(1, completion.prompt_tokens + completion.completion_tokens)
            calls.append(ModelCall(seq=len(calls), model=ctx.gateway.model_id, request=request.to_json(),
                                   text=completion.text, prompt_tokens=completion.prompt_tokens,
                                   completion_tokens=completion.completion_tokens,
                                   latency_s=completion.latency_s, finish_reason=completion.finish_reason,
                                   cache_hit=completion.cache_hit))
            return {"op": "completion", "text": completion.text, "finish_reason": completion.finish_reason,
                    "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens}

        outcome = ctx.pool.solve(inst.task_view(), on_generate)
        error_type, error_message = outcome.error_type, outcome.error_message
        if error_type == "exception" and model_errors:
            error_type, error_message = "model_error", model_errors[-1]
        correct = outcome.answer is not None and score(outcome.answer, inst, ctx.suite.scorer)
        result = InstanceResult(
            run_id=ctx.run.id, instance_id=inst.id, category=inst.category, model=ctx.run.model,
            answer=outcome.answer, target=inst.target, correct=bool(correct), score=1.0 if correct else 0.0,
            error_type=error_type, error_message=(error_message or "")[:4000] or None,  # type: ignore[arg-type]
            stdout_tail=(outcome.output_tail + ("\n" + outcome.traceback if outcome.traceback else ""))[-6000:],
            calls=calls, wall_seconds=time.perf_counter() - started)
        self.store.save_result(result)
        return result


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

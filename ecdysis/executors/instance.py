"""One instance end to end, and its result stored: what every executor runs, in whichever
process it runs instances. `InstanceRunner` runs the harness in a sandboxed worker with its model
calls through the gateway (cache, concurrency limit, budget) and scores the answer; `GroupWriter`
and `ResultWriter` store results (a group commit, on the caller's thread or on one of their own).

The runner (`ecdysis.runner`) keeps a run's bookkeeping; executors (`ecdysis.executors.local`,
`ecdysis.executors.ray_executor`) build on this module, which imports neither."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ecdysis.budget import CallBudget
from ecdysis.errors import BudgetExceeded, ModelError
from ecdysis.models.gateway import (CALL_LIMIT_MESSAGE, MAX_CALLS_PER_SOLVE, ModelGateway, harness_reply,
                                    harness_request)
from ecdysis.records import Instance, InstanceResult, ModelCall, ScorerSpec
from ecdysis.sandbox import WorkerPool
from ecdysis.store import Store
from ecdysis.suites.scorers import score


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
        starved: list[str] = []  # calls the budget refused: the instance is not done, whatever solve returns
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
                key = request.cache_key(gateway.model_id)
                if budget is not None and not (gateway.use_cache and budget.paid_for(key)):
                    budget.check()  # a request it paid for before replays free from the cache
                completion = gateway.complete(request)
            except (ModelError, BudgetExceeded) as exc:
                model_errors.append(str(exc))
                if isinstance(exc, BudgetExceeded):
                    starved.append(str(exc))
                calls.append(ModelCall(seq=len(calls), model=gateway.model_id, request=request.to_json(),
                                       text="", prompt_tokens=0, completion_tokens=0, latency_s=0.0,
                                       finish_reason="error", cache_hit=False, error=str(exc)))
                return {"op": "model_error", "message": str(exc)}
            if budget is not None:
                budget.charge_completion(completion, key)
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
        if starved:
            # A harness may carry on past a refused call (the first reply stands, a retry is
            # skipped) and return an answer, but not the one it would give with its calls: stored,
            # it would pass for the harness's outcome and a resume would skip it. It is left for
            # the resume to run again; what it did spend stays charged.
            result.error_type, result.error_message = "model_error", starved[-1][:4000]
            return result
        self.save(result)
        return result

"""The default executor: instances run on a thread pool of this process, each in a sandboxed
harness worker (reused across instances), model calls through one gateway shared by all threads."""

from __future__ import annotations

import queue
import threading

from ecdysis.executors.base import Batch, OnResult, ShouldStop
from ecdysis.models.gateway import ModelGateway
from ecdysis.records import Instance, InstanceResult
from ecdysis.executors.instance import InstanceRunner, ResultWriter
from ecdysis.sandbox import WorkerPool


class LocalExecutor:
    """`batch.concurrency` threads; each takes the next instance itself (asking `should_stop`
    first, one thread at a time) and hands its result to a `ResultWriter`, which stores results
    in groups and passes each stored group to the calling thread. The gateway holds model calls
    to the backend's own limit.

    The calling thread only reports progress, so it is never between one instance and the next,
    and no slot waits for the database. (Futures, and waiting on the set of running ones, cost
    O(running) per result; a thread that had to be woken to hand out the next instance cost
    milliseconds per instance on a busy machine.)"""

    name = "local"

    def run(self, batch: Batch, todo: list[Instance], *, on_result: OnResult,
            should_stop: ShouldStop) -> str | None:
        if not todo:
            return None
        # Stored groups, a systemic failure (BaseException) or a finished thread (None).
        done: queue.SimpleQueue[list[InstanceResult] | BaseException | None] = queue.SimpleQueue()
        failed = threading.Event()  # no thread starts another instance

        def writer_failed(exc: BaseException) -> None:
            failed.set()
            done.put(exc)

        pool = WorkerPool(batch.harness.files, batch.limits)
        writer = ResultWriter(batch.store, on_stored=done.put, on_failed=writer_failed)
        instance = InstanceRunner(run_id=batch.run.id, model=batch.run.model, scorer=batch.scorer,
                                  gateway=ModelGateway(batch.backend, batch.store, use_cache=batch.use_cache),
                                  pool=pool, save=writer.submit, budget=batch.budget)
        pending = list(reversed(todo))  # popped from the end, in the run's order
        taking = threading.Lock()
        stopped: list[str] = []   # the stop reason, once there is one
        released = threading.Event()

        def next_instance() -> Instance | None:
            with taking:
                if stopped or failed.is_set() or not pending:
                    return None
                reason = should_stop()
                if reason is not None:
                    stopped.append(reason)
                    return None
                return pending.pop()

        def serve() -> None:
            try:
                while (inst := next_instance()) is not None:
                    instance(inst)
            except BaseException as exc:  # systemic: raised in the calling thread
                failed.set()
                done.put(exc)
            finally:
                done.put(None)  # this thread has no more work
                # A harness worker dies with the thread that started it (the runtime's
                # PR_SET_PDEATHSIG follows the thread, not the process), and other threads borrow
                # it: so no thread ends before the pool is closed.
                released.wait()

        threads = [threading.Thread(target=serve, name=f"ecd-run-{i}", daemon=True)
                   for i in range(min(batch.concurrency, len(todo)))]
        failure: BaseException | None = None
        active = 0

        def take(item: list[InstanceResult] | BaseException | None) -> None:
            nonlocal active, failure
            if item is None:
                active -= 1
            elif isinstance(item, BaseException):
                failure = failure or item
            elif failure is None:
                for result in item:
                    on_result(result)

        try:
            for thread in threads:
                thread.start()
                active += 1
            while active:
                take(done.get())
            writer.close()  # the last group; its results are reported below
            while not done.empty():
                take(done.get())
        except BaseException:
            failed.set()  # e.g. an event sink that raised: let the running instances finish
            raise
        finally:
            while active:  # only after an exception above: wait for the running instances
                if done.get() is None:
                    active -= 1
            writer.close()
            pool.close()
            released.set()
            for thread in threads:
                thread.join()
        if failure is not None:
            raise failure
        return stopped[0] if stopped else None

"""Background work for the app: a batch, a diagnosis or an evolution runs in a worker thread of
the engine, never in a Streamlit script run. Its state lives in the store (progress, result,
cancel flag), so a refresh, a reconnect or another process sees it; Stop is cooperative."""

from __future__ import annotations

import os
import threading
import time
import traceback
import uuid
from typing import Any, Callable

from ecdysis.errors import Cancelled, EcdysisError
from ecdysis.store import JobRecord, Store

STALE_AFTER_S = 120.0


class JobContext:
    """What a job function gets: report progress, ask whether it was cancelled."""

    def __init__(self, store: Store, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        self._last_check = 0.0
        self._cancelled = False
        self._last_write = 0.0

    def progress(self, done: int, total: int, message: str = "", *, force: bool = False) -> None:
        now = time.time()
        # Progress writes are throttled: a 2,000-instance batch must not become 2,000 transactions.
        if force or done >= total or now - self._last_write > 0.5:
            self._last_write = now
            self.store.update_job(self.job_id, done=done, total=total, message=message, updated_at=now)

    def cancelled(self) -> bool:
        now = time.time()
        if not self._cancelled and now - self._last_check > 0.5:
            self._last_check = now
            job = self.store.get_job(self.job_id)
            self._cancelled = bool(job and job.cancel_requested)
        return self._cancelled

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled("stopped by request")


JobFn = Callable[[JobContext], dict[str, Any]]


class JobManager:
    """Runs job functions in daemon threads (thread-safe; share one per process)."""

    def __init__(self, store: Store, *, max_workers: int = 2) -> None:
        self.store = store
        self._slots = threading.BoundedSemaphore(max_workers)
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self.mark_stale()

    def mark_stale(self) -> None:
        """Jobs left 'running' by a process that died are marked failed; their runs can resume."""
        now = time.time()
        for job in self.store.list_jobs(limit=500):
            if job.status in ("running", "queued") and now - job.updated_at > STALE_AFTER_S:
                self.store.update_job(job.id, status="failed", updated_at=now,
                                      error="interrupted (the process running it stopped); start it again to resume")

    def submit(self, kind: str, params: dict[str, Any], fn: JobFn) -> str:
        job_id = "j" + uuid.uuid4().hex[:11]
        now = time.time()
        self.store.create_job(JobRecord(id=job_id, kind=kind, params={**params, "pid": os.getpid()},
                                        status="queued", created_at=now, updated_at=now))
        thread = threading.Thread(target=self._run, args=(job_id, fn), name=f"ecd-job-{job_id}", daemon=True)
        with self._lock:
            self._threads[job_id] = thread
        thread.start()
        return job_id

    def _run(self, job_id: str, fn: JobFn) -> None:
        with self._slots:
            ctx = JobContext(self.store, job_id)
            queued = self.store.get_job(job_id)
            if queued is None or queued.cancel_requested or queued.status == "cancelled":
                # Stopped while it waited for a slot: it never starts (`cancel` said so already).
                self.store.update_job(job_id, status="cancelled", updated_at=time.time())
                return
            self.store.update_job(job_id, status="running", updated_at=time.time())
            try:
                result = fn(ctx)
                status = "cancelled" if ctx.cancelled() else "done"
                self.store.update_job(job_id, status=status, result=result or {}, updated_at=time.time())
            except Cancelled:
                self.store.update_job(job_id, status="cancelled", updated_at=time.time())
            except EcdysisError as exc:
                self.store.update_job(job_id, status="failed", error=str(exc), updated_at=time.time())
            except Exception as exc:  # a bug must still end the job visibly, not hang it
                self.store.update_job(job_id, status="failed", updated_at=time.time(),
                                      error=f"{type(exc).__name__}: {exc}",
                                      result={"traceback": traceback.format_exc()[-4000:]})

    def cancel(self, job_id: str) -> None:
        """Ask a job to stop. One still queued (waiting for a worker slot) has done nothing yet, so
        it is cancelled at once rather than left 'queued · stopping…' until a slot frees."""
        job = self.store.get_job(job_id)
        self.store.update_job(job_id, cancel_requested=True, updated_at=time.time())
        if job is not None and job.status == "queued":
            self.store.update_job(job_id, status="cancelled", updated_at=time.time())

    def wait(self, job_id: str, timeout: float | None = None) -> JobRecord | None:
        with self._lock:
            thread = self._threads.get(job_id)
        if thread is not None:
            thread.join(timeout)
        return self.store.get_job(job_id)

"""Harness workers and their pool: one solve at a time per worker over a pipe, model calls relayed
to the engine, a worker that fails replaced, the pool closed with every process it started."""

from __future__ import annotations

import json
import logging
import os
import select
import selectors
import shutil
import signal
import threading
import time
from typing import Any

from ecdysis.errors import ConfigError
from ecdysis.sandbox.limits import ModelHandler, SandboxLimits, SolveOutcome
from ecdysis.sandbox.zygote import Zygote, OutputTail

log = logging.getLogger("ecdysis.sandbox")

class HarnessWorker:
    """One sandboxed process serving one harness version, reused across instances until it
    fails; forked by the pool's `Zygote` (by one of its own when none is given)."""

    def __init__(self, files: dict[str, str], limits: SandboxLimits, zygote: Zygote | None = None) -> None:
        self.limits = limits
        self._own_zygote = zygote is None
        self._zygote = zygote or Zygote(limits)
        self.load_error: SolveOutcome | None = None
        self._ended = False
        self._folder, self.uid = self._zygote.new_folder(files)
        try:
            self.pid, stdin_fd, self._out_fd, err_fd = self._zygote.spawn(self._folder, self.uid)
        except ConfigError as exc:
            self._ended = True
            self.load_error = SolveOutcome(None, "crash", exc.message)
            self._release()
            return
        self._stdin = os.fdopen(stdin_fd, "wb")
        # Both pipes are read by whichever thread is talking to the worker, in one select loop:
        # no thread per worker, and no waiting for one to catch up with the output.
        self._output = OutputTail(limits.output_tail)
        self._err_fd: int | None = err_fd  # None once it reached EOF
        self._err_raw = err_fd
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._out_fd, selectors.EVENT_READ)
        self._sel.register(self._err_fd, selectors.EVENT_READ)
        self._pending = b""
        ready = self._read(time.monotonic() + 30.0)
        if ready is None or not ready.get("ok"):
            message = ready.get("message", "") if ready else "the harness process did not start"
            kind = ready.get("type", "crash") if ready else "crash"
            self.load_error = SolveOutcome(None, "exception", f"harness failed to load: {kind}: {message}",
                                           output_tail=self._drain_output(until_mark=True, wait_s=1.0),
                                           traceback=(ready or {}).get("traceback", ""))
            self.close()

    @property
    def alive(self) -> bool:
        """Loaded, not retired, and with nothing on its stdout while idle (EOF: it died)."""
        if self.load_error is not None or self._ended:
            return False
        if select.select([self._out_fd], [], [], 0)[0]:
            return False
        return self._zygote.alive

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """One protocol message, or None on EOF or when the deadline passes; what the harness
        prints meanwhile goes to the output tail."""
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            for key, _ in self._sel.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fd, 65536)
                if key.fd == self._out_fd:
                    if not chunk:
                        return None
                    self._pending += chunk
                else:
                    self._output_chunk(chunk)
        line, _, self._pending = self._pending.partition(b"\n")
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            return {"op": "garbage", "message": line[:200].decode("utf-8", "replace")}
        return msg if isinstance(msg, dict) else {"op": "garbage", "message": str(msg)[:200]}

    def _output_chunk(self, chunk: bytes) -> None:
        if chunk:
            self._output.add(chunk)
        elif self._err_fd is not None:  # EOF: the process is gone, or closed its stderr
            self._output.add(b"", final=True)
            self._sel.unregister(self._err_fd)
            self._err_fd = None

    def _drain_output(self, *, until_mark: bool = False, wait_s: float = 0.0) -> str:
        """Everything printed so far, read off the pipe. `until_mark`: first wait (up to `wait_s`)
        for the runtime's end-of-output mark, which precedes its answer on the pipe, so no line
        printed before the answer is missed. Without it, only what is already there is read (up to
        `wait_s` more until EOF, for a process that has just died)."""
        deadline = time.monotonic() + wait_s
        while self._err_fd is not None and not (until_mark and self._output.marked):
            ready = select.select([self._err_fd], [], [], max(0.0, deadline - time.monotonic()))[0]
            if not ready:
                break
            self._output_chunk(os.read(self._err_fd, 65536))
        return self._output.take()

    def _write(self, obj: dict[str, Any]) -> bool:
        try:
            self._stdin.write((json.dumps(obj) + "\n").encode())
            self._stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def solve(self, task: dict[str, Any], on_generate: ModelHandler) -> SolveOutcome:
        if self.load_error is not None:
            return self.load_error
        self._drain_output()  # what an earlier instance printed is not this one's
        if not self._write({"op": "solve", "task": task}):
            return self._died()
        deadline = time.monotonic() + self.limits.timeout_s
        model_seconds = 0.0
        while True:
            msg = self._read(deadline)
            if msg is None:
                if time.monotonic() >= deadline:
                    self._end()  # killed: its output reaches EOF
                    tail = self._drain_output(wait_s=0.5)
                    self.close()
                    return SolveOutcome(None, "timeout", f"harness exceeded {self.limits.timeout_s:g}s",
                                        output_tail=tail, model_seconds=model_seconds)
                return self._died(model_seconds)
            op = msg.get("op")
            if op == "generate":
                start = time.monotonic()
                reply = on_generate(msg.get("request") or {})
                spent = time.monotonic() - start
                model_seconds += spent
                deadline += spent  # time waiting for the model is not the harness's time
                if not self._write(reply):
                    return self._died(model_seconds)
            elif op == "result":
                return self._left_behind(msg, SolveOutcome(
                    str(msg.get("answer", "")), output_tail=self._drain_output(until_mark=True, wait_s=1.0),
                    model_seconds=model_seconds))
            elif op == "error":
                kind = "memory" if msg.get("type") == "MemoryError" else (
                    "bad_output" if msg.get("type") == "TypeError" and "solve() returned" in str(msg.get("message")) else "exception")
                return self._left_behind(msg, SolveOutcome(
                    None, kind, f"{msg.get('type')}: {msg.get('message')}",
                    output_tail=self._drain_output(until_mark=True, wait_s=1.0), traceback=str(msg.get("traceback", "")),
                    model_seconds=model_seconds))
            else:
                tail = self._drain_output()
                self.close()
                return SolveOutcome(None, "crash", f"harness broke the protocol: {msg.get('message', '')}",
                                    output_tail=tail, model_seconds=model_seconds)

    def _left_behind(self, msg: dict[str, Any], outcome: SolveOutcome) -> SolveOutcome:
        """Processes or threads that harness code left running would share the next instance's
        pipe and limits: the worker is retired (its whole sandbox killed) and the outcome says so."""
        stray = int(msg.get("stray", 0) or 0)
        if stray:
            self.close()
            outcome.extra["stray"] = stray
            outcome.output_tail = (outcome.output_tail + f"\n[sandbox] the harness left {stray} process(es) "
                                   f"or thread(s) running; the worker was killed and replaced")[-self.limits.output_tail:]
        return outcome

    def _died(self, model_seconds: float = 0.0) -> SolveOutcome:
        code = self._end(grace_s=5.0)
        tail = self._drain_output(wait_s=1.0)  # to EOF: the last lines it printed before dying
        self.close()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            kind = "timeout" if sig == "SIGXCPU" else ("memory" if sig in ("SIGKILL", "SIGSEGV") and "MemoryError" in tail else "crash")
            return SolveOutcome(None, kind, f"harness process killed by {sig}", output_tail=tail,
                                model_seconds=model_seconds)
        kind = "memory" if "MemoryError" in tail else "crash"
        return SolveOutcome(None, kind, f"harness process exited with code {code}", output_tail=tail,
                            model_seconds=model_seconds)

    def _end(self, *, grace_s: float = 0.0) -> int | None:
        """The worker's exit code once it is gone (killed after `grace_s`); None if unknown."""
        if self._ended:
            return None
        self._ended = True
        return self._zygote.end(self.pid, grace_s=grace_s)

    def detach(self) -> None:
        """Close the engine's side only: for a pool closing its zygote, which ends every worker."""
        self._ended = True
        self.close()

    def close(self) -> None:
        self._end()
        self._err_fd = None
        for closing in (self._sel.close, self._stdin.close, lambda: os.close(self._out_fd),
                        lambda: os.close(self._err_raw)):
            try:
                closing()
            except (OSError, ValueError, KeyError):
                pass
        self._release()

    def _release(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)
        if self._own_zygote:
            self._zygote.close()


class WorkerPool:
    """Workers for one harness version, forked from one `Zygote`; a thread borrows one, a failed
    worker is replaced (and a zygote that died, with all its workers, too)."""

    def __init__(self, files: dict[str, str], limits: SandboxLimits) -> None:
        self.files = files
        self.limits = limits
        self._idle: list[HarnessWorker] = []
        self._lock = threading.Lock()
        self._zygote: Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._load_error: SolveOutcome | None = None

    def _fork_server(self) -> Zygote:
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    self._zygote.close()
                    self._zygote = None  # not left pointing at a closed one if the next fails to start
                self._zygote = Zygote(self.limits)
            return self._zygote

    def solve(self, task: dict[str, Any], on_generate: ModelHandler) -> SolveOutcome:
        if self._load_error is not None:
            return self._load_error
        worker = None
        dead: list[HarnessWorker] = []
        with self._lock:
            while self._idle and worker is None:
                worker = self._idle.pop()
                if not worker.alive:
                    dead.append(worker)
                    worker = None
        for gone in dead:  # outside the lock: each close is a round trip to the zygote
            gone.close()
        if worker is None:
            try:
                worker = HarnessWorker(self.files, self.limits, self._fork_server())
            except ConfigError as exc:
                self._load_error = SolveOutcome(None, "crash", exc.message)
                return self._load_error
            if worker.load_error is not None:
                self._load_error = worker.load_error
                return worker.load_error
        outcome = worker.solve(task, on_generate)
        if worker.alive:
            with self._lock:
                self._idle.append(worker)
        return outcome

    def close(self) -> None:
        """Ends every worker at once: closing the zygote ends its sandbox, workers included."""
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.detach()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None

"""Runs harness code isolated from the engine: a separate process per worker with memory, file
size and CPU limits, a wall-clock timeout per instance, a scrubbed environment and a temp folder.
Model calls come back to the engine over the pipe, so the harness holds no key and no database.

A harness that raises, hangs, exhausts memory or dies costs one failed instance, never the run.
This is isolation, not a security boundary (see the README)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ecdysis.harness import write_dir
from ecdysis.harness_runtime import OUTPUT_MARK

RUNTIME = Path(__file__).resolve().parent / "harness_runtime.py"


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120.0   # harness time per instance, not counting time spent in model calls
    memory_mb: int = 1024
    file_mb: int = 16
    cpu_s: int = 3600          # per worker process, a backstop behind the wall-clock timeout
    output_tail: int = 4000    # characters of what the harness printed that are kept


@dataclass
class SolveOutcome:
    answer: str | None
    error_type: str | None = None       # exception | timeout | memory | crash | bad_output
    error_message: str | None = None
    output_tail: str = ""
    traceback: str = ""
    model_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# The model handler gets the request the harness sent and returns the reply dict to send back.
ModelHandler = Callable[[dict[str, Any]], dict[str, Any]]


def scrubbed_env(home: str) -> dict[str, str]:
    """No inherited variables at all: keys, tokens and database URLs cannot reach harness code."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}


class _Tail:
    """Drains a stream in a thread, keeping only the last characters: a harness that prints
    megabytes can neither block on a full pipe nor fill the engine's memory."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._buf: deque[str] = deque()
        self._size = 0
        self._limit = limit
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: Any) -> None:
        for chunk in iter(lambda: stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536), b""):
            text = chunk.decode("utf-8", "replace")
            with self._lock:
                self._buf.append(text)
                self._size += len(text)
                while self._size > self._limit and len(self._buf) > 1:
                    self._size -= len(self._buf.popleft())

    def take(self, *, settle_s: float = 0.0) -> str:
        """The kept output; with `settle_s`, first wait (that long at most) for the runtime's
        end-of-output mark, which it writes after flushing, so no printed line is missed."""
        deadline = time.monotonic() + settle_s
        while settle_s and time.monotonic() < deadline:
            with self._lock:
                if self._buf and OUTPUT_MARK in self._buf[-1][-len(OUTPUT_MARK) - 1:]:
                    break
            time.sleep(0.002)
        with self._lock:
            text = "".join(self._buf).replace(OUTPUT_MARK, "")[-self._limit:]
            self._buf.clear()
            self._size = 0
        return text


class HarnessWorker:
    """One sandboxed process serving one harness version, reused across instances until it fails."""

    def __init__(self, files: dict[str, str], limits: SandboxLimits) -> None:
        self.limits = limits
        self._tmp = Path(tempfile.mkdtemp(prefix="ecdysis-h-"))
        self._dir = write_dir(files, self._tmp / "harness")
        self.load_error: SolveOutcome | None = None
        cmd = [sys.executable, "-I", str(RUNTIME), "--serve", "--harness", str(self._dir),
               "--memory-mb", str(limits.memory_mb), "--file-mb", str(limits.file_mb),
               "--cpu-s", str(limits.cpu_s)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, cwd=self._tmp,
                                      env=scrubbed_env(str(self._tmp)), start_new_session=True)
        self._tail = _Tail(self._proc.stderr, limits.output_tail)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        self._pending = b""
        ready = self._read(time.monotonic() + 30.0)
        if ready is None or not ready.get("ok"):
            message = ready.get("message", "") if ready else "the harness process did not start"
            kind = ready.get("type", "crash") if ready else "crash"
            self.load_error = SolveOutcome(None, "exception", f"harness failed to load: {kind}: {message}",
                                           output_tail=self._tail.take(),
                                           traceback=(ready or {}).get("traceback", ""))
            self.close()

    @property
    def alive(self) -> bool:
        return self.load_error is None and self._proc.poll() is None

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """One protocol message, or None on EOF or when the deadline passes."""
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not self._sel.select(timeout=min(remaining, 0.5)):
                continue
            chunk = os.read(self._proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            return {"op": "garbage", "message": line[:200].decode("utf-8", "replace")}
        return msg if isinstance(msg, dict) else {"op": "garbage", "message": str(msg)[:200]}

    def _write(self, obj: dict[str, Any]) -> bool:
        try:
            self._proc.stdin.write((json.dumps(obj) + "\n").encode())  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
            return True
        except (BrokenPipeError, OSError):
            return False

    def solve(self, task: dict[str, Any], on_generate: ModelHandler) -> SolveOutcome:
        if self.load_error is not None:
            return self.load_error
        self._tail.take()
        if not self._write({"op": "solve", "task": task}):
            return self._died()
        deadline = time.monotonic() + self.limits.timeout_s
        model_seconds = 0.0
        while True:
            msg = self._read(deadline)
            if msg is None:
                if time.monotonic() >= deadline:
                    self.close()
                    return SolveOutcome(None, "timeout", f"harness exceeded {self.limits.timeout_s:g}s",
                                        output_tail=self._tail.take(), model_seconds=model_seconds)
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
                return SolveOutcome(str(msg.get("answer", "")), output_tail=self._tail.take(settle_s=1.0),
                                    model_seconds=model_seconds)
            elif op == "error":
                kind = "memory" if msg.get("type") == "MemoryError" else (
                    "bad_output" if msg.get("type") == "TypeError" and "solve() returned" in str(msg.get("message")) else "exception")
                return SolveOutcome(None, kind, f"{msg.get('type')}: {msg.get('message')}",
                                    output_tail=self._tail.take(settle_s=1.0), traceback=str(msg.get("traceback", "")),
                                    model_seconds=model_seconds)
            else:
                self.close()
                return SolveOutcome(None, "crash", f"harness broke the protocol: {msg.get('message', '')}",
                                    output_tail=self._tail.take(), model_seconds=model_seconds)

    def _died(self, model_seconds: float = 0.0) -> SolveOutcome:
        code = self._proc.wait(timeout=5) if self._proc.poll() is None else self._proc.returncode
        self.close()
        tail = self._tail.take()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            kind = "timeout" if sig == "SIGXCPU" else ("memory" if sig in ("SIGKILL", "SIGSEGV") and "MemoryError" in tail else "crash")
            return SolveOutcome(None, kind, f"harness process killed by {sig}", output_tail=tail,
                                model_seconds=model_seconds)
        kind = "memory" if "MemoryError" in tail else "crash"
        return SolveOutcome(None, kind, f"harness process exited with code {code}", output_tail=tail,
                            model_seconds=model_seconds)

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the whole group: children it forked too
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait(timeout=5)
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
        try:
            self._sel.close()
        except (OSError, ValueError, KeyError):
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)


class WorkerPool:
    """Workers for one harness version; a thread borrows one, a failed worker is replaced."""

    def __init__(self, files: dict[str, str], limits: SandboxLimits) -> None:
        self.files = files
        self.limits = limits
        self._idle: list[HarnessWorker] = []
        self._lock = threading.Lock()
        self._load_error: SolveOutcome | None = None

    def solve(self, task: dict[str, Any], on_generate: ModelHandler) -> SolveOutcome:
        if self._load_error is not None:
            return self._load_error
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or not worker.alive:
            worker = HarnessWorker(self.files, self.limits)
            if worker.load_error is not None:
                self._load_error = worker.load_error
                return worker.load_error
        outcome = worker.solve(task, on_generate)
        if worker.alive:
            with self._lock:
                self._idle.append(worker)
        return outcome

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.close()

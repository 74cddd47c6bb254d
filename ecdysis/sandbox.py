"""Runs harness code isolated from the engine: a separate process per worker with memory, file
size, CPU and process limits, a wall-clock timeout per instance, a scrubbed environment and a temp
folder. Model calls come back to the engine over the pipe, so the harness holds no key and no database.

Where bubblewrap works (`bwrap`, Debian package `bubblewrap`), each worker also runs in its own
mount, PID, network, IPC and UTS namespaces: only the system and Python folders are visible
(read-only), the data folder is not mounted at all, /tmp and HOME are a private tmpfs, the harness
folder is the only writable host folder, there is no network (not even the host's loopback), and an
engine running as root runs harness code as an unprivileged uid of its own, so the process limit
holds. `isolation()` says which boundary this machine gets; without bwrap it is a plain child process
(rlimits and a scrubbed environment only), recorded as a note on every run.

A harness that raises, hangs, exhausts memory, forks or dies costs one failed instance, never the run.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import secrets
import select
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
from typing import Any, Callable, Literal

from ecdysis.errors import ConfigError
from ecdysis.harness import write_dir
from ecdysis.harness_runtime import OUTPUT_MARK

RUNTIME = Path(__file__).resolve().parent / "harness_runtime.py"
log = logging.getLogger("ecdysis.sandbox")

# Inside the bwrap sandbox: where the runtime, the worker folder and HOME are.
BOX_RUNTIME = "/opt/ecdysis/harness_runtime.py"
BOX_WORK = "/sandbox"
BOX_HOME = "/tmp"
# A root engine runs each worker's harness code as its own uid from this range (no passwd entry
# needed), so RLIMIT_NPROC, which the kernel never enforces for root, counts one worker's processes.
SANDBOX_UID_BASE = 1_600_000_000
SANDBOX_UID_SPAN = 1 << 24
# The few files of /etc that Python and the C library read; the rest of /etc stays out.
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120.0   # harness time per instance, not counting time spent in model calls
    memory_mb: int = 1024
    file_mb: int = 16
    cpu_s: int = 3600          # per worker process, a backstop behind the wall-clock timeout
    output_tail: int = 4000    # characters of what the harness printed that are kept
    processes: int = 32        # RLIMIT_NPROC of the harness (threads count too): stops a fork bomb
    tmp_mb: int = 64           # size of the private /tmp (and HOME) tmpfs under bwrap
    isolation: str | None = None  # auto | bwrap | process; None: the ECDYSIS_SANDBOX setting


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


# ---------------------------------------------------------------- the boundary on this machine

@dataclass(frozen=True)
class Isolation:
    """How harness processes are contained here: `bwrap` (namespaces, see the module docstring)
    or `process` (a plain child process: rlimits and a scrubbed environment only). `note` says
    why, for the run record and the logs."""

    mode: Literal["bwrap", "process"]
    note: str
    drop_uid: bool = False   # a root engine: harness code runs as a uid of its own

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "note": self.note, "unprivileged_uid": self.drop_uid}


_probed: dict[str, Isolation] = {}
_probe_lock = threading.Lock()


def isolation(requested: str | None = None) -> Isolation:
    """The boundary harness workers get, probed once per process: `auto` (default) uses bwrap
    when it works here and falls back with a note; `bwrap` insists (ConfigError otherwise);
    `process` never uses it."""
    if requested is None:
        from ecdysis.settings import Settings
        requested = Settings.from_env().sandbox
    if requested not in ("auto", "bwrap", "process"):
        raise ConfigError(f"unknown sandbox mode {requested!r}", hint="set ECDYSIS_SANDBOX to auto, bwrap or process")
    if requested == "process":
        return Isolation("process", "ECDYSIS_SANDBOX=process: harness code runs as a plain child process "
                                    "(rlimits and a scrubbed environment; no filesystem or network boundary)")
    with _probe_lock:
        if "bwrap" not in _probed:
            _probed["bwrap"] = _probe_bwrap()
        found = _probed["bwrap"]
    if requested == "bwrap" and found.mode != "bwrap":
        raise ConfigError(f"the bwrap sandbox is not available: {found.note}",
                          hint="apt-get install bubblewrap, or set ECDYSIS_SANDBOX=auto")
    return found


def _probe_bwrap() -> Isolation:
    fallback = ("harness code runs as a plain child process (rlimits and a scrubbed environment; no "
                "filesystem or network boundary)")
    if shutil.which("bwrap") is None:
        note = f"bubblewrap is not installed (apt-get install bubblewrap): {fallback}"
        log.warning(note)
        return Isolation("process", note)
    drop = os.geteuid() == 0
    work = Path(tempfile.mkdtemp(prefix="ecdysis-probe-"))
    try:
        uid = _sandbox_uid() if drop else None
        if uid is not None:
            os.chown(work, uid, uid)
        cmd = _bwrap_argv(work, SandboxLimits(), uid) + ["--probe"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                                  env=scrubbed_env(BOX_HOME))
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = subprocess.CompletedProcess(cmd, 1, "", str(exc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    expected = {"ok": True, "uid": uid} if uid is not None else {"ok": True}
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        reply = {}
    if done.returncode != 0 or any(reply.get(k) != v for k, v in expected.items()):
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
        note = f"bubblewrap cannot create the sandbox here ({why}): {fallback}"
        log.warning(note)
        return Isolation("process", note)
    who = "an unprivileged uid of its own per worker" if drop else "the engine's uid in a user namespace"
    return Isolation("bwrap", f"bubblewrap: private mount, PID, network, IPC and UTS namespaces; system and "
                              f"Python folders read-only, the data folder not mounted, private /tmp; harness "
                              f"code runs as {who}", drop_uid=drop)


def _sandbox_uid() -> int:
    # Random, not counted: two engine processes (the CLI and the app) must not hand out the same uid.
    return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)


def _python_dirs() -> list[Path]:
    """The folders the interpreter needs (the venv and the Python it was made from)."""
    dirs: list[Path] = []
    for raw in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                str(Path(os.path.realpath(sys.executable)).parent.parent)):
        path = Path(raw).resolve()
        if path == Path("/") or path == Path("/usr") or any(path.is_relative_to(d) for d in dirs):
            continue
        dirs = [d for d in dirs if not d.is_relative_to(path)] + [path]
    return dirs


def _hidden_dirs() -> list[Path]:
    """What must stay invisible even if it lies inside a mounted folder: the data folder and the
    folder of the SQLite database."""
    from ecdysis.settings import Settings
    settings = Settings.from_env()
    hidden = [settings.home]
    if settings.database_url.startswith("sqlite:///"):
        hidden.append(Path(settings.database_url[len("sqlite:///"):]).expanduser().resolve().parent)
    return [h.resolve() for h in hidden]


def _bwrap_argv(work: Path, limits: SandboxLimits, uid: int | None) -> list[str]:
    """The bwrap command line for one worker whose folder is `work` (mounted at /sandbox)."""
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if uid is not None:
        # Privileged bwrap (the engine is root): the runtime needs these two capabilities once, to
        # become `uid`; they are gone from then on (a uid change clears them; no_new_privs is set).
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    # The private /tmp comes before the Python folders: a checkout (and its venv) under /tmp must
    # be bound on top of it, not hidden by it.
    argv += ["--perms", "1777", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    for name in ETC_FILES:
        argv += ["--ro-bind-try", name, name]
    mounted = [Path("/usr")]
    for folder in _python_dirs():
        if not folder.is_relative_to("/usr"):
            # bwrap would create the parents of a mount point as 0700 root; the harness's uid must
            # be able to walk through them.
            for parent in reversed(folder.parents[:-1]):
                argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", str(folder), str(folder)]
            mounted.append(folder)
    for hidden in _hidden_dirs():
        if hidden.is_dir() and any(hidden.is_relative_to(m) for m in mounted):
            argv += ["--tmpfs", str(hidden)]  # mounted over: the data folder shows as empty
    argv += ["--perms", "0755", "--dir", str(Path(BOX_RUNTIME).parent),
             "--ro-bind", str(RUNTIME), BOX_RUNTIME, "--proc", "/proc", "--dev", "/dev",
             "--bind", str(work), BOX_WORK, "--remount-ro", "/", "--chdir", BOX_WORK,
             "--", sys.executable, "-I", BOX_RUNTIME, "--harness", f"{BOX_WORK}/harness",
             "--memory-mb", str(limits.memory_mb), "--file-mb", str(limits.file_mb),
             "--cpu-s", str(limits.cpu_s), "--nproc", str(limits.processes)]
    if uid is not None:
        argv += ["--uid", str(uid)]
    return argv


def _chown_tree(root: Path, uid: int) -> None:
    for dirpath, _dirs, names in os.walk(root):
        os.chown(dirpath, uid, uid)
        for name in names:
            os.chown(os.path.join(dirpath, name), uid, uid)


class _Output:
    """The last `limit` characters a worker printed (its stderr), fed by the thread that is talking
    to the worker, so a harness that prints megabytes can neither block on a full pipe nor fill
    the engine's memory. `marked` says the runtime's end-of-output mark, which it writes after
    flushing and before each answer, has arrived since the last `take`."""

    def __init__(self, limit: int) -> None:
        self._buf: deque[str] = deque()
        self._size = 0
        self._limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._carry = ""  # the end of the text before, for a mark split across two reads
        self.marked = False

    def add(self, chunk: bytes, *, final: bool = False) -> None:
        text = self._decoder.decode(chunk, final)
        if not text:
            return
        if OUTPUT_MARK in self._carry + text:
            self.marked = True
        self._carry = text[-len(OUTPUT_MARK):]
        self._buf.append(text)
        self._size += len(text)
        while self._size > 2 * self._limit and len(self._buf) > 1:
            self._size -= len(self._buf.popleft())

    def take(self) -> str:
        text = "".join(self._buf).replace(OUTPUT_MARK, "")[-self._limit:]
        self._buf.clear()
        self._size = 0
        self.marked = False
        return text


class HarnessWorker:
    """One sandboxed process serving one harness version, reused across instances until it fails."""

    def __init__(self, files: dict[str, str], limits: SandboxLimits) -> None:
        self.limits = limits
        self.isolation = isolation(limits.isolation)
        self._tmp = Path(tempfile.mkdtemp(prefix="ecdysis-h-"))
        self._dir = write_dir(files, self._tmp / "harness")
        self.load_error: SolveOutcome | None = None
        if self.isolation.mode == "bwrap":
            uid = _sandbox_uid() if self.isolation.drop_uid else None
            if uid is not None:
                _chown_tree(self._tmp, uid)  # the worker folder is the one place it may write
            cmd = _bwrap_argv(self._tmp, limits, uid) + ["--serve"]
            env = scrubbed_env(BOX_HOME)
        else:
            # No RLIMIT_NPROC here: outside a namespace it would count every process of the
            # engine's user (and root is exempt anyway), so it limits the wrong thing.
            cmd = [sys.executable, "-I", str(RUNTIME), "--serve", "--harness", str(self._dir),
                   "--memory-mb", str(limits.memory_mb), "--file-mb", str(limits.file_mb),
                   "--cpu-s", str(limits.cpu_s)]
            env = scrubbed_env(str(self._tmp))
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, cwd=self._tmp, env=env,
                                      start_new_session=True)
        # Both pipes are read by whichever thread is talking to the worker, in one select loop:
        # no thread per worker, and no waiting for one to catch up with the output.
        self._output = _Output(limits.output_tail)
        self._out_fd = self._proc.stdout.fileno()  # type: ignore[union-attr]
        self._err_fd: int | None = self._proc.stderr.fileno()  # type: ignore[union-attr]
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
        return self.load_error is None and self._proc.poll() is None

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
            self._proc.stdin.write((json.dumps(obj) + "\n").encode())  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
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
                    self._kill()
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
        code = self._proc.wait(timeout=5) if self._proc.poll() is None else self._proc.returncode
        tail = self._drain_output(wait_s=1.0)  # to EOF: the last lines it printed before dying
        self.close()
        if self.isolation.mode == "bwrap" and code is not None and code > 128:
            code = -(code - 128)  # bwrap reports its child's fatal signal as 128 + signal
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            kind = "timeout" if sig == "SIGXCPU" else ("memory" if sig in ("SIGKILL", "SIGSEGV") and "MemoryError" in tail else "crash")
            return SolveOutcome(None, kind, f"harness process killed by {sig}", output_tail=tail,
                                model_seconds=model_seconds)
        kind = "memory" if "MemoryError" in tail else "crash"
        return SolveOutcome(None, kind, f"harness process exited with code {code}", output_tail=tail,
                            model_seconds=model_seconds)

    def _kill(self) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the whole group: children it forked too
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait(timeout=5)

    def close(self) -> None:
        self._kill()
        self._err_fd = None
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
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
        # Starting a worker is CPU-bound: 64 threads starting theirs at once all finish late,
        # while a core's worth at a time lets the first instances start after one start-up.
        self._starting = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))

    def solve(self, task: dict[str, Any], on_generate: ModelHandler) -> SolveOutcome:
        if self._load_error is not None:
            return self._load_error
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or not worker.alive:
            with self._starting:
                if self._load_error is not None:
                    return self._load_error
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

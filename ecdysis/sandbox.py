"""Runs harness code isolated from the engine: a separate process per worker with memory, file
size, CPU and process limits, a wall-clock timeout per instance, a scrubbed environment and a temp
folder. Model calls come back to the engine over the pipe, so the harness holds no key and no database.

Where bubblewrap works (`bwrap`, Debian package `bubblewrap`), each worker also runs in its own
mount, PID, network, IPC and UTS namespaces: only the system and Python folders are visible
(read-only), and the source of BFCL's multi-turn environments when fetched (read-only: harnesses
run calls in them); the data folder is not mounted at all, /tmp and HOME are a private tmpfs, the
harness folder is the only writable host folder, there is no network (not even the host's loopback), and an
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
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

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
        limits = SandboxLimits()
        cmd = _bwrap_argv(work, limits, uid, [
            "--probe", "--memory-mb", str(limits.memory_mb), "--file-mb", str(limits.file_mb),
            "--cpu-s", str(limits.cpu_s), "--nproc", str(limits.processes),
            *(["--uid", str(uid)] if uid is not None else [])])
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


def _shared_dirs() -> list[Path]:
    """Public folders harness code may read besides the Python ones: the source of BFCL's
    multi-turn environments, when fetched (a multi-turn harness runs the agent's calls in them;
    the possible answers beside them are not mounted)."""
    from ecdysis.suites.bfcl_multi_turn import env_source_dir
    folder = env_source_dir().resolve()
    return [folder] if folder.is_dir() else []


def _hidden_dirs() -> list[Path]:
    """What must stay invisible even if it lies inside a mounted folder: the data folder and the
    folder of the SQLite database."""
    from ecdysis.settings import Settings
    settings = Settings.from_env()
    hidden = [settings.home]
    if settings.database_url.startswith("sqlite:///"):
        hidden.append(Path(settings.database_url[len("sqlite:///"):]).expanduser().resolve().parent)
    return [h.resolve() for h in hidden]


def _bwrap_argv(work: Path, limits: SandboxLimits, uid: int | None, runtime_args: Sequence[str]) -> list[str]:
    """The bwrap command line for the runtime with `runtime_args`, in a sandbox whose one writable
    host folder is `work` (mounted at /sandbox). `uid`: the engine is root and the runtime may
    change to unprivileged uids."""
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
    hidden_dirs = _hidden_dirs()
    for folder in _shared_dirs():
        # Never a folder inside the data folder (or holding it): that stays invisible whatever it holds.
        if any(folder.is_relative_to(m) for m in mounted) or any(
                folder.is_relative_to(h) or h.is_relative_to(folder) for h in hidden_dirs):
            continue
        for parent in reversed(folder.parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", str(folder), str(folder)]
    for hidden in hidden_dirs:
        if hidden.is_dir() and any(hidden.is_relative_to(m) for m in mounted):
            argv += ["--tmpfs", str(hidden)]  # mounted over: the data folder shows as empty
    argv += ["--perms", "0755", "--dir", str(Path(BOX_RUNTIME).parent),
             "--ro-bind", str(RUNTIME), BOX_RUNTIME, "--proc", "/proc", "--dev", "/dev",
             "--bind", str(work), BOX_WORK, "--remount-ro", "/", "--chdir", BOX_WORK,
             "--", sys.executable, "-I", "-S", BOX_RUNTIME]
    return argv + list(runtime_args)


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
        # Drop whole old reads only while the rest still holds the last `limit` characters: a read
        # of only the mark after a big one must not leave the tail empty.
        while self._size - len(self._buf[0]) >= self._limit:
            self._size -= len(self._buf.popleft())

    def take(self) -> str:
        text = "".join(self._buf).replace(OUTPUT_MARK, "")[-self._limit:]
        self._buf.clear()
        self._size = 0
        self.marked = False
        return text


class Zygote:
    """The fork server of one pool (`harness_runtime.zygote`): one sandbox (one bwrap, or one
    plain process) holding an interpreter with the runtime loaded, from which every worker of the
    pool is forked. An interpreter start costs about 100 ms of CPU; at concurrency 32 on two cores
    that kept the last slots of a batch waiting over a second for their first instance. A fork
    costs a few milliseconds.

    Inside one pool's sandbox, each worker still has its own folder (mode 0700), its own session
    and limits and, when the engine is root, its own uid: workers cannot read, signal or trace
    each other, and a fork bomb hits only its own uid's process limit. What they share is the
    pool's PID namespace (they can see that siblings exist), its private /tmp, and the harness
    version they all run.

    The zygote is started and kept by a thread of its own: PR_SET_PDEATHSIG and bwrap's
    --die-with-parent follow the thread that started a process, so no caller's thread may own it.
    Thread-safe: requests are serialised on the control socket."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.isolation = isolation(limits.isolation)
        self.boxed = self.isolation.mode == "bwrap"  # False: a plain process, no namespaces
        self.root = Path(tempfile.mkdtemp(prefix="ecdysis-pool-"))
        os.chmod(self.root, 0o755)
        self.uid_range = self.boxed and self.isolation.drop_uid
        self._lock = threading.Lock()
        self._count = 0
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ctl = ours
        args = ["--zygote", "--control-fd", str(theirs.fileno())]
        if self.uid_range:
            args += ["--uid-min", str(SANDBOX_UID_BASE)]
        if self.boxed:
            cmd = _bwrap_argv(self.root, limits, SANDBOX_UID_BASE if self.uid_range else None, args)
            env = scrubbed_env(BOX_HOME)
        else:
            cmd = [sys.executable, "-I", "-S", str(RUNTIME), *args]
            env = scrubbed_env(str(self.root))
        started: list[subprocess.Popen[bytes] | BaseException] = []
        self._release = threading.Event()
        ready = threading.Event()

        def keep() -> None:
            try:
                started.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.PIPE, cwd=self.root, env=env,
                                                pass_fds=[theirs.fileno()], start_new_session=True))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                started.append(exc)
            ready.set()
            self._release.wait()

        self._keeper = threading.Thread(target=keep, name="ecd-zygote", daemon=True)
        self._keeper.start()
        ready.wait()
        theirs.close()
        if isinstance(started[0], BaseException):
            self._cleanup()
            raise ConfigError(f"the harness sandbox could not start: {started[0]}")
        self._proc = started[0]
        hello = self._recv(timeout_s=30.0)
        if hello is None or hello.get("op") != "ready":
            why = self._stderr_tail() or "no answer from the sandbox's fork server"
            self.close()
            raise ConfigError(f"the harness sandbox could not start: {why}")

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def box_path(self, host: Path) -> str:
        """Where a host path under `root` appears to the workers."""
        return f"{BOX_WORK}/{host.relative_to(self.root)}" if self.boxed else str(host)

    def new_folder(self, files: dict[str, str]) -> tuple[Path, int | None]:
        """A worker's own folder holding the harness, and the uid it will run as."""
        with self._lock:
            self._count += 1
            folder = self.root / f"w{self._count}"
        write_dir(files, folder / "harness")
        uid = _sandbox_uid() if self.uid_range else None
        if uid is not None:
            _chown_tree(folder, uid)  # the worker's folder is the one place it may write
        os.chmod(folder, 0o700)
        return folder, uid

    def spawn(self, folder: Path, uid: int | None) -> tuple[int, int, int, int]:
        """A worker forked into `folder`: (its pid in the sandbox, and the engine's ends of its
        stdin, stdout and stderr)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        mine = (stdin_w, stdout_r, stderr_r)
        box = self.box_path(folder)
        limits = self.limits
        request = {"op": "spawn", "cwd": box, "harness": f"{box}/harness", "uid": uid,
                   "home": BOX_HOME if self.boxed else str(folder),
                   "memory_mb": limits.memory_mb, "file_mb": limits.file_mb, "cpu_s": limits.cpu_s,
                   # Outside a namespace RLIMIT_NPROC would count every process of the engine's
                   # user (and root is exempt), so it limits the wrong thing there.
                   "nproc": limits.processes if self.boxed else 0}
        try:
            reply = self._call(request, fds=[stdin_r, stdout_w, stderr_w])
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        if reply is None or not reply.get("ok"):
            for fd in mine:
                os.close(fd)
            raise ConfigError("the harness sandbox could not start a worker: "
                              + (reply.get("message", "") if reply else self._stderr_tail() or "its fork server is gone"))
        return int(reply["pid"]), *mine

    def end(self, pid: int, *, grace_s: float = 0.0) -> int | None:
        """Retire a worker: its exit code (negative: the signal that killed it), after waiting
        `grace_s` for it to exit by itself, then SIGKILL for it and all it left running."""
        reply = self._call({"op": "end", "pid": pid, "grace_s": grace_s})
        return int(reply["code"]) if reply and reply.get("ok") else None

    def _call(self, request: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any] | None:
        with self._lock:
            if self._proc.poll() is not None:
                return None
            try:
                socket.send_fds(self._ctl, [json.dumps(request).encode()], list(fds))
            except OSError:
                return None
            return self._recv(timeout_s=60.0)

    def _recv(self, timeout_s: float) -> dict[str, Any] | None:
        self._ctl.settimeout(timeout_s)
        try:
            data = self._ctl.recv(1 << 16)
        except OSError:
            return None
        try:
            msg = json.loads(data) if data else None
        except json.JSONDecodeError:
            return None
        return msg if isinstance(msg, dict) else None

    def _stderr_tail(self) -> str:
        stream = getattr(self, "_proc", None) and self._proc.stderr
        if not stream or self._proc.poll() is None:
            return ""
        try:
            return stream.read(65536).decode("utf-8", "replace").strip().splitlines()[-1][:300]
        except (OSError, ValueError, IndexError):
            return ""

    def close(self) -> None:
        """Every worker of the pool ends with it: under bwrap the whole PID namespace goes with
        bwrap; a plain zygote ends its workers itself on EOF (and is killed if it lingers)."""
        try:
            self._ctl.close()
        except OSError:
            pass
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            if self.boxed:
                _killpg(proc)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _killpg(proc)
                proc.wait(timeout=5)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        self._cleanup()

    def _cleanup(self) -> None:
        self._release.set()
        shutil.rmtree(self.root, ignore_errors=True)


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait(timeout=5)


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
        self._output = _Output(limits.output_tail)
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

"""The zygote: one fork server per pool inside the box, from which each worker is forked with the
harness already imported, and the bounded capture of what a worker prints."""

from __future__ import annotations

import codecs
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any, Sequence

from ecdysis.errors import ConfigError
from ecdysis.harness import write_dir
from ecdysis.sandbox.boundary import bwrap_argv, chown_tree, isolation, sandbox_uid
from ecdysis.sandbox.harness_box import OUTPUT_MARK
from ecdysis.sandbox.limits import BOX_HOME, BOX_WORK, HARNESS_BOX, RUNTIME, SANDBOX_UID_BASE, SandboxLimits, scrubbed_env

log = logging.getLogger("ecdysis.sandbox")

class OutputTail:
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
    """The fork server of one pool (`harness_box.zygote`): one sandbox (one bwrap, or one
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
            cmd = bwrap_argv(self.root, limits, SANDBOX_UID_BASE if self.uid_range else None, args)
            env = scrubbed_env(BOX_HOME)
        else:
            cmd = [sys.executable, "-I", "-S", str(HARNESS_BOX), "--runtime", str(RUNTIME), *args]
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
        uid = sandbox_uid() if self.uid_range else None
        if uid is not None:
            chown_tree(folder, uid)  # the worker's folder is the one place it may write
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

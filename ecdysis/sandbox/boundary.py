"""The boundary harness workers get on this machine: bubblewrap where it works (probed once per
process), else a plain child process, and the bwrap command line that builds the box."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from ecdysis.errors import ConfigError
from ecdysis.sandbox.limits import (BOX_HARNESS_BOX, BOX_HOME, BOX_RUNTIME, BOX_WORK, ETC_FILES, HARNESS_BOX, RUNTIME,
                                    SANDBOX_UID_BASE, SANDBOX_UID_SPAN, SandboxLimits, scrubbed_env)

log = logging.getLogger("ecdysis.sandbox")

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
        uid = sandbox_uid() if drop else None
        if uid is not None:
            os.chown(work, uid, uid)
        limits = SandboxLimits()
        cmd = bwrap_argv(work, limits, uid, [
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


def sandbox_uid() -> int:
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


def bwrap_argv(work: Path, limits: SandboxLimits, uid: int | None, runtime_args: Sequence[str]) -> list[str]:
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
             "--ro-bind", str(RUNTIME), BOX_RUNTIME, "--ro-bind", str(HARNESS_BOX), BOX_HARNESS_BOX,
             "--proc", "/proc", "--dev", "/dev",
             "--bind", str(work), BOX_WORK, "--remount-ro", "/", "--chdir", BOX_WORK,
             "--", sys.executable, "-I", "-S", BOX_HARNESS_BOX, "--runtime", BOX_RUNTIME]
    return argv + list(runtime_args)


def chown_tree(root: Path, uid: int) -> None:
    for dirpath, _dirs, names in os.walk(root):
        os.chown(dirpath, uid, uid)
        for name in names:
            os.chown(os.path.join(dirpath, name), uid, uid)

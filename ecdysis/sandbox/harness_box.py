"""The sandbox side of the harness runtime: what runs inside the box and nowhere else.

The engine starts this file as `python -I -S harness_box.py --runtime PATH --zygote ...` (in
bubblewrap, both files mounted read-only under /opt/ecdysis; without it, from the package). It loads the
harness API (`ecdysis/harness_runtime.py`, which is also an exported zip's `run.py`) from PATH, so
harness code can `import harness_runtime`, and then:

- `--zygote`: the fork server of one worker pool. Each worker serves tasks as JSON lines on its
  stdin; model calls go back to the engine over the same pipe (`_PipeModel`).
- `--probe`: the engine's one-time check that the box starts and the uid change works.

Standard library only, and no engine imports: inside the box there is no engine to import.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

_rt: Any = None  # the harness API module, loaded by `use_runtime`


def use_runtime(path: str | Path) -> Any:
    """Load the harness API from `path` as the module `harness_runtime`, once."""
    global _rt
    if _rt is None:
        spec = importlib.util.spec_from_file_location("harness_runtime", str(path))
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the harness runtime from {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["harness_runtime"] = module
        spec.loader.exec_module(module)
        _rt = module
    return _rt


# ---------------------------------------------------------------- a worker

class _PipeModel:
    """Model proxy: each call is one request/response on the engine pipe."""

    def __init__(self, rpc_in: Any, rpc_out: Any) -> None:
        self._in = rpc_in
        self._out = rpc_out

    def generate(self, messages: list[dict[str, str]], *, temperature: float = 0.0,
                 max_tokens: int = 256, stop: list[str] | None = None, seed: int = 0,
                 schema: dict[str, Any] | None = None) -> _rt.Reply:
        """The model's reply to `messages`. With `schema` (a JSON schema object) the reply is JSON
        of that shape where the backend can constrain its output (a grammar for the embedded
        models, structured output for API backends); the engine refuses a schema that is not a
        bounded JSON object, and the harness gets ModelCallError."""
        request = {"messages": _messages(messages), "temperature": float(temperature),
                   "max_tokens": int(max_tokens), "stop": list(stop or []), "seed": int(seed)}
        if schema is not None:
            request["json_schema"] = schema
        reply = self._call(request)
        return _rt.Reply(text=reply.get("text", ""), finish_reason=reply.get("finish_reason", "stop"),
                     prompt_tokens=reply.get("prompt_tokens", 0),
                     completion_tokens=reply.get("completion_tokens", 0))

    def score(self, messages: list[dict[str, str]], options: list[str]) -> _rt.Scores:
        """How likely the model finds each option as its whole reply to `messages`, without
        generating. Raises ModelCallError where the backend cannot score (remote chat APIs give no
        log-probabilities of a given text): a harness then generates instead."""
        if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
            raise TypeError("options must be a list of strings")
        reply = self._call({"messages": _messages(messages), "options": list(options)})
        logprobs, tokens = reply.get("option_logprobs"), reply.get("option_tokens")
        if not isinstance(logprobs, list) or len(logprobs) != len(options):
            raise _rt.ModelCallError("the engine returned no scores for the options")
        if not isinstance(tokens, list) or len(tokens) != len(options):
            tokens = [1] * len(options)
        return _rt.Scores(list(options), [float(x) for x in logprobs], [int(n) for n in tokens])

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        _send(self._out, {"op": "generate", "request": request})
        line = self._in.readline()
        if not line:
            raise _rt.ModelCallError("engine closed the pipe")
        reply = json.loads(line)
        if reply.get("op") == "model_error":
            raise _rt.ModelCallError(reply.get("message", "model call failed"))
        return dict(reply)


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    return [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in messages]


OUTPUT_MARK = "\x00ecdysis-end\x00"
_OWNER_PID = os.getpid()


def _send(out: Any, obj: dict[str, Any]) -> None:
    if os.getpid() != _OWNER_PID:
        # A process the harness forked came back out of solve(): it must never speak the protocol
        # (the engine would take its reply for the next instance's), so it ends here, silently.
        os._exit(0)
    if obj.get("op") in ("result", "error"):
        # Everything the harness printed reaches stderr before the engine reads the result, and
        # the mark tells the engine it has all of it.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.write(2, OUTPUT_MARK.encode())
    out.write(json.dumps(obj) + "\n")
    out.flush()


def apply_limits(memory_mb: int, file_mb: int, cpu_s: int, nproc: int = 0, uid: int | None = None) -> None:
    """Soft and hard limits for this process, set before any harness code is loaded; then, when
    the engine gave a uid (it runs as root), become that uid for good. Fails closed: if the uid
    cannot be taken, this raises and no harness code runs."""
    import resource
    for limit, value in ((resource.RLIMIT_AS, memory_mb * 1024 * 1024),
                         (resource.RLIMIT_FSIZE, file_mb * 1024 * 1024),
                         (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_CORE, 0)):
        if value > 0:
            try:
                resource.setrlimit(limit, (value, value))
            except (ValueError, OSError):
                pass
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of harness code stay our children, so we see them
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
            raise PermissionError(f"could not become uid {uid}")
    _prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL (after the uid change, which clears it): die with the engine


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass  # not Linux: the limits above still hold


def stray_count() -> int:
    """Processes and threads harness code left running. Exited children are reaped first; as the
    subreaper we are the parent of every orphan too, so "no child left" means none is running."""
    import threading
    alive = False
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            alive = True
            break
    threads = threading.active_count() - 1
    return threads + (max(1, _count_children()) if alive else 0)


def _count_children() -> int:
    return len(_children_by_parent().get(os.getpid(), []))


def _children_by_parent() -> dict[int, list[int]]:
    """Every process this PID namespace shows, grouped by its parent's pid (from /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    # field 4, the ppid, after "(comm)", which may itself hold spaces and ")"
                    ppid = int(fh.read().decode("ascii", "replace").rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def serve(folder: Path) -> int:
    # The RPC channel is a private copy of stdout; fd 1 then points at stderr, so whatever the
    # harness prints can never corrupt the protocol.
    rpc_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    rpc_in = sys.stdin
    try:
        solve = _rt.load_solve(folder)
        harness = _rt.Harness(folder)
    except BaseException as exc:  # a harness that does not load fails every instance, cleanly
        _send(rpc_out, {"op": "ready", "ok": False, "type": type(exc).__name__,
                        "message": str(exc)[:2000], "traceback": traceback.format_exc()[-4000:]})
        return 1
    _send(rpc_out, {"op": "ready", "ok": True})
    model = _PipeModel(rpc_in, rpc_out)
    for line in rpc_in:
        msg = json.loads(line)
        if msg.get("op") != "solve":
            continue
        try:
            answer = _rt.normalize_answer(solve(msg["task"], model, harness))
            reply: dict[str, Any] = {"op": "result", "answer": answer}
        except MemoryError as exc:
            reply = {"op": "error", "type": "MemoryError", "message": str(exc)[:2000], "traceback": ""}
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit from harness code is that instance's failure
            reply = {"op": "error", "type": type(exc).__name__, "message": str(exc)[:2000],
                     "traceback": traceback.format_exc()[-4000:]}
        try:
            reply["stray"] = stray_count()
        except BaseException:  # noqa: BLE001 - even the census failing must not lose the answer
            reply["stray"] = 1
        _send(rpc_out, reply)
    return 0


# ---------------------------------------------------------------- zygote mode

def zygote(control_fd: int, uid_min: int | None) -> int:
    """`--zygote`: the engine's fork server for one pool of workers, in the pool's sandbox.

    It imports what a worker needs once, and never loads harness code itself. Each `spawn` request
    on the control socket (a Unix SOCK_SEQPACKET socket, one JSON message each, carrying the
    worker's three pipe ends) forks a worker: the worker takes the pipes as its stdin, stdout and
    stderr, closes every other descriptor (the control socket first of all), starts a session of
    its own, applies the limits, becomes its own uid and serves (`serve`). A worker then costs a
    fork instead of an interpreter start: milliseconds instead of about 100 ms of CPU, for every
    slot of a batch. `end` retires a worker: its exit status, after a grace period for it to
    exit by itself, then SIGKILL for it and for everything it left (every process of its uid,
    or its descendants and its process group). EOF on the control socket ends them all.

    `uid_min`: a root engine's zygote forks workers only with a uid of at least this."""
    import socket
    import time

    import ctypes  # noqa: F401 - preloaded: apply_limits needs them in every worker
    import resource  # noqa: F401
    import threading  # noqa: F401

    _site_packages()
    _prctl(36, 1)  # subreaper: the orphans of retired workers come here to be reaped
    _prctl(1, 9)   # die with the engine (outside bwrap; inside, bwrap's --die-with-parent does it)
    ctl = socket.socket(fileno=control_fd)
    import gc
    gc.collect()
    gc.freeze()  # what is loaded now is never scanned again: fewer pages copied into each fork
    ctl.send(json.dumps({"op": "ready", "pid": os.getpid()}).encode())
    while True:
        _reap()
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 3)
        except OSError:
            break
        if not data:
            break  # the engine closed the pool, or is gone
        try:
            req = json.loads(data)
            if req.get("op") == "spawn":
                reply = _spawn(req, fds, uid_min)
            elif req.get("op") == "end":
                reply = _end(int(req["pid"]), float(req.get("grace_s", 0.0)))
            else:
                reply = {"ok": False, "message": f"unknown op {req.get('op')!r}"}
        except Exception as exc:  # noqa: BLE001 - a bad request must not end the pool
            reply = {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            ctl.send(json.dumps(reply).encode())
        except OSError:
            break
    for pid in list(_WORKERS):
        _end(pid, 0.0)
    return 0


def _site_packages() -> None:
    """The engine starts the runtime with -S (no `site`: 18 of its 60 ms of start-up go to .pth
    files); the environment's site-packages folders go on the path anyway, so harness code can
    import what is installed there. Only .pth hooks (editable installs) are not run."""
    if not sys.flags.no_site:
        return
    import site
    for folder in site.getsitepackages():
        if folder not in sys.path and os.path.isdir(folder):
            sys.path.append(folder)


_WORKERS: dict[int, int | None] = {}   # the zygote's live workers: pid -> uid
_EXITED: dict[int, int] = {}           # reaped workers' wait statuses, until `end` asks


def _spawn(req: dict[str, Any], fds: list[int], uid_min: int | None) -> dict[str, Any]:
    if len(fds) != 3:
        raise ValueError(f"spawn needs 3 descriptors, got {len(fds)}")
    uid = req.get("uid")
    uid = None if uid is None else int(uid)
    if uid_min is not None and (uid is None or uid < uid_min):
        raise PermissionError(f"a worker here must run as a uid of at least {uid_min}")
    limits = [int(req.get(k, 0)) for k in ("memory_mb", "file_mb", "cpu_s", "nproc")]
    pid = os.fork()
    if pid == 0:  # the worker
        code = 70
        try:
            global _OWNER_PID
            _OWNER_PID = os.getpid()
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for entry in os.listdir("/proc/self/fd"):
                if int(entry) > 2:
                    try:
                        os.close(int(entry))
                    except OSError:
                        pass
            os.chdir(req["cwd"])
            if req.get("home"):
                os.environ["HOME"] = str(req["home"])
            os.umask(0o077)
            apply_limits(*limits, uid=uid)
            code = serve(Path(req["harness"]))
        except BaseException:  # noqa: BLE001 - reported on the worker's own stderr
            try:
                traceback.print_exc()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(code)
    _WORKERS[pid] = uid
    return {"ok": True, "pid": pid}


def _end(pid: int, grace_s: float) -> dict[str, Any]:
    import time
    if pid not in _WORKERS:
        return {"ok": False, "message": f"no worker {pid}"}
    uid = _WORKERS[pid]
    deadline = time.monotonic() + grace_s
    killed = False
    while pid not in _EXITED:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            _EXITED[pid] = status
        elif killed:
            time.sleep(0.001)
        elif time.monotonic() >= deadline:
            _kill_worker(pid, uid)  # reaps it too, as a rule
            killed = True
        else:
            time.sleep(0.005)
    status = _EXITED.pop(pid)
    _kill_worker(pid, uid, reaped=True)  # whatever it left running
    _WORKERS.pop(pid, None)
    return {"ok": True, "code": os.waitstatus_to_exitcode(status)}


def _kill_worker(pid: int, uid: int | None, *, reaped: bool = False) -> None:
    """SIGKILL for a worker and everything it started: with a uid of its own, every process of
    that uid (a signal from that uid to -1), which catches what left its session; otherwise its
    descendants and its process group. Then the dead are reaped (they are our children by now, as
    the subreaper). `reaped`: the worker itself is gone, and its pid may be another's by now.
    (Its process group's number cannot be: it is not reused while the group has a member.)"""
    import signal
    import time
    victims = _descendants(pid)  # before anything dies and is reparented
    if uid is not None:
        sweeper = os.fork()
        if sweeper == 0:
            try:
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(sweeper, 0)
    for _ in range(50):  # a fork bomb keeps forking while we kill: until no new one shows
        for victim in victims if reaped else victims | {pid}:
            try:
                os.kill(victim, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        found = _descendants(pid) - victims
        if not found:
            break
        victims |= found
    # Until every victim is gone and reaped: the killed come to us (the subreaper) as zombies, and a
    # zombie left in the PID namespace would still show to the next worker.
    deadline = time.monotonic() + 2.0
    while True:
        _reap()
        orphans = [c for c in _children_by_parent().get(os.getpid(), []) if c not in _WORKERS]
        if not orphans and not any(os.path.exists(f"/proc/{v}") for v in victims - {pid}):
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.002)


def _descendants(pid: int) -> set[int]:
    children = _children_by_parent()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _reap() -> None:
    """Every dead child reaped; a worker's wait status is kept for `_end`."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in _WORKERS:
            _EXITED[pid] = status


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="The harness runtime's sandbox side (started by the engine).")
    parser.add_argument("--runtime", required=True, help="path of harness_runtime.py")
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--file-mb", type=int, default=0)
    parser.add_argument("--cpu-s", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--zygote", action="store_true")
    parser.add_argument("--control-fd", type=int, default=-1)
    parser.add_argument("--uid-min", type=int, default=None)
    args = parser.parse_args(argv)
    use_runtime(args.runtime)
    if args.probe:
        apply_limits(args.memory_mb, args.file_mb, args.cpu_s, args.nproc, args.uid)
        print(json.dumps({"ok": True, "uid": os.getuid() if args.uid is not None else None}))
        return 0
    if args.zygote:
        return zygote(args.control_fd, args.uid_min)
    parser.error("give --probe or --zygote")
    return 2


if __name__ == "__main__":
    sys.exit(main())

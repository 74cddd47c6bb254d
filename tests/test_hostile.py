"""Hostile harness code against the sandbox boundary (ecdysis/sandbox/).

The end-to-end test runs the real CLI (`ecdysis run`) in a subprocess whose environment holds API
keys from its first instruction (so they are in its /proc/PID/environ), on a data folder that
holds the database and a secrets file, with a harness that tries one attack per instance: read the
keys from its environment or from any process's /proc entries, read the database and the data
folder, write outside its folder, connect to a listener on the host's loopback, to the internet
and to an abstract Unix socket, signal the engine, take root back, fork-bomb, leave processes
behind, print megabytes. Each attempt must end as that instance's failure or a harmless answer,
the batch must finish, and the test checks the host side: no secret in anything stored, no file
written outside, no connection accepted, no process left in the sandbox's PID namespace.

Those claims hold for the bwrap sandbox only; the tests that prove them require it
(`ECDYSIS_SANDBOX=bwrap`), and skip where bubblewrap cannot run. Without bwrap the engine falls back
to a plain child process and records a note, which the last tests check.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ecdysis import sandbox
from ecdysis.sandbox import boundary
from ecdysis.harness import starter_files, write_dir
from ecdysis.sandbox import SandboxLimits, WorkerPool, isolation
from servers.proc_tree import alive, descendants

ROOT = Path(__file__).resolve().parent.parent
TASK = {"input": "x", "choices": None, "category": "c", "fields": {}}

needs_bwrap = pytest.mark.skipif(isolation("auto").mode != "bwrap",
                                 reason=f"bubblewrap sandbox unavailable here: {isolation('auto').note}")

HOSTILE = r'''
import json, os, signal, socket, sys, time

def _pidns():
    print("PIDNS " + os.readlink("/proc/self/ns/pid"), flush=True)

def solve(task, model, harness):
    p = json.loads(task["input"])
    a = p["attack"]
    if a == "model":
        return model.generate([{"role": "user", "content": "say ok"}]).text.strip()
    if a == "env":
        found = {k: v for k, v in os.environ.items()
                 if any(m in k for m in ("KEY", "TOKEN", "SECRET", "DATABASE")) or "sk-" in v}
        return "LEAK " + json.dumps(found) if found else "blocked"
    if a == "proc":
        leaks = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            for name in ("environ", "cmdline", "mem"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as fh:
                        data = fh.read(1 << 20)
                except OSError:
                    continue
                if b"sk-" in data or b"API_KEY" in data:
                    leaks.append(f"{pid}/{name}: {data[:200]!r}")
        return "LEAK " + "; ".join(leaks) if leaks else "blocked"
    if a == "read":
        for path in p["files"]:
            try:
                with open(path, "rb") as fh:
                    return "LEAK " + fh.read(200).decode("latin-1")
            except OSError:
                pass
        for folder in p["folders"]:
            try:
                entries = os.listdir(folder)
            except OSError:
                continue
            if entries:
                return "LEAK " + repr(entries)
        return "blocked"
    if a == "write":
        wrote = []
        for path in p["targets"]:
            try:
                with open(path, "w") as fh:
                    fh.write("pwned")
                wrote.append(path)
            except OSError:
                pass
        return "LEAK " + repr(wrote) if wrote else "blocked"
    if a == "write-own":
        with open(os.path.join(str(harness.dir), "scratch.txt"), "w") as fh:
            fh.write("my own folder is writable")
        with open("/tmp/" + p["token"], "w") as fh:
            fh.write("a private /tmp")
        with open(os.path.join(os.environ["HOME"], ".cache-" + p["token"]), "w") as fh:
            fh.write("HOME too")
        return "wrote"
    if a == "net-host":
        try:
            socket.create_connection(("127.0.0.1", p["port"]), timeout=3).close()
        except OSError:
            return "blocked"
        return "LEAK connected to the host's loopback"
    if a == "net-out":
        for addr in (("1.1.1.1", 53), ("8.8.8.8", 443)):
            try:
                socket.create_connection(addr, timeout=3).close()
                return f"LEAK connected to {addr}"
            except OSError:
                pass
        try:
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53))
            return "LEAK sent a datagram"
        except OSError:
            return "blocked"
    if a == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0" + p["abstract"])
        except OSError:
            return "blocked"
        return "LEAK connected to an abstract socket of the host"
    if a == "kill-engine":
        try:
            os.kill(os.getppid(), signal.SIGKILL)
        except OSError:
            pass
        return "blocked"
    if a == "setuid":
        for fn in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):
            try:
                fn()
                return "LEAK became root"
            except OSError:
                pass
        return "blocked"
    if a == "fork-bomb":
        _pidns()
        while True:
            os.fork()
    if a == "sleepers":
        _pidns()
        for _ in range(5):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
        return "blocked"
    if a == "flood":
        sys.stdout.write("x" * 3_000_000 + "\n")
        print("END OF FLOOD")
        return "blocked"
    raise ValueError(a)
'''


def _harness(tmp_path: Path) -> Path:
    files = starter_files()
    files["harness.py"] = HOSTILE
    return write_dir(files, tmp_path / "hostile-harness")


def _namespace_members(pidns: str) -> list[int]:
    """Host pids whose PID namespace is `pidns` ("pid:[...]")."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == pidns:
                    members.append(int(entry))
            except OSError:
                pass
    return members


class _Listener:
    """A TCP listener on the host's 127.0.0.1 and an abstract Unix socket that count connections."""

    def __init__(self) -> None:
        self.accepted = 0
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.abstract = f"ecdysis-hostile-{uuid.uuid4().hex[:8]}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.abstract)
        self.unix.listen(4)
        for s in (self.tcp, self.unix):
            s.settimeout(0.2)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        self._stop = False

    def _accept(self, s: socket.socket) -> None:
        while not getattr(self, "_stop", False):
            try:
                conn, _ = s.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.tcp.close()
        self.unix.close()


@needs_bwrap
@pytest.mark.slow
def test_hostile_harness_is_contained_end_to_end(tmp_path: Path) -> None:
    home = tmp_path / "engine-home"
    home.mkdir()
    secret = f"sk-hostile-{uuid.uuid4().hex}"
    (home / "secrets.env").write_text(f"OPENAI_API_KEY={secret}\n")
    db = home / "ecdysis.db"
    outside = tmp_path / "outside"
    outside.mkdir()
    token = f"ecdysis-escape-{uuid.uuid4().hex[:8]}"
    listener = _Listener()
    attacks = [
        ("model", {}, "ok"),
        ("env", {}, "blocked"),
        ("proc", {}, "blocked"),
        ("read", {"files": [str(db), str(db) + "-wal", str(home / "secrets.env"), "/etc/shadow",
                            "/proc/1/root/etc/shadow", str(ROOT / "pyproject.toml"),
                            str(ROOT / "ecdysis" / "settings.py"), "/root/.bash_history"],
                  "folders": [str(home), str(tmp_path), "/home", str(ROOT / "ecdysis")]}, "blocked"),
        ("write", {"targets": [str(outside / "escape.txt"), str(home / "pwned.txt"), str(ROOT / token),
                               "/usr/" + token, f"{sys.prefix}/{token}"]}, "blocked"),
        ("write-own", {"token": token}, "wrote"),
        ("net-host", {"port": listener.port}, "blocked"),
        ("net-out", {}, "blocked"),
        ("unix", {"abstract": listener.abstract}, "blocked"),
        ("kill-engine", {}, "blocked"),
        ("setuid", {}, "blocked"),
        ("fork-bomb", {}, None),
        ("env", {"again": True}, "blocked"),  # the worker the bomb poisoned was replaced
        ("sleepers", {}, "blocked"),
        ("flood", {}, "blocked"),
        ("model", {"again": True}, "ok"),
    ]
    suite = tmp_path / "hostile.jsonl"
    with suite.open("w") as fh:
        for i, (attack, params, target) in enumerate(attacks):
            fh.write(json.dumps({"id": f"a{i:02d}-{attack}", "input": json.dumps({"attack": attack, **params}),
                                 "target": target or "-", "category": "hostile"}) + "\n")
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"default": "ok"}))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(ECDYSIS_HOME=str(home), OPENAI_API_KEY=secret, ANTHROPIC_API_KEY=secret + "-a",
               ECDYSIS_SANDBOX="bwrap", ECDYSIS_INSTANCE_TIMEOUT="20", PYTHONPATH=str(ROOT))
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ecdysis.cli", "run", "--suite", str(suite), "--split", "all",
                               "--model", f"scripted:{script}", "--harness", str(_harness(tmp_path)), "--json"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr  # the engine survived every attack, the batch finished
    summary = json.loads(proc.stdout)
    assert summary["n"] == len(attacks)

    con = sqlite3.connect(db)
    rows = {r[0]: r[1:] for r in con.execute(
        "select instance_id, answer, error_type, error_message, stdout_tail from instance_result")}
    run_summary = json.loads(con.execute("select summary from run").fetchone()[0])
    con.close()
    assert run_summary["isolation"]["mode"] == "bwrap"
    assert len(rows) == len(attacks)
    for i, (attack, _params, target) in enumerate(attacks):
        answer, error_type, error_message, tail = rows[f"a{i:02d}-{attack}"]
        if target is None:  # the fork bomb: stopped by the process limit, one typed failure
            assert error_type == "exception", (attack, error_type, error_message)
            assert "BlockingIOError" in (error_message or ""), error_message
        else:
            assert error_type is None and answer == target, (attack, answer, error_type, error_message)

    # Nothing the harness could reach holds a secret: every stored byte, searched for it.
    raw = b"".join(p.read_bytes() for p in home.iterdir() if p.name.startswith("ecdysis.db"))
    assert secret.encode() not in raw
    assert b"SQLite format 3" not in b"".join((r[0] or "").encode() for r in rows.values())
    # The host is untouched: no file outside the sandbox, no connection reached the host.
    assert not (outside / "escape.txt").exists() and not (home / "pwned.txt").exists()
    assert not (ROOT / token).exists() and not Path("/usr", token).exists()
    assert not Path(sys.prefix, token).exists()
    assert secret not in proc.stdout + proc.stderr
    assert not Path("/tmp", token).exists(), "the sandbox's /tmp must be private"
    assert listener.accepted == 0
    # The fork bomb and the sleepers left nothing behind: their PID namespaces are empty.
    for attack in ("fork-bomb", "sleepers"):
        tail = next(r[3] for k, r in rows.items() if k.endswith(attack))
        pidns = re.search(r"PIDNS (pid:\[\d+\])", tail or "")
        assert pidns, tail
        deadline = time.monotonic() + 10  # SIGKILL is delivered at once; the exits take a moment
        while _namespace_members(pidns.group(1)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _namespace_members(pidns.group(1))
        assert left == [], [Path(f"/proc/{pid}/status").read_text()[:300] for pid in left if alive(pid)]
    sleepers_tail = next(r[3] for k, r in rows.items() if k.endswith("sleepers"))
    assert "the worker was killed and replaced" in sleepers_tail
    flood_tail = next(r[3] for k, r in rows.items() if k.endswith("flood"))
    assert "END OF FLOOD" in flood_tail and len(flood_tail) <= 6000
    print(f"{len(attacks)} attacks contained in {elapsed:.1f}s")


# ---------------------------------------------------------------- the sandbox itself


def _pool(code: str, **limits: object) -> WorkerPool:
    files = starter_files()
    files["harness.py"] = code
    return WorkerPool(files, SandboxLimits(timeout_s=float(limits.pop("timeout_s", 10.0)),  # type: ignore[arg-type]
                                           isolation="bwrap", **limits))  # type: ignore[arg-type]


@needs_bwrap
def test_sandbox_sees_only_its_own_world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the harness sees from inside, in one call: its uid is not root and not the engine's,
    its PID namespace holds only itself, bwrap's init and the pool's fork server (whose files it
    cannot read), the data folder does not exist, only its own harness folder and /tmp are
    writable, there is no network device but loopback."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "ecdysis.db").write_text("secret rows")
    monkeypatch.setenv("ECDYSIS_HOME", str(home))
    code = (
        "import os, json, socket\n"
        "def solve(task, model, harness):\n"
        "    def writable(p):\n"
        "        try:\n"
        "            open(os.path.join(p, 'probe.txt'), 'w').close(); return True\n"
        "        except OSError:\n"
        "            return False\n"
        f"    home = {str(home)!r}\n"
        "    def readable(pid):\n"
        "        try:\n"
        "            open(f'/proc/{pid}/environ', 'rb').read(1); return True\n"
        "        except OSError:\n"
        "            return False\n"
        "    pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "    return json.dumps({'uid': os.getuid(), 'pids': pids, 'me': os.getpid(),\n"
        "                       'readable': [p for p in pids if p != os.getpid() and readable(p)],\n"
        "                       'home_visible': os.path.exists(home), 'net': sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else [],\n"
        "                       'ifaces': [n for _, n in socket.if_nameindex()],\n"
        "                       'writable': sorted(set(p for p in (str(harness.dir), '/tmp', os.environ['HOME'], '/', '/usr', '/etc',\n"
        "                                                      '/proc', os.path.dirname(os.__file__), os.path.dirname(json.__file__)) if writable(p)))})\n")
    pool = _pool(code)
    try:
        out = pool.solve(TASK, lambda r: {})
    finally:
        pool.close()
    assert out.error_type is None, out
    seen = json.loads(out.answer or "{}")
    assert seen["uid"] not in (0, os.getuid())
    assert set(seen["pids"]) == {1, 2, seen["me"]}  # bwrap's init, the fork server, itself
    assert seen["readable"] == []
    assert seen["home_visible"] is False
    assert seen["ifaces"] == ["lo"]
    assert seen["writable"] == [f"{sandbox.BOX_WORK}/w1/harness", "/tmp"]  # HOME is /tmp


@needs_bwrap
def test_data_folder_inside_a_mounted_folder_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a data folder that lies inside a folder the sandbox mounts (here the venv) is hidden."""
    home = Path(sys.prefix) / f"ecdysis-test-home-{uuid.uuid4().hex[:6]}"
    home.mkdir()
    try:
        (home / "ecdysis.db").write_text("secret rows")
        monkeypatch.setenv("ECDYSIS_HOME", str(home))
        code = (f"import os\ndef solve(task, model, harness):\n    return repr(os.listdir({str(home)!r}))\n")
        pool = _pool(code)
        try:
            out = pool.solve(TASK, lambda r: {})
        finally:
            pool.close()
        assert out.answer == "[]", out
    finally:
        (home / "ecdysis.db").unlink()
        home.rmdir()


@needs_bwrap
def test_fork_bomb_costs_one_instance_and_the_next_one_is_clean() -> None:
    code = ("import os\n"
            "def solve(task, model, harness):\n"
            "    if task['input'] == 'bomb':\n"
            "        while True:\n"
            "            os.fork()\n"
            "    return str(len([p for p in os.listdir('/proc') if p.isdigit()]))\n")
    pool = _pool(code, processes=16)
    try:
        started = time.monotonic()
        bomb = pool.solve({**TASK, "input": "bomb"}, lambda r: {})
        spent = time.monotonic() - started
        after = [pool.solve(TASK, lambda r: {}) for _ in range(3)]
    finally:
        pool.close()
    assert bomb.error_type == "exception" and "BlockingIOError" in (bomb.error_message or ""), bomb
    assert spent < 8.0  # stopped by the process limit, not by the 10 s timeout
    # A fresh worker, and nothing of the bomb left: the namespace holds bwrap's init, the pool's
    # fork server and that one worker, which stays reused.
    assert [o.answer for o in after] == ["3", "3", "3"], after


@needs_bwrap
def test_workers_are_reused_and_the_per_instance_overhead_stays_small() -> None:
    code = ("import os\nTOKEN = os.urandom(4).hex()\n"
            "def solve(task, model, harness):\n    return TOKEN\n")
    pool = _pool(code)
    try:
        first = pool.solve(TASK, lambda r: {})
        started = time.perf_counter()
        answers = [pool.solve(TASK, lambda r: {}).answer for _ in range(30)]
        per_instance = (time.perf_counter() - started) / 30
    finally:
        pool.close()
    assert set(answers) == {first.answer}  # one worker served every instance
    assert per_instance < 0.05, f"{per_instance * 1000:.1f} ms per instance"


@pytest.mark.parametrize("mode", ["bwrap", "process"])
def test_engine_killed_mid_instance_takes_the_sandbox_with_it(tmp_path: Path, mode: str) -> None:
    """--die-with-parent (bwrap) / PR_SET_PDEATHSIG (plain process): a SIGKILLed engine leaves no
    harness process running."""
    if mode == "bwrap" and isolation("auto").mode != "bwrap":
        pytest.skip("bubblewrap sandbox unavailable here")
    files = starter_files()
    files["harness.py"] = ("import os, time\ndef solve(task, model, harness):\n"
                           "    print('PIDNS ' + os.readlink('/proc/self/ns/pid'), 'PID', os.getpid(), flush=True)\n"
                           "    time.sleep(600)\n")
    folder = write_dir(files, tmp_path / "sleepy")
    driver = (
        "import sys, threading\n"
        "from pathlib import Path\n"
        "from ecdysis.harness import read_dir\n"
        "from ecdysis.sandbox import WorkerPool, SandboxLimits\n"
        f"pool = WorkerPool(read_dir(Path({str(folder)!r})), SandboxLimits(timeout_s=600))\n"
        "print('STARTED', flush=True)\n"
        "pool.solve({'input': 'x', 'choices': None, 'category': 'c', 'fields': {}}, lambda r: {})\n")
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "ECDYSIS_SANDBOX": mode})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "STARTED"
        deadline = time.monotonic() + 20
        victims: list[int] = []
        while time.monotonic() < deadline and not victims:
            victims = descendants(proc.pid)
            time.sleep(0.1)
        time.sleep(0.5)
        victims = descendants(proc.pid)
        assert victims, "the worker never started"
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(pid) for pid in victims):
            time.sleep(0.1)
        assert not [pid for pid in victims if alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------- without bwrap: a recorded note


def test_missing_bwrap_falls_back_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundary, "_probed", {})
    monkeypatch.setattr(boundary.shutil, "which", lambda name: None)
    found = isolation("auto")
    assert found.mode == "process"
    assert "not installed" in found.note and "no filesystem or network boundary" in found.note
    from ecdysis.errors import ConfigError
    with pytest.raises(ConfigError):
        isolation("bwrap")


def test_bwrap_that_cannot_create_namespaces_falls_back_with_a_note(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(boundary, "_probed", {})
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    real_argv = boundary.bwrap_argv
    monkeypatch.setattr(boundary, "bwrap_argv", lambda *a: [str(fake)] + real_argv(*a)[1:])
    found = isolation("auto")
    assert found.mode == "process"
    assert "No permissions to create new namespace" in found.note


def test_a_run_records_the_boundary_it_had(store, monkeypatch: pytest.MonkeyPatch) -> None:
    from ecdysis.models.registry import register_backend
    from ecdysis.models.scripted import ScriptedBackend
    from ecdysis.service import RunRequest, Service
    register_backend(ScriptedBackend(model_id="scripted-hostile", default="True"))
    monkeypatch.setenv("ECDYSIS_SANDBOX", "process")
    svc = Service(store)
    summary = svc.run(RunRequest(suite="boolean", model="scripted-hostile", limit=2))
    recorded = svc.get_run(summary.run_id).summary["isolation"]
    assert recorded["mode"] == "process" and "no filesystem or network boundary" in recorded["note"]

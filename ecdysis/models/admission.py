"""Machine-wide admission for embedded generation: a generation holds one of `cores // threads`
slots, each an advisory file lock, so the llama.cpp threads of several processes (the app's job
slots, a CLI run, a second model in the same batch) take turns at the cores instead of spinning
against each other (measured: 13 s alone became 516 s for the same 10 calls beside two other
generating processes, on 2 cores).

Why file locks: the kernel drops a dead holder's lock, so a crashed or killed process never wedges
the others, and no server has to be started, found or cleaned up. The slots live in one folder per
user and machine (ECDYSIS_ADMISSION_DIR, else ~/.cache/ecdysis/admission); `ECDYSIS_ADMISSION=off`
turns admission off (to measure what it saves).
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ecdysis.settings import cache_dir


def admission_dir() -> Path:
    return cache_dir("ECDYSIS_ADMISSION_DIR", "admission")


def slot_count(threads: int, cores: int | None = None) -> int:
    """How many generations of `threads` threads fit on this machine's cores at once (at least 1)."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, threads))


@dataclass
class AdmissionStats:
    """What admission cost this process: generations admitted and seconds spent waiting."""

    admitted: int = 0
    waited: int = 0
    wait_s: float = 0.0


_stats = AdmissionStats()
_stats_lock = threading.Lock()


def stats() -> AdmissionStats:
    with _stats_lock:
        return AdmissionStats(_stats.admitted, _stats.waited, _stats.wait_s)


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextmanager
def slot(threads: int) -> Iterator[None]:
    """Hold one machine-wide slot for the duration of a generation. Each acquisition opens its own
    file description, so two threads of one process exclude each other as two processes do."""
    if os.environ.get("ECDYSIS_ADMISSION", "").lower() in ("off", "0", "false", "no"):
        yield
        return
    folder = admission_dir()
    folder.mkdir(parents=True, exist_ok=True)
    order = list(range(slot_count(threads)))
    random.shuffle(order)
    fd = -1
    start = time.monotonic()
    for i in order:
        candidate = _open(folder / f"slot-{i}.lock")
        try:
            fcntl.flock(candidate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fd = candidate
            break
        except BlockingIOError:
            os.close(candidate)
    waited = fd < 0
    if waited:
        fd = _open(folder / f"slot-{order[0]}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
    with _stats_lock:
        _stats.admitted += 1
        if waited:
            _stats.waited += 1
            _stats.wait_s += time.monotonic() - start
    _sign(fd)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _sign(fd: int) -> None:
    """Write who holds the slot into its file, for `holders` (a waiting reader's "held by")."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {time.time():.3f}\n".encode(), 0)
    except OSError:
        pass  # the name is a courtesy; the lock is what admits


@dataclass(frozen=True)
class Holder:
    """A slot held right now: by which process, since when, doing what (its command line)."""

    slot: int
    pid: int
    since: float
    command: str


def holders() -> list[Holder]:
    """The slots held right now, by any process of this user (a slot whose lock can be taken is
    free, whatever its file says: the kernel dropped a dead holder's lock)."""
    folder = admission_dir()
    found = []
    for path in sorted(folder.glob("slot-*.lock")) if folder.is_dir() else []:
        try:
            fd = _open(path)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                continue  # free
            except BlockingIOError:
                pass
            words = os.pread(fd, 64, 0).decode(errors="replace").split()
        finally:
            os.close(fd)
        if len(words) == 2 and words[0].isdigit():
            pid = int(words[0])
            found.append(Holder(int(path.stem.split("-")[1]), pid, float(words[1]), _command(pid)))
    return found


def held_elsewhere() -> list[Holder]:
    """The other processes holding a slot when every slot is held (a generation of this process
    would wait for them), else []."""
    held = holders()
    slots = len(list(admission_dir().glob("slot-*.lock")))
    others = [h for h in held if h.pid != os.getpid()]
    return others if others and len(held) >= slots else []


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:200]

"""Reading the process tree from /proc, for tests that prove no harness process outlives the
engine (test_faults, test_hostile); and stopping a server process a test started."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def descendants(root: int) -> list[int]:
    """Every live descendant pid of `root`, from the parent links in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(proc: subprocess.Popen, *, timeout_s: float) -> None:  # type: ignore[type-arg]
    """SIGTERM, then SIGKILL if `proc` has not exited within `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)

"""Machine-wide admission for embedded generation (`ecdysis.models.admission`), with real processes:
holders of a slot never overlap across processes or threads, a killed holder frees its slot at
once, and the slot count follows the cores. The throughput it buys is measured in
`bench/embedded_throughput.py`, not here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ecdysis.models import admission

ROOT = Path(__file__).resolve().parent.parent

HOLDER = textwrap.dedent("""
    import os, sys, time
    from ecdysis.models import admission
    log, hold_s, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    with admission.slot(threads):
        start = time.time()
        print("holding", flush=True)
        time.sleep(hold_s)
        end = time.time()
    with open(log, "a") as fh:
        fh.write(f"{start} {end}\\n")
""")


def holder(tmp_path: Path, log: Path, hold_s: float, threads: int) -> subprocess.Popen[str]:
    env = dict(os.environ, ECDYSIS_ADMISSION_DIR=str(tmp_path / "slots"), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(log), str(hold_s), str(threads)],
                            env=env, stdout=subprocess.PIPE, text=True)


def intervals(log: Path) -> list[tuple[float, float]]:
    return sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())  # type: ignore[misc]


@pytest.fixture(autouse=True)
def slots_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ECDYSIS_ADMISSION_DIR", str(tmp_path / "slots"))
    monkeypatch.delenv("ECDYSIS_ADMISSION", raising=False)
    return tmp_path / "slots"


def test_slot_count_follows_cores_and_threads() -> None:
    assert admission.slot_count(2, cores=2) == 1
    assert admission.slot_count(4, cores=2) == 1
    assert admission.slot_count(2, cores=8) == 4
    assert admission.slot_count(0, cores=3) == 3


def test_three_processes_on_one_slot_take_turns(tmp_path: Path) -> None:
    log = tmp_path / "held.log"
    cores = os.cpu_count() or 1
    procs = [holder(tmp_path, log, 0.4, cores) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    spans = intervals(log)
    assert len(spans) == 3
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 0.01, spans  # no two holders at once


def test_a_killed_holder_frees_its_slot_at_once(tmp_path: Path) -> None:
    log = tmp_path / "held.log"
    cores = os.cpu_count() or 1
    stuck = holder(tmp_path, log, 600, cores)
    assert stuck.stdout is not None and stuck.stdout.readline().strip() == "holding"
    waiting = holder(tmp_path, log, 0.0, cores)
    time.sleep(0.5)
    assert waiting.poll() is None  # still waiting for the slot
    killed_at = time.time()
    stuck.send_signal(signal.SIGKILL)
    stuck.wait(timeout=10)
    assert waiting.wait(timeout=10) == 0
    (start, _), = intervals(log)
    assert start - killed_at < 2.0


def test_threads_of_one_process_exclude_each_other() -> None:
    cores = os.cpu_count() or 1
    inside = 0
    most = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        for _ in range(5):
            with admission.slot(cores):
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.01)
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    before = admission.stats()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    after = admission.stats()
    assert most == 1
    assert after.admitted - before.admitted == 20
    assert after.waited > before.waited and after.wait_s > before.wait_s


def test_admission_can_be_turned_off_to_measure_what_it_saves(monkeypatch: pytest.MonkeyPatch,
                                                              slots_dir: Path) -> None:
    monkeypatch.setenv("ECDYSIS_ADMISSION", "off")
    cores = os.cpu_count() or 1
    with admission.slot(cores):
        with admission.slot(cores):  # would wait forever on the one slot if admission were on
            pass
    assert not slots_dir.exists()


def test_holders_name_the_process_that_holds_a_slot_and_only_while_it_holds(tmp_path: Path) -> None:
    """A user watched the demo sit at "1 of 12" for half a minute while a test run held the slot;
    `holders` says who holds one (pid, since when, its command), which the app shows. A slot freed
    (here by a kill) is free whatever its file still says."""
    cores = os.cpu_count() or 1
    proc = holder(tmp_path, tmp_path / "held.log", 30.0, cores)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        held = admission.holders()
        assert [h.pid for h in held] == [proc.pid]
        assert "admission.slot" in held[0].command and time.time() - 60 < held[0].since <= time.time()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert admission.holders() == []
    with admission.slot(cores):  # this process's own turn is listed under its own pid
        assert [h.pid for h in admission.holders()] == [os.getpid()]

"""What the machine was doing while a benchmark ran: load average and the share of CPU time the
hypervisor gave to other guests (steal). Every timing figure is recorded next to these."""

from __future__ import annotations

import os


def cpu_counters() -> list[int] | None:
    """The aggregate `cpu` line of /proc/stat (jiffies: user nice system idle iowait irq softirq
    steal ...), or None where there is none."""
    try:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_pct(before: list[int] | None, after: list[int] | None) -> float | None:
    if not before or not after or len(before) < 8:
        return None
    delta = [b - a for a, b in zip(before, after)]
    total = sum(delta[:8])
    return round(100.0 * delta[7] / total, 1) if total else None


def load_average() -> float:
    return round(os.getloadavg()[0], 2)

"""What the machine was doing while a benchmark ran: load average and the share of CPU time the
hypervisor gave to other guests (steal). Every timing figure is recorded next to these."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


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


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_results(out: Path, name: str, result: dict[str, Any], table: str) -> None:
    """`out/name.json` (the figures) and `out/name.md` (the table the README shows), then print it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(table)
    print(table)

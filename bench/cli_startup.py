"""How long the CLI's light commands take, start to exit, as a user types them: `--help`,
`settings`, and `runs`, `harnesses`, `proposals` on a data folder holding a few runs. Each is
run `--repeats` times in a fresh process; the median wall time is the figure, with CPU time and
peak memory beside it, and `python -c pass` as the floor. Nothing else should be running.

    .venv/bin/python bench/cli_startup.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

NAME = "cli_startup"
COMMANDS = (["--help"], ["settings"], ["runs"], ["harnesses"], ["proposals"])


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak resident MB) of one process, as GNU time reports them."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        subprocess.run(["/usr/bin/time", "-o", report.name, "-f", "%e %U %S %M", *argv], env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall, user, system, peak_kb = report.read().split()[-4:]
    return float(wall), float(user) + float(system), int(peak_kb) // 1024


def seed_home(env: dict[str, str]) -> None:
    """Three small runs of a built-in suite on SmolLM2 (the second and third from the cache)."""
    for _ in range(3):
        subprocess.run([sys.executable, "-m", "ecdysis.cli", "run", "--suite", "boolean", "--model", "smollm2",
                        "--limit", "2"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="ecdysis-cli-"))
    env = {**os.environ, "ECDYSIS_HOME": str(home)}
    env.pop("ECDYSIS_DATABASE_URL", None)
    seed_home(env)
    rows = []
    before, load0 = cpu_counters(), load_average()
    floor = [timed([sys.executable, "-c", "pass"], env) for _ in range(args.repeats)]
    rows.append({"command": "python -c pass", "wall_s": statistics.median(w for w, _, _ in floor),
                 "cpu_s": statistics.median(c for _, c, _ in floor), "peak_mb": max(m for _, _, m in floor)})
    for command in COMMANDS:
        samples = [timed([sys.executable, "-m", "ecdysis.cli", *command], env) for _ in range(args.repeats)]
        rows.append({"command": "ecdysis " + " ".join(command), "wall_s": statistics.median(w for w, _, _ in samples),
                     "cpu_s": statistics.median(c for _, c, _ in samples), "peak_mb": max(m for _, _, m in samples)})
        print(rows[-1], flush=True)
    return {"when": now(), "repeats": args.repeats, "rows": rows, "load": load0,
            "steal_pct": steal_pct(before, cpu_counters())}


def table(result: dict[str, Any]) -> str:
    lines = [f"Light CLI commands, start to exit in a fresh process, median of {result['repeats']} "
             f"(peak memory: the largest). Load {result['load']}, CPU steal {result['steal_pct']} %. "
             f"Measured {result['when']}.", "",
             "| command | wall s | CPU s | peak MB |", "|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| `{r['command']}` | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['peak_mb']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    result = run(args)
    write_results(args.out, NAME, result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

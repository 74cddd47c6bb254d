"""Benchmark: the runner's own overhead on a large batch against a model whose latency is fixed.

A local OpenAI-compatible server (`bench/latency_server.py`, its own process, 127.0.0.1 only)
answers every call after exactly `--latency-ms`. A generated suite of `--n` instances (default
2,000, written as JSONL) runs through the starter harness with the response cache off and a fresh
SQLite database per concurrency level, so every instance costs one real HTTP call. The ideal wall
time is `n x latency / concurrency`; whatever the run takes beyond it is the engine's overhead
(harness worker processes, the pipe, the HTTP client, scoring, storing each result).

Concurrency 1 over 2,000 instances would take 400 s of pure latency, so each level runs at most
`--budget-s` seconds of ideal time: n = min(--n, budget x concurrency / latency), at least one
instance per slot (defaults: 300 at concurrency 1, 2,000 at 8, 32 and 64; about 3 minutes in all).

Run: `.venv/bin/python bench/runner_load.py [--n 2000] [--latency-ms 200] [--concurrency 1,8,32,64]
[--budget-s 60] [--executor local|ray] [--out bench/results]`. Prints a Markdown table and writes
`runner_load.json` and `runner_load.md` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency_server import LatencyServer  # noqa: E402
from machine import cpu_counters, steal_pct  # noqa: E402

CATEGORIES = ("addition", "subtraction", "multiplication", "comparison")


def write_suite(path: Path, n: int, *, seed: int = 0) -> Path:
    """`n` small arithmetic instances in four categories, as a JSONL suite with a header."""
    rng = random.Random(seed)
    lines = [json.dumps({"ecdysis_suite": {"name": f"load-{n}", "scorer": {"kind": "numeric"},
                                           "description": "generated for bench/runner_load.py"}})]
    for i in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        category = CATEGORIES[i % len(CATEGORIES)]
        question, target = {
            "addition": (f"What is {a} + {b}?", a + b),
            "subtraction": (f"What is {a} - {b}?", a - b),
            "multiplication": (f"What is {a} * {b}?", a * b),
            "comparison": (f"Which is larger, {a} or {b}? Answer with the number.", max(a, b)),
        }[category]
        lines.append(json.dumps({"id": f"load-{i:05d}", "input": question, "target": str(target),
                                 "category": category}))
    path.write_text("\n".join(lines) + "\n")
    return path


def plan(n: int, concurrency: int, latency_s: float, budget_s: float) -> int:
    """Instances for one level: at most `n`, at most `budget_s` of ideal time, at least one per slot."""
    return max(min(n, concurrency), min(n, int(budget_s * concurrency / latency_s)))


def measure(suite_path: Path, *, n: int, concurrency: int, latency_s: float, base_url: str,
            executor: str, server: LatencyServer) -> dict[str, Any]:
    """One level on a fresh database: wall time of `execute_run`, ideal, ratio, overhead."""
    from ecdysis.models.registry import forget_backends
    from ecdysis.service import RunRequest, Service
    from ecdysis.settings import Settings
    from storage import open_store

    with tempfile.TemporaryDirectory(prefix="ecdysis-load-") as home:
        os.environ.update(ECDYSIS_HOME=home, OPENAI_BASE_URL=base_url, ECDYSIS_EXECUTOR=executor)
        os.environ.pop("ECDYSIS_DATABASE_URL", None)
        settings = Settings.from_env()
        store = open_store(settings.database_url)
        svc = Service(store, settings)
        run = svc.create_run(RunRequest(suite=str(suite_path), model="openai:latency", split="all",
                                        limit=n, concurrency=concurrency, use_cache=False))
        first_done: list[float] = []
        before = server.stats()
        requests_before, handling_before = before["requests"], before["handling_s"]
        cpu_before = _cpu()
        machine_before = cpu_counters()
        started = time.perf_counter()

        def events(e: dict[str, Any]) -> None:
            if e["type"] == "instance_done" and not first_done:
                first_done.append(time.perf_counter() - started)

        summary = svc.execute_run(run.id, use_cache=False, events=events)
        wall = time.perf_counter() - started
        engine_cpu = _cpu() - cpu_before
        steal = steal_pct(machine_before, cpu_counters())
        results = svc.results(run.id)
        stats = server.stats()
        store.close()
        forget_backends()
    ideal = n * latency_s / concurrency
    inside = [r.wall_seconds - sum(c.latency_s for c in r.calls) for r in results]
    call_latency = [c.latency_s for r in results for c in r.calls]
    return {
        "concurrency": concurrency, "n": n, "wall_s": round(wall, 3), "ideal_s": round(ideal, 3),
        "ratio": round(wall / ideal, 4),
        # Slot time each instance costs beyond its model call: (wall - ideal) spread over the slots.
        "overhead_ms_per_instance": round((wall - ideal) * concurrency / n * 1000, 2),
        # Inside the instance only (harness process, pipe, scoring, storing), excluding start-up and
        # time an instance waits for a free slot.
        "in_instance_overhead_ms": round(statistics.mean(inside) * 1000, 2) if inside else None,
        # Each model call beyond the server's fixed latency: the HTTP client (the SDK) and the
        # server's own handling.
        "call_overhead_ms": round((statistics.mean(call_latency) - latency_s) * 1000, 2) if call_latency else None,
        # The server's part of it: from the request line read to the reply written, beyond the latency.
        "server_overhead_ms": round(((stats["handling_s"] - handling_before) / max(1, stats["requests"] - requests_before)
                                     - latency_s) * 1000, 2),
        "first_result_s": round(first_done[0], 3) if first_done else None,
        # CPU of the engine process itself (all its threads), per instance. Harness workers are
        # killed at the end of a run, so their CPU never reaches RUSAGE_CHILDREN and is not shown.
        "engine_cpu_ms_per_instance": round(engine_cpu / n * 1000, 2),
        "throughput_per_s": round(n / wall, 1),
        "model_calls": summary.model_calls, "server_requests": stats["requests"] - requests_before,
        "server_max_in_flight": stats["max_in_flight"], "errors": summary.errors,
        "accuracy": summary.accuracy, "load_average": round(os.getloadavg()[0], 2),
        # The share of this machine's CPU time that its hypervisor gave to other guests meanwhile
        # ("steal"): on a shared VM, a level run with much of it measures the neighbours.
        "steal_pct": steal,
    }


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"Latency {meta['latency_ms']:g} ms per call, starter harness, cache off, fresh SQLite per level, "
             f"executor `{meta['executor']}`, sandbox `{meta['sandbox']}`, {meta['cpus']} CPUs, "
             f"Python {meta['python']}; machine load average {meta['load_before']} before, "
             f"{meta['load_after']} after.", "",
             "| concurrency | n | wall (s) | ideal (s) | wall / ideal | overhead per instance (ms) "
             "| in-instance overhead (ms) | call overhead (ms) | engine CPU per instance (ms) | CPU stolen (%) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['n']} | {r['wall_s']:.2f} | {r['ideal_s']:.2f} | "
                     f"{r['ratio']:.3f} | {r['overhead_ms_per_instance']:.1f} | {r['in_instance_overhead_ms']:.1f} | "
                     f"{r['call_overhead_ms']:.1f} | {r['engine_cpu_ms_per_instance']:.1f} | "
                     f"{'-' if r.get('steal_pct') is None else r['steal_pct']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Runner overhead against a fixed-latency local model server.")
    parser.add_argument("--n", type=int, default=2000, help="instances per level (before the time budget)")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", default="1,8,32,64", help="comma-separated levels")
    parser.add_argument("--budget-s", type=float, default=60.0, help="ideal seconds per level at most")
    parser.add_argument("--executor", default="local", help="local | ray")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for JSON + Markdown")
    args = parser.parse_args(argv)
    latency_s = args.latency_ms / 1000
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    os.environ.setdefault("ECDYSIS_OPENAI_CONCURRENCY", str(max(levels)))
    from ecdysis.sandbox import isolation
    boundary = isolation()  # probed once per process (about 0.15 s), not once per batch: not timed
    if args.executor == "ray":  # started here, so the levels time the batch and not Ray's start-up
        from ecdysis.executors.ray_executor import import_ray
        import_ray(local=True).init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    rows: list[dict[str, Any]] = []
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="ecdysis-load-suite-") as folder, \
            LatencyServer(latency_s, max_seconds=3600, idle_seconds=300) as server:
        suite_path = write_suite(Path(folder) / "load.jsonl", args.n)
        for concurrency in levels:
            n = plan(args.n, concurrency, latency_s, args.budget_s)
            row = measure(suite_path, n=n, concurrency=concurrency, latency_s=latency_s,
                          base_url=server.base_url, executor=args.executor, server=server)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    meta = {"latency_ms": args.latency_ms, "executor": args.executor, "sandbox": boundary.mode,
            "load_before": load_before, "load_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "python": platform.python_version(), "at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "budget_s": args.budget_s, "n_max": args.n}
    table = markdown(rows, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "runner_load" if args.executor == "local" else f"runner_load_{args.executor}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (out / f"{stem}.md").write_text(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

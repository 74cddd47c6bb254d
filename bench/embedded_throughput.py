"""Benchmark: embedded-model tokens per second through the engine against llama-cpp-python alone,
on one process and under contention.

Per model, one `ecdysis run --no-cache` over `--n` instances of a suite records the exact requests
the starter harness makes. Then, alternating for `--rounds` rounds:
- **engine**: `ecdysis run --no-cache --json` in its own process (sandboxed harness, store, cache
  off), tokens per second = completion tokens / the run's own wall time;
- **raw**: the same requests, in order, through a bare `llama_cpp.Llama` loop with the same
  model file, context and thread count, in its own process (load included on both sides).

Then the contended scenarios, each on one shared database, combined tokens per second over the
span from the first run's start to the last one's end:
- **engine_x2**, **engine_x3**: two or three `ecdysis run` processes at once;
- **app_slots**: one process with the app's job manager running two batches in its two slots;
- **engine_x2_unadmitted** (with `--unadmitted`): two processes with `ECDYSIS_ADMISSION=off`,
  the collapse that machine-wide admission prevents.

`ratio` is engine tokens/s over raw tokens/s (the mean of the raw rounds); targets: >= 0.9 for one
process, >= 0.8 combined under contention. Load average and CPU steal are recorded per scenario.
Nothing else should generate on the machine meanwhile.

Run: `.venv/bin/python bench/embedded_throughput.py [--model qwen2.5-coder-0.5b --model smollm2]
[--n 16] [--rounds 2] [--unadmitted] [--out bench/results]`. `--quick` is the test-sized mode.
Writes `embedded_throughput.json` and `embedded_throughput.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_counters, load_average, now, steal_pct, write_results  # noqa: E402

SUITE = "reasoning-mix"
DEFAULT_MODELS = ("qwen2.5-coder-0.5b", "smollm2")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, ECDYSIS_HOME=str(home), **extra)
    env.pop("ECDYSIS_DATABASE_URL", None)
    return env


def _ecdysis() -> list[str]:
    return [sys.executable, "-m", "ecdysis.cli"]


def start_engine(home: Path, model: str, n: int, **env: str) -> subprocess.Popen[str]:
    cmd = [*_ecdysis(), "run", "--suite", SUITE, "--model", model, "--limit", str(n), "--no-cache", "--json"]
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(home, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(map(str, proc.args))} failed ({proc.returncode}):\n{err[-2000:]}")
    return json.loads(out)


def recorded_requests(home: Path, run_id: str) -> list[dict[str, Any]]:
    """The requests the engine sent, in instance order, from the stored trajectories."""
    os.environ["ECDYSIS_HOME"] = str(home)
    from ecdysis.settings import Settings
    from storage import open_store
    store = open_store(Settings.from_env().database_url)
    try:
        results = sorted(store.get_results(run_id), key=lambda r: r.instance_id)
        return [call.request for r in results for call in r.calls if not call.error]
    finally:
        store.close()


def raw_replay(model: str, requests: list[dict[str, Any]], threads: int) -> dict[str, Any]:
    """Run in a child process: load the model with plain llama-cpp-python, answer every request."""
    from llama_cpp import Llama

    from ecdysis.models.llamacpp import LOCAL_MODELS, gguf_path
    start = time.perf_counter()
    n_ctx = int(LOCAL_MODELS[model].get("n_ctx", 4096))  # what the engine's backend uses
    kwargs: dict[str, Any] = dict(model_path=str(gguf_path(model)), n_ctx=n_ctx, n_threads=threads,
                                  verbose=False, seed=0, use_extra_bufts=False)
    if LOCAL_MODELS[model].get("chat_format"):
        kwargs["chat_format"] = LOCAL_MODELS[model]["chat_format"]
    llm = Llama(**kwargs)
    completion_tokens = prompt_tokens = 0
    for req in requests:
        out = llm.create_chat_completion(messages=req["messages"], temperature=req["temperature"],
                                         max_tokens=req["max_tokens"], stop=req["stop"] or None,
                                         seed=req["seed"])
        completion_tokens += out["usage"]["completion_tokens"]
        prompt_tokens += out["usage"]["prompt_tokens"]
    wall = time.perf_counter() - start
    llm.close()
    return {"wall_s": wall, "completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens}


def run_raw(model: str, requests_file: Path, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--raw", str(requests_file), "--model", model, "--threads", str(threads)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: raw replay failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def span_of_runs(home: Path, run_ids: list[str]) -> float:
    """From the first run's start to the last run's end, by the runs' own stored clocks."""
    os.environ["ECDYSIS_HOME"] = str(home)
    from ecdysis.settings import Settings
    from storage import open_store
    store = open_store(Settings.from_env().database_url)
    try:
        runs = [store.get_run(r) for r in run_ids]
    finally:
        store.close()
    starts = [r.finished_at - r.summary["wall_seconds"] for r in runs if r and r.finished_at]
    ends = [r.finished_at for r in runs if r and r.finished_at]
    return max(ends) - min(starts)


class Scenario:
    """Machine state around one measured scenario."""

    def __enter__(self) -> "Scenario":
        self.load_before = load_average()
        self.cpu_before = cpu_counters()
        return self

    def __exit__(self, *exc: object) -> None:
        self.steal = steal_pct(self.cpu_before, cpu_counters())
        self.load_after = load_average()

    def meta(self) -> dict[str, Any]:
        return {"load_before": self.load_before, "load_after": self.load_after, "steal_pct": self.steal}


def engine_processes(home: Path, model: str, n: int, k: int, **env: str) -> dict[str, Any]:
    with Scenario() as machine:
        procs = [start_engine(home, model, n, **env) for _ in range(k)]
        summaries = [finish(p) for p in procs]
    tokens = sum(s["completion_tokens"] for s in summaries)
    span = span_of_runs(home, [s["run_id"] for s in summaries])
    return {"processes": k, "completion_tokens": tokens, "wall_s": round(span, 2),
            "engine_tokens_per_s": round(tokens / span, 2), **machine.meta()}


def app_slots(home: Path, model: str, n: int) -> dict[str, Any]:
    """Two batches submitted to the app's job manager at once, in this process, as the Runs page
    does; timed from submission until both are done."""
    os.environ["ECDYSIS_HOME"] = str(home)
    from ecdysis.service import RunRequest, Service
    from ecdysis.settings import Settings
    from storage import open_store
    settings = Settings.from_env()
    svc = Service(open_store(settings.database_url), settings)
    try:
        with Scenario() as machine:
            start = time.perf_counter()
            jobs = [svc.start_run_job(RunRequest(suite=SUITE, model=model, limit=n, use_cache=False))
                    for _ in range(2)]
            records = [svc.jobs.wait(j) for j in jobs]
            wall = time.perf_counter() - start
        bad = [r for r in records if r is None or r.status != "done"]
        if bad:
            raise SystemExit(f"error: app job failed: {bad[0] and bad[0].error}")
        tokens = sum(r.result["summary"]["completion_tokens"] for r in records if r)
    finally:
        svc.store.close()
    return {"processes": 1, "slots": 2, "completion_tokens": tokens, "wall_s": round(wall, 2),
            "engine_tokens_per_s": round(tokens / wall, 2), **machine.meta()}


def bench_model(model: str, n: int, rounds: int, threads: int, unadmitted: bool, work: Path) -> dict[str, Any]:
    home = work / model
    print(f"== {model}: recording the requests of {n} instances", flush=True)
    first = finish(start_engine(home, model, n))
    requests = recorded_requests(home, first["run_id"])
    requests_file = work / f"{model}.requests.json"
    requests_file.write_text(json.dumps(requests))
    engine_rounds, raw_rounds = [], []
    for i in range(rounds):
        with Scenario() as machine:
            summary = finish(start_engine(home, model, n))
        engine_rounds.append({"wall_s": summary["wall_seconds"], "completion_tokens": summary["completion_tokens"],
                              "tokens_per_s": round(summary["completion_tokens"] / summary["wall_seconds"], 2),
                              **machine.meta()})
        with Scenario() as machine:
            raw = run_raw(model, requests_file, threads)
        raw_rounds.append({**raw, "tokens_per_s": round(raw["completion_tokens"] / raw["wall_s"], 2),
                           **machine.meta()})
        print(f"   round {i + 1}: engine {engine_rounds[-1]['tokens_per_s']} tok/s, "
              f"raw {raw_rounds[-1]['tokens_per_s']} tok/s", flush=True)
    raw_tps = sum(r["tokens_per_s"] for r in raw_rounds) / len(raw_rounds)
    engine_tps = sum(r["tokens_per_s"] for r in engine_rounds) / len(engine_rounds)
    scenarios: dict[str, Any] = {"single": {
        "engine_tokens_per_s": round(engine_tps, 2), "raw_tokens_per_s": round(raw_tps, 2),
        "ratio": round(engine_tps / raw_tps, 3), "target": 0.9,
        "engine_rounds": engine_rounds, "raw_rounds": raw_rounds}}
    contended: list[tuple[str, Any]] = [("engine_x2", lambda: engine_processes(home, model, n, 2)),
                                        ("engine_x3", lambda: engine_processes(home, model, n, 3)),
                                        ("app_slots", lambda: app_slots(home, model, n))]
    if unadmitted:
        contended.append(("engine_x2_unadmitted",
                          lambda: engine_processes(home, model, n, 2, ECDYSIS_ADMISSION="off")))
    for name, measure in contended:
        row = measure()
        row.update(raw_tokens_per_s=round(raw_tps, 2), ratio=round(row["engine_tokens_per_s"] / raw_tps, 3),
                   target=None if name.endswith("unadmitted") else 0.8)
        scenarios[name] = row
        print(f"   {name}: {row['engine_tokens_per_s']} tok/s combined, ratio {row['ratio']}", flush=True)
    return {"n": n, "requests": len(requests), "threads": threads, "scenarios": scenarios}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | scenario | engine tok/s | raw tok/s (one process) | ratio | target | load | CPU stolen (%) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for model, data in result["models"].items():
        for name, row in data["scenarios"].items():
            if name == "single":
                loads = [r["load_before"] for r in row["engine_rounds"]]
                steals = [r["steal_pct"] for r in row["engine_rounds"] + row["raw_rounds"] if r["steal_pct"] is not None]
                load, steal = max(loads), (max(steals) if steals else None)
            else:
                load, steal = row["load_before"], row["steal_pct"]
            target = "-" if row.get("target") is None else f"≥ {row['target']}"
            lines.append(f"| {model} | {name} | {row['engine_tokens_per_s']} | {row['raw_tokens_per_s']} | "
                         f"{row['ratio']} | {target} | {load} | {'-' if steal is None else steal} |")
    meta = result["meta"]
    lines.append("")
    lines.append(f"{meta['cpus']} CPUs, {meta['instances']} instances of {SUITE} per run, "
                 f"{meta['rounds']} alternating rounds, {meta['date']}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help=f"default: {', '.join(DEFAULT_MODELS)}")
    parser.add_argument("--n", type=int, default=16, help="instances per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the engine's)")
    parser.add_argument("--unadmitted", action="store_true", help="also measure two processes without admission")
    parser.add_argument("--quick", action="store_true", help="smollm2 only, 3 instances, 1 round (for tests)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--raw", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw:
        print(json.dumps(raw_replay(args.model[0], json.loads(args.raw.read_text()), args.threads)))
        return 0
    from ecdysis.settings import Settings
    threads = args.threads or Settings.from_env().n_threads
    models = args.model or list(DEFAULT_MODELS)
    if args.quick:
        models, args.n, args.rounds = (args.model or ["smollm2"]), 3, 1
    result: dict[str, Any] = {"models": {}}
    with tempfile.TemporaryDirectory(prefix="ecdysis-throughput-") as tmp:
        for model in models:
            result["models"][model] = bench_model(model, args.n, args.rounds, threads, args.unadmitted, Path(tmp))
    result["meta"] = {"cpus": os.cpu_count(), "threads": threads, "instances": args.n, "rounds": args.rounds,
                      "python": platform.python_version(), "date": now()}
    write_results(args.out, "embedded_throughput", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

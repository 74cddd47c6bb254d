"""The fixed-latency server behind `bench/runner_load.py`: it must answer like an OpenAI-compatible
server, take at least the latency it is given, hold 64 requests in flight at once (so the
benchmark measures the engine, not a queue in the server), and stop by itself. How close to the
latency it answers is the benchmark's to report (`bench/runner_load.py` records the ideal beside
the wall), not a test's to time."""

from __future__ import annotations

import http.client
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from latency_server import LatencyServer  # noqa: E402

BODY = json.dumps({"model": "latency", "messages": [{"role": "user", "content": "What is 2 + 2?"}]})


def post(port: int, conn: http.client.HTTPConnection | None = None) -> tuple[float, dict]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=BODY, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    assert response.status == 200
    return time.perf_counter() - started, data


@pytest.fixture(scope="module")
def server():
    with LatencyServer(0.2, reply="4", idle_seconds=60) as s:
        yield s


def test_answers_like_openai_after_the_latency(server: LatencyServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    elapsed = []
    for _ in range(3):  # one kept-alive connection: no Nagle / delayed-ACK stall between calls
        seconds, data = post(server.port, conn)
        elapsed.append(seconds)
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "4"}
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["prompt_tokens"] == 5 and data["usage"]["completion_tokens"] == 1
    assert all(s >= 0.2 for s in elapsed), elapsed  # it waited the latency it was given


def test_sixty_four_at_once_are_all_in_flight_together(server: LatencyServer) -> None:
    before = server.stats()["requests"]
    with ThreadPoolExecutor(64) as pool:
        replies = list(pool.map(lambda _: post(server.port), range(64)))
    stats = server.stats()
    assert len(replies) == 64 and stats["requests"] - before == 64
    assert stats["max_in_flight"] == 64  # none queued behind another


def test_stops_by_itself_when_idle() -> None:
    s = LatencyServer(0.01, idle_seconds=0.5)
    with s:
        post(s.port)
        assert s._proc is not None
        assert s._proc.wait(timeout=10) == 0  # returned on its own, before the context closed it

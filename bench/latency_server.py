"""A local OpenAI-compatible chat-completions server whose every answer takes a fixed latency, for
`bench/runner_load.py`: the engine's overhead is what the wall time adds to n x latency / concurrency.

Standard library only (`ThreadingHTTPServer`, HTTP/1.1 keep-alive, a thread per connection that
mostly sleeps), run in its own process so its interpreter lock never competes with the engine's.
It listens on 127.0.0.1 only and stops by itself: after `--max-requests`, after `--max-seconds`, or
after `--idle-seconds` without a request.

Run: `.venv/bin/python bench/latency_server.py --latency-ms 200 [--port 0]`; it prints
`listening on PORT` as its first stdout line. `GET /stats` reports requests served and the most
seen in flight at once; `POST /v1/chat/completions` answers `--reply` after the latency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.last_request = time.monotonic()
        self.handling_s = 0.0  # summed over completions: from parsing the request to the reply sent

    def enter(self) -> None:
        with self.lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.last_request = time.monotonic()

    def leave(self, handling_s: float = 0.0) -> None:
        with self.lock:
            self.in_flight -= 1
            self.handling_s += handling_s
            self.last_request = time.monotonic()

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "in_flight": self.in_flight,
                    "max_in_flight": self.max_in_flight, "handling_s": round(self.handling_s, 6)}


class LatencyHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of 64+ new connections must not be refused by the backlog

    def __init__(self, port: int, *, latency_s: float, reply: str) -> None:
        super().__init__((HOST, port), _Handler)
        self.latency_s = latency_s
        self.reply = reply
        self.stats = _Stats()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool reuses connections
    # One write per response, sent at once: headers and body as two small writes on a kept-alive
    # connection meet Nagle's algorithm and the client's delayed ACK, about 40 ms per call.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: LatencyHTTPServer

    def parse_request(self) -> bool:
        self.arrived = time.perf_counter()  # the request line is in; headers are parsed next
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.rstrip("/").endswith("/stats"):
            self._send(200, self.server.stats.snapshot())
        elif self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "latency", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": {"message": "body is not JSON"}})
            return
        stats = self.server.stats
        stats.enter()
        try:
            time.sleep(self.server.latency_s)
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
            self._send(200, {
                "id": f"cmpl-{stats.requests}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "latency"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": self.server.reply}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(self.server.reply.split()),
                          "total_tokens": prompt_tokens + len(self.server.reply.split())}})
        finally:
            stats.leave(time.perf_counter() - self.arrived)


def serve(port: int, *, latency_s: float, reply: str, max_requests: int, max_seconds: float,
          idle_seconds: float) -> int:
    server = LatencyHTTPServer(port, latency_s=latency_s, reply=reply)
    print(f"listening on {server.server_address[1]}", flush=True)
    started = time.monotonic()

    def watchdog() -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with server.stats.lock:
                idle = server.stats.in_flight == 0 and now - server.stats.last_request > idle_seconds
                done = server.stats.requests >= max_requests and server.stats.in_flight == 0
            if idle or done or now - started > max_seconds:
                server.shutdown()
                return

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


class LatencyServer:
    """The server in a child process, as a context manager: `with LatencyServer(0.2) as s: s.base_url`."""

    def __init__(self, latency_s: float, *, reply: str = "42", max_requests: int = 100_000,
                 max_seconds: float = 1800.0, idle_seconds: float = 120.0) -> None:
        self.latency_s = latency_s
        self._args = [sys.executable, str(Path(__file__).resolve()), "--latency-ms", str(latency_s * 1000),
                      "--reply", reply, "--max-requests", str(max_requests),
                      "--max-seconds", str(max_seconds), "--idle-seconds", str(idle_seconds)]
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def stats(self) -> dict[str, int]:
        import urllib.request
        with urllib.request.urlopen(f"{self.base_url}/stats", timeout=5) as resp:
            return json.loads(resp.read())

    def __enter__(self) -> "LatencyServer":
        self._proc = subprocess.Popen(self._args, stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line.startswith("listening on "):
            self.__exit__()
            raise RuntimeError(f"the latency server did not start: {line!r}")
        self.port = int(line.split()[-1])
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        if self._proc is not None and self._proc.stdout:
            self._proc.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--reply", default="42", help="the text of every completion")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument("--idle-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    return serve(args.port, latency_s=args.latency_ms / 1000, reply=args.reply,
                 max_requests=args.max_requests, max_seconds=args.max_seconds, idle_seconds=args.idle_seconds)


if __name__ == "__main__":
    sys.exit(main())

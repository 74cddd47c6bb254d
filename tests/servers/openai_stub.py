"""A chat-completions server on 127.0.0.1 that misbehaves on purpose, for batch-level tests.

What it does with a request is chosen by a `mode=NAME` marker in the last message, so one batch
can mix instances that succeed, fail transiently, and fail for good:

- `ok` answers `answer` (default "True"); `flaky-429` / `flaky-500` fail the first one / two
  attempts of a prompt (429 with Retry-After, 500), then answer;
- `429`, `500` always fail; `garbage` is a 200 whose body is not JSON; `empty` a 200 with no
  choices; `hang` holds the request longer than any client timeout; `drop` closes the connection
  without an answer.

Every request is recorded (prompt, mode, arrival time, whether the answer was written out) and the
loop is bounded: after `max_requests` it answers 418 to everything, so a runaway retry loop ends
and shows. `delay_s` slows every answer, so a test can kill a client mid-batch; `gate` (an Event)
holds every request until it is set, so a test can line several clients up (`waiting` counts them).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODE = re.compile(r"mode=([a-z0-9-]+)")


@dataclass
class Hit:
    prompt: str
    mode: str
    at: float
    answered: bool = False


class MisbehavingOpenAI:
    def __init__(self, *, max_requests: int = 200, delay_s: float = 0.0, hang_s: float = 20.0,
                 answer: str = "True", retry_after: float = 0.2,
                 gate: threading.Event | None = None) -> None:
        self.hits: list[Hit] = []
        self.gate = gate
        self.waiting = 0
        self.max_requests = max_requests
        self.delay_s = delay_s
        self.hang_s = hang_s
        self.answer = answer
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "MisbehavingOpenAI":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- what the tests read

    def attempts(self, needle: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if needle in h.prompt]

    def snapshot(self) -> list[Hit]:
        with self._lock:
            return [Hit(h.prompt, h.mode, h.at, h.answered) for h in self.hits]

    # ---- serving

    def _record(self, prompt: str) -> tuple[Hit, int]:
        match = MODE.search(prompt)
        hit = Hit(prompt, match.group(1) if match else "ok", time.monotonic())
        with self._lock:
            self.hits.append(hit)
            earlier = sum(1 for h in self.hits if h.prompt == prompt) - 1
            over = len(self.hits) > self.max_requests
        return hit, (-1 if over else earlier)

    def _reply(self, mode: str, earlier: int) -> tuple[int, Any, dict[str, str]]:
        """(status, body, headers); body None means: drop the connection."""
        retry = {"Retry-After": str(self.retry_after)}
        if earlier < 0:
            return 418, {"error": {"message": "request budget of the test server exhausted"}}, {}
        if mode == "429" or (mode == "flaky-429" and earlier < 1):
            return 429, {"error": {"message": "rate limited", "type": "rate_limit"}}, retry
        if mode == "500" or (mode == "flaky-500" and earlier < 2):
            return 500, {"error": {"message": "internal error"}}, {}
        if mode == "garbage":
            return 200, "<html>this is not json</html>", {}
        if mode == "empty":
            return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "stub", "choices": []}, {}
        if mode == "drop":
            return 0, None, {}
        return 200, {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": self.answer}}],
                     "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}, {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    prompt = str((body.get("messages") or [{}])[-1].get("content", ""))
                except (ValueError, AttributeError):
                    prompt = ""
                hit, earlier = server._record(prompt)
                if server.gate is not None and not server.gate.is_set():
                    with server._lock:
                        server.waiting += 1
                    while not (server.gate.is_set() or server._closing.is_set()):
                        server.gate.wait(0.05)
                    with server._lock:
                        server.waiting -= 1
                if hit.mode == "hang":
                    server._closing.wait(server.hang_s)
                elif server.delay_s:
                    server._closing.wait(server.delay_s)
                status, payload, headers = server._reply(hit.mode, earlier)
                if payload is None:
                    self.close_connection = True
                    self.connection.close()
                    return
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                    hit.answered = status == 200
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass  # the client gave up (timeout) or died (a killed engine)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

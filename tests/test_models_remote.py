"""Remote backends over real HTTP on 127.0.0.1, no SDK mocks: llama.cpp's own OpenAI-compatible
server, a Messages-API stub (canned text, or SmolLM2 behind it) and deliberately misbehaving servers.

Invariants checked here:
- both SDKs make exactly one HTTP request per attempt (their own retries are off), so a server
  that always fails sees `max_retries + 1` requests, and a non-retryable status sees one;
- `with_retries` waits at least the server's Retry-After, and backs off with bounded jitter otherwise;
- a body that is not a completion is a retryable `bad_response`, never text handed to a harness;
- the key never appears in a repr, an error message or hint, the exception chain, or `Settings.public()`.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from ecdysis.errors import ConfigError, ModelError
from ecdysis.models.anthropic_backend import AnthropicBackend, split_system
from ecdysis.models.llamacpp import LlamaCppBackend, gguf_path
from ecdysis.models.loopback import is_loopback_url
from ecdysis.models.openai_backend import PLACEHOLDER_KEY, OpenAIBackend
from ecdysis.models.registry import create_backend
from ecdysis.models.retry import RetryingBackend, parse_retry_after, with_retries
from ecdysis.records import Completion, CompletionRequest
from ecdysis.settings import Settings
from servers.proc_tree import stop

KEY = "sk-ecdysis-test-4f7a9c1e-do-not-leak"
QUESTION = CompletionRequest.make([
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
], max_tokens=24)


# --- a loopback HTTP server in a thread ---------------------------------------------------------

@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict or list -> JSON; str or bytes are sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    delay_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # decoded JSON, or the raw text when it is not JSON


Responder = Callable[[Seen], Reply]


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    # The default listen backlog of 5 resets connections when 16 client threads connect at once
    # (httpx's own transport sees the same resets from it).
    request_queue_size = 128


class LoopbackServer:
    """Stdlib HTTP server on 127.0.0.1:<free port>. Records every request; answers through
    `responder` up to `max_requests`, then 418, so a runaway retry loop ends and shows."""

    def __init__(self, responder: Responder, *, max_requests: int = 20) -> None:
        self.requests: list[Seen] = []
        self._responder = responder
        self._max = max_requests
        self._lock = threading.Lock()
        self._httpd = _ThreadingServer(("127.0.0.1", 0), self._handler_class())
        # A short poll interval keeps shutdown (one per test) from costing half a second.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, seen: Seen) -> Reply:
        with self._lock:
            self.requests.append(seen)
            over_budget = len(self.requests) > self._max
        if over_budget:
            return Reply(418, {"error": {"message": "request budget of the test server exhausted"}})
        return self._responder(seen)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = server.answer(Seen(self.command, self.path, headers, body))
                time.sleep(reply.delay_s)
                payload = reply.body if isinstance(reply.body, (str, bytes)) else json.dumps(reply.body)
                data = payload.encode() if isinstance(payload, str) else payload
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test); nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def scripted(*replies: Reply) -> Responder:
    """Answer with `replies` in order; one more request than scripted is a test failure (418)."""
    queue = list(replies)
    lock = threading.Lock()

    def respond(seen: Seen) -> Reply:
        with lock:
            return queue.pop(0) if queue else Reply(418, {"error": {"message": "script exhausted"}})
    return respond


@pytest.fixture
def serve() -> Iterator[Callable[..., LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def start(responder: Responder, *, max_requests: int = 20) -> LoopbackServer:
        servers.append(LoopbackServer(responder, max_requests=max_requests))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def chat_body(text: Any, *, prompt_tokens: int = 11, completion_tokens: int = 3,
              finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class SleepRecorder:
    """Injected as `sleep`: records each backoff instead of waiting it out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def openai_on(server: LoopbackServer, *, api_key: str | None = KEY, timeout_s: float = 5.0) -> OpenAIBackend:
    return OpenAIBackend("stub-model", base_url=f"{server.url}/v1", api_key=api_key, timeout_s=timeout_s)


def error_chain_text(exc: BaseException) -> str:
    """Everything a traceback of `exc` would print as messages, following causes and contexts."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None:
        parts.append(f"{current!s} {current!r} {getattr(current, 'hint', '')}")
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return "\n".join(parts)


# --- 1. OpenAI SDK against llama.cpp's real OpenAI-compatible server ---------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_serving(proc: subprocess.Popen[bytes], url: str, log: Path, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"llama_cpp.server did not answer /v1/models in {deadline_s}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m llama_cpp.server` with SmolLM2 on a free loopback port; yields its /v1 URL."""
    if importlib.util.find_spec("llama_cpp.server") is None:
        pytest.skip("llama-cpp-python[server] is not installed (pip install -e '.[server]')")
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path("smollm2")),
           "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "2048", "--n_threads", "2"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_serving(proc, url, log, deadline_s=180.0)
        yield url
    finally:
        stop(proc, timeout_s=15)


@pytest.mark.slow
def test_openai_backend_generates_text_on_llama_cpp_server(llama_server: str) -> None:
    backend = OpenAIBackend("smollm2", base_url=llama_server, api_key=None, timeout_s=120.0)
    try:
        out = backend.complete(QUESTION)
    finally:
        backend.close()
    assert out.text.strip(), out
    assert out.prompt_tokens > 10 and out.completion_tokens > 0
    assert out.latency_s > 0 and out.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_openai_backend_reports_length_when_max_tokens_cuts_the_answer(llama_server: str) -> None:
    backend = OpenAIBackend("smollm2", base_url=llama_server, api_key=None, timeout_s=120.0)
    request = CompletionRequest.make(
        [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}],
        max_tokens=5)
    try:
        out = backend.complete(request)
    finally:
        backend.close()
    assert out.finish_reason == "length"
    assert 0 < out.completion_tokens <= 5


@pytest.mark.slow
def test_registry_reaches_local_server_through_openai_base_url_without_key(
        llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llama_server)
    settings = Settings.from_env()
    assert settings.openai_api_key is None
    backend = create_backend("openai:smollm2", settings)
    try:
        out = backend.complete(QUESTION)
    finally:
        backend.close()
    assert isinstance(backend, RetryingBackend) and backend.model_id == "openai:smollm2"
    assert out.text.strip() and out.prompt_tokens > 0 and out.completion_tokens > 0


# --- 2. Anthropic SDK against a Messages-API server on loopback --------------------------------

@dataclass
class Generated:
    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: str


Generator = Callable[[str, list[tuple[str, str]], int, list[str]], Generated]


def _text_of(content: Any) -> str:
    """Message or system content: a string, or a list of blocks of which the text ones count."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _anthropic_error(status: int, kind: str, message: str) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message}})


def messages_api(generate: Generator, *, api_key: str = KEY) -> Responder:
    """POST /v1/messages as the Messages API defines it: key in `x-api-key`, a dated
    `anthropic-version`, required `model`/`max_tokens`/`messages`, a `message` object back."""

    def respond(seen: Seen) -> Reply:
        if seen.method != "POST" or seen.path != "/v1/messages":
            return _anthropic_error(404, "not_found_error", f"no route {seen.method} {seen.path}")
        if seen.headers.get("x-api-key") != api_key:
            # Echo the key the way careless gateways do, so redaction is really exercised.
            return _anthropic_error(401, "authentication_error",
                                    f"invalid x-api-key: {seen.headers.get('x-api-key')}")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", seen.headers.get("anthropic-version", "")):
            return _anthropic_error(400, "invalid_request_error", "anthropic-version header missing")
        body = seen.body if isinstance(seen.body, dict) else {}
        if not {"model", "max_tokens", "messages"} <= body.keys():
            return _anthropic_error(400, "invalid_request_error", "model, max_tokens and messages are required")
        turns = [(m["role"], _text_of(m["content"])) for m in body["messages"]]
        if any(role not in ("user", "assistant") for role, _ in turns):
            return _anthropic_error(400, "invalid_request_error", "roles must be user or assistant")
        out = generate(_text_of(body.get("system", "")), turns, int(body["max_tokens"]),
                       list(body.get("stop_sequences", [])))
        return Reply(200, {"id": "msg_test", "type": "message", "role": "assistant", "model": body["model"],
                           "content": [{"type": "text", "text": out.text}], "stop_reason": out.stop_reason,
                           "stop_sequence": None,
                           "usage": {"input_tokens": out.input_tokens, "output_tokens": out.output_tokens}})
    return respond


CANNED = "Paris is the capital of France and has been for centuries"


def canned(system: str, turns: list[tuple[str, str]], max_tokens: int, stop: list[str]) -> Generated:
    words = CANNED.split()
    prompt = len(system.split()) + sum(len(text.split()) for _, text in turns)
    if len(words) > max_tokens:
        return Generated(" ".join(words[:max_tokens]), prompt, max_tokens, "max_tokens")
    return Generated(CANNED, prompt, len(words), "end_turn")


def smollm2_generator(llm: LlamaCppBackend) -> Generator:
    def generate(system: str, turns: list[tuple[str, str]], max_tokens: int, stop: list[str]) -> Generated:
        messages = ((("system", system),) if system else ()) + tuple(turns)
        out = llm.complete(CompletionRequest(messages=messages, max_tokens=max_tokens, stop=tuple(stop)))
        stop_reason = "max_tokens" if out.finish_reason == "length" else "end_turn"
        return Generated(out.text, out.prompt_tokens, out.completion_tokens, stop_reason)
    return generate


def anthropic_on(server: LoopbackServer, *, api_key: str | None = KEY, timeout_s: float = 5.0) -> AnthropicBackend:
    return AnthropicBackend("claude-test", base_url=server.url, api_key=api_key, timeout_s=timeout_s)


def test_anthropic_sends_key_version_and_system_parameter(serve: Callable[..., LoopbackServer]) -> None:
    server = serve(messages_api(canned))
    backend = anthropic_on(server)
    request = CompletionRequest.make([
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Say it in a sentence."},
        {"role": "system", "content": "No lists."},
    ], max_tokens=50, stop=["\n\n"])
    out = backend.complete(request)
    seen = server.requests[0]
    assert out.text == CANNED and out.finish_reason == "stop"
    assert out.completion_tokens == len(CANNED.split()) and out.prompt_tokens == 13
    assert seen.headers["x-api-key"] == KEY and seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body["system"] == "Be terse.\n\nNo lists."
    assert [m["role"] for m in seen.body["messages"]] == ["user", "assistant", "user"]
    assert seen.body["max_tokens"] == 50 and seen.body["stop_sequences"] == ["\n\n"]
    assert "temperature" not in seen.body  # the API version SDK 2.x speaks rejects it
    assert backend.model_id == "anthropic:claude-test"


def test_anthropic_max_tokens_stop_reason_is_length(serve: Callable[..., LoopbackServer]) -> None:
    server = serve(messages_api(canned))
    out = anthropic_on(server).complete(CompletionRequest.make(
        [{"role": "user", "content": "Capital of France?"}], max_tokens=3))
    assert out.finish_reason == "length"
    assert out.text == "Paris is the" and out.completion_tokens == 3


def test_split_system_merges_turns_of_one_role() -> None:
    system, turns = split_system((("system", "A"), ("user", "q1"), ("user", "q2"), ("tool", "t")))
    assert system == "A"
    assert turns == [{"role": "user", "content": "q1\n\nq2\n\nt"}]


def test_anthropic_wrong_key_fails_at_once_with_hint_and_no_key_in_message(
        serve: Callable[..., LoopbackServer]) -> None:
    server = serve(messages_api(canned, api_key="the-right-key"))
    sleep = SleepRecorder()
    backend = with_retries(anthropic_on(server), max_retries=4, sleep=sleep)
    with pytest.raises(ModelError) as caught:
        backend.complete(QUESTION)
    assert caught.value.kind == "auth" and not caught.value.retryable
    assert "ANTHROPIC_API_KEY" in (caught.value.hint or "")
    assert len(server.requests) == 1 and sleep.delays == []
    assert KEY in json.dumps(server.requests[0].headers)  # the key did travel to the server ...
    assert KEY not in error_chain_text(caught.value)  # ... but not into the error


def test_anthropic_overloaded_and_rate_limited_are_retried(serve: Callable[..., LoopbackServer]) -> None:
    ok = messages_api(canned)
    replies = iter([_anthropic_error(529, "overloaded_error", "Overloaded"),
                    Reply(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
                          headers={"retry-after": "3"})])
    server = serve(lambda seen: next(replies, None) or ok(seen))
    sleep = SleepRecorder()
    out = with_retries(anthropic_on(server), max_retries=3, sleep=sleep, rng=random.Random(1)).complete(QUESTION)
    assert out.text == CANNED
    assert len(server.requests) == 3
    assert 0.0 <= sleep.delays[0] <= 0.5 and sleep.delays[1] == 3.0


@pytest.fixture(scope="module")
def smollm2() -> Iterator[LlamaCppBackend]:
    llm = LlamaCppBackend("smollm2", n_ctx=2048, n_threads=2)
    yield llm
    llm.close()


@pytest.mark.slow
def test_anthropic_backend_generates_through_stub_backed_by_smollm2(
        serve: Callable[..., LoopbackServer], smollm2: LlamaCppBackend) -> None:
    server = serve(messages_api(smollm2_generator(smollm2)))
    # a real generation behind the stub: under a loaded machine it may wait for an admission slot
    out = anthropic_on(server, timeout_s=120.0).complete(QUESTION)
    assert out.text.strip(), out
    assert out.prompt_tokens > 10 and 0 < out.completion_tokens <= QUESTION.max_tokens
    assert out.finish_reason in ("stop", "length") and out.latency_s > 0


# --- 3. OpenAI SDK against a misbehaving server -------------------------------------------------

def test_retries_through_429_500_and_garbage_honouring_retry_after(
        serve: Callable[..., LoopbackServer]) -> None:
    server = serve(scripted(
        Reply(429, {"error": {"message": "Rate limit reached", "type": "requests"}}, headers={"Retry-After": "7"}),
        Reply(500, {"error": {"message": "upstream crashed"}}),
        Reply(200, "{\"choices\": [ {not json"),
        Reply(200, chat_body("Paris")),
    ))
    sleep = SleepRecorder()
    out = with_retries(openai_on(server), max_retries=3, sleep=sleep, rng=random.Random(7)).complete(QUESTION)
    assert out.text == "Paris" and out.prompt_tokens == 11 and out.completion_tokens == 3
    assert len(server.requests) == 4
    assert all(r.path == "/v1/chat/completions" and r.headers["authorization"] == f"Bearer {KEY}"
               for r in server.requests)
    assert len(sleep.delays) == 3
    assert sleep.delays[0] == 7.0  # Retry-After beats the 0.5 s backoff ceiling
    assert 0.0 <= sleep.delays[1] <= 1.0 and 0.0 <= sleep.delays[2] <= 2.0


def test_request_carries_the_completion_parameters(serve: Callable[..., LoopbackServer]) -> None:
    server = serve(scripted(Reply(200, chat_body("ok"))))
    request = CompletionRequest.make([{"role": "user", "content": "hi"}], temperature=0.3,
                                     max_tokens=17, stop=["END"], seed=5)
    openai_on(server, api_key=None).complete(request)
    body = server.requests[0].body
    assert body["model"] == "stub-model" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert (body["temperature"], body["max_tokens"], body["stop"], body["seed"]) == (0.3, 17, ["END"], 5)
    assert server.requests[0].headers["authorization"] == f"Bearer {PLACEHOLDER_KEY}"


def test_last_error_is_raised_with_attempt_count_when_server_always_fails(
        serve: Callable[..., LoopbackServer]) -> None:
    server = serve(lambda seen: Reply(500, {"error": {"message": "still broken"}}))
    sleep = SleepRecorder()
    backend = with_retries(openai_on(server), max_retries=2, sleep=sleep)
    with pytest.raises(ModelError) as caught:
        backend.complete(QUESTION)
    # One request per attempt: had the SDK kept its own retries, the server would see 9.
    assert len(server.requests) == 3 and len(sleep.delays) == 2
    assert caught.value.kind == "server_error" and caught.value.retryable
    assert "3 attempts" in str(caught.value) and "still broken" in str(caught.value)


def test_unauthorized_fails_at_once_with_hint_and_redacted_message(
        serve: Callable[..., LoopbackServer]) -> None:
    server = serve(lambda seen: Reply(401, {"error": {
        "message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error",
        "code": "invalid_api_key"}}))
    sleep = SleepRecorder()
    with pytest.raises(ModelError) as caught:
        with_retries(openai_on(server), max_retries=4, sleep=sleep).complete(QUESTION)
    assert caught.value.kind == "auth" and not caught.value.retryable
    assert caught.value.hint == "check OPENAI_API_KEY"
    assert len(server.requests) == 1 and sleep.delays == []
    assert "Incorrect API key provided: ***" in caught.value.message
    assert KEY not in error_chain_text(caught.value)


@pytest.mark.parametrize("status, body, kind, retryable", [
    (400, {"error": {"message": "Requested tokens (5000) exceed context window of 2048"}},
     "context_overflow", False),
    (400, {"error": {"message": "stop must be a list"}}, "bad_request", False),
    (404, {"error": {"message": "model 'stub-model' not found"}}, "not_found", False),
    (503, {"error": {"message": "loading model"}}, "server_error", True),
    (429, {"error": {"message": "quota"}}, "rate_limit", True),
])
def test_status_codes_map_to_kinds(serve: Callable[..., LoopbackServer], status: int,
                                   body: dict[str, Any], kind: str, retryable: bool) -> None:
    server = serve(scripted(Reply(status, body)))
    with pytest.raises(ModelError) as caught:
        openai_on(server).complete(QUESTION)
    assert (caught.value.kind, caught.value.retryable) == (kind, retryable)
    assert caught.value.retry_after is None and f"HTTP {status}" in caught.value.message


@pytest.mark.parametrize("reply", [
    Reply(200, "{\"id\": \"x\", \"choices\": [", content_type="application/json"),
    Reply(200, "<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
    Reply(200, {"id": "x", "object": "chat.completion", "choices": []}),
    Reply(200, {"id": "x", "object": "list", "data": []}),
    Reply(200, chat_body(None)),
    Reply(200, chat_body({"unexpected": "object"})),
], ids=["truncated-json", "html", "no-choices", "wrong-object", "null-content", "non-text-content"])
def test_garbage_bodies_are_retryable_bad_responses(serve: Callable[..., LoopbackServer], reply: Reply) -> None:
    server = serve(scripted(reply))
    with pytest.raises(ModelError) as caught:
        openai_on(server).complete(QUESTION)
    assert caught.value.kind == "bad_response" and caught.value.retryable


def test_slow_server_is_a_retryable_timeout(serve: Callable[..., LoopbackServer]) -> None:
    server = serve(scripted(Reply(200, chat_body("late"), delay_s=2.0)))
    with pytest.raises(ModelError) as caught:
        openai_on(server, timeout_s=0.3).complete(QUESTION)
    assert caught.value.kind == "timeout" and caught.value.retryable


def test_closed_port_is_a_retryable_connection_error() -> None:
    backend = OpenAIBackend("m", base_url=f"http://127.0.0.1:{_free_port()}/v1", api_key=KEY, timeout_s=2.0)
    with pytest.raises(ModelError) as caught:
        backend.complete(QUESTION)
    assert caught.value.kind == "connection" and caught.value.retryable
    assert "OPENAI_BASE_URL" in (caught.value.hint or "")


def test_parse_retry_after_reads_seconds_milliseconds_and_dates() -> None:
    assert parse_retry_after({"Retry-After": "7"}) == 7.0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    in_a_minute = parse_retry_after({"retry-after": formatdate(time.time() + 60, usegmt=True)})
    assert in_a_minute is not None and 55.0 <= in_a_minute <= 61.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-3"}) is None
    assert parse_retry_after({}) is None


class Flaky:
    """A backend that fails with `error` `failures` times, then answers."""

    model_id = "flaky"
    max_concurrency = 3
    deterministic = True

    def __init__(self, error: ModelError, failures: int) -> None:
        self.error, self.failures, self.calls = error, failures, 0

    def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return Completion(text="done")

    def close(self) -> None:
        pass


def test_retry_after_is_capped_by_max_delay_and_protocol_is_kept() -> None:
    sleep = SleepRecorder()
    inner = Flaky(ModelError("busy", kind="rate_limit", retryable=True, retry_after=120.0), failures=2)
    backend = with_retries(inner, max_retries=2, max_delay=20.0, sleep=sleep)
    assert backend.complete(QUESTION).text == "done"
    assert sleep.delays == [20.0, 20.0]
    assert (backend.model_id, backend.max_concurrency, backend.deterministic) == ("flaky", 3, True)


def test_backoff_grows_exponentially_within_full_jitter() -> None:
    sleep = SleepRecorder()
    inner = Flaky(ModelError("blip", kind="server_error", retryable=True), failures=6)
    with_retries(inner, max_retries=6, base_delay=1.0, max_delay=8.0, sleep=sleep,
                 rng=random.Random(3)).complete(QUESTION)
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert len(sleep.delays) == 6
    assert all(0.0 <= d <= c for d, c in zip(sleep.delays, ceilings))
    assert max(sleep.delays[3:]) > 2.0  # later waits really use the larger ceiling


# --- 4. keys never leak; registry errors ------------------------------------------------------

def test_key_is_absent_from_reprs_and_public_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    backends = [OpenAIBackend("gpt-x", base_url="http://127.0.0.1:9/v1", api_key=KEY, timeout_s=1.0),
                AnthropicBackend("claude-x", base_url="http://127.0.0.1:9", api_key=KEY, timeout_s=1.0)]
    wrapped = [with_retries(b, max_retries=1) for b in backends]
    for backend in backends + wrapped:
        assert KEY not in repr(backend) and KEY not in str(backend)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    settings = Settings.from_env()
    public = settings.public()
    assert public["openai_api_key"] == "set" and public["anthropic_api_key"] == "set"
    assert KEY not in json.dumps(public) and KEY not in repr(settings)


def test_unknown_model_name_is_a_config_error_with_hint() -> None:
    with pytest.raises(ConfigError) as caught:
        create_backend("nope", Settings.from_env())
    assert "openai:NAME" in (caught.value.hint or "")


def test_anthropic_without_key_is_a_config_error_with_hint() -> None:
    with pytest.raises(ConfigError) as caught:
        create_backend("anthropic:x", Settings.from_env())
    assert "ANTHROPIC_API_KEY" in (caught.value.hint or "")


def test_openai_without_key_or_base_url_is_a_config_error_with_hint() -> None:
    with pytest.raises(ConfigError) as caught:
        create_backend("openai:gpt-4o-mini", Settings.from_env())
    assert "OPENAI_BASE_URL" in (caught.value.hint or "")


# --- the loopback transport under the OpenAI SDK -------------------------------------------------

@pytest.mark.parametrize("url, loopback", [
    ("http://127.0.0.1:8000/v1", True), ("http://localhost:11434/v1", True), ("http://[::1]:8080/v1", True),
    ("http://127.3.2.1/v1", True), ("https://127.0.0.1:8000/v1", False), ("http://10.0.0.5:8000/v1", False),
    ("https://api.openai.com/v1", False), ("http://localhost.example.com/v1", False), (None, False), ("", False),
])
def test_only_plain_http_to_this_machine_counts_as_loopback(url: str | None, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_a_local_server_gets_the_loopback_transport_and_a_remote_one_the_sdk_default() -> None:
    local = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    remote = OpenAIBackend("m", base_url="https://api.example.com/v1", api_key=KEY)
    try:
        assert (local.transport, remote.transport) == ("loopback", "httpx")
    finally:
        local.close()
        remote.close()


class _KeepAliveThenClose:
    """A raw HTTP/1.1 server that answers each connection's first request with a kept-alive reply
    (no `Connection: close`) and then closes that connection: what a server with a short idle
    timeout does to a client's pooled connection."""

    def __init__(self, text: str) -> None:
        self.connections = 0
        self.requests = 0
        self._body = json.dumps(chat_body(text)).encode()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(self._body), self._body))
                time.sleep(0.05)  # the client has read the reply and pooled the connection

    def close(self) -> None:
        self._sock.close()


def test_a_kept_alive_connection_the_server_closed_is_retried_once_on_a_fresh_one() -> None:
    server = _KeepAliveThenClose("Paris")
    backend = OpenAIBackend("m", base_url=server.url, api_key=KEY, timeout_s=5.0)
    try:
        first = backend.complete(QUESTION)
        time.sleep(0.2)  # the server has closed the pooled connection by now
        second = backend.complete(QUESTION)
    finally:
        backend.close()
        server.close()
    assert (first.text, second.text) == ("Paris", "Paris")
    # One request per call reached the server: the dead connection cost a reconnect, not a retry
    # of the call (the backend's own retries stay off in this test: no RetryingBackend).
    assert (server.requests, server.connections) == (2, 2)


def test_threads_share_one_backend_over_the_loopback_transport(serve: Callable[..., LoopbackServer]) -> None:
    server = serve(lambda seen: Reply(200, chat_body(seen.body["messages"][-1]["content"][::-1])), max_requests=200)
    backend = openai_on(server)
    questions = [CompletionRequest.make([{"role": "user", "content": f"question {i}"}]) for i in range(64)]
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda q: backend.complete(q).text, questions))
    finally:
        backend.close()
    assert answers == [f"question {i}"[::-1] for i in range(64)]  # every reply went to its own caller
    assert len(server.requests) == 64


# --- 4. Structured output: each remote API's own way of asking for a JSON shape ----------------

SHAPE = {"type": "object", "required": ["verdict", "reason"],
         "properties": {"verdict": {"enum": ["harness-level", "model-specific", "noise"]},
                        "reason": {"type": "string", "minLength": 1, "maxLength": 200}}}
SHAPED = CompletionRequest.make([
    {"role": "system", "content": "You attribute failures of an LLM harness. Reply with JSON."},
    {"role": "user", "content": "15 failures on 10 instances in 5 categories, on both models. Verdict?"}],
    max_tokens=120, json_schema=SHAPE)


def test_openai_asks_for_structured_outputs_and_falls_back_to_json_mode_once_refused(
        serve: Callable[..., LoopbackServer]) -> None:
    refusal = Reply(422, {"detail": [{"loc": ["body", "response_format", "type"],
                                      "msg": "Input should be 'text' or 'json_object'"}]})
    answer = json.dumps({"verdict": "noise", "reason": "one category"})
    server = serve(scripted(refusal, Reply(200, chat_body(answer)), Reply(200, chat_body(answer))))
    backend = openai_on(server, api_key=None)
    assert backend.complete(SHAPED).text == answer
    assert backend.complete(SHAPED).text == answer
    formats = [r.body["response_format"] for r in server.requests]
    assert formats[0] == {"type": "json_schema", "json_schema": {"name": "reply", "schema": SHAPE, "strict": False}}
    assert formats[1] == formats[2] == {"type": "json_object", "schema": SHAPE}  # remembered, no second refusal
    free = serve(scripted(Reply(200, chat_body("ok"))))
    openai_on(free, api_key=None).complete(QUESTION)
    assert "response_format" not in free.requests[0].body


@pytest.mark.slow
def test_openai_structured_output_on_llama_cpp_server(llama_server: str) -> None:
    backend = OpenAIBackend("smollm2", base_url=llama_server, api_key=None, timeout_s=120.0)
    try:
        out = backend.complete(SHAPED)
    finally:
        backend.close()
    value = json.loads(out.text)
    assert value["verdict"] in SHAPE["properties"]["verdict"]["enum"] and value["reason"].strip()
    assert backend._schema_style == "json_object"  # llama-cpp-python's server refused json_schema


def tool_use_api(answer: Callable[[dict[str, Any], list[tuple[str, str]], int], dict[str, Any]]) -> Responder:
    """A Messages API that honours a forced tool call: the reply is a `tool_use` block whose input
    `answer(input_schema, turns, max_tokens)` produces."""
    plain = messages_api(canned)

    def respond(seen: Seen) -> Reply:
        body = seen.body if isinstance(seen.body, dict) else {}
        choice = body.get("tool_choice") or {}
        if choice.get("type") != "tool":
            return plain(seen)
        tool = next((t for t in body.get("tools", []) if t.get("name") == choice.get("name")), None)
        if tool is None:
            return _anthropic_error(400, "invalid_request_error", "tool_choice names no tool")
        turns = [(m["role"], _text_of(m["content"])) for m in body["messages"]]
        value = answer(tool["input_schema"], turns, int(body["max_tokens"]))
        return Reply(200, {"id": "msg_tool", "type": "message", "role": "assistant", "model": body["model"],
                           "content": [{"type": "tool_use", "id": "toolu_1", "name": tool["name"], "input": value}],
                           "stop_reason": "tool_use", "stop_sequence": None,
                           "usage": {"input_tokens": 40, "output_tokens": 12}})
    return respond


def test_anthropic_structured_output_is_a_forced_tool_call(serve: Callable[..., LoopbackServer]) -> None:
    server = serve(tool_use_api(lambda schema, turns, max_tokens: {"verdict": "noise", "reason": "one model"}))
    out = anthropic_on(server).complete(SHAPED)
    assert json.loads(out.text) == {"verdict": "noise", "reason": "one model"}
    assert out.finish_reason == "stop"
    body = server.requests[0].body
    assert body["tools"][0]["input_schema"] == SHAPE
    assert body["tool_choice"] == {"type": "tool", "name": body["tools"][0]["name"]}
    anthropic_on(server).complete(QUESTION)
    assert "tools" not in server.requests[1].body


@pytest.mark.slow
def test_anthropic_tool_call_backed_by_smollm2_under_the_schema(
        serve: Callable[..., LoopbackServer], smollm2: LlamaCppBackend) -> None:
    def answer(schema: dict[str, Any], turns: list[tuple[str, str]], max_tokens: int) -> dict[str, Any]:
        out = smollm2.complete(CompletionRequest.make([{"role": r, "content": c} for r, c in turns],
                                                      max_tokens=max_tokens, json_schema=schema))
        return json.loads(out.text)
    out = anthropic_on(serve(tool_use_api(answer)), timeout_s=120.0).complete(SHAPED)
    value = json.loads(out.text)
    assert value["verdict"] in SHAPE["properties"]["verdict"]["enum"] and value["reason"].strip()

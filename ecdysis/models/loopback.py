"""An httpx transport for a model server on this machine (`http://127.0.0.1:PORT/v1`, vLLM,
llama.cpp's server, Ollama): the standard library's `http.client`, one kept-alive connection per
thread, under the OpenAI SDK as its `http_client`.

The SDK keeps its request building, errors and parsing; only the wire changes. At concurrency 32
on two cores httpx's own send path was a third of the engine's CPU per instance
(`bench/runner_load.py`), and that CPU, taken under one interpreter lock when 32 replies land at
once, is what every call waits for. Proxies, TLS and HTTP/2 have no business on loopback, so
nothing is lost there; any other URL keeps the SDK's default client.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import httpx

# Response headers that describe the wire, not the body http.client hands over (already de-chunked).
_HOP_BY_HOP = frozenset({"transfer-encoding", "connection", "keep-alive"})


def is_loopback_url(url: str | None) -> bool:
    """True for an http:// URL whose host is this machine (localhost, 127.0.0.0/8, ::1)."""
    if not url:
        return False
    parts = urlsplit(url)
    host = (parts.hostname or "").strip("[]").lower()
    if parts.scheme != "http" or not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LoopbackTransport(httpx.BaseTransport):
    """`handle_request` over `http.client`, with a connection per (thread, host, port).

    Failures map to the httpx exceptions the SDK turns into its own: a timeout to
    `httpx.ReadTimeout` (`APITimeoutError`), anything else on the wire to `httpx.ConnectError`
    or `httpx.RemoteProtocolError` (`APIConnectionError`). A kept-alive connection the server has
    closed meanwhile is retried once on a fresh one, as connection pools do, before any byte of a
    response has been read."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[http.client.HTTPConnection] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"the loopback transport speaks http only, not {url.scheme}",
                                            request=request)
        timeout = _read_timeout(request)
        body = request.read()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers.raw}
        target = url.raw_path.decode("ascii")
        for attempt in (0, 1):
            conn, reused = self._connection(url.host, url.port or 80, timeout)
            try:
                conn.request(request.method, target, body=body, headers=headers)
                response = conn.getresponse()
                content = response.read()
            except (TimeoutError, socket.timeout) as exc:
                self._drop(conn)
                raise httpx.ReadTimeout(f"no answer within {timeout}s", request=request) from exc
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop(conn)
                if reused and attempt == 0:
                    continue  # the server closed an idle kept-alive connection: once more, fresh
                raise httpx.RemoteProtocolError(f"the server closed the connection: {exc}",
                                                request=request) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
            if response.will_close:
                self._drop(conn)
            return httpx.Response(
                response.status, content=content, request=request,
                headers=[(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP],
                extensions={"http_version": b"HTTP/1.1"})
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self, host: str, port: int, timeout: float | None) -> tuple[http.client.HTTPConnection, bool]:
        conns: dict[tuple[str, int], http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        conn = conns.get((host, port))
        if conn is not None and conn.sock is not None:
            conn.sock.settimeout(timeout)
            conn.timeout = timeout
            return conn, True
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conns[(host, port)] = conn
        with self._lock:
            self._open.append(conn)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        conns: dict[tuple[str, int], Any] = self._local.__dict__.get("conns", {})
        for key, value in list(conns.items()):
            if value is conn:
                del conns[key]
        with self._lock:  # or every reconnect of a long run would stay listed
            if conn in self._open:
                self._open.remove(conn)

    def close(self) -> None:
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            conn.close()


def _read_timeout(request: httpx.Request) -> float | None:
    timeouts = request.extensions.get("timeout") or {}
    values = [v for v in (timeouts.get("read"), timeouts.get("connect")) if v is not None]
    return max(values) if values else None

"""What the hosted-API backends (OpenAI-compatible, Anthropic) share: `HostedBackend`, the timed
call around their own request and reply handling, and `RemoteErrors`, the one ladder from an SDK's
errors to `ModelError` (both SDKs raise the same four kinds: a status error, a timeout, a
connection error and an unreadable body), with the key redacted from every message.

Each backend keeps what is its own: the hints for its status codes, its environment variable in
the connection hint, the status detail it reads (`message` or `api_message`) and any kind it
refines (OpenAI's context overflow). Every error is raised `from None` by the caller: an SDK error
holds the request, headers included, and the raw body, either of which may echo the key.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Mapping, NoReturn

from ecdysis.errors import ModelError
from ecdysis.models.retry import is_retryable_status, parse_retry_after, status_kind
from ecdysis.records import Completion, CompletionRequest


class HostedBackend:
    """Base of a hosted-API backend: `complete` times the subclass's `_call` (the request, errors
    mapped by its `RemoteErrors`) and hands the response to its `_completion` (the reply checked
    field by field). Subclasses set `model`, `base_url` and `_client` (the SDK client)."""

    model: str
    base_url: str
    _client: Any

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    def complete(self, request: CompletionRequest) -> Completion:
        start = time.perf_counter()
        response = self._call(request)
        return self._completion(response, time.perf_counter() - start)

    def close(self) -> None:
        self._client.close()

    def _call(self, request: CompletionRequest) -> Any:
        raise NotImplementedError

    def _completion(self, response: Any, latency: float) -> Completion:
        raise NotImplementedError


@dataclass(frozen=True)
class RemoteErrors:
    """How one backend's failures read: `model_id` and `base_url` name it, `secret` is redacted,
    `hints` map an HTTP status to what to check, `connection_hint` says what to check when the
    server cannot be reached."""

    model_id: str
    base_url: str
    secret: str = ""
    hints: Mapping[int, str] = field(default_factory=dict)
    connection_hint: str = "check the base URL and that the server is running"

    def redact(self, text: str) -> str:
        return text.replace(self.secret, "***") if self.secret else text

    def translate(self, exc: BaseException, sdk: ModuleType, *, status_detail: str = "",
                  kind: str | None = None) -> ModelError | None:
        """The `ModelError` for an exception the SDK module `sdk` raised, None for any other.
        `status_detail` and `kind` refine a status error (default: its message and its status's kind)."""
        if isinstance(exc, sdk.APIStatusError):
            return self.status(exc.status_code, status_detail or str(exc.message), exc.response.headers, kind=kind)
        if isinstance(exc, sdk.APITimeoutError):  # a subclass of the connection error: checked first
            return ModelError(f"{self.model_id}: no answer from {self.base_url} within the timeout",
                              kind="timeout", retryable=True,
                              hint="raise ECDYSIS_MODEL_TIMEOUT if the server is just slow")
        if isinstance(exc, sdk.APIConnectionError):
            return ModelError(f"{self.model_id}: cannot reach {self.base_url}: {self.redact(str(exc))}",
                              kind="connection", retryable=True, hint=self.connection_hint)
        if isinstance(exc, (sdk.APIResponseValidationError, json.JSONDecodeError)):
            # JSONDecodeError: a 200 whose body claims to be JSON but is not.
            return self.bad_response(f"unreadable response body ({type(exc).__name__})")
        return None

    def reraise(self, exc: BaseException, sdk: ModuleType, **refine: Any) -> NoReturn:
        """Raise `exc` as its `ModelError` (`translate`), without the SDK error as its context;
        an exception the ladder does not know is raised as it is."""
        error = self.translate(exc, sdk, **refine)
        if error is None:
            raise exc
        raise error from None

    def status(self, status: int, detail: str, headers: Any, *, kind: str | None = None) -> ModelError:
        return ModelError(f"{self.model_id}: HTTP {status}: {self.redact(short(detail))}",
                          kind=kind or status_kind(status), retryable=is_retryable_status(status),
                          retry_after=parse_retry_after(headers), hint=self.hints.get(status))

    def bad_response(self, what: str) -> ModelError:
        # Retryable: a proxy hiccup or a truncated body usually comes right on the next try.
        return ModelError(f"{self.model_id}: bad response from {self.base_url}: {what}",
                          kind="bad_response", retryable=True)


def short(text: str, limit: int = 300) -> str:
    """One line of at most `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def token_count(usage: Any, name: str) -> int:
    """A usage field that is a non-negative int, else 0 (bodies are not validated by the SDKs)."""
    value = getattr(usage, name, None)
    return value if isinstance(value, int) and value >= 0 else 0

"""OpenAI-compatible chat completions through the official SDK (OpenAI itself, vLLM, Ollama,
llama.cpp's server, LM Studio via the base URL). The registry wraps it in `with_retries`."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletion

from ecdysis.models.loopback import LoopbackTransport, is_loopback_url
from ecdysis.models.hosted import HostedBackend, RemoteErrors, token_count
from ecdysis.records import Completion, CompletionRequest

# Local servers ignore the key, but the SDK refuses to build a client without one.
PLACEHOLDER_KEY = "no-key-needed"

_HINTS: dict[int, str] = {
    401: "check OPENAI_API_KEY",
    403: "check that OPENAI_API_KEY may use this model",
    404: "check the model name and OPENAI_BASE_URL (it usually ends in /v1)",
    429: "lower the run's concurrency or wait for the quota to refill",
}


class OpenAIBackend(HostedBackend):
    """Chat completions from one model of an OpenAI-compatible server.

    `max_retries=0` in the SDK because `with_retries` owns retrying (otherwise attempts multiply).
    `deterministic` defaults to False: hosted models do not promise the same text at temperature 0;
    pass True for a local server that does. The key lives only inside the SDK client."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 60.0, max_concurrency: int = 64,
                 deterministic: bool = False) -> None:
        self.model = model
        self.model_id = f"openai:{model}"
        self.max_concurrency = max_concurrency
        self.deterministic = deterministic
        # A server on this machine gets the lean loopback transport (see `loopback`); any other
        # keeps the SDK's own httpx client, with its proxy, TLS and pool handling.
        effective = base_url or os.environ.get("OPENAI_BASE_URL")
        http_client = httpx.Client(transport=LoopbackTransport(), timeout=timeout_s, follow_redirects=True) \
            if is_loopback_url(effective) else None
        self.transport = "loopback" if http_client is not None else "httpx"
        self._schema_style = "json_schema"  # or "json_object" once a server refused it
        self._client = openai.OpenAI(api_key=api_key or PLACEHOLDER_KEY, base_url=base_url,
                                     timeout=timeout_s, max_retries=0, http_client=http_client)
        self.base_url = str(self._client.base_url)
        self._errors = RemoteErrors(self.model_id, self.base_url, api_key or "", _HINTS,
                                    "check OPENAI_BASE_URL and that the server is running")

    def _call(self, request: CompletionRequest) -> Any:
        params: dict[str, Any] = dict(model=self.model, messages=request.message_dicts(),
                                      temperature=request.temperature, seed=request.seed,
                                      # max_tokens, not max_completion_tokens: every compatible
                                      # server (vLLM, llama.cpp, Ollama) understands this one.
                                      max_tokens=request.max_tokens)
        if request.stop:
            params["stop"] = list(request.stop)
        if request.json_schema:
            params["response_format"] = self._response_format(request.schema())
        # `from None` everywhere: the SDK error holds the request (headers included) and the raw
        # body, which may echo the key; our message is redacted instead.
        try:
            # The SDK's own low-level POST, not `chat.completions.create`: the same request,
            # errors and parsed `ChatCompletion`, without `create`'s recursive re-typing of the
            # (already plain) parameters: about 1 ms of CPU per call, a sixth of the engine's
            # whole CPU per instance (bench/runner_load.py).
            return self._client.post("/chat/completions", body=params, cast_to=ChatCompletion)
        except openai.APIStatusError as exc:
            if "response_format" in params and self._schema_style == "json_schema" \
                    and exc.status_code in (400, 422, 500) and "response_format" in f"{exc.message} {exc.body}":
                # A server that knows only the older JSON mode with a schema: use that from now on,
                # and ask again once. llama-cpp-python's own server answers its validation error
                # about `response_format` with a 500, others with 400 or 422.
                self._schema_style = "json_object"
                return self._call(request)
            overflow = exc.status_code == 400 and _is_context_overflow(exc)
            self._errors.reraise(exc, openai, kind="context_overflow" if overflow else None)
        except (openai.APIError, json.JSONDecodeError) as exc:
            self._errors.reraise(exc, openai)

    def _response_format(self, schema: dict[str, Any] | None) -> dict[str, Any]:
        """Structured Outputs as OpenAI defines it (also vLLM and llama.cpp's C++ server), non-strict
        since our schemas have optional fields; or, for a server that refused that, JSON mode with
        the schema beside it, which llama-cpp-python's server turns into a grammar."""
        if self._schema_style == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": False}}
        return {"type": "json_object", "schema": schema}

    def _completion(self, response: Any, latency: float) -> Completion:
        # The SDK does not validate bodies: a non-JSON 200 comes back as a str, and a JSON one of
        # the wrong shape as a half-built object, so every field is checked here.
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise self._errors.bad_response("the response has no choices")
        message = getattr(choices[0], "message", None)
        text = getattr(message, "content", None)
        if not isinstance(text, str):
            raise self._errors.bad_response(f"choice 0 has no text content (got {type(text).__name__})")
        usage = getattr(response, "usage", None)
        finish = getattr(choices[0], "finish_reason", None)
        return Completion(text=text, prompt_tokens=token_count(usage, "prompt_tokens"),
                          completion_tokens=token_count(usage, "completion_tokens"), latency_s=latency,
                          finish_reason=finish if isinstance(finish, str) and finish else "stop")


def _is_context_overflow(exc: openai.APIStatusError) -> bool:
    message = str(exc.message).lower()
    return exc.code == "context_length_exceeded" or "context window" in message \
        or "context length" in message

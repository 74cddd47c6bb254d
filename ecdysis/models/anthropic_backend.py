"""Anthropic's Messages API through the official SDK (or any server that speaks it, via the base
URL). The registry wraps it in `with_retries`; system messages become the `system` parameter."""

from __future__ import annotations

import json
from typing import Any

import anthropic

from ecdysis.models.hosted import HostedBackend, RemoteErrors, token_count
from ecdysis.records import Completion, CompletionRequest

# A local Anthropic-compatible server may need no key; without one the SDK would go looking for
# credential profiles on disk, which is not what a caller without a key asked for.
PLACEHOLDER_KEY = "no-key-needed"

_HINTS: dict[int, str] = {
    401: "check ANTHROPIC_API_KEY",
    403: "check that ANTHROPIC_API_KEY may use this model",
    404: "check the model name (e.g. claude-3-5-haiku-latest) and ANTHROPIC_BASE_URL",
    429: "lower the run's concurrency or wait for the rate limit to reset",
    529: "Anthropic is overloaded; retry later",
}

_FINISH: dict[str, str] = {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop",
                          "tool_use": "stop"}


class AnthropicBackend(HostedBackend):
    """Messages from one Anthropic model.

    The request's temperature and seed are not sent: SDK 2.x has no sampling parameters and the
    API version it speaks rejects them, so `deterministic` is False. The key goes both as the
    SDK's Bearer token and as `x-api-key`, the header Anthropic-compatible gateways check."""

    deterministic = False

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 60.0, max_concurrency: int = 16) -> None:
        self.model = model
        self.model_id = f"anthropic:{model}"
        self.max_concurrency = max_concurrency
        key = api_key or PLACEHOLDER_KEY
        self._client = anthropic.Anthropic(api_key=key, base_url=base_url, timeout=timeout_s,
                                           max_retries=0, default_headers={"x-api-key": key})
        self.base_url = str(self._client.base_url)
        self._errors = RemoteErrors(self.model_id, self.base_url, api_key or "", _HINTS,
                                    "check ANTHROPIC_BASE_URL and the network")

    def _call(self, request: CompletionRequest) -> Any:
        system, messages = split_system(request.messages)
        params: dict[str, Any] = dict(model=self.model, messages=messages,
                                      max_tokens=request.max_tokens)
        if system:
            params["system"] = system
        if request.stop:
            params["stop_sequences"] = list(request.stop)
        if request.json_schema:
            # Anthropic's structured output is tool use: one tool whose input is the schema,
            # and a forced call of it; `_completion` returns that input as the JSON text.
            params["tools"] = [{"name": REPLY_TOOL, "description": "Give the reply in this shape.",
                                "input_schema": request.schema()}]
            params["tool_choice"] = {"type": "tool", "name": REPLY_TOOL}
        # `from None`: the SDK error holds the request headers and raw body, which may carry the key.
        try:
            return self._client.messages.create(**params)
        except anthropic.APIStatusError as exc:
            self._errors.reraise(exc, anthropic, status_detail=str(exc.api_message or exc.message))
        except (anthropic.APIError, json.JSONDecodeError) as exc:
            self._errors.reraise(exc, anthropic)

    def _completion(self, response: Any, latency: float) -> Completion:
        # Bodies are not validated by the SDK, so a wrong shape is caught here, field by field.
        blocks = getattr(response, "content", None)
        if not isinstance(blocks, list):
            raise self._errors.bad_response("the response has no content list")
        texts = [b.text for b in blocks
                 if getattr(b, "type", None) == "text" and isinstance(getattr(b, "text", None), str)]
        tool_inputs = [b.input for b in blocks if getattr(b, "type", None) == "tool_use"
                       and getattr(b, "name", None) == REPLY_TOOL and isinstance(getattr(b, "input", None), dict)]
        if tool_inputs:
            texts = [json.dumps(tool_inputs[0], ensure_ascii=False)]
        if not texts:
            raise self._errors.bad_response("the response has no text block")
        usage = getattr(response, "usage", None)
        stop = getattr(response, "stop_reason", None)
        finish = _FINISH.get(stop, stop) if isinstance(stop, str) else "stop"
        return Completion(text="".join(texts), prompt_tokens=token_count(usage, "input_tokens"),
                          completion_tokens=token_count(usage, "output_tokens"), latency_s=latency,
                          finish_reason=finish)


REPLY_TOOL = "reply"


def split_system(messages: tuple[tuple[str, str], ...]) -> tuple[str, list[dict[str, str]]]:
    """System messages joined into the `system` text; the rest as user/assistant turns, with
    consecutive turns of one role merged, since the API wants the roles to alternate."""
    system = [content for role, content in messages if role == "system"]
    turns: list[dict[str, str]] = []
    for role, content in messages:
        if role == "system":
            continue
        role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + content
        else:
            turns.append({"role": role, "content": content})
    return "\n\n".join(system), turns



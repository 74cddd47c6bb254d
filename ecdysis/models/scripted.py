"""A scripted model for deterministic unit tests only (never a default): replies come from a list
or a JSON file, by prompt substring or in order, and every request is recorded."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from ecdysis.errors import ConfigError, ModelError
from ecdysis.records import Completion, CompletionRequest


@dataclass(frozen=True)
class Rule:
    """Reply `text` when `match` occurs in the last message (or always, when `match` is None)."""

    text: str
    match: str | None = None


class ScriptedBackend:
    """Scores options too: the option its script would reply (case and spaces aside) gets
    log-probability 0, every other one -10 per word, so tests can tell a scored answer."""

    max_concurrency = 8
    deterministic = True
    scores_options = True

    def __init__(self, rules: list[Rule] | None = None, *, model_id: str = "scripted",
                 queue: list[str] | None = None, default: str | None = None) -> None:
        self.model_id = model_id
        self.rules = list(rules or [])
        self.queue = list(queue or [])
        self.default = default
        self.history: list[CompletionRequest] = []
        self._lock = threading.Lock()

    @staticmethod
    def from_file(path: str | Path, *, model_id: str = "scripted") -> "ScriptedBackend":
        """File: {"rules": [{"match": "...", "text": "..."}], "queue": [...], "default": "..."}."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read scripted responses from {path}: {exc}") from exc
        rules = [Rule(text=r["text"], match=r.get("match")) for r in data.get("rules", [])]
        return ScriptedBackend(rules, model_id=model_id, queue=data.get("queue"), default=data.get("default"))

    def enqueue(self, *texts: str) -> None:
        with self._lock:
            self.queue.extend(texts)

    def complete(self, request: CompletionRequest) -> Completion:
        with self._lock:
            self.history.append(request)
            last = request.messages[-1][1] if request.messages else ""
            text = next((r.text for r in self.rules if r.match is not None and r.match in last), None)
            if text is None and self.queue:
                text = self.queue.pop(0)
            if text is None:
                text = next((r.text for r in self.rules if r.match is None), self.default)
        if text is None:
            raise ModelError(f"scripted model has no reply for: {last[:80]!r}", kind="script_exhausted")
        prompt_tokens = sum(len(c.split()) for _, c in request.messages)
        if request.options:
            said = " ".join(text.split()).lower()
            lengths = [max(1, len(o.split())) for o in request.options]
            logprobs = [0.0 if " ".join(o.split()).lower() == said else -10.0 * n
                        for o, n in zip(request.options, lengths)]
            best = max(range(len(logprobs)), key=lambda i: logprobs[i] / lengths[i])
            return Completion(text=request.options[best], prompt_tokens=prompt_tokens, completion_tokens=sum(lengths),
                              option_logprobs=logprobs, option_tokens=lengths)
        words = text.split()
        finish = "stop"
        if len(words) > request.max_tokens:
            text, finish = " ".join(words[: request.max_tokens]), "length"
        return Completion(text=text, prompt_tokens=prompt_tokens,
                          completion_tokens=min(len(words), request.max_tokens), latency_s=0.0,
                          finish_reason=finish)

    def close(self) -> None:
        pass

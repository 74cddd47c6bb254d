"""Typed records that flow through the engine: suite -> runner -> trajectories.

JSON appears only at the edges (store, CLI, sandbox pipe); inside the engine these are dataclasses.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Literal, Mapping, Sequence, TypeVar

_D = TypeVar("_D")
_T = TypeVar("_T")


def from_fields(cls: type[_D], data: Mapping[str, Any]) -> _D:
    """The dataclass `cls` built from a stored dict: every field taken from `data`, a missing one
    as None, unknown keys ignored (a record written by another version still reads)."""
    return cls(**{f.name: data.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")

# Why an instance failed before scoring; None when the harness returned an answer.
ErrorType = Literal["exception", "timeout", "memory", "model_error", "bad_output", "crash"]


@dataclass(frozen=True)
class Instance:
    """One task instance. `target` never reaches harness code; `id` does not either."""

    id: str
    input: str
    target: str
    category: str = "default"
    choices: tuple[str, ...] | None = None
    split: Split | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def task_view(self) -> dict[str, Any]:
        """What the harness sees: no target and no id, so a harness cannot key on either."""
        return {"input": self.input, "choices": list(self.choices) if self.choices else None,
                "category": self.category, "fields": dict(self.fields)}


@dataclass(frozen=True)
class ScorerSpec:
    """How answers are compared with targets: exact | numeric | multiple_choice | regex."""

    kind: str = "exact"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    name: str
    instances: list[Instance]
    scorer: ScorerSpec = field(default_factory=ScorerSpec)
    description: str = ""
    source: str = "builtin"

    @property
    def categories(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for inst in self.instances:
            counts[inst.category] = counts.get(inst.category, 0) + 1
        return dict(sorted(counts.items()))

    def split(self, name: Split) -> list[Instance]:
        return [i for i in self.instances if i.split == name]


@dataclass(frozen=True)
class CompletionRequest:
    """Messages in; the cache key covers everything that can change the text out. `json_schema`
    (JSON text, empty for free text) asks the backend for output of that shape with its native
    structured-output feature; its properties keep the order they were given in, because a grammar
    made from it asks for them in that order (a call's "name" before its "arguments"), and the
    cache key covers that order too. `options`, when given, asks for no text at all: the backend
    scores each option as the assistant's reply (its log-probability given the messages), and the
    completion carries the scores. Each enters the cache key only when set, so plain keys stay
    what they were."""

    messages: tuple[tuple[str, str], ...]
    temperature: float = 0.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0
    json_schema: str = ""
    options: tuple[str, ...] = ()

    @staticmethod
    def make(messages: list[dict[str, str]], *, temperature: float = 0.0, max_tokens: int = 256,
             stop: list[str] | tuple[str, ...] | None = None, seed: int = 0,
             json_schema: dict[str, Any] | None = None,
             options: list[str] | tuple[str, ...] | None = None) -> "CompletionRequest":
        return CompletionRequest(
            messages=tuple((str(m["role"]), str(m["content"])) for m in messages),
            temperature=float(temperature), max_tokens=int(max_tokens),
            stop=tuple(stop or ()), seed=int(seed),
            json_schema=json.dumps(json_schema, ensure_ascii=False) if json_schema else "",
            options=checked_options(options))

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def schema(self) -> dict[str, Any] | None:
        return json.loads(self.json_schema) if self.json_schema else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": self.message_dicts(), "temperature": self.temperature,
                               "max_tokens": self.max_tokens, "stop": list(self.stop), "seed": self.seed}
        if self.json_schema:
            out["json_schema"] = self.schema()
        if self.options:
            out["options"] = list(self.options)
        return out

    def cache_key(self, model_id: str) -> str:
        return request_key(model_id, self.to_json())


def request_key(model_id: str, request: dict[str, Any]) -> str:
    """The cache key of a request in its `to_json` form: a recorded call's (`ModelCall.request`)
    is its request's `cache_key`."""
    if isinstance(request.get("json_schema"), dict):  # its order is part of what it asks for
        request = {**request, "json_schema": json.dumps(request["json_schema"], ensure_ascii=False)}
    blob = json.dumps({"model": model_id, **request}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def in_turn(groups: Iterable[Sequence[_T]]) -> list[_T]:
    """The items of `groups`, one from each group in turn (in the groups' order) until every group
    is spent: how a few instances span every category, not only the first."""
    queues = [list(group) for group in groups]
    out: list[_T] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def keys_sorted(value: Any) -> Any:
    """`value` with every object's keys in sorted order, all the way down."""
    if isinstance(value, dict):
        return {k: keys_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [keys_sorted(v) for v in value]
    return value


MAX_OPTIONS = 64         # options one scoring call may weigh
MAX_OPTION_CHARS = 2000  # characters of one option


def checked_options(options: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The options of a scoring request, refused with a ValueError unless they are 1 to
    MAX_OPTIONS distinct non-empty strings of at most MAX_OPTION_CHARS characters."""
    if not options:
        return ()
    if isinstance(options, str) or not all(isinstance(o, str) for o in options):
        raise ValueError("options must be a list of strings")
    out = tuple(options)
    if len(out) > MAX_OPTIONS:
        raise ValueError(f"{len(out)} options; a scoring call takes at most {MAX_OPTIONS}")
    if any(not o.strip() for o in out):
        raise ValueError("an option is empty")
    if any(len(o) > MAX_OPTION_CHARS for o in out):
        raise ValueError(f"an option is longer than {MAX_OPTION_CHARS} characters")
    if len(set(out)) != len(out):
        raise ValueError("the options are not distinct")
    return out


@dataclass
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str = "stop"  # "stop" | "length"
    cache_hit: bool = False
    # On a cache hit, the latency the call took when it was made (latency_s is then the lookup's).
    recorded_latency_s: float = 0.0
    # A scoring call's answer: each option's log-probability as the reply (natural log, summed over
    # its tokens) and its length in tokens; `text` is then the option with the highest mean.
    option_logprobs: list[float] | None = None
    option_tokens: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ModelCall:
    """One call the harness made, as the engine saw it (the trajectory is a list of these)."""

    seq: int
    model: str
    request: dict[str, Any]
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str
    cache_hit: bool
    error: str | None = None
    option_logprobs: list[float] | None = None  # a scoring call's scores, one per requested option


@dataclass
class InstanceResult:
    run_id: str
    instance_id: str
    category: str
    model: str
    answer: str | None
    target: str
    correct: bool
    score: float
    error_type: ErrorType | None = None
    error_message: str | None = None
    stdout_tail: str = ""
    calls: list[ModelCall] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.calls)

    @property
    def raw_output(self) -> str:
        """The last model text, which is what answer extraction worked on."""
        return self.calls[-1].text if self.calls else ""


RunStatus = Literal["pending", "running", "done", "failed", "cancelled"]


@dataclass
class RunRecord:
    id: str
    suite: str
    model: str
    harness_version: str
    split: str
    instance_ids: list[str]
    concurrency: int = 1
    status: RunStatus = "pending"
    created_at: float = 0.0
    finished_at: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    label: str = ""


@dataclass
class RunSummary:
    run_id: str
    suite: str
    model: str
    harness_version: str
    n: int
    accuracy: float
    accuracy_by_category: dict[str, float]
    model_calls: int
    cache_hits: int
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float
    errors: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

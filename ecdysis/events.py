"""The progress events the engine sends to whoever watches a job (the CLI's printer, the app's
progress bars, a benchmark's log): one TypedDict per kind, told apart by its `type`, so a sink
that matches `event["type"] == "instance_done"` is checked to read only that event's keys.

Events are plain dicts at run time (a sink may log or serialise them as they are); nothing waits
on a sink, and a sink must not raise.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, TypedDict, Union


class RunStarted(TypedDict):
    """A batch starts (or resumes: `done` instances were already stored)."""

    type: Literal["run_started"]
    run_id: str
    total: int
    done: int


class InstanceDone(TypedDict):
    """One instance of a batch is scored and stored."""

    type: Literal["instance_done"]
    run_id: str
    done: int
    total: int
    instance_id: str
    correct: bool
    error_type: str | None


class RunFinished(TypedDict):
    type: Literal["run_finished"]
    run_id: str
    status: str
    accuracy: float


class Clustered(TypedDict):
    """A diagnosis has clustered the batch's failures."""

    type: Literal["clustered"]
    clusters: int
    failures: int


class Probed(TypedDict):
    """The recoverability probe is done; `harness_level` clusters are left to repair."""

    type: Literal["probed"]
    harness_level: int


class _RefiningKeys(TypedDict):
    type: Literal["refining"]
    cluster_id: str


class Refining(_RefiningKeys, total=False):
    """The roles start on one cluster; with `alternative`, the engine weighs drafting its own pick
    for it (skipped when the roles chose that pick)."""

    alternative: bool


class Diagnosed(TypedDict):
    type: Literal["diagnosed"]
    diagnosis_id: str
    proposals: int


class _IterationKeys(TypedDict):
    type: Literal["iteration_done"]
    evolution_id: str
    iteration: int
    harness_version: str
    val_accuracy: float | None
    gate: str


class IterationDone(_IterationKeys, total=False):
    """An evolution iteration is over: the keys above, and the rest of its stored row (train
    accuracy, proposals, calls by phase...), without its steps and history."""

    train_accuracy: float | None
    proposals: int
    kept: int
    model_calls: int
    extra: dict[str, Any]


Event = Union[RunStarted, InstanceDone, RunFinished, Clustered, Probed, Refining, Diagnosed, IterationDone]
EventSink = Callable[[Event], None]

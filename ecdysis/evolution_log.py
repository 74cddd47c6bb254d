"""What an evolution leaves in the store, as typed records.

The evolver keeps its working state in JSON columns (`EvolutionRecord.iterations` and `.result`,
`HarnessVersion.metrics`), because a crash must lose nothing and a resume must pick up exactly
where it stood. Everything that reads that state back — the app, the CLI, the strategy comparison,
the export, the benchmarks — reads it through these records instead: one parser per shape, which
tolerates rows written by older versions (a missing key is its default), so no face re-parses keys.

    for row in evo.rows: row.val_accuracy, row.steps[0].verdict.wins   # EvolutionRecord.rows
    evo.outcome.test_accuracy, evo.outcome.cursor.phase                 # EvolutionRecord.outcome
    version.measured.val_accuracy                                       # HarnessVersion.measured
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping


def _pick(cls: type, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys of `data` that are fields of `cls`: newer keys an older reader does not know are
    ignored, missing ones take the field's default."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in (data or {}).items() if k in names}


def _no_change_error(se: float | None, wins: int, losses: int) -> float:
    """A stored standard error of no change (`gate.spread`), or, for a row stored before it was,
    the one-model figure its gate used: sqrt(wins + losses)."""
    return se if se is not None else math.sqrt(wins + losses)


@dataclass(frozen=True)
class GateVerdict:
    """The paired acceptance gate's verdict on one candidate against its parent."""

    passed: bool       # the candidate beat its parent by more than the noise (and paid for its calls)
    reason: str
    wins: int          # instances the candidate gets right and the parent wrong
    losses: int        # the reverse: regressions
    n: int             # paired instances compared
    parent_accuracy: float
    candidate_accuracy: float
    policy: str
    # The standard error of the net gain under no change (`gate.spread`); None on rows written
    # before it was stored, whose gate took sqrt(wins + losses) (`error`).
    se: float | None = None

    @property
    def error(self) -> float:
        return _no_change_error(self.se, self.wins, self.losses)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> GateVerdict | None:
        if not data:
            return None
        d = {"passed": bool(data.get("accepted")),  # rows written before the field was renamed
             "reason": "", "wins": 0, "losses": 0, "n": 0, "parent_accuracy": 0.0,
             "candidate_accuracy": 0.0, "policy": "", **_pick(cls, data)}
        return cls(**d)


@dataclass(frozen=True)
class Spend:
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> Spend:
        d = _pick(cls, data)
        return cls(int(d.get("calls") or 0), int(d.get("tokens") or 0), float(d.get("seconds") or 0.0))


@dataclass(frozen=True)
class Cursor:
    """Where a stored evolution stands: the iteration and phase its next step resumes at."""

    iteration: int | None = None
    phase: str | None = None          # train | diagnose | ... | test | finished
    diagnosis_id: str | None = None   # the diagnosis of the iteration in progress, once made

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> Cursor:
        d = _pick(cls, data)
        it = d.get("iteration")
        return cls(it if isinstance(it, int) else None, d.get("phase"), d.get("diagnosis_id"))


@dataclass(frozen=True)
class Screening:
    """A change tried alone on its cluster and the batch, paired against the parent's outcomes."""

    n: int | None = None
    earlier: int = 0      # of the n, outcomes from this change's screens on earlier batches
    wins: int = 0
    losses: int = 0
    net: int | None = None
    se: float | None = None  # the net's standard error under no change (`gate.spread`); None before it was stored
    parent_calls: float | None = None
    candidate_calls: float | None = None
    extra_calls: float | None = None
    passed: bool | None = None
    reason: str = ""
    read: int | None = None  # a repair of reading passed on this many answers it now reads
    # A repair of reading validated against the same parent as the others that survived with it
    # (`Evolver._readings_by_validation`): n, wins, losses, net, and `rivals` (proposal_id,
    # operator, wins, losses, net each), which decided the order they were validated in.
    contest: Mapping[str, Any] | None = None

    @property
    def error(self) -> float:
        return _no_change_error(self.se, self.wins, self.losses)

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> Screening | None:
        return cls(**_pick(cls, data)) if data else None


@dataclass(frozen=True)
class Measured:
    """A change's effect at the validation gate (jointly with `jointly_with` others when the
    strategy composes changes)."""

    val_delta: float
    wins: int = 0
    losses: int = 0
    n: int = 0
    kept: bool = False
    jointly_with: int = 0
    extra_calls: float | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> Measured | None:
        if not data or "val_delta" not in data:
            return None
        return cls(**_pick(cls, data))


@dataclass(frozen=True)
class AppliedChange:
    """One approved proposal as applied to a version: what it predicted and what it measured."""

    proposal_id: str
    cluster_id: str = ""
    operator: str = ""
    predicted: str = ""
    edited: bool = False
    spec: Mapping[str, Any] = field(default_factory=dict)
    screened: Screening | None = None
    measured: Measured | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> AppliedChange:
        d = _pick(cls, data)
        return cls(proposal_id=str(d.get("proposal_id", "")), cluster_id=str(d.get("cluster_id") or ""),
                   operator=str(d.get("operator") or ""), predicted=str(d.get("predicted") or ""),
                   edited=bool(d.get("edited")), spec=dict(d.get("spec") or {}),
                   screened=Screening.parse(d.get("screened")), measured=Measured.parse(d.get("measured")))


@dataclass(frozen=True)
class GateStep:
    """One candidate of an iteration through the validation gate: changes are validated one at a
    time, so an iteration has a step per change that reached validation."""

    parent: str | None
    candidate: str | None
    verdict: GateVerdict | None
    kept: bool
    changes: tuple[AppliedChange, ...]
    spent: Spend | None = None   # what the iteration had spent when the verdict came (None: not recorded)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> GateStep:
        return cls(parent=data.get("parent"), candidate=data.get("candidate"),
                   verdict=GateVerdict.parse(data.get("verdict")), kept=bool(data.get("kept")),
                   changes=tuple(AppliedChange.parse(c) for c in data.get("changes") or ()),
                   spent=Spend.parse(data["spent"]) if data.get("spent") else None)


@dataclass(frozen=True)
class Tried:
    """A proposal of an iteration and what became of it (kept, rolled back, screened out, not
    validated, rejected by a person, not endorsed by the Critic, not applied), as later
    iterations' roles are told."""

    proposal_id: str
    operator: str = ""
    cluster_id: str = ""
    change: str = ""
    outcome: str = ""
    why: str = ""
    harness_version: str = ""

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Tried:
        d = _pick(cls, data)
        return cls(**{k: str(v or "") for k, v in d.items()})


@dataclass(frozen=True)
class PairScreen:
    """Two changes screened composed (a near miss and a change screened after it): against the
    parent, and over the later change alone on the same batch; what became of the pair."""

    members: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    passed: bool = False
    n: int | None = None
    wins: int = 0
    losses: int = 0
    net: int | None = None
    over_alone: Mapping[str, int] = field(default_factory=dict)
    outcome: str = ""
    why: str = ""

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> PairScreen:
        d = _pick(cls, data)
        return cls(**{**d, "members": tuple(str(m) for m in d.get("members") or ()),
                      "operators": tuple(str(o or "") for o in d.get("operators") or ()),
                      "passed": bool(d.get("passed")), "over_alone": dict(d.get("over_alone") or {}),
                      "outcome": str(d.get("outcome") or ""), "why": str(d.get("why") or "")})


@dataclass(frozen=True)
class IterationRow:
    """A finished iteration of an evolution."""

    iteration: int
    harness_version: str = ""            # the version the iteration ended on
    parent_version: str = ""
    candidate_version: str | None = None
    train_accuracy: float | None = None
    val_accuracy: float | None = None    # of the last kept candidate, or the parent's
    proposals: int = 0
    screened: int = 0
    screen_rounds: int = 1
    applied: int = 0
    kept: int = 0
    rolled_back: bool = False
    gate: str = ""                       # the gate's reasons, or why there was no candidate
    steps: tuple[GateStep, ...] | None = None  # None in rows written before steps were stored
    history: tuple[Tried, ...] = ()
    pairs: tuple[PairScreen, ...] = ()   # pairs screened together (`EvolveConfig.complements`)
    model_calls: int = 0
    tokens: int = 0
    model_seconds: float | None = None   # None in rows written before model seconds were charged
    calls_by_phase: Mapping[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0            # working time, without waiting for a human
    review_wait_seconds: float = 0.0
    diagnosis_id: str | None = None
    diagnosis_ids: tuple[str, ...] = ()
    partial: bool = False                # sealed early: recorded as far as it went

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> IterationRow:
        d = _pick(cls, data)
        steps = d.pop("steps", None)
        return cls(**{**d, "iteration": int(d.get("iteration") or 0),
                      "steps": None if steps is None else tuple(GateStep.parse(s) for s in steps),
                      "history": tuple(Tried.parse(h) for h in d.get("history") or ()),
                      "pairs": tuple(PairScreen.parse(p) for p in d.get("pairs") or ()),
                      "diagnosis_ids": tuple(d.get("diagnosis_ids") or ()),
                      "model_calls": int(d.get("model_calls") or 0), "tokens": int(d.get("tokens") or 0),
                      "model_seconds": None if d.get("model_seconds") is None else float(d["model_seconds"]),
                      "wall_seconds": float(d.get("wall_seconds") or 0.0),
                      "calls_by_phase": dict(d.get("calls_by_phase") or {}), "gate": str(d.get("gate") or "")})


@dataclass(frozen=True)
class EvolutionOutcome:
    """What an evolution has spent and, once its sealed test is scored, achieved."""

    final_version: str | None = None
    test_accuracy: float | None = None
    base_test_accuracy: float | None = None
    test_instances: int | None = None
    test_runs: tuple[str, ...] = ()
    test_base_runs: tuple[str, ...] = ()
    spent: Spend = Spend()
    test_spent: Spend = Spend()      # the sealed test's calls, never charged to training
    stopped: str | None = None       # why the last attempt stopped, while it is stopped
    stopped_by: str | None = None    # the budget limit that stopped it: "calls", "tokens" or "wall"
    diagnoses: tuple[str, ...] = ()
    cursor: Cursor = Cursor()

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> EvolutionOutcome:
        d = _pick(cls, data)
        return cls(final_version=d.get("final_version"), test_accuracy=d.get("test_accuracy"),
                   base_test_accuracy=d.get("base_test_accuracy"), test_instances=d.get("test_instances"),
                   test_runs=tuple(d.get("test_runs") or ()), test_base_runs=tuple(d.get("test_base_runs") or ()),
                   spent=Spend.parse(d.get("spent")), test_spent=Spend.parse(d.get("test_spent")),
                   stopped=d.get("stopped"), stopped_by=d.get("stopped_by"), diagnoses=tuple(d.get("diagnoses") or ()),
                   cursor=Cursor.parse(d.get("cursor")))


@dataclass(frozen=True)
class VersionMetrics:
    """What the engine measured about a harness version (`HarnessVersion.metrics`)."""

    val_accuracy: float | None = None
    parent_val_accuracy: float | None = None
    test_accuracy: float | None = None
    gate: GateVerdict | None = None
    applied: tuple[AppliedChange, ...] = ()
    models: tuple[str, ...] = ()
    evolution: str | None = None
    iteration: int | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> VersionMetrics:
        d = _pick(cls, data)
        num = {k: (float(d[k]) if isinstance(d.get(k), (int, float)) else None)
               for k in ("val_accuracy", "parent_val_accuracy", "test_accuracy")}
        return cls(**num, gate=GateVerdict.parse(d.get("gate")),
                   applied=tuple(AppliedChange.parse(a) for a in d.get("applied") or () if isinstance(a, Mapping)),
                   models=tuple(d.get("models") or ()), evolution=d.get("evolution"), iteration=d.get("iteration"))

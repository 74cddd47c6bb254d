"""The role seam of Failure-Driven Collaborative Refinement: what a role backend receives (a
`CaseFile`), what it returns (a `RoleTurn` of schema-valid output plus transcript messages).

Both backends (heuristic, LLM) return the same objects, validated against the same JSON schemas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Protocol, Sequence

import jsonschema

from ecdysis.aggregate import BatchContext, Cluster
from ecdysis.records import from_fields

RoleName = Literal["investigator", "attributor", "proposer", "critic"]
ROLES: tuple[RoleName, ...] = ("investigator", "attributor", "proposer", "critic")
MessageKind = Literal["prompt", "reply", "repair", "output", "fallback", "check"]


@dataclass
class RoleMessage:
    """One entry of a role-by-role transcript. `data` holds the validated structured output on
    `output` messages; `text` is always a human-readable rendering."""

    round: int
    role: RoleName
    kind: MessageKind
    backend: str
    text: str
    data: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "RoleMessage":
        return from_fields(RoleMessage, data)


@dataclass(frozen=True)
class ModificationSpec:
    """A harness modification specification: what changes where, and why it is general."""

    target_files: tuple[str, ...]
    change: str
    root_cause: str
    expected_effect: str
    risk: str
    scope: str
    operator: str | None = None
    exemplars: tuple[str, ...] = ()  # instance keys of passing train instances quoted as few-shot
    # Filled by the engine, not the Proposer: the most calls per instance the patched harness's
    # parameters allow, and the consolidated outcome of the review passes (what was agreed, what
    # stays disputed, how many passes ran).
    expected_calls: float = 1.0
    agreed: tuple[str, ...] = ()
    disputed: tuple[str, ...] = ()
    passes: int = 1

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("target_files", "exemplars", "agreed", "disputed"):
            data[key] = list(data[key])
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "ModificationSpec":
        return ModificationSpec(
            target_files=tuple(data.get("target_files") or ()), change=str(data.get("change", "")),
            root_cause=str(data.get("root_cause", "")), expected_effect=str(data.get("expected_effect", "")),
            risk=str(data.get("risk", "")), scope=str(data.get("scope", "")), operator=data.get("operator"),
            exemplars=tuple(data.get("exemplars") or ()), expected_calls=float(data.get("expected_calls", 1.0) or 1.0),
            agreed=tuple(str(a) for a in data.get("agreed") or ()),
            disputed=tuple(str(d) for d in data.get("disputed") or ()), passes=int(data.get("passes", 1) or 1))


@dataclass(frozen=True)
class Exemplar:
    """A passing train instance that a few-shot operator may quote (the sanctioned exception to
    the leakage rule): it passed in every run of the batch that attempted it and failed in none."""

    key: str
    instance_id: str
    category: str
    input: str
    choices: tuple[str, ...] | None
    answer: str


@dataclass(frozen=True)
class CheckResult:
    """One hard check of the Critic (applies, loads + smoke run, no leakage)."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Draft:
    """The Proposer's output made concrete: the spec, the new files and, once checked, the results."""

    spec: ModificationSpec
    files: dict[str, str]
    replies: list[str] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)


# Outcomes that judge a change on one batch only: on the next batch it may be proposed again.
BATCH_VERDICTS = ("screened_out", "not_validated", "not_endorsed")


@dataclass
class CaseFile:
    """Everything the roles of one cluster see: the cluster, the harness it failed under, the batch,
    the passing train exemplars, and what earlier roles and rounds said."""

    cluster: Cluster
    files: dict[str, str]
    harness_version: str
    batch: BatchContext
    exemplars: list[Exemplar] = field(default_factory=list)
    investigation: dict[str, Any] | None = None
    attribution: dict[str, Any] | None = None
    draft: Draft | None = None
    objections: list[str] = field(default_factory=list)       # the Critic's, for the next round
    # A review pass's measured concerns about an accepted spec ({"kind", "text"}), for the Critic.
    concerns: list[dict[str, str]] = field(default_factory=list)
    tried_operators: list[str] = field(default_factory=list)  # operators already objected to here
    # When set, the engine's Proposer drafts only these catalogue operators (a cluster's other
    # reading repairs, drafted beside its proposal: `diagnosis._reading_siblings`).
    only_operators: tuple[str, ...] = ()
    # What earlier iterations of the evolution tried and what became of it: dicts with operator,
    # change, outcome (kept | rejected | not_endorsed | screened_out | rolled_back | not_validated |
    # not_applied) and why. `rejected` is a person's decision; `not_endorsed` is the Critic's.
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ruled_out(self) -> dict[str, str]:
        """Operators tried before without being kept, with what happened: one a person rejected,
        always; one the gate rolled back, while the harness is still the version it was tried on
        (on a changed harness it may complete a kept change); one that screening found no better,
        whose validation the budget left could not pay for, or that the Critic did not endorse,
        on that harness and in the same batch only (see `screened_elsewhere`, `refused_elsewhere`). The Critic's "no"
        is not a person's: a repair set aside for budget and then re-drafted is refused by the
        novelty check, and that refusal must not outlive the batch."""
        out: dict[str, str] = {}
        for h in self.history:
            outcome = h.get("outcome")
            same = h.get("harness_version") in (None, self.harness_version)
            if outcome in BATCH_VERDICTS and h.get("other_batch"):
                continue
            if h.get("operator") and (outcome == "rejected"
                                      or (outcome in (*BATCH_VERDICTS, "rolled_back") and same)):
                out[str(h["operator"])] = f"{str(outcome).replace('_', ' ')} in iteration {h.get('iteration', '?')}"
        return out

    def _elsewhere(self, outcome: str) -> list[dict[str, Any]]:
        """History entries with this outcome on an earlier iteration's batch of this same harness."""
        return [h for h in self.history if h.get("operator") and h.get("outcome") == outcome
                and h.get("other_batch") and h.get("harness_version") in (None, self.harness_version)]

    @property
    def refused_elsewhere(self) -> dict[str, str]:
        """Operators the Critic did not endorse on an earlier iteration's batch of this harness.
        Its refusal holds on that batch only, but it is evidence: such an operator is proposed
        again only after every untried one (re-proposed first, it took every round the Proposer
        had, and the next-ranked operator never got its turn)."""
        return {str(h["operator"]): f"not endorsed by the Critic on another batch in iteration "
                                    f"{h.get('iteration', '?')}" for h in self._elsewhere("not_endorsed")}

    @property
    def screened_elsewhere(self) -> dict[str, str]:
        """Operators screening turned down on an earlier iteration's batch of this same harness. A
        batch of 12 instances is weak evidence (on a BIG-bench mixture a repair screened out at 1
        won, 2 lost gained 27 to 16 on validation), so such a change may be proposed again, marked
        as tried, and screened on the new batch."""
        return {str(h["operator"]): f"screened out on another batch in iteration {h.get('iteration', '?')} "
                                    f"({str(h.get('why', ''))[:160]})" for h in self._elsewhere("screened_out")}


@dataclass
class RoleTurn:
    """What one role produced in one round: `output` is schema-valid for that role."""

    output: dict[str, Any]
    messages: list[RoleMessage]


class RoleBackend(Protocol):
    """Contract for a role backend.

    - `run(role, case, round)` returns a `RoleTurn` whose `output` validates against
      `SCHEMAS[role]`, and the transcript messages of that turn (prompts, raw replies, repairs,
      fallbacks, the final `output`), all tagged with `round`.
    - It never raises for a bad model reply: malformed output is repaired, retried or replaced by
      the heuristic backend's output, and the transcript says which.
    - The Proposer's `output` either names a catalogue `operator`, gives `edits` (exact find/replace
      pairs on harness files), or gives `files` (full new text of changed files); refine turns it
      into a `Draft`. The Critic's `output` is advisory: refine's hard checks always apply too.
    """

    name: str

    def run(self, role: RoleName, case: CaseFile, round: int) -> RoleTurn: ...


# ---------------------------------------------------------------- schemas

_TEXT = {"type": "string", "minLength": 1}
_SPEC = {
    "type": "object",
    "required": ["target_files", "change", "root_cause", "expected_effect", "risk", "scope"],
    "properties": {
        "target_files": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "change": _TEXT, "root_cause": _TEXT, "expected_effect": _TEXT, "risk": _TEXT, "scope": _TEXT,
        "exemplars": {"type": "array", "items": {"type": "string"}},
    },
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "investigator": {
        "type": "object", "required": ["root_cause", "component", "evidence"],
        "properties": {"root_cause": _TEXT, "component": _TEXT,
                       "evidence": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                       "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    },
    "attributor": {
        "type": "object", "required": ["verdict", "reason", "cross_instance", "cross_model"],
        "properties": {"verdict": {"enum": ["harness-level", "model-specific", "noise"]}, "reason": _TEXT,
                       "cross_instance": _TEXT, "cross_model": _TEXT},
    },
    "proposer": {
        "type": "object", "anyOf": [{"required": ["spec"]}, {"required": ["give_up"]}],
        "properties": {
            "operator": {"type": ["string", "null"]},
            "spec": _SPEC,
            "edits": {"type": "array", "items": {
                "type": "object", "required": ["path", "find", "replace"],
                "properties": {"path": _TEXT, "find": {"type": "string"}, "replace": {"type": "string"}}}},
            "files": {"type": "object", "additionalProperties": {"type": "string"}},
            "replies": {"type": "array", "items": {"type": "string"}},
            "give_up": {"type": "string"},
        },
    },
    "critic": {
        "type": "object", "required": ["decision", "objections"],
        "properties": {"decision": {"enum": ["accept", "revise"]},
                       "objections": {"type": "array", "items": {"type": "string"}},
                       "notes": {"type": "string"}},
    },
}


def schema_errors(role: RoleName, output: Any) -> list[str]:
    """Every way `output` breaks the role's schema, as short messages (empty when valid)."""
    validator = jsonschema.Draft202012Validator(SCHEMAS[role])
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(output), key=lambda e: list(e.absolute_path))]


def render_output(role: RoleName, output: Mapping[str, Any]) -> str:
    """A human-readable line or two for a role's structured output (for the transcript)."""
    if role == "investigator":
        return f"Root cause ({output.get('component')}): {output.get('root_cause')}"
    if role == "attributor":
        return f"{output.get('verdict')}: {output.get('reason')}"
    if role == "proposer":
        if output.get("give_up"):
            return f"No proposal: {output['give_up']}"
        spec = output.get("spec", {})
        how = f"operator {output['operator']}" if output.get("operator") else "hand-written edit"
        return f"Proposes ({how}) on {', '.join(spec.get('target_files', []))}: {spec.get('change')}"
    if output.get("decision") == "accept":
        return "Accepts the proposal." + (f" {output.get('notes')}" if output.get("notes") else "")
    return "Objects: " + " | ".join(output.get("objections", []))


def render_transcript(messages: Sequence[RoleMessage]) -> str:
    return "\n".join(f"[round {m.round}] {m.role} ({m.kind}, {m.backend}): {m.text}" for m in messages)

"""Failure-Driven Collaborative Refinement: per harness-level cluster, Investigator -> Attributor ->
Proposer <-> Critic for at most `max_rounds`, ending in an endorsed or a rejected `Proposal`.

Whatever the role backend says, the Critic's hard checks decide too: the patch applies cleanly to
the current harness, the patched harness loads and answers a smoke run on one train instance, and
no instance id, target answer or instance-specific text of the data appears in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tomllib
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from ecdysis.diffs import ApplyResult, FileDiff, apply_diffs, diff_files
from ecdysis.errors import BudgetExceeded, EcdysisError, InputError, ModelError
from ecdysis.harness import validate_files
from ecdysis.models.gateway import (CALL_LIMIT_MESSAGE, MAX_CALLS_PER_SOLVE, ModelGateway, harness_reply,
                                    harness_request)
from ecdysis.records import Instance, ScorerSpec, in_turn
from ecdysis.roles.base import CaseFile, CheckResult, Draft, Exemplar, ModificationSpec, RoleBackend, RoleMessage
from ecdysis.roles.drafting import ProposalError, materialize
from ecdysis.roles.operators import OPERATORS
from ecdysis.sandbox import SandboxLimits, WorkerPool
from ecdysis.store import ProposalRecord

ProposalStatus = Literal["endorsed", "rejected"]  # the Critic's word on a proposal
ENGINE = "engine"
# Answers so common that finding one in code says nothing about a particular instance.
GENERIC_ANSWERS = {"true", "false", "yes", "no", "none", ""}
# A target at least this many instances share is a class label ("different", "valid",
# "plausible"): the task's vocabulary, which names no instance, so a patch may use the word.
LABEL_SHARE = 3
_TOKEN = re.compile(r"[a-z0-9]+")
_STRING_LITERAL = re.compile(r"(?P<q>['\"])(?P<body>(?:\\.|(?!(?P=q)).)*)(?P=q)")


# ---------------------------------------------------------------- the proposal record

@dataclass
class Proposal:
    """A harness modification: its spec, a diff per changed file against `base_harness`, the checks
    it passed or failed, and the full role-by-role transcript that produced it."""

    id: str
    cluster_id: str
    status: ProposalStatus
    spec: ModificationSpec
    diffs: list[FileDiff]
    base_harness: str
    rounds: int
    checks: list[CheckResult]
    objections: list[str]
    transcript: list[RoleMessage]
    reason: str
    # Set on the engine's own pick drafted beside the roles' proposal for the same cluster: why.
    alternative: str = ""

    @property
    def files(self) -> dict[str, str]:
        """Full new text of every changed (or added) file."""
        return {d.path: d.new for d in self.diffs if d.new is not None}

    def apply_to(self, files: Mapping[str, str]) -> ApplyResult:
        return apply_diffs(files, self.diffs)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "cluster_id": self.cluster_id, "status": self.status, "reason": self.reason,
                "spec": self.spec.to_json(), "base_harness": self.base_harness, "rounds": self.rounds,
                "diffs": [d.to_json() for d in self.diffs], "checks": [c.to_json() for c in self.checks],
                "objections": list(self.objections), "transcript": [m.to_json() for m in self.transcript],
                **({"alternative": self.alternative} if self.alternative else {})}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Proposal":
        return Proposal(
            id=data["id"], cluster_id=data["cluster_id"],
            status="endorsed" if data["status"] == "accepted" else data["status"],  # the older name
            spec=ModificationSpec.from_json(data["spec"]), diffs=[FileDiff.from_json(d) for d in data["diffs"]],
            base_harness=data["base_harness"], rounds=int(data["rounds"]),
            checks=[CheckResult(**c) for c in data.get("checks", [])], objections=list(data.get("objections", [])),
            transcript=[RoleMessage.from_json(m) for m in data.get("transcript", [])], reason=data.get("reason", ""),
            alternative=str(data.get("alternative") or ""))

    def to_record(self, diagnosis_id: str, created_at: float = 0.0) -> ProposalRecord:
        """The storable form (`Store.save_proposal`); rejected proposals are stored as rejected."""
        return ProposalRecord(
            id=self.id, diagnosis_id=diagnosis_id, cluster_id=self.cluster_id, harness_version=self.base_harness,
            spec=self.spec.to_json(), files=self.files,
            status="pending" if self.status == "endorsed" else "rejected",
            data={k: v for k, v in self.to_json().items() if k in ("diffs", "checks", "objections",
                                                                  "transcript", "reason", "rounds", "status",
                                                                  "alternative")},
            created_at=created_at)


@dataclass
class RefineOutcome:
    """What refinement of one cluster produced: a proposal, or the reason there is none."""

    cluster_id: str
    proposal: Proposal | None
    transcript: list[RoleMessage]
    no_patch_reason: str | None = None


def expected_calls(files: Mapping[str, str]) -> float:
    """The most model calls per instance a harness's parameters allow (samples x (1 + retries));
    1 when harness.toml does not say. A harness whose code loops by itself is measured instead,
    in screening."""
    try:
        params = tomllib.loads(files.get("harness.toml", "")).get("params", {})
        return float(max(1, int(params.get("samples", 1))) * (1 + max(0, int(params.get("retries", 0)))))
    except (tomllib.TOMLDecodeError, TypeError, ValueError, AttributeError):
        return 1.0


# ---------------------------------------------------------------- the data the leakage check guards

def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _shingles(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass
class DataIndex:
    """Every instance of the batch's suites (train, validation and test alike), which passing train
    instances are sanctioned exemplars, and the input shingles that occur in exactly one instance
    (text shared by a template is not instance-specific)."""

    instances: dict[str, Instance]
    exemplars: dict[str, Exemplar]
    specific: dict[tuple[str, ...], str]
    ids: re.Pattern[str] | None
    shingle: int
    labels: frozenset[str] = frozenset()  # targets (lowercased) shared by LABEL_SHARE instances or more

    @staticmethod
    def build(instances: Mapping[str, Instance], exemplars: Sequence[Exemplar], shingle: int = 6) -> "DataIndex":
        owners: dict[tuple[str, ...], set[str]] = {}
        for key, inst in instances.items():
            for s in _shingles(_tokens(inst.input), shingle):
                owners.setdefault(s, set()).add(key)
        specific = {s: next(iter(keys)) for s, keys in owners.items() if len(keys) == 1}
        ids = sorted({i.id for i in instances.values() if len(i.id) >= 4}, key=len, reverse=True)
        pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, ids)) + r")(?![\w-])") if ids else None
        shared = Counter(i.target.strip().lower() for i in instances.values())
        labels = frozenset(t for t, n in shared.items() if n >= LABEL_SHARE)
        return DataIndex(dict(instances), {e.key: e for e in exemplars}, specific, pattern, shingle, labels)


def _distinctive(target: str, labels: frozenset[str]) -> bool:
    """A target specific enough that finding it in a patch means the answer was copied in: not a
    generic answer, not one character, and not a class label many instances share (an English
    word such as "different" in a patch's comment is no instance's answer leaking)."""
    text = target.strip().lower()
    return (text not in GENERIC_ANSWERS and text not in labels and len(text) >= 2
            and not re.fullmatch(r"[a-z]", text))


@dataclass(frozen=True)
class LeakageCheck:
    """No instance data in the lines a patch adds. Decided as follows:

    - an instance id (any split) anywhere: leak;
    - a run of `shingle` tokens that occurs in exactly one instance's input: leak, unless that
      instance is a declared exemplar of the spec and a sanctioned one (a train instance that
      passed in every run of the batch and failed in none);
    - a target answer: in harness code, a string literal equal to a distinctive target (not
      True/False/yes/no, a single character or a class label `LABEL_SHARE` instances or more share)
      of any non-exemplar instance; in any file, a
      multi-word or long distinctive target; and any target, however short, on the same line as
      text specific to that instance anywhere in the patch (`if <question> in input: return <answer>`);
    - a declared exemplar that is not sanctioned (failing, or not a passing train instance): leak.
    Exemplars quoted by the few-shot operator are therefore allowed, and only those: a line that
    quotes a sanctioned exemplar is checked for instance ids only (its options may coincide with
    another instance's answer, which is the exemplar's own data)."""

    def check(self, diffs: Sequence[FileDiff], spec: ModificationSpec, index: DataIndex) -> CheckResult:
        problems = self.problems(diffs, spec, index)
        if problems:
            return CheckResult("leakage", False, "leaks task data: " + "; ".join(problems[:4]))
        return CheckResult("leakage", True, "no instance id, target or instance-specific text in the patch"
                           + (f" (quotes {len(spec.exemplars)} sanctioned exemplars)" if spec.exemplars else ""))

    def problems(self, diffs: Sequence[FileDiff], spec: ModificationSpec, index: DataIndex) -> list[str]:
        declared = set(spec.exemplars)
        found = [f"declares {key} as an exemplar, but it is not a passing train instance"
                 for key in sorted(declared) if key not in index.exemplars]
        allowed = declared & set(index.exemplars)
        added = [(d.path, line) for d in diffs for line in d.added_lines()]
        quoting = [self._quotes_exemplar(line, allowed, index) for _, line in added]
        for (path, line), exemplar_line in zip(added, quoting):
            found += self._line(line, path, allowed, exemplar_line, index)
        # A line quoting a sanctioned exemplar is the exemplar's own text: on a templated task (formal
        # fallacies) it shares runs of words with other instances' questions, which is no leak of them.
        found += self._quoted([a for a, q in zip(added, quoting) if not q], allowed, index)
        return list(dict.fromkeys(found))

    @staticmethod
    def _quoted(added: Sequence[tuple[str, str]], allowed: set[str], index: DataIndex) -> list[str]:
        """Instances whose specific text the patch quotes; with their target too, a hard-coded answer."""
        owners = {index.specific[s] for _, line in added for s in _shingles(_tokens(line), index.shingle)
                  if s in index.specific}
        text = "\n".join(line for _, line in added).lower()
        out: list[str] = []
        for key in sorted(owners - allowed):
            inst = index.instances[key]
            target = inst.target.strip().lower()
            if target and re.search(rf"(?<![\w/]){re.escape(target)}(?![\w/])", text):
                out.append(f"hard-codes the answer {inst.target!r} of instance {inst.id} (quotes its question "
                           f"and its answer)")
            else:
                out.append(f"quotes text specific to instance {inst.id} (not a sanctioned exemplar)")
        return out

    @staticmethod
    def _quotes_exemplar(line: str, allowed: set[str], index: DataIndex) -> bool:
        return any(index.specific.get(s) in allowed for s in _shingles(_tokens(line), index.shingle))

    @staticmethod
    def _line(line: str, path: str, allowed: set[str], exemplar_line: bool, index: DataIndex) -> list[str]:
        out: list[str] = []
        if index.ids is not None:
            out += [f"names instance id {m}" for m in index.ids.findall(line)]
        if exemplar_line:
            # The line quotes a sanctioned exemplar (its question, options and answer); an option
            # that happens to equal another instance's answer is the exemplar's data, not a leak.
            return out
        literals = ({m.group("body").strip().lower() for m in _STRING_LITERAL.finditer(line)}
                    if path.endswith(".py") else set())
        lowered = f" {line.lower()} "
        for key, inst in index.instances.items():
            target = inst.target.strip().lower()
            if key in allowed or not _distinctive(target, index.labels):
                continue
            if target in literals:
                out.append(f"hard-codes the target answer {inst.target!r} of instance {inst.id}")
            elif (" " in target or len(target) >= 8) and re.search(rf"(?<!\w){re.escape(target)}(?!\w)", lowered):
                out.append(f"contains the target answer {inst.target!r} of instance {inst.id}")
        return out


# ---------------------------------------------------------------- smoke run and the hard checks

# How many of a cluster's failing instances a call-multiplying draft is probed on before screening.
HEADROOM_PROBES = 3


def train_failures(cluster: Any, instances: Mapping[str, Instance], model: str, *,
                   others_too: bool = False) -> list[tuple[str, Instance]]:
    """The cluster's failing train instances as (key, instance), `model`'s own failures first, by
    key (with `others_too`, then the other models' failures)."""
    mine = {f.key for f in cluster.failures if f.model == model}
    keys = sorted(mine) + (sorted({f.key for f in cluster.failures} - mine) if others_too else [])
    return [(k, inst) for k in keys if (inst := instances.get(k)) is not None and inst.split == "train"]


def spread(failures: Sequence[tuple[str, Instance]], n: int,
           asked: Sequence[str] | set[str] = ()) -> list[tuple[str, Instance]]:
    """Up to `n` of `failures`, drawn in turn from each category they span, so a few probes speak
    for the whole cluster and not for the category whose name sorts first; in each category, and
    across categories, in an order fixed by a hash of the key, not by the name. Failures in `asked`
    (already asked about; a cached, deterministic model would answer the same) come last."""
    def rank(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    picked: list[tuple[str, Instance]] = []
    for pool in ([f for f in failures if f[0] not in asked], [f for f in failures if f[0] in asked]):
        by_category: dict[str, list[tuple[str, Instance]]] = {}
        for key, inst in sorted(pool, key=lambda f: rank(f[0])):
            by_category.setdefault(inst.category, []).append((key, inst))
        picked += in_turn(by_category[c] for c in sorted(by_category, key=rank))
    return picked[:n]


@dataclass
class SmokeRunner:
    """Runs a patched harness on one instance in the sandbox, with a real model through the
    gateway (cached, so a repeated smoke run is free)."""

    gateway: ModelGateway
    limits: SandboxLimits = field(default_factory=lambda: SandboxLimits(timeout_s=60.0))
    scorers: dict[str, ScorerSpec] = field(default_factory=dict)  # suite name -> scorer

    def suite_of(self, key: str) -> str:
        """The suite of an instance key ("suite/instance id"): the longest suite name this runner
        scores that the key starts with, since a suite named by its file's path holds "/" too."""
        names = [name for name in self.scorers if key.startswith(f"{name}/")]
        return max(names, key=len) if names else key.rsplit("/", 1)[0]

    def run(self, files: dict[str, str], instance: Instance, suite: str = "") -> CheckResult:
        outcome, calls, errors = self._solve(files, instance)
        if outcome.error_type or outcome.answer is None:
            why = errors[-1] if errors else outcome.error_message
            return CheckResult("loads", False, f"the patched harness fails its smoke run on train instance "
                                               f"{instance.id}: {outcome.error_type}: {why}")
        verdict = self._score(outcome.answer, instance, self.scorers.get(suite))
        return CheckResult("loads", True, f"loads and answers the smoke run on {instance.id} with "
                                          f"{outcome.answer[:60]!r} in {calls} model call(s){verdict}")

    def _solve(self, files: dict[str, str], instance: Instance) -> tuple[Any, int, list[str]]:
        """The patched harness's outcome on one instance, the model calls it made, its call errors.
        Raises BudgetExceeded when the budget refused one of its calls: what the harness made of
        the refusal is not its outcome, and a check or probe that counted it would refuse a repair
        for want of budget (the evolution stops instead, and its resume asks again)."""
        errors: list[str] = []
        calls = [0]
        starved: list[BudgetExceeded] = []

        def on_generate(req: dict[str, Any]) -> dict[str, Any]:
            if calls[0] >= MAX_CALLS_PER_SOLVE:
                errors.append(CALL_LIMIT_MESSAGE)
                return {"op": "model_error", "message": errors[-1]}
            calls[0] += 1
            try:
                done = self.gateway.complete(harness_request(req))
            except (ModelError, BudgetExceeded, KeyError, TypeError, ValueError) as exc:
                errors.append(str(exc))
                if isinstance(exc, BudgetExceeded):
                    starved.append(exc)
                return {"op": "model_error", "message": str(exc)}
            return harness_reply(done)

        pool = WorkerPool(files, self.limits)
        try:
            outcome = pool.solve(instance.task_view(), on_generate)
        finally:
            pool.close()
        if starved:
            raise starved[-1]
        return outcome, calls[0], errors

    def still_passes(self, files: dict[str, str], instance: Instance, suite: str = "") -> bool | None:
        """Whether the patched harness still answers a passing instance correctly (None: unknown)."""
        result = self.run(files, instance, suite)
        if not result.ok:
            return False
        if result.detail.endswith("(not correct)"):
            return False
        return True if result.detail.endswith("(correct)") else None

    def recovered(self, files: dict[str, str], members: Sequence[tuple[str, Instance]]) -> list[str]:
        """The keys ("suite/id") of `members` (failures) the patched harness now gets right."""
        return self.right_and_read(files, members)[0]

    def right_and_read(self, files: dict[str, str],
                       members: Sequence[tuple[str, Instance]]) -> tuple[list[str], list[str]]:
        """One run per member (failures): the keys the patched harness now gets right, and the keys
        for which it now returns an answer of the task's form, right or wrong. For a repair that
        only changes how a reply is read, the second is the evidence that the harness can read
        the model's answer; whether that answer is right is the model's."""
        from ecdysis.failures import conforms, expected_shape
        right, read = [], []
        for key, inst in members:
            outcome, _, _ = self._solve(files, inst)
            if outcome.error_type or outcome.answer is None:
                continue  # what `run` fails
            answer = outcome.answer.strip()
            if answer and conforms(answer, expected_shape(inst), inst):
                read.append(key)
            # Scored as `run` scores a smoke run: the answer as the harness returned it.
            if self._score(outcome.answer, inst, self.scorers.get(self.suite_of(key))) == " (correct)":
                right.append(key)
        return right, read

    @staticmethod
    def _score(answer: str, instance: Instance, scorer: ScorerSpec | None) -> str:
        """Informational only: gating on one instance's correctness would fit the patch to it."""
        if scorer is None:
            return ""
        try:
            from ecdysis.suites.scorers import score
            return " (correct)" if score(answer, instance, scorer) else " (not correct)"
        except (EcdysisError, ImportError):
            return ""


@dataclass
class CriticChecks:
    """The hard checks every draft goes through, whichever backend plays the Critic."""

    index: DataIndex
    smoke: SmokeRunner
    current_files: dict[str, str]
    leakage: LeakageCheck = field(default_factory=LeakageCheck)
    # Why the budget left could not screen and validate a harness with these files, or None (an
    # evolution's; a lone diagnosis has no such limit). Asked of drafts that add model calls only.
    affordable: Callable[[dict[str, str]], str | None] | None = None

    def run(self, case: CaseFile, draft: Draft) -> tuple[list[CheckResult], list[FileDiff]]:
        diffs = diff_files(case.files, draft.files)
        results = [self._novel(case, draft, diffs), self._applies(diffs, draft)]
        try:
            validate_files(draft.files)
        except InputError as exc:
            results.append(CheckResult("loads", False, f"the patched harness does not load: {exc}"))
        else:
            # A patch that repeats a repair already present, or does not apply, is not run (it has
            # failed already): the same wrapper applied twice calls itself, call after call.
            if all(r.ok for r in results):
                more = expected_calls(draft.files) > expected_calls(case.files)
                short = self.affordable(draft.files) if more and self.affordable is not None else None
                if short:
                    # Its smoke run and headroom probes would buy evidence for a change no validation
                    # could follow (on BIG-Bench Hard, a diagnosis that smoke-ran and probed 5-sample
                    # voting took 123 calls of an iteration that could not then validate it).
                    results.append(CheckResult("affordable", False, f"not affordable: {short}"))
                else:
                    key = self._smoke_key(case)
                    results.append(self.smoke.run(draft.files, self.index.instances[key], self.smoke.suite_of(key)))
                    if results[-1].ok and more:
                        results.append(self._headroom(case, draft))
        results.append(self.leakage.check(diffs, draft.spec, self.index))
        return results, diffs

    def _headroom(self, case: CaseFile, draft: Draft) -> CheckResult:
        """A draft that multiplies calls (voting, retries) must first show it can recover something:
        run on up to `HEADROOM_PROBES` of the cluster's failing train instances (the smoke model's
        own failures first), at least one must come back right. Screening such a change on the
        whole batch costs its extra calls on every instance; a change that recovers none of a few
        failures is not worth that."""
        calls = expected_calls(draft.files)
        mine = self.smoke.gateway.model_id
        probes = train_failures(case.cluster, self.index.instances, mine, others_too=True)[:HEADROOM_PROBES]
        if not probes:
            return CheckResult("headroom", True, "no train instance of the cluster to probe; screening decides")
        recovered = self.smoke.recovered(draft.files, probes)
        if not recovered:
            return CheckResult("headroom", False, f"the patched harness may make up to {calls:g} model calls per "
                                                  f"instance but recovers none of {len(probes)} of the cluster's "
                                                  f"failing instances on {mine}; extra calls need headroom first")
        return CheckResult("headroom", True, f"recovers {len(recovered)} of {len(probes)} of the cluster's failing "
                                             f"instances on {mine} ({', '.join(recovered)})")

    @staticmethod
    def _novel(case: CaseFile, draft: Draft, diffs: Sequence[FileDiff]) -> CheckResult:
        name = draft.spec.operator
        if not diffs:
            return CheckResult("novel", False, "the patch changes nothing")
        if name and name in OPERATORS and OPERATORS[name].present(case.files):
            return CheckResult("novel", False, f"operator {name} is already present in the harness; "
                                               f"propose a different repair")
        if name and name in case.ruled_out:
            # The heuristic Proposer skips these itself; an LLM Proposer is told and may still
            # propose one, and each such draft would cost a screen that has already said no.
            return CheckResult("novel", False, f"operator {name} was {case.ruled_out[name]} on this harness; "
                                               f"propose a different repair")
        return CheckResult("novel", True, f"changes {', '.join(d.path for d in diffs)}")

    def _applies(self, diffs: list[FileDiff], draft: Draft) -> CheckResult:
        result = apply_diffs(self.current_files, diffs)
        if not result.ok:
            return CheckResult("applies", False, "the patch does not apply cleanly to the current harness: "
                                                 + "; ".join(result.failures))
        changed = [d.path for d in diffs]
        if any((result.files or {}).get(p) != draft.files.get(p) for p in changed):
            return CheckResult("applies", False, "the patch applies but does not reproduce the proposed files")
        hunks = sum(len(v) for v in result.hunk_flags.values())
        return CheckResult("applies", True, f"all {hunks} hunk(s) apply cleanly to the current harness")

    def concerns(self, case: CaseFile, draft: Draft) -> list[dict[str, str]]:
        """What a review pass weighs beyond the hard checks, each with its evidence: regressions
        (the patch run on up to two passing train instances of other categories), cost (calls
        per instance the patched harness can make), generality (the categories the cluster spans).
        Regressions demand a revision; the others are recorded as agreed or disputed."""
        out: list[dict[str, str]] = []
        others = [e for e in case.exemplars if e.category not in case.cluster.categories] or list(case.exemplars)
        for ex in others[:2]:
            inst = self.index.instances.get(ex.key)
            suite = self.smoke.suite_of(ex.key)
            # Paired on the smoke model: the parent must pass where the patch fails (both cached).
            if (inst is not None and self.smoke.still_passes(draft.files, inst, suite) is False
                    and self.smoke.still_passes(dict(case.files), inst, suite)):
                out.append({"kind": "regression", "text": f"regression: the patched harness gets passing train "
                                                         f"instance {ex.key} ({ex.category}) wrong"})
        calls = expected_calls(draft.files)
        if calls > expected_calls(case.files):
            out.append({"kind": "cost", "text": f"cost: the patched harness may make up to {calls:g} model calls "
                                                f"per instance (now {expected_calls(case.files):g}); it must "
                                                f"earn them in screening"})
        if len(case.cluster.categories) < 2 and len(case.batch.category_names) > 1:
            out.append({"kind": "generality", "text": f"generality: the cluster lies in one category "
                                                      f"({', '.join(case.cluster.categories)}) of "
                                                      f"{len(case.batch.category_names)}; the change may fit it alone"})
        return out

    def _smoke_key(self, case: CaseFile) -> str:
        """A failing train instance of the cluster if there is one, else any train instance."""
        for key in case.cluster.instance_keys:
            inst = self.index.instances.get(key)
            if inst is not None and inst.split == "train":
                return key
        train = sorted(k for k, i in self.index.instances.items() if i.split == "train")
        return (train or sorted(self.index.instances))[0]


# ---------------------------------------------------------------- the loop

def _check_message(round: int, checks: Sequence[CheckResult]) -> RoleMessage:
    text = "; ".join(f"{c.name}: {'ok' if c.ok else 'FAILED'} — {c.detail}" for c in checks)
    return RoleMessage(round=round, role="critic", kind="check", backend=ENGINE, text=text,
                       data={"checks": [c.to_json() for c in checks]})


@dataclass
class _Attempt:
    """One round's checked draft and the objections it drew."""

    draft: Draft
    diffs: list[FileDiff]
    objections: list[str]
    round: int


@dataclass
class Refiner:
    """Runs the four roles on one case file. `max_rounds` bounds Proposer <-> Critic exchanges.
    With `respect_verdicts` off (the per-instance baseline), the Attributor cannot veto a patch."""

    backend: RoleBackend
    checks: CriticChecks
    max_rounds: int = 3
    respect_verdicts: bool = True
    passes: int = 2

    def refine(self, case: CaseFile) -> RefineOutcome:
        log: list[RoleMessage] = []
        veto = self._diagnose(case, log)
        if veto is not None:
            return veto
        outcome = self._rounds(case, log, first=1)
        for number in range(2, max(1, self.passes) + 1):
            if outcome.proposal is None or outcome.proposal.status != "endorsed":
                break
            outcome = self._review(case, log, number, outcome)
        return outcome

    def _rounds(self, case: CaseFile, log: list[RoleMessage], first: int) -> RefineOutcome:
        last: _Attempt | None = None
        # The first draft that passed every hard check: when the Critic's objections to it turn out
        # unfounded, the drafts that tried to answer them were not needed.
        clean: _Attempt | None = None
        why = f"not endorsed within {self.max_rounds} round(s)"
        for number in range(first, first + max(1, self.max_rounds)):
            step = self._round(case, number, log)
            if isinstance(step, RefineOutcome):
                return step
            if isinstance(step, str):  # the Proposer gave up
                why = step
                break
            last = step or last
            if clean is None and step is not None and all(c.ok for c in step.draft.checks):
                clean = step
        if clean is not None:
            disputed = self._unfounded(case, log, clean)
            if disputed is not None:
                return disputed
        return self._finish(case, log, last, why)

    def _unfounded(self, case: CaseFile, log: list[RoleMessage], clean: _Attempt) -> RefineOutcome | None:
        """A draft the Critic turned down although every hard check passed goes on, its objections
        recorded as disputed, unless the engine measures a regression on a passing train instance.
        A veto must rest on evidence a person can check: a failed check or a measured regression.
        An objection that names neither ("introduces functionality the codebase does not support")
        is an opinion, and whether the change helps is what screening and the paired gate measure;
        a small LLM Critic otherwise rejects every repair, the real ones included."""
        case.draft = clean.draft
        regressions = [c["text"] for c in self.checks.concerns(case, clean.draft) if c["kind"] == "regression"]
        if regressions:
            log.append(RoleMessage(clean.round, "critic", "check", ENGINE,
                                   "The Critic's objections stand: " + "; ".join(regressions),
                                   data={"concerns": [{"kind": "regression", "text": t} for t in regressions]}))
            clean.objections = clean.objections + [t for t in regressions if t not in clean.objections]
            return None
        objections = [o for o in clean.objections if str(o).strip()] or ["the Critic did not endorse it"]
        log.append(RoleMessage(clean.round, "critic", "check", ENGINE,
                               "Every hard check passed and no regression was measured, so the Critic's objections "
                               "do not veto the change: it goes on with them recorded as disputed, and screening "
                               "and the paired gate decide.", data={"disputed": objections}))
        proposal = self._proposal(case, clean, "endorsed", log,
                                  "every hard check passed; the Critic's objections, which name no failed check "
                                  "and no measured regression, are recorded as disputed")
        proposal.spec = dataclasses.replace(proposal.spec, disputed=tuple(f"the Critic: {o}" for o in objections))
        return RefineOutcome(case.cluster.id, proposal, log)

    def _review(self, case: CaseFile, log: list[RoleMessage], number: int, endorsed: RefineOutcome) -> RefineOutcome:
        """Review pass `number` over an endorsed specification: the engine measures the concerns
        (regressions, cost, generality), the Critic weighs them against the spec, and a revision
        answers them even though every hard check passed. The result is one consolidated
        specification that records what was agreed and what stays disputed."""
        proposal = endorsed.proposal
        assert proposal is not None and case.draft is not None
        first = number * 100 + 1  # the rounds of pass k are numbered k01, k02, ...
        concerns = self.checks.concerns(case, case.draft)
        text = "; ".join(c["text"] for c in concerns) or "no regression on passing instances, no added calls, " \
                                                           "spans several categories"
        log.append(RoleMessage(first, "critic", "check", ENGINE, f"Review pass {number} of the specification: {text}",
                               data={"concerns": concerns}))
        if not concerns:
            return self._consolidated(endorsed, log, number, agreed=[text], disputed=[])
        case.concerns = concerns
        case.objections = [c["text"] for c in concerns]
        turn = self.backend.run("critic", case, first)
        log += turn.messages
        if turn.output["decision"] == "accept":
            notes = str(turn.output.get("notes") or "the Critic accepts these as the change's known risks")
            return self._consolidated(endorsed, log, number, agreed=[notes],
                                      disputed=[c["text"] for c in concerns])
        self._next_round(case, list(turn.output.get("objections") or case.objections), proposal.spec.operator)
        case.concerns = []  # each revised draft is judged by the hard checks, then measured again
        revised = self._rounds(case, log, first=first + 1)
        if revised.proposal is not None and revised.proposal.status == "endorsed" and case.draft is not None:
            left = self.checks.concerns(case, case.draft)
            log.append(RoleMessage(first, "critic", "check", ENGINE, "The revision measured again: "
                                   + ("; ".join(c["text"] for c in left) or "no concern left"), data={"concerns": left}))
            return self._consolidated(revised, log, number,
                                      agreed=[f"revised to answer: {c['text']}" for c in concerns],
                                      disputed=[c["text"] for c in left])
        why = revised.no_patch_reason or "no endorsed revision"
        return self._consolidated(endorsed, log, number, agreed=[],
                                  disputed=[c["text"] for c in concerns] + [f"revision failed: {why[:200]}"])

    @staticmethod
    def _consolidated(outcome: RefineOutcome, log: list[RoleMessage], number: int, *, agreed: list[str],
                      disputed: list[str]) -> RefineOutcome:
        proposal = outcome.proposal
        assert proposal is not None
        # What its own rounds left disputed (a Critic's objection that was no veto) stays disputed.
        spec = dataclasses.replace(proposal.spec, passes=number, agreed=tuple(agreed),
                                   disputed=tuple(dict.fromkeys([*proposal.spec.disputed, *disputed])))
        proposal = dataclasses.replace(proposal, spec=spec, transcript=list(log))
        return RefineOutcome(outcome.cluster_id, proposal, list(log), outcome.no_patch_reason)

    def _diagnose(self, case: CaseFile, log: list[RoleMessage]) -> RefineOutcome | None:
        """Investigator then Attributor (round 1); an outcome only when the Attributor vetoes."""
        turn = self.backend.run("investigator", case, 1)
        log += turn.messages
        case.investigation = turn.output
        turn = self.backend.run("attributor", case, 1)
        log += turn.messages
        case.attribution = turn.output
        if turn.output["verdict"] == "harness-level" or not self.respect_verdicts:
            return None
        # A role may veto a patch; it cannot promote a cluster aggregation did not call harness-level.
        return RefineOutcome(case.cluster.id, None, log, f"the Attributor judged it {turn.output['verdict']}: "
                                                         f"{turn.output['reason']}")

    def _round(self, case: CaseFile, number: int, log: list[RoleMessage]) -> RefineOutcome | _Attempt | str | None:
        """One Proposer -> hard checks -> Critic exchange: an outcome when the Critic endorses, the
        rejected attempt when the next round must answer its objections, the Proposer's reason when
        it gives up, None for no draft."""
        turn = self.backend.run("proposer", case, number)
        log += turn.messages
        if turn.output.get("give_up"):
            return str(turn.output["give_up"])
        try:
            draft = materialize(turn.output, case)
        except (ProposalError, InputError) as exc:
            objection = f"the proposal cannot be turned into files: {exc}"
            log.append(RoleMessage(number, "critic", "check", ENGINE, objection))
            self._next_round(case, [objection], turn.output.get("operator"))
            return None
        draft.checks, diffs = self.checks.run(case, draft)
        log.append(_check_message(number, draft.checks))
        case.draft = draft
        turn = self.backend.run("critic", case, number)
        log += turn.messages
        hard_ok = all(c.ok for c in draft.checks)
        if turn.output["decision"] == "accept" and hard_ok:
            proposal = self._proposal(case, _Attempt(draft, diffs, [], number), "endorsed", log,
                                      "endorsed by the Critic; every hard check passed")
            return RefineOutcome(case.cluster.id, proposal, log)
        objections = list(turn.output.get("objections") or [])
        objections += [c.detail for c in draft.checks if not c.ok and c.detail not in objections]
        if turn.output["decision"] == "accept":
            log.append(RoleMessage(number, "critic", "check", ENGINE,
                                   "The Critic endorsed it, but hard checks failed, so the proposal is rejected."))
        self._next_round(case, objections, draft.spec.operator)
        return _Attempt(draft, diffs, objections, number)

    @staticmethod
    def _next_round(case: CaseFile, objections: list[str], operator: Any) -> None:
        case.objections = objections
        if operator:
            case.tried_operators.append(str(operator))

    def _finish(self, case: CaseFile, log: list[RoleMessage], last: _Attempt | None, why: str) -> RefineOutcome:
        if last is None:
            return RefineOutcome(case.cluster.id, None, log, f"no patch: {why}")
        reason = f"rejected by the Critic ({why}): " + "; ".join(last.objections)
        return RefineOutcome(case.cluster.id, self._proposal(case, last, "rejected", log, reason), log, reason)

    @staticmethod
    def _proposal(case: CaseFile, attempt: _Attempt, status: ProposalStatus, log: list[RoleMessage],
                  reason: str) -> Proposal:
        spec = dataclasses.replace(attempt.draft.spec, expected_calls=expected_calls({**case.files, **attempt.draft.files}))
        return Proposal(id="p" + uuid.uuid4().hex[:10], cluster_id=case.cluster.id, status=status,
                        spec=spec, diffs=attempt.diffs, base_harness=case.harness_version,
                        rounds=attempt.round, checks=list(attempt.draft.checks), objections=attempt.objections,
                        transcript=list(log), reason=reason)

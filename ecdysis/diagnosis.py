"""The service-level entry of one diagnosis: stored runs -> typed failures -> clusters with verdicts
-> refinement of each harness-level cluster in priority order -> a `DiagnosisReport`.

`ecdysis diagnose RUN_ID ... [--json]` prints `report.to_json()` or `report.render_text()`. Runs
and results are read through the `Store` protocol. `diagnose` writes only the model-call cache
(smoke runs and LLM roles go through the cached gateway); `store_report` then stores the report
and its proposals in one transaction.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ecdysis.aggregate import (AgglomerativeTfidf, BatchContext, Cluster, ClusteringPolicy, ThresholdVerdicts,
                               VerdictPolicy, aggregate, priority_value)
from ecdysis.budget import CallBudget
from ecdysis.errors import InputError, NotFound
from ecdysis.events import EventSink
from ecdysis.failures import Failure, extract_failures
from ecdysis.models.base import ModelBackend
from ecdysis.models.gateway import ModelGateway
from ecdysis.probe import probe_clusters, reads_only
from ecdysis.records import InstanceResult, RunRecord, Suite
from ecdysis.refine import ENGINE, CriticChecks, DataIndex, Proposal, RefineOutcome, Refiner, SmokeRunner
from ecdysis.roles import make_role_backend
from ecdysis.roles.base import CaseFile, Exemplar, RoleBackend, RoleMessage, render_transcript
from ecdysis.roles.heuristic import HeuristicRoleBackend, propose
from ecdysis.roles.ranking import Ranking
from ecdysis.sandbox import SandboxLimits
from ecdysis.store import DiagnosisRecord, HarnessVersion, Store

NO_PATCH = {
    "model-specific": "no patch: the pattern is one model's quirk, and the harness is not bent to fit one model",
    "noise": "no patch: the pattern is too small or too inconsistent to justify a harness change",
}


@dataclass(frozen=True)
class PatchOutcome:
    """What became of one cluster in a diagnosis: the proposal made for it (or shared with the
    cluster `shared_with`, which wanted the same change), or why none was made."""

    proposal_id: str | None = None
    status: str = ""                    # the Critic's word on the proposal: endorsed | rejected
    no_patch_reason: str | None = None
    shared_with: str | None = None
    transcript: tuple[RoleMessage, ...] = ()   # the roles' messages when no proposal of its own came of it
    alternative_id: str | None = None   # the engine's own pick beside the roles' (`_engine_alternative`)
    reading_ids: tuple[str, ...] = ()   # the cluster's other reading repairs (`_reading_siblings`)

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> "PatchOutcome":
        d = data or {}
        return cls(proposal_id=d.get("proposal_id"), status=str(d.get("status") or ""),
                   no_patch_reason=d.get("no_patch_reason"), shared_with=d.get("shared_with"),
                   transcript=tuple(RoleMessage.from_json(m) for m in d.get("transcript") or ()),
                   alternative_id=d.get("alternative_id"), reading_ids=tuple(d.get("reading_ids") or ()))

    def text(self) -> str:
        """In words: "proposal P (endorsed)", or the reason no patch was made; then the engine's
        alternative and the other reading repairs, when there are any."""
        if self.proposal_id:
            own = f"proposal {self.proposal_id} ({self.status})" if self.status else f"proposal {self.proposal_id}"
        else:
            own = self.no_patch_reason or "not refined"
        if self.alternative_id:
            own += f"; the engine's alternative: proposal {self.alternative_id}"
        if len(self.reading_ids) == 1:
            own += f"; another reading repair: proposal {self.reading_ids[0]}"
        elif self.reading_ids:
            own += "; other reading repairs: proposals " + ", ".join(self.reading_ids)
        return own


@dataclass
class DiagnosisReport:
    """Clusters (in priority order, each with its verdict and patch status) and proposals, with the
    full role transcripts; plain data, so it can be stored and reloaded with `from_json`."""

    id: str
    run_ids: list[str]
    harness_version: str
    models: list[str]
    suites: list[str]
    role_backend: str
    clusters: list[Cluster]
    proposals: list[Proposal]
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # cluster id -> patch status
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    def proposal_for(self, cluster_id: str) -> Proposal | None:
        """The roles' own proposal for the cluster (not one it shares, nor the engine's alternative)."""
        pid = self.patch(cluster_id).proposal_id
        if cluster_id in self.outcomes:
            return next((p for p in self.proposals if p.id == pid and p.cluster_id == cluster_id), None)
        return next((p for p in self.proposals if p.cluster_id == cluster_id and not p.alternative), None)

    def alternative_for(self, cluster_id: str) -> Proposal | None:
        """The engine's alternative for the cluster, drafted for it or shared with another cluster."""
        pid = self.patch(cluster_id).alternative_id
        return next((p for p in self.proposals if p.id == pid), None) if pid else None

    def readings_for(self, cluster_id: str) -> list[Proposal]:
        """The cluster's other reading repairs (`_reading_siblings`), drafted for it or shared."""
        ids = self.patch(cluster_id).reading_ids
        return [p for p in self.proposals if p.id in ids]

    def patch(self, cluster_id: str) -> PatchOutcome:
        return PatchOutcome.parse(self.outcomes.get(cluster_id))

    def transcript(self, cluster_id: str) -> list[RoleMessage]:
        """The role messages of one cluster: its proposal's, or (no proposal of its own came of it)
        those stored with its patch outcome; empty for clusters never refined."""
        proposal = self.proposal_for(cluster_id)
        return list(proposal.transcript) if proposal is not None else list(self.patch(cluster_id).transcript)

    def to_json(self) -> dict[str, Any]:
        clusters = []
        for rank, c in enumerate(self.clusters, start=1):
            clusters.append({**c.to_json(), "priority": rank, "priority_value": priority_value(c),
                             "patch": self.outcomes.get(c.id, {"proposal_id": None,
                                                               "no_patch_reason": NO_PATCH.get(c.verdict)})})
        return {"id": self.id, "run_ids": self.run_ids, "harness_version": self.harness_version,
                "models": self.models, "suites": self.suites, "role_backend": self.role_backend,
                "created_at": self.created_at, "notes": self.notes, "stats": self.stats,
                "clusters": clusters, "proposals": [p.to_json() for p in self.proposals]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "DiagnosisReport":
        return DiagnosisReport(
            id=data["id"], run_ids=list(data.get("run_ids", [])), harness_version=data.get("harness_version", ""),
            models=list(data.get("models", [])), suites=list(data.get("suites", [])),
            role_backend=data.get("role_backend", ""),
            clusters=[Cluster.from_json(c) for c in data.get("clusters", [])],
            proposals=[Proposal.from_json(p) for p in data.get("proposals", [])],
            outcomes={c["id"]: c["patch"] for c in data.get("clusters", []) if "patch" in c},
            notes=list(data.get("notes", [])), stats=dict(data.get("stats", {})),
            created_at=float(data.get("created_at", 0.0)))

    def to_record(self) -> DiagnosisRecord:
        """The storable form (`Store.save_diagnosis`); proposals go separately via `Proposal.to_record`."""
        return DiagnosisRecord(id=self.id, run_ids=list(self.run_ids), harness_version=self.harness_version,
                               report=self.to_json(), created_at=self.created_at)

    def render_text(self, *, transcripts: bool = True) -> str:
        return _render(self, transcripts)


# ---------------------------------------------------------------- loading the batch

@dataclass
class _Batch:
    runs: list[RunRecord]
    suites: dict[str, Suite]
    results: list[tuple[str, InstanceResult]]
    failures: list[Failure]
    context: BatchContext
    harness: HarnessVersion
    notes: list[str]


def _load(store: Store, run_ids: Sequence[str], suite_loader: Callable[[str], Suite],
          only_instances: Sequence[str] | None = None) -> _Batch:
    if not run_ids:
        raise InputError("give at least one run id", hint="`ecdysis runs` lists stored runs")
    runs: list[RunRecord] = []
    for rid in dict.fromkeys(run_ids):
        run = store.get_run(rid)
        if run is None:
            raise NotFound(f"no run {rid!r}", hint="`ecdysis runs` lists stored runs")
        runs.append(run)
    suites = {name: suite_loader(name) for name in sorted({r.suite for r in runs})}
    notes: list[str] = []
    results: list[tuple[str, InstanceResult]] = []
    failures: list[Failure] = []
    for run in runs:
        got = store.get_results(run.id)
        if not got:
            notes.append(f"run {run.id} ({run.model}) has no stored results yet")
        by_id = {i.id: i for i in suites[run.suite].instances}
        results += [(run.suite, r) for r in got if r.instance_id in by_id]
        failures += extract_failures(got, by_id, suite=run.suite, harness_version=run.harness_version)
    if only_instances is not None:
        keep = set(only_instances)
        failures = [f for f in failures if f.instance_id in keep]
        notes.append(f"per-instance mode: only the failures of {', '.join(sorted(keep))} are diagnosed, and "
                     f"their verdicts do not gate the patch (the iterative per-instance search baseline)")
    newest = max(runs, key=lambda r: (r.created_at, r.id))
    if len({r.harness_version for r in runs}) > 1:
        notes.append(f"the runs used different harness versions; proposals target the newest run's version "
                     f"{newest.harness_version}")
    harness = store.get_harness(newest.harness_version)
    if harness is None:
        raise NotFound(f"harness version {newest.harness_version!r} of run {newest.id} is not stored")
    if len({r.model for r in runs}) < 2:
        notes.append("only one model was run: verdicts rest on cross-instance and cross-category spread "
                     "(cross-model evidence unavailable)")
    return _Batch(runs, suites, results, failures, BatchContext.build(results, failures), harness, notes)


def sanctioned_exemplars(batch_results: Sequence[tuple[str, InstanceResult]],
                         suites: Mapping[str, Suite], failures: Sequence[Failure]) -> list[Exemplar]:
    """Train instances that passed in every run of the batch that attempted them and failed in none."""
    failed = {f.key for f in failures}
    passed: dict[str, list[bool]] = defaultdict(list)
    for suite, r in batch_results:
        passed[f"{suite}/{r.instance_id}"].append(r.correct)
    by_key = {f"{name}/{i.id}": i for name, s in suites.items() for i in s.instances}
    out: list[Exemplar] = []
    for key in sorted(passed):
        inst = by_key.get(key)
        if inst is None or inst.split != "train" or key in failed or not all(passed[key]):
            continue
        answer = inst.target
        if inst.choices and inst.target in inst.choices:  # the form the harness is asked for: a letter
            answer = chr(ord("A") + list(inst.choices).index(inst.target))
        out.append(Exemplar(key=key, instance_id=inst.id, category=inst.category, input=inst.input,
                            choices=inst.choices, answer=answer))
    return out


def _resolve_model(model: str | ModelBackend | None, fallback: str,
                   factory: Callable[[str], ModelBackend] | None) -> ModelBackend:
    if model is not None and not isinstance(model, str):
        return model
    from ecdysis.models.registry import get_backend
    return (factory or get_backend)(model or fallback)


# ---------------------------------------------------------------- the entry point

def diagnose(store: Store, run_ids: Sequence[str], *, suite_loader: Callable[[str], Suite],
             role_backend: str | RoleBackend | ModelBackend = "heuristic",
             smoke_model: str | ModelBackend | None = None,
             max_rounds: int = 3, backend_factory: Callable[[str], ModelBackend] | None = None,
             clustering: ClusteringPolicy | None = None, verdicts: VerdictPolicy | None = None,
             previous_clusters: Sequence[Sequence[Cluster | Mapping[str, Any]]] = (),
             current_files: Mapping[str, str] | None = None, limits: SandboxLimits | None = None,
             max_proposals: int | None = None, only_instances: Sequence[str] | None = None,
             events: EventSink | None = None, budget: CallBudget | None = None,
             history: Sequence[Mapping[str, Any]] = (), passes: int = 2, probe: bool = True,
             alternatives: bool = True,
             affordable: Callable[[dict[str, str]], str | None] | None = None) -> DiagnosisReport:
    """Diagnose the failures of `run_ids` as one batch.

    `role_backend` is "heuristic" (default, offline), a model name or model backend for the LLM
    role backend, or a ready `RoleBackend`;
    `smoke_model` runs the Critic's smoke check (default: the first run's model); `backend_factory`
    resolves model names (default: the registry). `previous_clusters` (one list per earlier
    iteration, as `Cluster`s or their JSON) feeds the prior-recurrence term of systematicity.
    `current_files` is the harness the patches must apply to (default: the runs' version).
    `only_instances` restricts the diagnosis to those instances' failures and refines every
    cluster whatever its verdict: the per-instance search baseline the paper compares against.
    `budget` is charged for every role and smoke-run call (and stops them when it runs out).
    `history` is what earlier iterations of an evolution tried and what became of it (see
    `CaseFile.history`): the roles see it, and a change that was not kept is not proposed again.
    `passes` is the number of refinement passes: pass 1 is Investigator -> Attributor ->
    Proposer <-> Critic; each later pass reviews the endorsed specification (see `Refiner`).
    `probe` runs the recoverability probe (`ecdysis.probe`) on clusters one model alone shows,
    before refinement, in a whole-batch diagnosis.
    `alternatives`: in a whole-batch diagnosis with no proposal limit and model-played roles, a
    cluster whose roles ended on another repair than the engine's pick also gets the engine's pick
    as a second proposal (`_engine_alternative`); what screens both alone should ask for it. Under
    the same conditions, whatever plays the roles, a cluster whose proposal only changes how replies
    are read also gets the other reading repairs that apply to it (`_reading_siblings`).
    `affordable(files)` says why the budget left cannot screen and validate such a harness (or
    None): the Critic refuses a draft that adds model calls on that ground before paying for its
    smoke run and headroom probes, and the roles turn to the next repair.
    Raises NotFound/InputError for unknown runs."""
    emit = events or (lambda e: None)
    started = time.perf_counter()
    batch = _load(store, run_ids, suite_loader, only_instances)
    previous = [[c if isinstance(c, Cluster) else Cluster.from_json(c) for c in iteration]
                for iteration in previous_clusters]
    clusters = aggregate(batch.failures, batch.context, clustering=clustering or AgglomerativeTfidf(),
                         verdicts=verdicts or ThresholdVerdicts(), previous_clusters=previous)
    cluster_s = time.perf_counter() - started
    emit({"type": "clustered", "clusters": len(clusters), "failures": len(batch.failures)})
    backend = make_role_backend(role_backend, store=store, backend_factory=backend_factory, budget=budget)
    exemplars = sanctioned_exemplars(batch.results, batch.suites, batch.failures)
    instances = {f"{name}/{i.id}": i for name, s in batch.suites.items() for i in s.instances}
    index = DataIndex.build(instances, exemplars)
    smoke = SmokeRunner(ModelGateway(_resolve_model(smoke_model, batch.runs[0].model, backend_factory), store,
                                     budget=budget),
                        limits or SandboxLimits(timeout_s=60.0),
                        scorers={name: s.scorer for name, s in batch.suites.items()})
    checks = CriticChecks(index, smoke, dict(current_files or batch.harness.files), affordable=affordable)
    if probe and only_instances is None:
        scorers = {name: s.scorer for name, s in batch.suites.items()}

        def runner_for(model: str) -> SmokeRunner:
            backend = _resolve_model(model, model, backend_factory)
            return SmokeRunner(ModelGateway(backend, store, budget=budget), limits or SandboxLimits(timeout_s=60.0),
                               scorers=scorers)
        passed: dict[str, list[str]] = {}
        for suite_name, result in batch.results:
            if result.correct and not result.error_type:
                passed.setdefault(result.model, []).append(f"{suite_name}/{result.instance_id}")
        clusters = probe_clusters(clusters, dict(current_files or batch.harness.files), exemplars, instances,
                                  runner_for, earlier=[c for iteration in previous for c in iteration],
                                  passed=passed)
        emit({"type": "probed", "harness_level": sum(c.verdict == "harness-level" for c in clusters)})
    refiner = Refiner(backend, checks, max_rounds=max_rounds, respect_verdicts=only_instances is None, passes=passes)
    engine = HeuristicRoleBackend()
    # The engine's own roles, beside whatever plays them, in a whole-batch diagnosis.
    readings = (Refiner(engine, checks, max_rounds=max_rounds, passes=passes)
                if alternatives and only_instances is None and max_proposals is None else None)
    alternate = readings if backend.name != engine.name else None
    outcomes, proposals = _refine_all(clusters, batch, exemplars, refiner, max_proposals, emit,
                                      [dict(h) for h in history], alternate, readings)
    report = DiagnosisReport(
        id="d" + uuid.uuid4().hex[:11], run_ids=[r.id for r in batch.runs], harness_version=batch.harness.id,
        models=sorted({r.model for r in batch.runs}), suites=sorted(batch.suites), role_backend=backend.name,
        clusters=clusters, proposals=proposals, outcomes=outcomes, notes=batch.notes, created_at=time.time(),
        stats={"results": len(batch.results), "failures": len(batch.failures), "clusters": len(clusters),
               "harness_level": sum(c.verdict == "harness-level" for c in clusters),
               "exemplars_available": len(exemplars), "cluster_seconds": round(cluster_s, 3),
               "total_seconds": round(time.perf_counter() - started, 3)})
    emit({"type": "diagnosed", "diagnosis_id": report.id, "proposals": len(proposals)})
    return report


def _refine_all(clusters: Sequence[Cluster], batch: _Batch, exemplars: list[Exemplar], refiner: Refiner,
                max_proposals: int | None, emit: EventSink, history: list[dict[str, Any]],
                alternate: Refiner | None = None,
                readings: Refiner | None = None) -> tuple[dict[str, dict[str, Any]], list[Proposal]]:
    """Each cluster to refine gets the roles in priority order. Clusters that want the same repair
    (an identical patch) share the first one's proposal instead of being pushed to a different,
    lesser operator. With `alternate` (the engine's own roles), a cluster whose roles did not end
    on the engine's pick also gets that pick, as a second proposal: see `_engine_alternative`.
    With `readings` (the engine's roles too), a cluster whose proposal only changes how replies are
    read gets its other reading repairs as well: see `_reading_siblings`."""
    outcomes: dict[str, dict[str, Any]] = {}
    proposals: list[Proposal] = []
    for cluster in clusters:
        if cluster.verdict != "harness-level" and refiner.respect_verdicts:
            outcomes[cluster.id] = {"proposal_id": None, "no_patch_reason": NO_PATCH[cluster.verdict]}
            continue
        # Only proposals the Critic endorsed count against the limit: a refused one repairs
        # nothing, and with a limit of 1 (a per-instance scope) it used to leave the instance's
        # other cluster unrefined, iteration after iteration.
        if max_proposals is not None and sum(p.status == "endorsed" for p in proposals) >= max_proposals:
            why = f"not refined: the limit of {max_proposals} proposals was reached"
            outcomes[cluster.id] = {"proposal_id": None, "no_patch_reason": why}
            continue
        emit({"type": "refining", "cluster_id": cluster.id})
        case = _case(cluster, batch, exemplars, history)
        outcome: RefineOutcome = refiner.refine(case)
        entry: dict[str, Any] = {"proposal_id": None, "no_patch_reason": outcome.no_patch_reason}
        if outcome.proposal is not None:
            placed = _place(outcome.proposal, proposals)
            entry = {"proposal_id": placed.id, "status": placed.status,
                     "no_patch_reason": None if placed.status == "endorsed" else outcome.no_patch_reason}
            if placed is not outcome.proposal:
                entry |= {"shared_with": placed.cluster_id,
                          "transcript": [m.to_json() for m in outcome.proposal.transcript]}
        else:
            entry["transcript"] = [m.to_json() for m in outcome.transcript]
        # The model's Attributor may veto a patch; the engine's pick does not overrule it.
        vetoed = (case.attribution or {}).get("verdict", "harness-level") != "harness-level"
        if alternate is not None and not vetoed:
            emit({"type": "refining", "cluster_id": cluster.id, "alternative": True})
            alternative = _engine_alternative(alternate, cluster, batch, exemplars, history, outcome)
            if alternative is not None:  # shared with another cluster's proposal when the patch is the same
                entry["alternative_id"] = _place(alternative, proposals).id
        made = [p for p in proposals if p.id in (entry.get("proposal_id"), entry.get("alternative_id"))]
        if readings is not None and not vetoed and made:
            siblings = _reading_siblings(readings, cluster, batch, exemplars, history, made)
            if siblings:
                emit({"type": "refining", "cluster_id": cluster.id, "readings": len(siblings)})
                entry["reading_ids"] = list(dict.fromkeys(_place(p, proposals).id for p in siblings))
        outcomes[cluster.id] = entry
    return outcomes, proposals


def _case(cluster: Cluster, batch: _Batch, exemplars: list[Exemplar], history: list[dict[str, Any]],
          only_operators: tuple[str, ...] = ()) -> CaseFile:
    """A new case file of one cluster of the batch, for one refinement."""
    return CaseFile(cluster=cluster, files=dict(batch.harness.files), harness_version=batch.harness.id,
                    batch=batch.context, exemplars=exemplars, history=history, only_operators=only_operators)


def _place(proposal: Proposal, proposals: list[Proposal]) -> Proposal:
    """The endorsed proposal already made with the same patch (clusters that want the same repair
    share it), else `proposal`, appended."""
    twin = next((p for p in proposals if p.status == "endorsed" == proposal.status and p.files == proposal.files),
                None)
    if twin is None:
        proposals.append(proposal)
    return twin or proposal


def _engine_alternative(alternate: Refiner, cluster: Cluster, batch: _Batch, exemplars: list[Exemplar],
                        history: list[dict[str, Any]], roles: RefineOutcome) -> Proposal | None:
    """The engine's pick for a cluster (the best-ranked open catalogue repair, drafted and checked
    by the deterministic roles) when the model's roles ended elsewhere: a different repair, a
    refusal or nothing. A small role model's pick follows a prior more than the evidence
    (`bench/proposer_picks.py`: Qwen 1.5B named the answer-format instruction on every cluster of
    closed answers, where option scoring ranks first), and a batch can afford to screen both:
    a screen costs about a tenth of a validation. Neither proposal is preferred; each is screened
    alone and the human gate sees both. None when the engine has no endorsed repair, or the same."""
    theirs = roles.proposal
    endorsed = theirs if theirs is not None and theirs.status == "endorsed" else None
    if endorsed is not None and propose(_case(cluster, batch, exemplars, history)).get("files") == endorsed.files:
        return None  # the roles chose the engine's first pick: nothing to draft, no smoke run to pay
    mine = alternate.refine(_case(cluster, batch, exemplars, history)).proposal
    if mine is None or mine.status != "endorsed" or (endorsed is not None and endorsed.files == mine.files):
        return None
    operator = mine.spec.operator or "a hand-written change"
    why = Ranking.for_cluster(cluster).reasons.get(mine.spec.operator or "", "")
    if theirs is None:
        said = f"the roles made no proposal ({roles.no_patch_reason or 'no reason given'})"
    else:
        named = theirs.spec.operator or "a hand-written change"
        said = f"the roles' proposal {theirs.id} names {named} and was {theirs.status} by the Critic"
    mine.alternative = (f"The engine's alternative: {said}. The best-ranked repair still open for this cluster "
                        f"is {operator}{f' ({why})' if why else ''}. Each is screened alone on the batch "
                        "before validation.")
    mine.transcript.insert(0, RoleMessage(1, "proposer", "check", ENGINE, mine.alternative))
    return mine


READING_NOTE = "Another reading repair"  # how `_reading_siblings` notes begin (the app labels them by it)


def _reading_siblings(engine: Refiner, cluster: Cluster, batch: _Batch, exemplars: list[Exemplar],
                      history: list[dict[str, Any]], made: list[Proposal]) -> list[Proposal]:
    """When a cluster's endorsed proposal only changes how replies are read (`probe.reads_only`:
    answer extraction, choice matching), the other reading repairs that apply to the cluster,
    each drafted and checked by the engine's roles. Such a repair asks the model nothing its parent
    did not ask, so screening it on the batch and validating it replay requests the evolution has
    paid for: trying each costs no model call, where proposing only the best-ranked one leaves the
    others untried (on a BIG-Bench Hard mixture, answer extraction was kept at +5 of 120 in every
    run and choice matching, last in its cluster's ranking, never proposed; the Self-Evolution
    baseline reached it and kept it at +8). Each is screened alone and validated on its own."""
    endorsed = [p for p in made if p.status == "endorsed"]
    if not any(reads_only(p.spec.operator) for p in endorsed):
        return []
    have = {p.spec.operator for p in endorsed}
    out: list[Proposal] = []
    for name in Ranking.for_cluster(cluster).names:
        if not reads_only(name) or name in have:
            continue
        mine = engine.refine(_case(cluster, batch, exemplars, history, only_operators=(name,))).proposal
        if mine is None or mine.status != "endorsed" or any(p.files == mine.files for p in endorsed + out):
            continue
        first = next(p for p in endorsed if reads_only(p.spec.operator))
        mine.alternative = (f"{READING_NOTE} for this cluster, beside proposal {first.id} "
                            f"({first.spec.operator}): {name} only changes how replies are read, so screening "
                            "and validating it ask the model nothing new. Each is screened alone on the batch "
                            "and validated on its own.")
        mine.transcript.insert(0, RoleMessage(1, "proposer", "check", ENGINE, mine.alternative))
        out.append(mine)
    return out


def report_of(rec: DiagnosisRecord) -> DiagnosisReport:
    """A stored diagnosis as its typed report: what every reader outside the engine uses instead
    of the stored JSON (reports written by older versions read too)."""
    return DiagnosisReport.from_json({"id": rec.id, "run_ids": rec.run_ids, "harness_version": rec.harness_version,
                                      **rec.report})


def store_report(store: Store, report: DiagnosisReport) -> DiagnosisRecord:
    """Persist a report and its proposals (endorsed ones as `pending` for the human gate, rejected
    ones as `rejected`) in one transaction, returning the stored diagnosis record: a process
    killed meanwhile leaves neither, never a diagnosis without its proposals."""
    record = report.to_record()
    store.save_report(record, [p.to_record(report.id, created_at=report.created_at) for p in report.proposals])
    return record


# ---------------------------------------------------------------- the readable report

def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _render(report: DiagnosisReport, transcripts: bool) -> str:
    lines = [f"Diagnosis {report.id} over {len(report.run_ids)} run(s): {', '.join(report.run_ids)}",
             f"models: {', '.join(report.models)}; suites: {', '.join(report.suites)}; harness "
             f"{report.harness_version}; roles: {report.role_backend}",
             f"{report.stats.get('failures', 0)} failures of {report.stats.get('results', 0)} results in "
             f"{len(report.clusters)} clusters ({report.stats.get('harness_level', 0)} harness-level)"]
    lines += [f"note: {n}" for n in report.notes]
    lines += ["", "CLUSTERS (by priority)"]
    for rank, c in enumerate(report.clusters, start=1):
        patch = report.patch(c.id).text() if c.id in report.outcomes else NO_PATCH.get(c.verdict, "")
        lines += [f"{rank:>2}. {c.id} [{c.verdict}] systematicity {c.systematicity:.2f} — {c.label}",
                  f"    {c.size} failures on {len(c.instances)} instances; categories: {_counts(c.categories)}; "
                  f"models: {_counts(c.models)}",
                  f"    why: {c.reason}", f"    patch: {patch}"]
        lines += [f"    evidence: {e}" for e in c.evidence[:3]]
    lines += ["", "PROPOSALS"] if report.proposals else ["", "PROPOSALS: none"]
    for p in report.proposals:
        lines += _render_proposal(p, transcripts)
    return "\n".join(lines) + "\n"


def _render_proposal(p: Proposal, transcripts: bool) -> list[str]:
    s = p.spec
    lines = [f"{p.id} for {p.cluster_id}: {p.status.upper()} after {p.rounds} round(s)"
             + (f" — operator {s.operator}" if s.operator else "")]
    lines += [f"  {p.alternative}"] if p.alternative else []
    lines += [f"  targets: {', '.join(s.target_files)}", f"  change: {s.change}", f"  root cause: {s.root_cause}",
              f"  expected effect: {s.expected_effect}", f"  risk: {s.risk}", f"  scope: {s.scope}",
              f"  outcome: {p.reason}"]
    lines += [f"  check {c.name}: {'ok' if c.ok else 'FAILED'} — {c.detail}" for c in p.checks]
    for d in p.diffs:
        lines += ["  " + line for line in d.unified.rstrip("\n").splitlines()]
    if transcripts:
        lines += ["  transcript:"] + ["    " + line for line in render_transcript(p.transcript).splitlines()]
    return lines + [""]

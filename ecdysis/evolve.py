"""The evolution loop: batch on train -> diagnose -> human (or auto) gate -> apply -> paired
validation gate -> keep or roll back, K times; then the sealed test split is scored once.

Two strategies differ only in how feedback is aggregated: `ecdysis` diagnoses the whole batch
(clusters across instances and models), `per-instance` takes failing instances one at a time.
Every phase's products are stored before the next starts, so an interrupted evolution resumes
where it stopped without redoing finished work or losing a decision."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ecdysis import diagnosis
from ecdysis.diffs import FileDiff, apply_diffs
from ecdysis.errors import BudgetExceeded, Cancelled, ConfigError, Conflict, InputError
from ecdysis.gate import POLICIES, AcceptancePolicy, GateVerdict, PairKey, approved_files, decide
from ecdysis.harness import harness_id, new_version
from ecdysis.leases import Held, evolution_key
from ecdysis.records import Instance, RunRecord
from ecdysis.runner import CallBudget, EventSink, Runner, check_limit, pick_instances
from ecdysis.store import DecisionRecord, DiagnosisRecord, EvolutionRecord, HarnessVersion, ProposalRecord

STRATEGIES = ("ecdysis", "per-instance")
DECIDED_STATUS = {"approve": "approved", "edit": "edited", "reject": "rejected"}
# Proposal statuses `_compose` (re)applies: "applied" and "superseded" are its own earlier verdicts
# on them, which a process that died before saving the cursor must be able to reach again.
COMPOSABLE = ("approved", "edited", "applied", "superseded")

# A reviewer sees one pending proposal and returns (decision, reason, edited files or None).
Reviewer = Callable[[ProposalRecord], tuple[str, str, dict[str, str] | None]]


@dataclass
class EvolveConfig:
    suite: str
    models: list[str]
    strategy: str = "ecdysis"
    iterations: int = 3
    batch_size: int = 30
    val_limit: int | None = 40
    test_limit: int | None = None
    harness: str | None = None
    auto_approve: bool = False
    gate: str = "paired-sign"
    gate_min_net: int = 2
    gate_k: float = 1.0
    role_backend: str = "heuristic"
    max_rounds: int = 3
    concurrency: int = 1
    max_model_calls: int | None = None
    max_tokens: int | None = None
    max_wall_s: float | None = None
    label: str = ""

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}", hint=f"use one of {', '.join(STRATEGIES)}")
        if not self.models:
            raise ConfigError("at least one --model is needed")
        if self.iterations < 1 or self.batch_size < 1:
            raise ConfigError("--iterations and --batch-size must be at least 1")
        if self.gate not in POLICIES:
            raise ConfigError(f"unknown gate {self.gate!r}", hint=f"use one of {', '.join(POLICIES)}")
        check_limit("--val-limit", self.val_limit)
        check_limit("--test-limit", self.test_limit)

    def policy(self) -> AcceptancePolicy:
        if self.gate == "paired-sign":
            return POLICIES["paired-sign"](min_net=self.gate_min_net, k=self.gate_k)  # type: ignore[call-arg]
        return POLICIES[self.gate]()  # type: ignore[call-arg]


class Evolver:
    """Drives one evolution through the service (suites, backends, harness versions, store)."""

    def __init__(self, service: Any, *, events: EventSink | None = None, reviewer: Reviewer | None = None,
                 cancelled: Callable[[], bool] | None = None, poll_s: float = 1.0) -> None:
        self.svc = service
        self.store = service.store
        self.events = events or (lambda e: None)
        self.reviewer = reviewer
        self.cancelled = cancelled or (lambda: False)
        self.poll_s = poll_s

    # ------------------------------------------------------------ lifecycle

    def create(self, config: EvolveConfig) -> EvolutionRecord:
        config.validate()
        suite = self.svc.suite(config.suite)
        for model in config.models:
            self.svc.backend(model)  # an unknown model or a missing key fails before any work
        base = self.svc.harness(config.harness)
        if not suite.split("train") or not suite.split("validation"):
            raise ConfigError(f"suite {suite.name!r} needs train and validation instances")
        now = time.time()
        evo = EvolutionRecord(id="e" + uuid.uuid4().hex[:11], strategy=config.strategy, suite=suite.name,
                              models=list(config.models), config=asdict(config), status="running",
                              base_version=base.id, current_version=base.id, created_at=now, updated_at=now,
                              result={"cursor": {"iteration": 1, "phase": "train"}, "spent": {"calls": 0, "tokens": 0},
                                      "tried_instances": []})
        self.store.save_evolution(evo)
        return evo

    def run(self, evolution_id: str, *, overrides: dict[str, Any] | None = None) -> EvolutionRecord:
        """Run (or resume) an evolution until its iterations are done, a budget is spent, it is
        cancelled, or it waits for human decisions without a reviewer."""
        evo = self._load(evolution_id)
        # Refused here, before anything is saved, while another process executes it.
        with Held(self.store, evolution_key(evo.id), ttl_s=self.svc.settings.lease_ttl_s, role="evolve") as held:
            outer = self.cancelled
            self.cancelled = lambda: outer() or held.lost
            try:
                return self._run(evo, overrides)
            finally:
                self.cancelled = outer

    def _run(self, evo: EvolutionRecord, overrides: dict[str, Any] | None) -> EvolutionRecord:
        if overrides:
            evo.config.update({k: v for k, v in overrides.items() if v is not None})
        cfg = EvolveConfig(**evo.config)
        spent = dict(evo.result.setdefault("spent", {"calls": 0, "tokens": 0}))
        deadline = time.time() + cfg.max_wall_s if cfg.max_wall_s else None
        budget = CallBudget(max_calls=None if cfg.max_model_calls is None else cfg.max_model_calls - spent["calls"],
                            max_tokens=None if cfg.max_tokens is None else cfg.max_tokens - spent["tokens"],
                            deadline=deadline)
        # Every save writes what was spent so far, so a killed process does not reset the budget.
        self._spent_before, self._budget = spent, budget
        evo.status = "running"
        evo.result.pop("stopped", None)  # why an earlier attempt stopped is history once this one runs
        self._save(evo)
        try:
            while evo.result["cursor"]["phase"] != "finished":
                if self.cancelled():
                    raise Cancelled("stopped by request")
                self._step(evo, cfg, budget)
            evo.status = "done"
        except BudgetExceeded as exc:
            evo.status = "stopped"
            evo.result["stopped"] = f"{exc.message}; resume with more budget to continue"
        except Cancelled:
            evo.status = "stopped"
            evo.result["stopped"] = "cancelled; resume to continue"
        except _Waiting as w:
            evo.status = "waiting"
            evo.result["stopped"] = f"waiting for decisions on {len(w.pending)} proposal(s): {', '.join(w.pending)}"
        except Exception as exc:
            # Any other fault ends the evolution visibly (never a record stuck at "running");
            # every finished phase is stored, so a resume continues from the cursor.
            evo.status = "failed"
            evo.result["stopped"] = f"failed: {type(exc).__name__}: {exc}; resume to continue"
            raise
        finally:
            self._save(evo)
        return evo

    def _spent(self) -> dict[str, int]:
        """Calls and tokens this evolution has spent, over every process that ran it."""
        before = getattr(self, "_spent_before", {"calls": 0, "tokens": 0})
        budget = getattr(self, "_budget", None)
        return {"calls": before["calls"] + (budget.calls if budget else 0),
                "tokens": before["tokens"] + (budget.tokens if budget else 0)}

    # ------------------------------------------------------------ the phases

    def _step(self, evo: EvolutionRecord, cfg: EvolveConfig, budget: CallBudget) -> None:
        cur = evo.result["cursor"]
        phase = cur["phase"]
        if phase == "train":
            if cur["iteration"] > cfg.iterations:
                cur.update(phase="test")
                return
            cur.setdefault("started", time.time())
            cur.setdefault("spent_at_start", self._spent())
            version = self.svc.harness(evo.current_version)
            instances = self._train_window(evo, cfg, cur["iteration"])
            runs = self._ensure_runs(cur, "train_runs", version, instances, cfg, budget, split="train", owner=evo.id)
            cur["train_accuracy"] = self._accuracy(runs)
            cur["phase"] = "diagnose"
        elif phase == "diagnose":
            cur.setdefault("diagnose_started", time.time())
            self._save(evo)
            cur["diagnosis_id"], cur["proposal_ids"] = self._adopt_diagnosis(evo, cur) or self._diagnose(evo, cfg, cur)
            cur["phase"] = "gate"
        elif phase == "gate":
            self._gate(cfg, cur["proposal_ids"])
            cur["phase"] = "apply"
        elif phase == "apply":
            cur["candidate"], cur["applied"] = self._compose(evo, cur["proposal_ids"])
            cur["phase"] = "validate" if cur["candidate"] else "record"
        elif phase == "validate":
            self._validate(evo, cfg, cur, budget)
            cur["phase"] = "record"
        elif phase == "record":
            self._record(evo, cur, budget)
        elif phase == "test":
            self._test(evo, cfg, budget)
            cur["phase"] = "finished"
        self._save(evo)

    def _train_window(self, evo: EvolutionRecord, cfg: EvolveConfig, iteration: int) -> list[Instance]:
        """Iteration k sees the k-th window of the train split (wrapping), the same for both
        strategies, so neither sees more data than the other."""
        train = pick_instances(self.svc.suite(evo.suite), "train", None)
        size = min(cfg.batch_size, len(train))
        start = ((iteration - 1) * size) % len(train)
        return [train[(start + i) % len(train)] for i in range(size)]

    def _val_instances(self, evo: EvolutionRecord, cfg: EvolveConfig, split: str = "validation",
                       limit: int | None = None) -> list[Instance]:
        return pick_instances(self.svc.suite(evo.suite), split, limit)

    def _ensure_runs(self, cur: dict[str, Any], slot: str, version: HarnessVersion, instances: list[Instance],
                     cfg: EvolveConfig, budget: CallBudget, *, split: str, owner: str = "") -> list[str]:
        """One run per model of `version` on `instances`, created once, resumed if interrupted,
        reused when an identical finished run exists (a parent's validation, for instance)."""
        suite = self.svc.suite(cfg.suite)
        ids: dict[str, str] = cur.setdefault(slot, {})
        # The label names the evolution, iteration and slot, so a run created just before a crash
        # (before the cursor naming it was saved) is found and resumed, not created a second time.
        label = f"{cfg.label or 'evolve'}:{slot}" + (f"@{owner}/{cur.get('iteration', '')}" if owner else "")
        for model in cfg.models:
            iids = [i.id for i in instances]
            run_id = (ids.get(model) or self._find_run(version.id, model, iids)
                      or (self._find_run(version.id, model, iids, label=label) if owner else None))
            if run_id is None:
                run = Runner(self.store, limits=self.svc.limits()).create(
                    suite, model, version, split=split, concurrency=cfg.concurrency,
                    label=label, instances=instances)
                run_id = run.id
            ids[model] = run_id
            self._save_cursor_only(cur)
            run = self.store.get_run(run_id)
            if run is not None and run.status != "done":
                self.svc.execute_run(run_id, budget=budget, cancelled=self.cancelled,
                                     events=self.events)
                if self.store.get_run(run_id).status != "done":  # type: ignore[union-attr]
                    if self.cancelled():
                        raise Cancelled("stopped by request")
                    raise BudgetExceeded("a budget ran out during a batch")
        return list(ids.values())

    def _find_run(self, version_id: str, model: str, instance_ids: list[str], *,
                  label: str | None = None) -> str | None:
        """A finished run of this version, model and instances; with `label`, this evolution's own
        run in whatever state."""
        for run in self.store.list_runs(limit=500):
            if (run.harness_version == version_id and run.model == model and run.instance_ids == instance_ids
                    and (run.label == label if label is not None else run.status == "done")):
                return run.id
        return None

    def _accuracy(self, run_ids: list[str]) -> float:
        results = [r for rid in run_ids for r in self.store.get_results(rid)]
        return round(sum(r.correct for r in results) / len(results), 4) if results else 0.0

    def _outcomes(self, run_ids: list[str]) -> dict[PairKey, bool]:
        return {(r.model, r.instance_id): r.correct for rid in run_ids for r in self.store.get_results(rid)}

    def _diagnose(self, evo: EvolutionRecord, cfg: EvolveConfig, cur: dict[str, Any]) -> tuple[str, list[str]]:
        run_ids = list(cur["train_runs"].values())
        previous = [d.report.get("clusters", []) for d in self._past_diagnoses(evo)]
        only: list[str] | None = None
        if cfg.strategy == "per-instance":
            only = cur.get("only_instances") or self._next_failing_instance(evo, run_ids)
            if only is None:
                return "", []
            cur["only_instances"] = only
            self._save(evo)  # the instance is marked tried before a diagnosis of it can be stored
        # Per-instance search sees one failing instance's feedback and repairs it, whatever a
        # cross-instance view would say: that is the baseline's defining property.
        report = diagnosis.diagnose(self.store, run_ids, suite_loader=self.svc.suite,
                                    role_backend=cfg.role_backend, smoke_model=self.svc.backend(cfg.models[0]),
                                    max_rounds=cfg.max_rounds, previous_clusters=previous,
                                    backend_factory=self.svc.backend, limits=self.svc.limits(),
                                    only_instances=only, max_proposals=1 if only is not None else None)
        rec = diagnosis.store_report(self.store, report)
        evo.result.setdefault("diagnoses", []).append(rec.id)
        return rec.id, [p.id for p in self.store.list_proposals(diagnosis_id=rec.id)]

    def _adopt_diagnosis(self, evo: EvolutionRecord, cur: dict[str, Any]) -> tuple[str, list[str]] | None:
        """A diagnosis of this iteration's batch stored by a process that died before it could
        save the cursor: taken as it is (its missing proposals saved from its report) rather than
        diagnosed a second time, which would leave the first one's proposals pending forever."""
        from ecdysis import diagnosis
        run_ids = list(cur["train_runs"].values())
        since = float(cur.get("diagnose_started", time.time()))
        known = set(evo.result.get("diagnoses", []))
        for rec in self.store.list_diagnoses(limit=50):
            if rec.created_at < since or rec.run_ids != run_ids or rec.id in known:
                continue
            stored = {p.id for p in self.store.list_proposals(diagnosis_id=rec.id)}
            report = diagnosis.DiagnosisReport.from_json(rec.report)
            for proposal in report.proposals:
                if proposal.id not in stored:
                    self.store.save_proposal(proposal.to_record(rec.id, created_at=report.created_at))
            evo.result.setdefault("diagnoses", []).append(rec.id)
            return rec.id, [p.id for p in self.store.list_proposals(diagnosis_id=rec.id)]
        return None

    def _past_diagnoses(self, evo: EvolutionRecord) -> list[DiagnosisRecord]:
        found = [self.store.get_diagnosis(i) for i in evo.result.get("diagnoses", [])]
        return [d for d in found if d is not None]

    def _next_failing_instance(self, evo: EvolutionRecord, run_ids: list[str]) -> list[str] | None:
        """Per-instance search: the first failing instance of this batch not tried before."""
        tried = set(evo.result.setdefault("tried_instances", []))
        for rid in run_ids:
            for r in sorted(self.store.get_results(rid), key=lambda r: r.instance_id):
                if not r.correct and r.instance_id not in tried:
                    evo.result["tried_instances"].append(r.instance_id)
                    return [r.instance_id]
        return None

    def _gate(self, cfg: EvolveConfig, proposal_ids: list[str]) -> None:
        pending = [p for p in (self.store.get_proposal(i) for i in proposal_ids) if p and p.status == "pending"]
        for proposal in pending:
            earlier = self.store.list_decisions(proposal.id)
            if earlier:
                # Decided, but the status not set: a database written by a version whose `decide`
                # made two writes and died between them. Finish that write instead of deciding twice.
                self.store.set_proposal_status(proposal.id, DECIDED_STATUS[earlier[-1].decision])
                continue
            try:
                if cfg.auto_approve:
                    decide(self.store, proposal.id, "approve", who="auto-approve", reason="--auto-approve")
                elif self.reviewer is not None:
                    decision, reason, files = self.reviewer(proposal)
                    decide(self.store, proposal.id, decision, who="terminal", reason=reason, files=files)  # type: ignore[arg-type]
            except Conflict:
                continue  # a reviewer elsewhere (the app, the CLI) decided it meanwhile: that decision stands
        while True:
            waiting = [i for i in proposal_ids if (p := self.store.get_proposal(i)) and p.status == "pending"]
            if not waiting:
                return
            if self.cancelled():
                raise Cancelled("stopped by request")
            if self.poll_s <= 0:
                raise _Waiting(waiting)
            time.sleep(self.poll_s)

    def _compose(self, evo: EvolutionRecord, proposal_ids: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
        """Apply every approved or edited proposal, in priority order, onto the current version.
        A later proposal whose patch no longer applies cleanly is skipped and recorded."""
        base = self.svc.harness(evo.current_version)
        files = dict(base.files)
        applied: list[dict[str, Any]] = []
        for pid in proposal_ids:
            proposal = self.store.get_proposal(pid)
            if proposal is None or proposal.status not in COMPOSABLE:
                continue
            chosen = approved_files(self.store, proposal)
            if chosen is None:
                continue  # "applied" by hand outside this evolution, without an approval: not ours
            target = {**base.files, **chosen}
            patch = [FileDiff.from_json(d) for d in _diffs_between(base.files, target)]
            result = apply_diffs(files, patch)
            if not result.ok:
                self.store.set_proposal_status(pid, "superseded")
                applied.append({"proposal_id": pid, "applied": False, "why": "; ".join(result.failures)})
                continue
            files = result.files  # type: ignore[assignment]
            applied.append({"proposal_id": pid, "applied": True, "cluster_id": proposal.cluster_id,
                            "operator": proposal.spec.get("operator"), "spec": proposal.spec,
                            "predicted": proposal.spec.get("expected_effect", ""),
                            "edited": _last_approval(self.store, pid) == "edit"})
        if not any(a["applied"] for a in applied) or harness_id(files) == base.id:
            return None, applied
        note = "; ".join(str(a.get("operator") or a["proposal_id"]) for a in applied if a["applied"])
        try:
            candidate = new_version(files, parent=base.id, note=note, status="candidate")
        except InputError as exc:
            return None, applied + [{"applied": False, "why": f"composed harness is invalid: {exc}"}]
        existing = self.store.get_harness(candidate.id)
        if existing is None:
            self.store.put_harness(candidate)
        for a in applied:
            if a["applied"]:
                self.store.set_proposal_status(a["proposal_id"], "applied")
        return candidate.id, applied

    def _validate(self, evo: EvolutionRecord, cfg: EvolveConfig, cur: dict[str, Any], budget: CallBudget) -> None:
        instances = self._val_instances(evo, cfg, "validation", cfg.val_limit)
        parent = self.svc.harness(evo.current_version)
        candidate = self.svc.harness(cur["candidate"])
        parent_runs = self._ensure_runs(cur, "val_parent_runs", parent, instances, cfg, budget, split="validation",
                                        owner=evo.id)
        cand_runs = self._ensure_runs(cur, "val_candidate_runs", candidate, instances, cfg, budget, split="validation",
                                      owner=evo.id)
        verdict = cfg.policy().judge(self._outcomes(parent_runs), self._outcomes(cand_runs))
        cur["verdict"] = verdict.to_json()

    def _record(self, evo: EvolutionRecord, cur: dict[str, Any], budget: CallBudget) -> None:
        verdict = GateVerdict(**cur["verdict"]) if cur.get("verdict") else None
        parent_id = evo.current_version
        kept = bool(verdict and verdict.accepted)
        measured = None
        if verdict is not None:
            measured = {"val_delta": round(verdict.candidate_accuracy - verdict.parent_accuracy, 4),
                        "wins": verdict.wins, "losses": verdict.losses, "n": verdict.n, "kept": kept,
                        "jointly_with": sum(1 for a in cur.get("applied", []) if a.get("applied")) - 1}
        applied = [dict(a, measured=measured) for a in cur.get("applied", []) if a.get("applied")]
        if cur.get("candidate"):
            cand = self.store.get_harness(cur["candidate"])
            metrics = dict(cand.metrics if cand else {})
            metrics.update(val_accuracy=verdict.candidate_accuracy if verdict else None,
                           parent_val_accuracy=verdict.parent_accuracy if verdict else None,
                           gate=cur.get("verdict"), applied=applied, models=list(evo.models),
                           evolution=evo.id, iteration=cur["iteration"])
            self.store.update_harness(cur["candidate"], status="accepted" if kept else "rolled_back",
                                      metrics=metrics)
            if kept:
                evo.current_version = cur["candidate"]
        spent0 = cur.get("spent_at_start", {"calls": 0, "tokens": 0})
        row = {
            "iteration": cur["iteration"],
            "harness_version": evo.current_version,
            "parent_version": parent_id,
            "candidate_version": cur.get("candidate"),
            "train_accuracy": cur.get("train_accuracy"),
            "val_accuracy": (verdict.candidate_accuracy if kept else verdict.parent_accuracy) if verdict else None,
            "proposals": len(cur.get("proposal_ids", [])),
            "applied": len(applied),
            "rolled_back": bool(cur.get("candidate")) and not kept,
            "gate": verdict.reason if verdict else "no applicable proposal",
            "model_calls": self._spent()["calls"] - spent0["calls"],
            "tokens": self._spent()["tokens"] - spent0["tokens"],
            "wall_seconds": round(time.time() - cur.get("started", time.time()), 2),
            "diagnosis_id": cur.get("diagnosis_id"),
        }
        evo.iterations.append(row)
        self.events({"type": "iteration_done", "evolution_id": evo.id, **row})
        evo.result["cursor"] = {"iteration": cur["iteration"] + 1, "phase": "train"}

    def _test(self, evo: EvolutionRecord, cfg: EvolveConfig, budget: CallBudget) -> None:
        """The sealed split: scored once, at the end, for the final and the base version; never
        used to choose anything."""
        instances = self._val_instances(evo, cfg, "test", cfg.test_limit)
        cur = evo.result["cursor"]
        final = self.svc.harness(evo.current_version)
        base = self.svc.harness(evo.base_version)
        final_runs = self._ensure_runs(cur, "test_final_runs", final, instances, cfg, budget, split="test", owner=evo.id)
        base_runs = self._ensure_runs(cur, "test_base_runs", base, instances, cfg, budget, split="test", owner=evo.id)
        evo.result.update(final_version=final.id, test_accuracy=self._accuracy(final_runs),
                          base_test_accuracy=self._accuracy(base_runs), test_instances=len(instances),
                          test_runs=final_runs)
        self.store.update_harness(final.id, metrics={**final.metrics, "test_accuracy": evo.result["test_accuracy"]})

    # ------------------------------------------------------------ persistence

    def _load(self, evolution_id: str) -> EvolutionRecord:
        evo = self.store.get_evolution(evolution_id)
        if evo is None:
            from ecdysis.errors import NotFound
            raise NotFound(f"no evolution {evolution_id!r}", hint="`ecdysis evolutions` lists them")
        return evo

    def _save(self, evo: EvolutionRecord) -> None:
        evo.updated_at = time.time()
        if getattr(self, "_budget", None) is not None:
            evo.result["spent"] = self._spent()
        self.store.save_evolution(evo)
        self._current = evo

    def _save_cursor_only(self, cur: dict[str, Any]) -> None:
        evo = getattr(self, "_current", None)
        if evo is not None and evo.result.get("cursor") is cur:
            self._save(evo)


class _Waiting(Exception):
    def __init__(self, pending: list[str]) -> None:
        super().__init__(pending)
        self.pending = pending


def _last_approval(store: Any, proposal_id: str) -> str | None:
    """"approve" or "edit": the decision in force on an approved proposal (its status may since
    have become "applied")."""
    approvals = [d.decision for d in store.list_decisions(proposal_id) if d.decision in ("approve", "edit")]
    return approvals[-1] if approvals else None


def _diffs_between(old: dict[str, str], new: dict[str, str]) -> list[dict[str, Any]]:
    from ecdysis.diffs import diff_files
    return [d.to_json() for d in diff_files(old, new)]


def summary(evo: EvolutionRecord) -> dict[str, Any]:
    """The JSON the CLI prints: a row per iteration, the final version, held-out test accuracy."""
    return {"evolution_id": evo.id, "strategy": evo.strategy, "suite": evo.suite, "models": evo.models,
            "status": evo.status, "iterations": evo.iterations, "base_version": evo.base_version,
            "final_version": evo.result.get("final_version", evo.current_version),
            "test_accuracy": evo.result.get("test_accuracy"),
            "base_test_accuracy": evo.result.get("base_test_accuracy"),
            "spent": evo.result.get("spent"), "stopped": evo.result.get("stopped"),
            "train_wall_seconds": round(sum(r.get("wall_seconds", 0) for r in evo.iterations), 2)}

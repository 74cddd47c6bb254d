"""The service API: the one surface the CLI and the Streamlit pages both call. It composes
suites, harness versions, model backends and the runner over a `Store`; no UI code here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ecdysis import harness as harness_mod
from ecdysis import lifecycle
from ecdysis.harness_refs import resolve
from ecdysis.errors import Conflict, InputError, NotFound
from ecdysis.leases import Held, diagnosis_key, evolution_key, run_key
from ecdysis.models.base import ModelBackend
from ecdysis.models.registry import get_backend
from ecdysis.records import InstanceResult, RunRecord, RunSummary, Suite
from ecdysis.events import EventSink
from ecdysis.runner import CallBudget, Runner, check_limit
from ecdysis.sandbox import SandboxLimits
from ecdysis.settings import Settings
from ecdysis.store import HarnessVersion, Store
from ecdysis.suites import describe_suites, load_suite

if TYPE_CHECKING:
    from ecdysis.diffs import FileDiff
    from ecdysis.executors import Executor
    from ecdysis.evolve import EvolveConfig
    from ecdysis.jobs import JobContext, JobManager
    from ecdysis.store import DecisionRecord, DiagnosisRecord, EvolutionRecord, JobRecord, ProposalRecord




def load_workflows() -> None:
    """Import what diagnoses and evolutions run on (the roles, the clustering stack, scikit-learn)
    in the calling thread. A job calls this before its work goes to a thread of its own: two job
    threads importing one module at the same moment can see it half-built. Light commands never
    pay for it (about half a second)."""
    import ecdysis.diagnosis  # noqa: F401
    import ecdysis.evolve  # noqa: F401
    from ecdysis.aggregate import load_clustering_stack
    load_clustering_stack()


@dataclass
class RunRequest:
    suite: str
    model: str
    harness: str | None = None      # version id/prefix, "starter", a folder or a zip
    split: str = "train"
    limit: int | None = None
    concurrency: int = 1
    use_cache: bool = True
    label: str = ""
    executor: str | None = None     # local | ray; None: the `executor` setting
    extra: dict[str, Any] = field(default_factory=dict)


class AfterRuns:
    """The half of `Service` that works on what runs produced: diagnoses, proposals and the human
    gate, evolutions, harness export and import, and the background jobs that run them. (`Service`
    adds suites, harnesses and runs.) The CLI and the pages call only the two."""

    store: Store
    settings: Settings

    # ---- background jobs (the app never runs long work in a script run)
    @property
    def jobs(self) -> "JobManager":
        if getattr(self, "_jobs", None) is None:
            from ecdysis.jobs import JobManager
            self._jobs = JobManager(self.store)
        return self._jobs

    def job(self, job_id: str) -> "JobRecord":
        job = self.store.get_job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    def recent_jobs(self, limit: int = 20) -> list["JobRecord"]:
        return self.store.list_jobs(limit=limit)

    def cancel_job(self, job_id: str) -> None:
        self.jobs.cancel(job_id)

    def start_run_job(self, req: RunRequest) -> str:
        run = self.create_run(req)  # type: ignore[attr-defined]

        def work(ctx: "JobContext") -> dict[str, Any]:
            def events(e: dict[str, Any]) -> None:
                if e["type"] in ("run_started", "instance_done"):
                    ctx.progress(e["done"], e["total"], f"run {run.id}")
            summary = self.execute_run(run.id, use_cache=req.use_cache, events=events,  # type: ignore[attr-defined]
                                       cancelled=ctx.cancelled, executor=req.executor)
            return {"run_id": run.id, "summary": summary.to_json()}
        return self.jobs.submit("run", {"run_id": run.id, "suite": req.suite, "model": req.model}, work)

    def start_resume_job(self, run_id: str) -> str:
        self.refuse_if_running_elsewhere(run_key(run_id))

        def work(ctx: "JobContext") -> dict[str, Any]:
            summary = self.execute_run(run_id, cancelled=ctx.cancelled,  # type: ignore[attr-defined]
                                       events=lambda e: ctx.progress(e.get("done", 0), e.get("total", 0), f"run {run_id}")
                                       if e["type"] in ("run_started", "instance_done") else None)
            return {"run_id": run_id, "summary": summary.to_json()}
        return self.jobs.submit("run", {"run_id": run_id, "resume": True}, work)

    def start_demo_job(self, *, suite: str = "reasoning-mix", models: list[str] | None = None,
                       limit: int = 12) -> str:
        """The five-minute demo as one job: a batch of `limit` instances on each model (the default
        two-model batch), then the heuristic diagnosis of their failures; the result names the runs,
        the diagnosis and the seconds each step took, and the Review page holds its proposals."""
        chosen = list(models or self.settings.default_models)
        runs = [self.create_run(RunRequest(suite=suite, model=m, limit=limit, label="demo")) for m in chosen]  # type: ignore[attr-defined]
        steps = len(runs) + 1
        load_workflows()

        def work(ctx: "JobContext") -> dict[str, Any]:
            import time
            timings: dict[str, float] = {}
            for n, run in enumerate(runs, 1):
                started = time.perf_counter()

                def events(e: dict[str, Any], n: int = n, run: RunRecord = run) -> None:
                    if e["type"] in ("run_started", "instance_done"):
                        ctx.progress(n - 1, steps, f"step {n} of {steps}: {run.model} on {suite}, "
                                                   f"{e['done']} of {e['total']} instances")
                self.execute_run(run.id, events=events, cancelled=ctx.cancelled)  # type: ignore[attr-defined]
                timings[f"run {run.model}"] = round(time.perf_counter() - started, 1)
                if ctx.cancelled():
                    return {"run_ids": [r.id for r in runs], "timings": timings, "stopped": True}
            ctx.progress(steps - 1, steps, f"step {steps} of {steps}: clustering and diagnosing the failures",
                         force=True)
            started = time.perf_counter()
            rec = self.diagnose([r.id for r in runs])
            timings["diagnosis"] = round(time.perf_counter() - started, 1)
            pending = self.proposals(diagnosis_id=rec.id, status="pending")
            return {"run_ids": [r.id for r in runs], "diagnosis_id": rec.id, "proposals": len(pending),
                    "timings": timings}
        return self.jobs.submit("demo", {"suite": suite, "models": chosen, "limit": limit,
                                         "run_ids": [r.id for r in runs]}, work)

    def demo_estimate(self, *, models: list[str] | None = None, limit: int = 12) -> dict[str, float | None]:
        """Seconds the demo's runs should take here, per model, from this machine's finished runs
        of that model (median seconds per instance, cached calls excluded); None where none exist."""
        import statistics
        out: dict[str, float | None] = {}
        for model in models or self.settings.default_models:
            rates = [float(r.summary["wall_seconds"]) / int(r.summary["n"]) for r in self.runs(limit=200)  # type: ignore[attr-defined]
                     if r.model == model and r.status == "done" and int(r.summary.get("n") or 0)
                     and not int(r.summary.get("cache_hits") or 0) and r.summary.get("wall_seconds")]
            out[model] = round(statistics.median(rates) * limit, 0) if rates else None
        return out

    # ---- diagnoses and proposals
    def diagnose(self, run_ids: list[str], *, role_backend: str = "heuristic", max_rounds: int = 3,
                 events: Callable[[dict[str, Any]], None] | None = None) -> "DiagnosisRecord":
        from ecdysis import diagnosis
        with Held(self.store, diagnosis_key(run_ids), ttl_s=self.settings.lease_ttl_s, role="diagnose"):
            report = diagnosis.diagnose(self.store, run_ids, suite_loader=self.suite,  # type: ignore[attr-defined]
                                        role_backend=role_backend, max_rounds=max_rounds,
                                        backend_factory=self.backend, events=events,  # type: ignore[attr-defined]
                                        limits=self.limits())  # type: ignore[attr-defined]
            return diagnosis.store_report(self.store, report)

    def start_diagnosis_job(self, run_ids: list[str], *, role_backend: str = "heuristic") -> str:
        self.refuse_if_running_elsewhere(diagnosis_key(run_ids))
        load_workflows()

        def work(ctx: "JobContext") -> dict[str, Any]:
            ctx.progress(0, 1, "clustering failures", force=True)
            rec = self.diagnose(run_ids, role_backend=role_backend,
                                events=lambda e: ctx.progress(0, 1, str(e.get("type", "")), force=True))
            return {"diagnosis_id": rec.id}
        return self.jobs.submit("diagnose", {"run_ids": run_ids, "role_backend": role_backend}, work)

    def diagnoses(self, limit: int = 50) -> list["DiagnosisRecord"]:
        return self.store.list_diagnoses(limit=limit)

    def get_diagnosis(self, diagnosis_id: str) -> "DiagnosisRecord":
        rec = self.store.get_diagnosis(diagnosis_id)
        if rec is None:
            raise NotFound(f"no diagnosis {diagnosis_id!r}")
        return rec

    def proposals(self, *, diagnosis_id: str | None = None, status: str | None = None) -> list["ProposalRecord"]:
        if status is not None and status not in lifecycle.STATUSES:
            raise InputError(f"unknown proposal status {status!r}", hint=f"one of {', '.join(lifecycle.STATUSES)}")
        return self.store.list_proposals(diagnosis_id=diagnosis_id, status=status)

    def get_proposal(self, proposal_id: str) -> "ProposalRecord":
        p = self.store.get_proposal(proposal_id)
        if p is None:
            raise NotFound(f"no proposal {proposal_id!r}")
        return p

    def decide(self, proposal_id: str, decision: str, *, who: str, reason: str = "",
               files: dict[str, str] | None = None) -> "DecisionRecord":
        from ecdysis.gate import decide
        return decide(self.store, proposal_id, decision, who=who, reason=reason, files=files)  # type: ignore[arg-type]

    def decisions(self, proposal_id: str | None = None) -> list["DecisionRecord"]:
        return self.store.list_decisions(proposal_id)

    def apply_proposal(self, proposal_id: str) -> HarnessVersion:
        """Create the next harness version from an approved or edited proposal (outside an
        evolution); the caller may then evaluate it."""
        from ecdysis.gate import approved_files
        from ecdysis.harness import new_version
        from ecdysis.errors import InputError
        proposal = self.get_proposal(proposal_id)
        files = approved_files(self.store, proposal)
        if proposal.status not in ("approved", "edited") or files is None:
            raise InputError(f"proposal {proposal_id} is {proposal.status}; approve or edit it first")
        base = self.harness(proposal.harness_version)  # type: ignore[attr-defined]
        version = new_version({**base.files, **files}, parent=base.id,
                              note=f"{proposal.spec.get('operator') or 'manual'} from proposal {proposal.id}")
        version.metrics = {"applied": [{"proposal_id": proposal.id, "cluster_id": proposal.cluster_id,
                                        "spec": proposal.spec, "predicted": proposal.spec.get("expected_effect", ""),
                                        "edited": proposal.status == "edited"}]}
        stored = self.store.get_harness(version.id) or self.store.put_harness(version)
        lifecycle.move(self.store, proposal_id, "applied")
        return stored

    # ---- evolutions
    def start_evolution_job(self, config: "EvolveConfig") -> str:
        from ecdysis.evolve import Evolver
        evo = Evolver(self).create(config)  # type: ignore[arg-type]
        return self._evolution_job(evo.id)

    def run_evolution(self, config: "EvolveConfig | None" = None, *, resume: str | None = None,
                      events: Callable[[dict[str, Any]], None] | None = None,
                      reviewer: Callable[..., Any] | None = None, poll_s: float = 1.0,
                      overrides: dict[str, Any] | None = None) -> "EvolutionRecord":
        """Run a new evolution (`config`) or finish a stored one (`resume`, with budget `overrides`)
        in this thread, to its end or to a clean stop, as the CLI does; the app runs the same
        evolution as a background job (`start_evolution_job`)."""
        from ecdysis.evolve import Evolver
        evolver = Evolver(self, events=events, reviewer=reviewer, poll_s=poll_s)  # type: ignore[arg-type]
        if resume:
            return evolver.run(resume, overrides=overrides)
        if config is None:
            raise InputError("an evolution needs a configuration or an evolution to resume")
        return evolver.run(evolver.create(config).id)

    def resume_evolution_job(self, evolution_id: str, *, max_model_calls: int | None = None) -> str:
        """Resume in a background job; `max_model_calls` raises (or sets) the model-call budget, as
        `ecdysis evolve --resume ID --max-model-calls N` does: an evolution stopped by its budget
        otherwise stops again at once."""
        self.refuse_if_running_elsewhere(evolution_key(evolution_id))
        if max_model_calls is not None and max_model_calls < 1:
            raise InputError(f"a model-call budget must be at least 1, not {max_model_calls}")
        return self._evolution_job(evolution_id, {"max_model_calls": max_model_calls} if max_model_calls else None)

    def _evolution_job(self, evolution_id: str, overrides: dict[str, Any] | None = None) -> str:
        load_workflows()
        from ecdysis.evolve import Evolver, summary

        def work(ctx: "JobContext") -> dict[str, Any]:
            def events(e: dict[str, Any]) -> None:
                if e["type"] == "iteration_done":
                    ctx.progress(e["iteration"], 0, f"iteration {e['iteration']} done", force=True)
                elif e["type"] in ("run_started", "instance_done"):
                    ctx.progress(e.get("done", 0), e.get("total", 0), f"batch {e.get('run_id')}")
            evo = Evolver(self, events=events, cancelled=ctx.cancelled,  # type: ignore[arg-type]
                          poll_s=1.0).run(evolution_id, overrides=overrides)
            return summary(evo)
        return self.jobs.submit("evolve", {"evolution_id": evolution_id, **({"overrides": overrides} if overrides else {})},
                                work)

    # ---- leases: who executes what right now, in any process
    def running_elsewhere(self) -> dict[str, str]:
        """Live leases as {key: holder}, keys "run:ID", "evolution:ID", "diagnosis:RUN,RUN"."""
        import time
        now = time.time()
        return {lease.key: lease.owner for lease in self.store.list_leases() if lease.live(now)}

    def refuse_if_running_elsewhere(self, key: str) -> None:
        """Raise Conflict naming the holder when `key` is leased: checked before a job is created,
        so a refusal stores nothing (the executor itself takes the lease and checks again)."""
        holder = self.running_elsewhere().get(key)
        if holder is not None:
            raise Conflict(f"{key.replace(':', ' ', 1)} is running elsewhere: held by {holder}",
                           hint="wait for it to finish or stop it there")

    def evolutions(self, limit: int = 50) -> list["EvolutionRecord"]:
        return self.store.list_evolutions(limit=limit)

    def get_evolution(self, evolution_id: str) -> "EvolutionRecord":
        evo = self.store.get_evolution(evolution_id)
        if evo is None:
            raise NotFound(f"no evolution {evolution_id!r}")
        return evo

    # ---- harness export / import / diff
    def export_harness(self, version_id: str, dest: str | None = None) -> bytes:
        """The version as a zip that runs on its own, and written to `dest` when given (an
        `InputError` says why it cannot be, and nothing is left half-written there)."""
        from ecdysis.export import export_zip
        return export_zip(self.store, self.harness(version_id).id, dest)  # type: ignore[attr-defined]

    def import_harness(self, data: bytes, *, name: str = "upload.zip") -> HarnessVersion:
        from ecdysis.export import import_zip
        return import_zip(self.store, data, origin=name)

    def harness_diff(self, old_id: str, new_id: str) -> list["FileDiff"]:
        from ecdysis.diffs import diff_files
        return diff_files(self.harness(old_id).files, self.harness(new_id).files)  # type: ignore[attr-defined]


class Service(AfterRuns):
    def __init__(self, store: Store, settings: Settings | None = None,
                 backend_factory: Callable[[str], ModelBackend] | None = None) -> None:
        self.store = store
        self.settings = settings or Settings.from_env()
        self._backend_factory = backend_factory or (lambda name: get_backend(name, self.settings))

    # ---- suites
    def suites(self) -> list[dict[str, Any]]:
        return describe_suites(store=self.store)

    def suite(self, name: str) -> Suite:
        return load_suite(name, store=self.store)

    def import_suite_file(self, path: str, *, name: str | None = None, replace: bool = False) -> Suite:
        """Store the JSONL suite at `path` (every line checked first) under `name`, else the name its
        header gives, else the file's name."""
        from pathlib import Path
        from ecdysis.suites import import_jsonl
        return import_jsonl(Path(path), store=self.store, name=name, replace=replace)

    def import_suite(self, data: bytes, *, name: str, filename: str = "upload.jsonl",
                     replace: bool = False) -> Suite:
        """Store the JSONL suite in `data` under `name` (every line checked first; nothing is stored
        when one is bad). Refused in one `InputError` that names `filename` and the line."""
        import tempfile
        from pathlib import Path
        from ecdysis.suites import import_jsonl
        from ecdysis.suites.jsonl import MAX_FILE_BYTES
        if len(data) > MAX_FILE_BYTES:
            raise InputError(f"the file is {len(data) / 2**20:.1f} MB; a suite file may hold at most "
                             f"{MAX_FILE_BYTES // 2**20} MB", path=filename, hint="split it into several suites")
        with tempfile.TemporaryDirectory(prefix="ecdysis-suite-") as tmp:
            path = Path(tmp) / "upload.jsonl"
            path.write_bytes(data)
            try:
                return import_jsonl(path, store=self.store, name=name, replace=replace)
            except InputError as exc:  # the temporary path means nothing to the user: name the upload
                message = exc.message.split(": ", 1)[1] if exc.path and exc.message.startswith(exc.path) else exc.message
                raise InputError(message, path=filename, line=exc.line, hint=exc.hint) from None

    # ---- harnesses
    def harness(self, ref: str | None, *, suite: Suite | None = None) -> HarnessVersion:
        return resolve(self.store, ref, suite=suite)

    def harnesses(self) -> list[HarnessVersion]:
        harness_mod.ensure_starter(self.store)
        return self.store.list_harnesses()

    # ---- models
    def backend(self, name: str) -> ModelBackend:
        return self._backend_factory(name)

    # ---- runs
    def executor(self, name: str | None = None) -> "Executor":
        """The executor called `name` (None: the `executor` setting); its workers reach this
        service's database."""
        from ecdysis.executors import create_executor
        url = getattr(self.store, "url", None) or self.settings.database_url
        return create_executor(name, self.settings, database_url=url)

    def limits(self) -> SandboxLimits:
        return SandboxLimits(timeout_s=self.settings.instance_timeout_s,
                             memory_mb=self.settings.instance_memory_mb)

    def create_run(self, req: RunRequest) -> RunRecord:
        check_limit("--limit", req.limit)
        suite = self.suite(req.suite)
        self.backend(req.model)  # fail fast on an unknown model or a missing key
        version = self.harness(req.harness, suite=suite)
        return Runner(self.store, limits=self.limits()).create(
            suite, req.model, version, split=req.split, limit=req.limit,
            concurrency=req.concurrency, label=req.label)

    def execute_run(self, run_id: str, *, use_cache: bool = True, events: EventSink | None = None,
                    budget: CallBudget | None = None, cancelled: Callable[[], bool] | None = None,
                    executor: str | None = None) -> RunSummary:
        """Run what `run_id` has left, on `executor` (None: the `executor` setting)."""
        chosen = self.executor(executor)  # an unknown name fails before any work
        run = self.get_run(run_id)
        suite = self.suite(run.suite)
        version = self.harness(run.harness_version)
        runner = Runner(self.store, limits=self.limits(), events=events)
        # One executor per run: a second one is refused here, before the run is touched.
        with Held(self.store, run_key(run_id), ttl_s=self.settings.lease_ttl_s, role="run") as held:
            def stop() -> bool:
                return held.lost or (cancelled is not None and cancelled())
            run = self.get_run(run_id)  # as the previous holder left it
            return runner.execute(run, suite, self.backend(run.model), version, use_cache=use_cache,
                                  budget=budget, cancelled=stop, executor=chosen)

    def run(self, req: RunRequest, *, events: EventSink | None = None) -> RunSummary:
        run = self.create_run(req)
        return self.execute_run(run.id, use_cache=req.use_cache, events=events, executor=req.executor)

    def resume(self, run_id: str, *, events: EventSink | None = None,
               executor: str | None = None) -> RunSummary:
        return self.execute_run(run_id, events=events, executor=executor)

    def get_run(self, run_id: str) -> RunRecord:
        run = self.store.get_run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}", hint="`ecdysis runs` lists stored runs")
        return run

    def runs(self, limit: int = 100) -> list[RunRecord]:
        return self.store.list_runs(limit=limit)

    def results(self, run_id: str) -> list[InstanceResult]:
        self.get_run(run_id)
        return self.store.get_results(run_id)

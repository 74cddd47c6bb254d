"""The service API: the one surface the CLI and the Streamlit pages both call. It composes
suites, harness versions, model backends and the runner over a `Store`; no UI code here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ecdysis import harness as harness_mod
from ecdysis.errors import NotFound
from ecdysis.models.base import ModelBackend
from ecdysis.models.registry import get_backend
from ecdysis.records import InstanceResult, RunRecord, RunSummary, Suite
from ecdysis.runner import CallBudget, EventSink, Runner
from ecdysis.sandbox import SandboxLimits
from ecdysis.settings import Settings
from ecdysis.store import HarnessVersion, Store
from ecdysis.suites import describe_suites, load_suite


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
    extra: dict[str, Any] = field(default_factory=dict)


class Service:
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

    # ---- harnesses
    def harness(self, ref: str | None) -> HarnessVersion:
        return harness_mod.resolve(self.store, ref)

    def harnesses(self) -> list[HarnessVersion]:
        harness_mod.ensure_starter(self.store)
        return self.store.list_harnesses()

    # ---- models
    def backend(self, name: str) -> ModelBackend:
        return self._backend_factory(name)

    # ---- runs
    def limits(self) -> SandboxLimits:
        return SandboxLimits(timeout_s=self.settings.instance_timeout_s,
                             memory_mb=self.settings.instance_memory_mb)

    def create_run(self, req: RunRequest) -> RunRecord:
        suite = self.suite(req.suite)
        self.backend(req.model)  # fail fast on an unknown model or a missing key
        version = self.harness(req.harness)
        return Runner(self.store, limits=self.limits()).create(
            suite, req.model, version, split=req.split, limit=req.limit,
            concurrency=req.concurrency, label=req.label)

    def execute_run(self, run_id: str, *, use_cache: bool = True, events: EventSink | None = None,
                    budget: CallBudget | None = None,
                    cancelled: Callable[[], bool] | None = None) -> RunSummary:
        run = self.get_run(run_id)
        suite = self.suite(run.suite)
        version = self.harness(run.harness_version)
        runner = Runner(self.store, limits=self.limits(), events=events)
        return runner.execute(run, suite, self.backend(run.model), version, use_cache=use_cache,
                              budget=budget, cancelled=cancelled)

    def run(self, req: RunRequest, *, events: EventSink | None = None) -> RunSummary:
        run = self.create_run(req)
        return self.execute_run(run.id, use_cache=req.use_cache, events=events)

    def resume(self, run_id: str, *, events: EventSink | None = None) -> RunSummary:
        return self.execute_run(run_id, events=events)

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

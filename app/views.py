"""View data: service records turned into the rows, labels and numbers the pages show, and the 2-D
failure map. No Streamlit here, so every number on screen can be checked without a browser."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ecdysis.aggregate import Cluster
from ecdysis import diagnosis
from ecdysis.diagnosis import READING_NOTE, DiagnosisReport
from ecdysis.evolution_log import GateVerdict
from ecdysis.failures import AGENT_TYPES, Failure
from ecdysis.leases import held_here
from ecdysis.records import InstanceResult, RunRecord
from ecdysis.roles.base import RoleMessage
from ecdysis.store import DiagnosisRecord, EvolutionRecord, HarnessVersion, JobRecord, ProposalRecord

ACTIVE_JOB = ("queued", "running")
UNFINISHED_RUN = ("pending", "running", "cancelled")
ROLE_ORDER = ("investigator", "attributor", "proposer", "critic")


def plural(n: int, word: str, many: str | None = None) -> str:
    """"1 proposal", "2 proposals" (a page said "2 proposal(s)" and "1 instances")."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def short(ident: str | None, n: int = 8) -> str:
    return (ident or "")[:n]


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else ""


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def count(n: int, one: str, many: str | None = None) -> str:
    """'1 failure', '2 failures', '1 category', '3 categories'."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def forms_text(suite_row: dict[str, Any]) -> str:
    """', answers: integer, list' for a suite row of `describe_suites` ('' when it has none)."""
    kinds = sorted({str(f.get("kind", "")) for f in (suite_row.get("answer_forms") or {}).values()} - {""})
    return f", answers: {', '.join(kinds)}" if kinds else ""


def option_rows(options: Sequence[str], logprobs: Sequence[float] | None) -> list[dict[str, Any]]:
    """A scoring call's options with their log-probabilities ("—" where the call failed)."""
    scores = list(logprobs or [])
    return [{"option": o, "log-probability": f"{scores[i]:.3f}" if i < len(scores) else "—"}
            for i, o in enumerate(options)]


# ---------------------------------------------------------------- exports

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """A value as a CSV cell a spreadsheet shows as text: model replies and answers are untrusted,
    and a cell starting with =, +, -, @ would run as a formula when the file is opened."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def to_csv(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    import csv
    import io
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for row in rows:
        writer.writerow([csv_cell(v) for v in row])
    return buffer.getvalue()


RESULT_COLUMNS = ("instance_id", "category", "model", "correct", "answer", "target", "error_type",
                  "model_calls", "prompt_tokens", "completion_tokens", "wall_seconds")


def run_csv(results: Sequence[Any]) -> str:
    """One row per instance of a run."""
    return to_csv(RESULT_COLUMNS, ([r.instance_id, r.category, r.model, r.correct, r.answer, r.target,
                                    r.error_type or "", len(r.calls), r.prompt_tokens, r.completion_tokens,
                                    round(r.wall_seconds, 3)] for r in results))


def run_json(run: Any, results: Sequence[Any]) -> str:
    """The run, its summary and every instance with its whole trajectory (each model call)."""
    import json
    from dataclasses import asdict
    body = {"run": asdict(run), "results": [asdict(r) for r in results]}
    return json.dumps(body, ensure_ascii=False, indent=1, default=str)


CLUSTER_COLUMNS = ("cluster", "type", "verdict", "failures", "instances", "categories", "models",
                   "systematicity", "label", "reason")


def diagnosis_csv(report: DiagnosisReport) -> str:
    """One row per cluster of a diagnosis report."""
    rows = [[c.id, c.type, c.verdict, c.size, len(c.instances), " ".join(c.categories), " ".join(c.models),
             c.systematicity, c.label, c.reason] for c in report.clusters]
    return to_csv(CLUSTER_COLUMNS, rows)


# ---------------------------------------------------------------- runs and jobs

@dataclass(frozen=True)
class RunNumbers:
    """A run's numbers as of now: from its stored results while it runs or after a stop (the
    summary is written only when an execution ends), from its summary once done. `accuracy` is
    None until an instance is scored: a run with nothing scored has no accuracy, not 0 %."""

    scored: int
    instances: int
    correct: int
    accuracy: float | None
    tokens: int
    calls: int
    cache_hits: int
    seconds: float | None

    @property
    def partial(self) -> bool:
        return self.scored < self.instances

    def accuracy_text(self) -> str:
        if self.accuracy is None:
            return "—"
        return pct(self.accuracy) + (f" of {self.scored} scored" if self.partial else "")


def run_numbers(run: RunRecord, results: Sequence[InstanceResult] | None = None) -> RunNumbers:
    """`results` are the run's stored results (needed unless the run is done)."""
    s = run.summary or {}
    seconds = float(s.get("wall_seconds_total", s.get("wall_seconds", 0.0))) if s else None
    if results is None:
        n = int(s.get("n", len(run.instance_ids) if run.status == "done" else 0))
        acc = s.get("accuracy") if n else None
        return RunNumbers(n, len(run.instance_ids), round(float(acc or 0) * n), acc, int(s.get("prompt_tokens", 0))
                          + int(s.get("completion_tokens", 0)), int(s.get("model_calls", 0)),
                          int(s.get("cache_hits", 0)), seconds)
    calls = [c for r in results for c in r.calls]
    correct = sum(1 for r in results if r.correct)
    return RunNumbers(len(results), len(run.instance_ids), correct,
                      correct / len(results) if results else None,
                      sum(c.prompt_tokens + c.completion_tokens for c in calls), len(calls),
                      sum(1 for c in calls if c.cache_hit), seconds)


def run_row(run: RunRecord, numbers: RunNumbers | None = None) -> dict[str, Any]:
    """One line of the runs table; cost is tokens and model calls (local models have no price).
    No cell is left empty (Streamlit shows an empty cell as 'None'): unknown numbers read '—'."""
    n = numbers or run_numbers(run)
    return {"run": run.id, "started": when(run.created_at), "suite": run.suite, "model": run.model,
            "harness": short(run.harness_version), "split": run.split, "status": run.status,
            "scored": f"{n.scored}/{n.instances}", "accuracy": n.accuracy_text(),
            "tokens": n.tokens, "model calls": n.calls, "cache hits": n.cache_hits,
            "seconds": "—" if n.seconds is None else f"{n.seconds:.1f}", "label": run.label}


def run_label(run: RunRecord) -> str:
    acc = (run.summary or {}).get("accuracy")
    score = f" · {acc:.0%}" if isinstance(acc, (int, float)) and (run.summary or {}).get("n") else ""
    return f"{run.id} · {run.model} · {run.suite}/{run.split} · {len(run.instance_ids)} inst{score} · {run.status}"


def active_jobs(jobs: Iterable[JobRecord], kinds: Sequence[str]) -> list[JobRecord]:
    return [j for j in jobs if j.kind in kinds and j.status in ACTIVE_JOB]


def job_fraction(job: JobRecord) -> float:
    if job.status == "done":
        return 1.0
    return min(1.0, job.done / job.total) if job.total else 0.0


def job_text(job: JobRecord) -> str:
    what = {"run": "batch", "diagnose": "diagnosis", "evolve": "evolution"}.get(job.kind, job.kind)
    count = f" · {job.done}/{job.total}" if job.total else ""
    stop = " · stopping…" if job.cancel_requested and job.status in ACTIVE_JOB else ""
    return f"{what} {job.id} · {job.status}{count}{' · ' + job.message if job.message else ''}{stop}"


def resumable(runs: Iterable[RunRecord], jobs: Iterable[JobRecord],
              leased: Mapping[str, str] | None = None) -> list[RunRecord]:
    """Unfinished runs that no live job is working on and no process holds a lease on (the
    process died, or it was stopped)."""
    busy = busy_runs(jobs)
    held = leased or {}
    return [r for r in runs if r.status in UNFINISHED_RUN and r.id not in busy and f"run:{r.id}" not in held]


def busy_runs(jobs: Iterable[JobRecord]) -> set[str]:
    """The runs this app's live jobs will execute: a batch's run, and every run of a demo (created
    up front and run one after another, so the later ones wait, pending, for their turn)."""
    busy: set[str] = set()
    for j in jobs:
        if j.status in ACTIVE_JOB and j.kind in ("run", "demo"):
            busy.update(filter(None, [j.params.get("run_id"), *(j.params.get("run_ids") or [])]))
    return busy


def running_elsewhere(runs: Iterable[RunRecord], jobs: Iterable[JobRecord],
                      leased: Mapping[str, str]) -> list[tuple[RunRecord, str]]:
    """(run, holder) for runs executed by a process this app has no job for (a CLI run, another
    app): shown as such, never offered for resume."""
    busy = busy_runs(jobs)
    return [(r, holder) for r in runs if (holder := leased.get(f"run:{r.id}")) is not None
            and r.id not in busy and not held_here(holder)]  # an evolution job's runs are held by this process


def result_row(r: InstanceResult) -> dict[str, Any]:
    outcome = "correct" if r.correct else (r.error_type or "wrong")
    return {"instance": r.instance_id, "category": r.category, "outcome": outcome,
            "answer": "—" if r.answer is None else r.answer[:80], "target": r.target[:80], "calls": len(r.calls),
            "tokens": r.prompt_tokens + r.completion_tokens, "seconds": round(r.wall_seconds, 2)}


def filter_results(results: Sequence[InstanceResult], *, outcome: str = "all", categories: Sequence[str] = (),
                   text: str = "") -> list[InstanceResult]:
    """The results a reader asked for: outcome all | correct | failed, the chosen categories (all
    when none), and `text` (case-insensitive) in the instance id, the answer, the target or a reply."""
    wanted = text.strip().casefold()
    out = []
    for r in results:
        if outcome == "correct" and not r.correct or outcome == "failed" and r.correct:
            continue
        if categories and r.category not in categories:
            continue
        if wanted and not any(wanted in str(v or "").casefold()
                              for v in (r.instance_id, r.answer, r.target, *(c.text for c in r.calls))):
            continue
        out.append(r)
    return out


# ---------------------------------------------------------------- diagnoses

_REPORTS: dict[tuple[str, float], DiagnosisReport] = {}


def report_of(rec: DiagnosisRecord) -> DiagnosisReport:
    """A stored diagnosis as the typed report the pages read. A stored diagnosis never changes, so
    each is parsed once per process (the pages ask on every rerun)."""
    key = (rec.id, rec.created_at)
    if key not in _REPORTS:
        if len(_REPORTS) >= 64:
            _REPORTS.pop(next(iter(_REPORTS)))
        _REPORTS[key] = diagnosis.report_of(rec)
    return _REPORTS[key]


def diagnosis_label(rec: DiagnosisRecord) -> str:
    rep = report_of(rec)
    failures = int(rep.stats.get("failures", 0) or 0)
    return (f"{rec.id} · {when(rec.created_at)} · {count(len(rec.run_ids), 'run')} · {', '.join(rep.models)} · "
            f"{count(failures, 'failure')} → {count(len(rep.clusters), 'cluster')}")


def cluster_title(c: Cluster, width: int = 60) -> str:
    shown = c.label if len(c.label) <= width else c.label[: width - 1] + "…"
    return f"{c.id} · {shown}"


def member_rows(cluster: Cluster) -> list[dict[str, Any]]:
    """A cluster's failures as table rows. A text answer's row shows its evidence; an agent's
    (`failures.AGENT_TYPES`) shows instead how its calls went wrong (the mechanism) and the
    checker's detail, which is what its evidence is made of."""
    return [_member_row(f) for f in cluster.failures]


def _member_row(f: Failure) -> dict[str, Any]:
    agent = f.type in AGENT_TYPES
    row: dict[str, Any] = {"instance": f.instance_id, "model": f.model, "category": f.category, "failure": f.type}
    if agent:
        row |= {"mechanism": str(f.detail.get("mechanism") or ""), "check": str(f.detail.get("check") or "")}
    row |= {"answer": (f.answer or "")[:60], "target": str(f.target)[:60]}
    if not agent:
        row["evidence"] = f.excerpt
    return row | {"run": f.run_id}


def filter_members(rows: Sequence[Mapping[str, Any]], *, models: Sequence[str] = (),
                   failures: Sequence[str] = (), text: str = "") -> list[Mapping[str, Any]]:
    """A cluster's failing instances that a reader asked for: the chosen models and failure types
    (all when none), and `text` (case-insensitive) in the instance id, answer, target or evidence
    (an agent's: its mechanism or the checker's detail)."""
    wanted = text.strip().casefold()
    return [r for r in rows
            if (not models or r["model"] in models) and (not failures or r["failure"] in failures)
            and (not wanted or any(wanted in str(r.get(k) or "").casefold()
                                   for k in ("instance", "answer", "target", "evidence", "mechanism", "check")))]


def member_evidence(row: Mapping[str, Any]) -> str:
    """What a member's caption says after its failure type: an agent's mechanism and the checker's
    detail, else the evidence excerpt."""
    if "mechanism" in row:
        return f"{row['mechanism']}; checker: {row['check']}" if row.get("check") else str(row["mechanism"])
    return str(row.get("evidence", ""))


def output_backends(report: DiagnosisReport) -> str:
    """Which backend actually produced the roles' outputs across the report ("12 from llm:qwen…,
    3 from heuristic (fallback)"): an LLM role backend falls back per turn, and this says how often."""
    counts: dict[str, int] = {}
    messages = [m for p in report.proposals for m in p.transcript]
    messages += [m for c in report.clusters for m in report.patch(c.id).transcript]
    for m in messages:
        if m.kind == "output":
            counts[m.backend] = counts.get(m.backend, 0) + 1
    return ", ".join(f"{n} from {name}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def round_label(number: int) -> str:
    """A transcript round as a reader counts it: the engine numbers review pass k's rounds k01,
    k02, ... (`refine.Refiner._review`), which the page showed as "round 201"."""
    if number < 100:
        return f"round {number}"
    return f"review pass {number // 100}, round {number % 100}"


def by_round(messages: Sequence[RoleMessage]) -> list[tuple[int, list[RoleMessage]]]:
    rounds: dict[int, list[RoleMessage]] = {}
    for m in messages:
        rounds.setdefault(int(m.round or 1), []).append(m)
    return sorted(rounds.items())


# ---------------------------------------------------------------- the failure map

@dataclass(frozen=True)
class MapPoint:
    """One failure placed on the 2-D map (x, y from its evidence text)."""

    x: float
    y: float
    cluster_id: str
    instance: str
    model: str
    category: str
    excerpt: str
    run_id: str = ""

    @property
    def member(self) -> str:
        """The drill-down's key for this failure: `run id/instance id`."""
        return f"{self.run_id}/{self.instance}"


def _jitter(key: str, scale: float) -> tuple[float, float]:
    """A small deterministic offset, so failures with identical evidence do not hide each other."""
    digest = hashlib.sha256(key.encode()).digest()
    return ((digest[0] / 255 - 0.5) * scale, (digest[1] / 255 - 0.5) * scale)


def failure_map(report: DiagnosisReport) -> list[MapPoint]:
    """Every failure of a diagnosis at 2-D coordinates: TF-IDF of its evidence (signature, type
    and excerpt) reduced by truncated SVD, the same text the clustering worked on. No model calls."""
    members = [(c.id, f) for c in report.clusters for f in c.failures]
    if not members:
        return []
    coords = _project([f"{f.type} {f.signature} {f.excerpt}" for _, f in members])
    span = max(1e-9, float(coords[:, 0].max() - coords[:, 0].min()), float(coords[:, 1].max() - coords[:, 1].min()))
    points = []
    for (cid, f), (x, y) in zip(members, coords):
        dx, dy = _jitter(f"{f.run_id}/{f.instance_id}", 0.04 * span)
        points.append(MapPoint(float(x) + dx, float(y) + dy, cid, f.instance_id, f.model, f.category, f.excerpt,
                               f.run_id))
    return points


def _project(texts: list[str]) -> Any:
    import numpy as np
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    if len(texts) < 3:
        return np.array([[float(i), 0.0] for i in range(len(texts))])
    matrix = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b").fit_transform(texts)
    if matrix.shape[1] < 3:
        padded = np.zeros((len(texts), 2))
        padded[:, : matrix.shape[1]] = matrix.toarray()
        return padded
    return TruncatedSVD(n_components=2, random_state=0).fit_transform(matrix)


# ---------------------------------------------------------------- proposals

def proposal_label(p: ProposalRecord, titles: Mapping[str, str] | None = None,
                   twins: Mapping[str, ProposalRecord] | None = None) -> str:
    title = (titles or {}).get(f"{p.diagnosis_id}/{p.cluster_id}", p.cluster_id)
    note = str(p.data.get("alternative") or "")
    kind = "another reading repair" if note.startswith(READING_NOTE) else "the engine's alternative"
    twin = (twins or {}).get(p.id)
    return (f"{p.id} · {p.status} · {title}" + (f" · {kind}" if note else "")
            + (f" · same change as {twin.id} ({twin.status})" if twin else ""))


def evaluation_label(tag: str, proposal_id: str) -> str:
    """The label of a run the Review page starts to evaluate an applied proposal (tag: parent | applied)."""
    return f"evaluate {tag} of {proposal_id}"


def evaluations_of(proposal_id: str, runs: Iterable[RunRecord]) -> dict[str, RunRecord]:
    """The newest evaluation the Review page started for an applied proposal, as {"parent": run,
    "applied": run} (one model's pair: the first model in name order), or {} when none was."""
    pairs: dict[str, dict[str, RunRecord]] = {}
    for run in sorted(runs, key=lambda r: r.created_at):
        for tag in ("parent", "applied"):
            if run.label == evaluation_label(tag, proposal_id):
                pairs.setdefault(run.model, {})[tag] = run
    complete = {model: pair for model, pair in pairs.items() if len(pair) == 2}
    return complete[min(complete)] if complete else {}


def same_changes(proposals: Iterable[ProposalRecord]) -> dict[str, ProposalRecord]:
    """proposal id -> the first proposal of exactly the same change (the same files patched the same
    way on the same version), for every later one. Diagnosing the starter's batch again proposes
    again what was already applied or rejected; a reviewer should see that before deciding twice."""
    first: dict[tuple[str, tuple[tuple[str, str], ...]], ProposalRecord] = {}
    twins: dict[str, ProposalRecord] = {}
    for p in sorted(proposals, key=lambda p: (p.created_at, p.id)):
        key = (p.harness_version, tuple(sorted(p.files.items())))
        if key in first:
            twins[p.id] = first[key]
        else:
            first[key] = p
    return twins


def cluster_titles(diagnoses: Iterable[DiagnosisRecord], width: int = 50) -> dict[str, str]:
    """`diagnosis id/cluster id` -> readable cluster title, for labelling proposals."""
    return {f"{d.id}/{c.id}": cluster_title(c, width) for d in diagnoses for c in report_of(d).clusters}


def evolution_of(proposal: ProposalRecord, evolutions: Iterable[EvolutionRecord]) -> EvolutionRecord | None:
    """The evolution whose diagnosis produced this proposal (it applies the proposal itself)."""
    return next((e for e in evolutions if proposal.diagnosis_id in e.outcome.diagnoses), None)


def evolution_iteration_of(proposal: ProposalRecord, evolution: EvolutionRecord) -> str:
    """The iteration of `evolution` whose diagnosis made the proposal ('?' when not recorded)."""
    for row in evolution.rows:
        if row.diagnosis_id == proposal.diagnosis_id:
            return str(row.iteration)
    cursor = evolution.outcome.cursor
    if cursor.diagnosis_id == proposal.diagnosis_id and cursor.iteration is not None:
        return str(cursor.iteration)
    return "?"


def applied_version(proposal_id: str, harnesses: Iterable[HarnessVersion]) -> HarnessVersion | None:
    return next((h for h in harnesses
                 if any(a.proposal_id == proposal_id for a in h.measured.applied)), None)


# ---------------------------------------------------------------- evolutions

def screening_rule(e: EvolutionRecord) -> str:
    """What sends a screened change on to validation, with this evolution's own thresholds (a user
    read "only changes that gain there are validated" above a change screened at net +0)."""
    from ecdysis.evolve import EvolveConfig
    default = EvolveConfig(suite="", models=[])
    wins = int(e.config.get("screen_min_wins", default.screen_min_wins))
    net = int(e.config.get("screen_min_net", default.screen_min_net))
    k = float(e.config.get("screen_k", default.screen_k))
    return (f"Screened: the change alone on its own cluster's instances plus as many passing ones, paired against "
            f"the parent. It goes on to validation, one change at a time, when it repairs at least {wins} of the "
            f"batch's outcomes (a repair of reading: when it reads answers the harness could not and breaks "
            f"nothing), its net gain is not below {net:+d} by more than {k:g} standard errors of the batch's "
            f"noise, and it pays for any calls it adds. A batch is small: validation decides.")


def evolution_label(e: EvolutionRecord) -> str:
    planned = e.config.get("iterations", "?")
    return (f"{e.id} · {e.strategy} · {e.suite} · {', '.join(e.models)} · {e.status} · "
            f"{len(e.rows)}/{planned} iterations")


def iteration_rows(e: EvolutionRecord) -> list[dict[str, Any]]:
    return [{"iteration": r.iteration, "train acc": r.train_accuracy, "validation acc": r.val_accuracy,
             "proposals": r.proposals, "applied": r.applied, "rolled back": r.rolled_back, "gate": r.gate,
             "model calls": r.model_calls, "tokens": r.tokens, "seconds": r.wall_seconds,
             "version": short(r.harness_version)} for r in e.rows]


@dataclass(frozen=True)
class StrategyStats:
    """What one evolution cost and achieved, as the comparison states it."""

    evolution_id: str
    strategy: str
    train_seconds: float
    model_calls: int
    tokens: int
    final_val: float | None
    test_accuracy: float | None
    base_test_accuracy: float | None


def strategy_stats(e: EvolutionRecord) -> StrategyStats:
    out, rows = e.outcome, e.rows
    vals = [r.val_accuracy for r in rows if r.val_accuracy is not None]
    return StrategyStats(
        evolution_id=e.id, strategy=e.strategy,
        train_seconds=round(sum(r.wall_seconds for r in rows), 2),
        model_calls=out.spent.calls or sum(r.model_calls for r in rows),
        tokens=out.spent.tokens or sum(r.tokens for r in rows),
        final_val=vals[-1] if vals else None, test_accuracy=out.test_accuracy,
        base_test_accuracy=out.base_test_accuracy)


@dataclass(frozen=True)
class Comparison:
    """Ecdysis against a baseline by the benchmark's definitions (`ecdysis.compare`): the speedup
    to the baseline's final validation accuracy in model calls and in charged model seconds, and
    the test-accuracy delta in percentage points (None where it is undefined or not finished)."""

    ecdysis: StrategyStats
    baseline: StrategyStats
    speedup_calls: float | None
    speedup_seconds: float | None
    target: float | None
    why: str | None
    accuracy_delta: float | None

    def sentences(self) -> list[str]:
        e, b = self.ecdysis, self.baseline
        out = []
        if self.speedup_calls is not None or self.speedup_seconds is not None:
            parts = []
            if self.speedup_calls:
                ratio = _ratio(self.speedup_calls, 'fewer', 'more')
                parts.append("the same number of calls" if ratio == "the same" else f"{ratio} calls")
            if self.speedup_seconds:
                ratio = _ratio(self.speedup_seconds, 'faster', 'slower')
                parts.append("the same model time" if ratio == "the same" else f"{ratio} in model time")
            out.append(f"Training time: ecdysis against {b.strategy}, to reach {b.strategy}'s final validation "
                       f"accuracy {pct(self.target)} — " + (", ".join(parts) or "never reached") + ".")
        else:
            out.append(f"Training time: ecdysis against {b.strategy} — no speedup to state: {self.why or 'not finished'}.")
        out.append(f"Model calls in all: ecdysis {e.model_calls} vs {b.strategy} {b.model_calls}.")
        if self.accuracy_delta is not None:
            out.append(f"Test accuracy: ecdysis {pct(e.test_accuracy)} vs {b.strategy} {pct(b.test_accuracy)} "
                       f"— {self.accuracy_delta:+.1f} percentage points.")
        else:
            out.append("Test accuracy: not available until both evolutions finish (the test split is scored once, "
                       "at the end).")
        return out


def _ratio(value: float, better: str, worse: str) -> str:
    """1.84 -> '1.84× faster'; 0.5 -> '2.00× slower' (a ratio below one reads inverted); a ratio
    that rounds to 1.00 either way is 'the same'."""
    if round(value, 2) == 1.0 or round(1 / value, 2) == 1.0:
        return "the same"
    return f"{value:.2f}× {better}" if value >= 1 else f"{1 / value:.2f}× {worse}"


@dataclass(frozen=True)
class Delta:
    """A change in percentage points as `st.metric` shows it: no colour and no arrow when it
    rounds to zero (a green up arrow on +0.0 says the opposite of the number)."""

    text: str
    moved: bool


def points_delta(new: float | None, base: float | None, what: str = "vs base") -> Delta | None:
    if new is None or base is None:
        return None
    pts = round(100 * (new - base), 1)
    return Delta(f"{pts:+.1f} pts {what}", True) if pts else Delta(f"±0.0 pts {what}", False)


def evolution_where(e: EvolutionRecord) -> str:
    """Where an evolution's cursor stands, in words: past its last iteration it is scoring the
    sealed test split, not in an iteration beyond the plan."""
    cursor = e.outcome.cursor
    phase, iteration = cursor.phase, cursor.iteration
    planned = e.config.get("iterations")
    if phase == "finished":
        return "finished"
    if phase == "test" or (iteration is not None and isinstance(planned, int) and iteration > planned):
        return "all iterations done, scoring the sealed test split"
    return f"iteration {iteration if iteration is not None else '—'}/{planned or '?'}, phase {phase or '—'}"


@dataclass(frozen=True)
class GateRow:
    """One iteration's validation gate: parent against candidate on the same instances."""

    iteration: int
    parent: float | None
    candidate: float | None
    wins: int | None
    losses: int | None
    paired: int | None
    needed: str
    outcome: str
    reason: str

    def to_row(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "parent acc": self.parent, "candidate acc": self.candidate,
                "wins": self.wins, "losses": self.losses, "net": None if self.wins is None else
                self.wins - (self.losses or 0), "paired instances": self.paired, "threshold": self.needed,
                "outcome": self.outcome, "why": self.reason}


def gate_threshold(config: Mapping[str, Any]) -> str:
    """The acceptance rule of an evolution's gate, in words with its numbers."""
    if config.get("gate", "paired-sign") == "paired-sign":
        k = float(config.get("gate_k", 1.0))
        return (f"net ≥ {int(config.get('gate_min_net', 2))} and net > {k:g}·SE, where SE = √(wins+losses) with "
                "one model; with several, √ of the sum over questions of each question's net squared")
    return "any net gain (wins > losses)"


def gate_bound(config: Mapping[str, Any], verdict: GateVerdict) -> str:
    """The bound one verdict was held to, with its own standard error: "net ≥ 2 and net > 2 × 4.69
    = 9.38" (the rule alone for a gate without one)."""
    if config.get("gate", "paired-sign") != "paired-sign":
        return gate_threshold(config)
    k = float(config.get("gate_k", 1.0))
    return (f"net ≥ {int(config.get('gate_min_net', 2))} and net > {k:g} × {verdict.error:.2f} "
            f"= {k * verdict.error:.2f}")


def gate_rows(e: EvolutionRecord, harnesses: Iterable[HarnessVersion]) -> list[GateRow]:
    """Each finished iteration's gates: one per change validated (changes are validated one at a
    time), from the verdicts stored with the iteration; older records, from the candidate version.
    Each row's threshold is the bound its verdict was held to, with that verdict's standard error."""
    by_id = {h.id: h for h in harnesses}
    needed = gate_threshold(e.config)
    rows = []
    for r in e.rows:
        steps = [st for st in r.steps or () if st.verdict is not None]
        for step in steps:
            v = step.verdict
            assert v is not None
            what = ", ".join(c.operator or c.proposal_id for c in step.changes)
            rows.append(GateRow(r.iteration, v.parent_accuracy, v.candidate_accuracy, v.wins, v.losses, v.n,
                                gate_bound(e.config, v), "kept" if step.kept else "rolled back",
                                f"{what}: {v.reason}" if what else v.reason))
        if steps:
            continue
        # Rows written before steps were stored keep their verdict with the candidate version.
        cand = by_id.get(r.candidate_version or "") if r.steps is None else None
        verdict = cand.measured.gate if cand else None
        if verdict is None:
            rows.append(GateRow(r.iteration, None, None, None, None, None, needed, "no candidate", r.gate))
            continue
        rows.append(GateRow(r.iteration, verdict.parent_accuracy, verdict.candidate_accuracy, verdict.wins,
                            verdict.losses, verdict.n, gate_bound(e.config, verdict),
                            "kept" if verdict.passed else "rolled back",
                            verdict.reason))
    return rows


def change_rows(e: EvolutionRecord) -> list[dict[str, Any]]:
    """Every proposal of every iteration with its predicted effect beside what it measurably did:
    screened alone on its cluster (paired wins and losses, calls per instance), then validated."""
    rows = []
    for r in e.rows:
        # The last step each change was in, and the changes validated with it there (a pair).
        measured = {c.proposal_id: (c, [o.operator or o.proposal_id for o in st.changes if o is not c])
                    for st in r.steps or () for c in st.changes}
        for h in r.history:
            c, others = measured.get(h.proposal_id, (None, []))
            sc, val = (c.screened, c.measured) if c else (None, None)
            jointly = f"; with {', '.join(others)}" if others else ""
            rows.append({
                "iteration": r.iteration, "proposal": h.proposal_id, "operator": h.operator or "edit",
                "predicted": (c.predicted[:160] if c else "") or None,
                "screened": (f"net {sc.net:+d} ({sc.wins} won, {sc.losses} lost of {sc.n}"
                             + (f", {sc.earlier} from earlier batches)" if sc.earlier else ")")
                             + (f"; reads {sc.read} answers that went unread" if sc.read else "")
                             + _contest(sc.contest) + jointly
                             if sc and sc.n is not None and sc.net is not None else None),
                "calls/instance": (f"{sc.parent_calls or 0:g} → {sc.candidate_calls:g}"
                                   if sc and sc.candidate_calls is not None else None),
                "validated": (f"{100 * val.val_delta:+.1f} pts ({val.wins} won, {val.losses} lost){jointly}"
                              if val else None),
                "outcome": h.outcome.replace("_", " "), "why": h.why or None})
    return rows


def _contest(contest: Mapping[str, Any] | None) -> str:
    """"; ranked on validation: net +8 (answer_extraction +4)": a reading repair validated against
    the same parent as its rivals, which set the order they went to the gate in."""
    if not contest or not contest.get("rivals"):
        return ""
    rivals = ", ".join(f"{r.get('operator') or r.get('proposal_id')} {int(r.get('net', 0)):+d}"
                       for r in contest["rivals"])
    return f"; ranked on validation: net {int(contest.get('net', 0)):+d} ({rivals})"


def pair_rows(e: EvolutionRecord) -> list[dict[str, Any]]:
    """Every pair of changes screened together (a near miss and a change screened after it), with
    what the batch said against the parent and over the later change alone, and its fate."""
    rows = []
    for r in e.rows:
        for p in r.pairs:
            names = [o or m for o, m in zip(p.operators, p.members)] or list(p.members)
            over = p.over_alone
            rows.append({
                "iteration": r.iteration, "pair": " + ".join(names),
                "screened": (f"net {p.net:+d} ({p.wins} won, {p.losses} lost of {p.n})"
                             if p.n is not None and p.net is not None else None),
                "over the later alone": (f"net {over.get('net', 0):+d} ({over.get('wins', 0)} won, "
                                         f"{over.get('losses', 0)} lost of {over.get('n', 0)})" if over else None),
                "outcome": p.outcome.replace("_", " "), "why": p.why or None})
    return rows


def compare(ecdysis: EvolutionRecord, baseline: EvolutionRecord) -> Comparison:
    from ecdysis import compare as defs
    e, b = strategy_stats(ecdysis), strategy_stats(baseline)
    start = defs.start_accuracy(ecdysis)
    start = defs.start_accuracy(baseline) if start is None else start
    ours, theirs = defs.curve(ecdysis, start or 0.0), defs.curve(baseline, start or 0.0)
    up = defs.speedup(theirs, ours, start or 0.0)
    delta = (100.0 * (e.test_accuracy - b.test_accuracy)
             if e.test_accuracy is not None and b.test_accuracy is not None else None)
    return Comparison(e, b, up.get("calls"), up.get("seconds"), up.get("target"), up.get("why"), delta)


# ---------------------------------------------------------------- harness lineage

@dataclass(frozen=True)
class ValScore:
    """A version's validation accuracy and what it was measured on, since scores on different
    suites or models do not compare (a user saw one version at 17 % next to another at 73 %)."""

    accuracy: float
    on: str  # "reasoning-mix · 2 models", or "its evolution's gate"


def validation_scores(harnesses: Iterable[HarnessVersion], runs: Iterable[RunRecord]) -> dict[str, ValScore]:
    """Each version's validation accuracy on the suite it was last validated on: every model's
    newest finished validation run of that suite pooled, instance by instance (a version
    validated on Qwen and SmolLM2 is neither one's score alone). A version with no such run has
    its evolution gate's measurement, when there is one."""
    newest: dict[tuple[str, str, str], RunRecord] = {}  # (version, suite, model) -> its newest run
    for run in sorted(runs, key=lambda r: r.created_at):
        s = run.summary or {}
        if (run.split == "validation" and run.status == "done" and isinstance(s.get("accuracy"), (int, float))
                and s.get("n")):
            newest[(run.harness_version, run.suite, run.model)] = run
    last_suite: dict[str, tuple[float, str]] = {}
    for (version, suite, _), run in newest.items():
        if run.created_at >= last_suite.get(version, (float("-inf"), ""))[0]:
            last_suite[version] = (run.created_at, suite)
    scores: dict[str, ValScore] = {}
    for version, (_, suite) in last_suite.items():
        pooled = [r for (v, s, _), r in newest.items() if v == version and s == suite]
        n = sum(int(r.summary["n"]) for r in pooled)
        right = sum(round(float(r.summary["accuracy"]) * int(r.summary["n"])) for r in pooled)  # whole instances
        scores[version] = ValScore(round(right / n, 4), f"{suite} · {plural(len(pooled), 'model')}")
    for h in harnesses:
        if h.id not in scores and h.measured.val_accuracy is not None:
            scores[h.id] = ValScore(h.measured.val_accuracy, "its evolution's gate")
    return scores


def harness_row(h: HarnessVersion, scores: Mapping[str, ValScore]) -> dict[str, Any]:
    score = scores.get(h.id)
    return {"version": h.id, "status": h.status, "parent": h.parent or "",
            "validation": score.accuracy if score else None, "validated on": score.on if score else "",
            "note": h.note, "created": when(h.created_at), "files": len(h.files)}


def harness_label(h: HarnessVersion, scores: Mapping[str, ValScore] | None = None) -> str:
    score = (scores or {}).get(h.id)
    said = f" · val {score.accuracy:.0%} ({score.on})" if score is not None else ""
    return f"{h.id} · {h.status}{said} · {h.note[:40]}"


STATUS_STYLE: dict[str, tuple[str, str]] = {  # status -> (fill colour, edge style)
    "starter": ("#e8e6e1", "solid"), "kept": ("#cdebd9", "solid"), "candidate": ("#dbe7fb", "solid"),
    "rolled_back": ("#fde3c8", "dashed"), "rejected": ("#f7d4d7", "dashed"), "imported": ("#e6dcf7", "solid"),
}


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', "'")


def lineage_dot(harnesses: Sequence[HarnessVersion], scores: Mapping[str, ValScore],
                rejected: Sequence[ProposalRecord] = ()) -> str:
    """Graphviz DOT of the version tree: parent -> child, filled by status (kept, rolled back,
    rejected told apart by colour and a dashed edge), each node with its validation score; rejected
    proposals hang off the version they targeted as dotted leaves."""
    known = {h.id for h in harnesses}
    lines = ['digraph lineage {', 'rankdir=LR; bgcolor="transparent";',
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, color="#8a857c"];',
             'edge [color="#8a857c", arrowsize=0.7];']
    for h in sorted(harnesses, key=lambda h: h.created_at):
        fill, _ = STATUS_STYLE.get(h.status, ("#ffffff", "solid"))
        score = scores.get(h.id)
        label = f"{h.id[:8]}\\n{h.status.replace('_', ' ')}" + (
            f"\\nval {score.accuracy:.0%}\\n{_dot_text(score.on)}" if score is not None else "")
        tip = _dot_text(h.note or h.status)
        lines.append(f'"{h.id}" [label="{label}", fillcolor="{fill}", tooltip="{tip}"];')
    for h in harnesses:
        if h.parent and h.parent in known:
            _, style = STATUS_STYLE.get(h.status, ("", "solid"))
            lines.append(f'"{h.parent}" -> "{h.id}" [style={style}];')
    for p in rejected:
        if p.harness_version in known:
            lines.append(f'"{p.id}" [label="{p.id[:8]}\\nproposal rejected", shape=note, fillcolor="#f7d4d7", '
                         f'style="filled,dotted", fontsize=9];')
            lines.append(f'"{p.harness_version}" -> "{p.id}" [style=dotted, color="#c53948"];')
    lines.append("}")
    return "\n".join(lines)


# ---------------------------------------------------------------- two runs, instance by instance

PAIR_ORDER = ("fixed", "broken", "still wrong", "still right")


@dataclass(frozen=True)
class PairedRuns:
    """Two runs (two harness versions, or two models) on the instances both scored: each instance
    fixed (wrong in A, right in B), broken (the reverse) or unchanged (still right, still wrong)."""

    rows: list[dict[str, Any]]
    only_a: int
    only_b: int

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.rows if r["change"] == outcome)

    def sentence(self) -> str:
        n = len(self.rows)
        if not n:
            return "The two runs share no scored instance."
        acc_a = sum(1 for r in self.rows if r["A"] == "correct") / n
        acc_b = sum(1 for r in self.rows if r["B"] == "correct") / n
        return (f"On the {count(n, 'instance')} both scored: {self.count('fixed')} fixed, {self.count('broken')} "
                f"broken, {self.count('still right') + self.count('still wrong')} unchanged "
                f"({self.count('still right')} still right, {self.count('still wrong')} still wrong); "
                f"accuracy {pct(acc_a)} → {pct(acc_b)}.")


def pair_runs(a: Sequence[InstanceResult], b: Sequence[InstanceResult]) -> PairedRuns:
    """Pair two runs' results by instance id; changes first (fixed, broken), then the unchanged."""
    by_b = {r.instance_id: r for r in b}
    rows = []
    for ra in a:
        rb = by_b.get(ra.instance_id)
        if rb is None:
            continue
        change = ("fixed" if rb.correct else "still wrong") if not ra.correct else ("still right" if rb.correct
                                                                                      else "broken")
        rows.append({"change": change, "instance": ra.instance_id, "category": ra.category,
                     "A": "correct" if ra.correct else (ra.error_type or "wrong"),
                     "B": "correct" if rb.correct else (rb.error_type or "wrong"),
                     "answer A": "—" if ra.answer is None else ra.answer[:60],
                     "answer B": "—" if rb.answer is None else rb.answer[:60], "target": ra.target[:60]})
    rows.sort(key=lambda r: (PAIR_ORDER.index(r["change"]), r["instance"]))
    a_ids, b_ids = {r.instance_id for r in a}, set(by_b)
    return PairedRuns(rows, len(a_ids - b_ids), len(b_ids - a_ids))


def comparable_pair(runs: Sequence[RunRecord]) -> tuple[str, str] | None:
    """A default pair to compare: the newest two runs of one suite and split that differ in
    harness version or model (e.g. an applied version and its parent, evaluated together)."""
    for i, newer in enumerate(runs):
        for older in runs[i + 1:]:
            if (older.suite, older.split) == (newer.suite, newer.split) and \
                    (older.harness_version, older.model) != (newer.harness_version, newer.model) and \
                    set(older.instance_ids) & set(newer.instance_ids):
                return older.id, newer.id
    return None

"""The `ecdysis` command: a thin face over `ecdysis.service.Service`. Engine errors become one
clear line on stderr (exit 2) here, at the boundary; never a stack trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ecdysis.errors import BudgetExceeded, EcdysisError
from ecdysis.service import RunRequest, Service
from ecdysis.settings import Settings, redact_credentials

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Evolve the runtime harness of LLM agents from batches of failures.")
# Piped output gets a wide console: ids and paths must not be cut or wrapped for scripts.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _service() -> Service:
    from storage import open_store  # the composition root: the engine itself never imports storage
    settings = Settings.from_env()
    return Service(open_store(settings.database_url), settings)


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _progress_sink(progress: Progress, task_id: Any) -> Callable[[dict[str, Any]], None]:
    def sink(event: dict[str, Any]) -> None:
        if event["type"] == "run_started":
            progress.update(task_id, total=event["total"], completed=event["done"])
        elif event["type"] == "instance_done":
            progress.update(task_id, completed=event["done"])
    return sink


@app.command()
def suites(as_json: bool = typer.Option(False, "--json", help="print a JSON list"),
           match: Optional[str] = typer.Option(None, "--match", help="only suites whose name holds this text"),
           source: Optional[str] = typer.Option(None, "--source", help="builtin | bfcl | bigbench | bbh | jsonl"),
           catalogue: bool = typer.Option(False, "--catalogue",
                                          help="first list the BIG-bench tasks not catalogued yet (minutes)")) -> None:
    """List the task suites (built-in, imported, fetched BFCL, BIG-bench and BIG-Bench Hard) with sizes,
    categories and answer forms."""
    from ecdysis.suites import bfcl_suites, bigbench_catalogue, uncatalogued_tasks
    from ecdysis.suites.bfcl import FETCH_HINT, SUITES
    if catalogue:
        bigbench_catalogue(progress=lambda n, total, task: err.print(f"cataloguing {n}/{total}: {escape(task)}"))
    rows = _service().suites()
    if match:
        rows = [r for r in rows if match.casefold() in r["name"].casefold()]
    if source:
        if source not in SOURCES:
            raise EcdysisError(f"unknown --source {source!r}", hint=f"one of {', '.join(SOURCES)}")
        rows = [r for r in rows if str(r.get("source", "")).split(":")[0] == source]
        if not rows and not match:
            err.print(escape(f"no {source} suites on this machine{SOURCE_HINTS.get(source, '')}"))
    if not bfcl_suites():
        err.print(escape(f"the BFCL suites ({', '.join(SUITES)}) are not fetched on this machine: {FETCH_HINT}"))
    if as_json:
        _emit_json(rows)
        return
    table = Table("suite", "size", "categories", "answer form", "scorer", "source")
    for r in rows:
        cats = r["categories"]
        cat_text = (", ".join(f"{k} {v}" for k, v in cats.items()) if len(cats) <= 5
                    else f"{len(cats)} categories")
        forms = sorted({_form_text(f) for f in r.get("answer_forms", {}).values()})
        table.add_row(escape(r["name"]), str(r["size"]), escape(cat_text), escape(", ".join(forms)),
                      escape(str(r.get("scorer", ""))), escape(str(r.get("source", "")).split(":")[0]))
    out.print(table)
    missing = uncatalogued_tasks()
    if missing:
        err.print(f"{missing} fetched BIG-bench task(s) are not listed yet: `ecdysis suites --catalogue` "
                  "lists them (a few minutes); each runs as bigbench:TASK meanwhile")


SOURCES = ("builtin", "bfcl", "bigbench", "bbh", "jsonl")
SOURCE_HINTS = {"bigbench": ": the BIG-bench task files are not set up (`python scripts/fetch_bigbench.py`, or "
                            "--sdist FILE / --source DIR with the files at hand; README, Quick start)",
                "jsonl": ": `ecdysis import-suite FILE.jsonl` stores one",
                "bbh": ": `python scripts/fetch_bbh.py` (set-up does) writes them",
                "bfcl": ": `python scripts/fetch_bfcl.py` (set-up does) fetches them"}


def _form_text(form: dict[str, Any]) -> str:
    from ecdysis.suites.forms import AnswerForm
    return AnswerForm.from_json(form).describe()


def _summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"run {summary['run_id']}", show_header=False)
    for key in ("suite", "model", "harness_version", "n", "accuracy", "model_calls", "cache_hits",
                "prompt_tokens", "completion_tokens", "wall_seconds"):
        table.add_row(key, escape(str(summary.get(key))))
    for cat, acc in summary.get("accuracy_by_category", {}).items():
        table.add_row(escape(f"  accuracy[{cat}]"), f"{acc:.3f}")
    for kind, count in summary.get("errors", {}).items():
        table.add_row(escape(f"  errors[{kind}]"), str(count))
    return table


@app.command()
def run(
    suite: Optional[str] = typer.Option(None, help="suite name, bigbench:TASK, or a .jsonl / task.json path"),
    model: Optional[str] = typer.Option(None, help="qwen2.5-coder-0.5b (default) | smollm2 | qwen2.5-coder-1.5b | "
                                                     "gemma3-270m | openai:NAME | anthropic:NAME"),
    harness: Optional[str] = typer.Option(None, help="harness version id, 'starter', a folder or a zip"),
    split: str = typer.Option("train", help="train | validation | test | all"),
    limit: Optional[int] = typer.Option(None, help="at most N instances (round-robin over categories)"),
    concurrency: int = typer.Option(1, min=1, max=256, help="instances in parallel"),
    resume: Optional[str] = typer.Option(None, help="finish the stored run RUN_ID"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not read or write the response cache"),
    executor: Optional[str] = typer.Option(None, help="local | ray (default: ECDYSIS_EXECUTOR, else local)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run a batch of task instances through a harness on one model."""
    svc = _service()
    svc.executor(executor)  # an unknown executor fails before a run is created
    if resume:
        run_id = svc.get_run(resume).id
    else:
        if not suite:
            raise EcdysisError("--suite is required", hint="`ecdysis suites` lists them")
        req = RunRequest(suite=suite, model=model or svc.settings.default_model, harness=harness,
                         split=split, limit=limit, concurrency=concurrency, use_cache=not no_cache,
                         executor=executor)
        run_id = svc.create_run(req).id
    if as_json:
        summary = svc.execute_run(run_id, use_cache=not no_cache, executor=executor)
        _emit_json(summary.to_json())
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        task_id = progress.add_task(f"run {run_id}", total=None)
        summary = svc.execute_run(run_id, use_cache=not no_cache, events=_progress_sink(progress, task_id),
                                  executor=executor)
    out.print(_summary_table(summary.to_json()))


@app.command()
def runs(as_json: bool = typer.Option(False, "--json")) -> None:
    """List stored runs, newest first."""
    rows = [{"run_id": r.id, "suite": r.suite, "model": r.model, "harness_version": r.harness_version,
             "split": r.split, "n": len(r.instance_ids), "status": r.status,
             "accuracy": r.summary.get("accuracy"), "wall_seconds": r.summary.get("wall_seconds")}
            for r in _service().runs()]
    if as_json:
        _emit_json(rows)
        return
    table = Table(*(rows[0].keys() if rows else ["run_id"]))
    for r in rows:  # an unfinished run has no accuracy or time yet: "—", not "None"
        table.add_row(*(escape("—" if v is None else str(v)) for v in r.values()))
    out.print(table if rows else "no runs yet: try `ecdysis run --suite reasoning-mix --limit 10`")


@app.command()
def harnesses(as_json: bool = typer.Option(False, "--json")) -> None:
    """List stored harness versions with their parents."""
    rows = [{"id": v.id, "parent": v.parent, "status": v.status, "note": v.note, "files": sorted(v.files)}
            for v in _service().harnesses()]
    if as_json:
        _emit_json(rows)
        return
    table = Table("id", "parent", "status", "note", "files")
    for r in rows:
        table.add_row(r["id"], str(r["parent"] or ""), escape(r["status"]), escape(r["note"]),
                      escape(", ".join(r["files"])))
    out.print(table)


@app.command()
def diagnose(
    run_ids: list[str] = typer.Argument(..., help="one or more stored runs, diagnosed as one batch"),
    roles: str = typer.Option("heuristic", help="role backend: heuristic, or a model name for LLM roles"),
    max_rounds: int = typer.Option(3, min=1, help="Proposer/Critic rounds per cluster"),
    transcripts: bool = typer.Option(False, "--transcripts", help="print every role message in the report"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Cluster the failures of runs across instances and models, attribute them, propose patches."""
    from ecdysis.diagnosis import report_of
    svc = _service()
    with err.status("diagnosing: clustering failures, running the roles"):
        rec = svc.diagnose(list(run_ids), role_backend=roles, max_rounds=max_rounds)
    report = report_of(rec)
    if as_json:
        _emit_json(report.to_json())
        return
    sys.stdout.write(report.render_text(transcripts=transcripts) + "\n")
    out.print(f"stored as diagnosis {rec.id}; review with `ecdysis proposals --diagnosis {rec.id}`")


@app.command()
def proposals(diagnosis: Optional[str] = typer.Option(None, help="only this diagnosis"),
              status: Optional[str] = typer.Option(None, help="pending | approved | edited | rejected | applied"),
              as_json: bool = typer.Option(False, "--json")) -> None:
    """List stored proposals and their gate status."""
    rows = [{"id": p.id, "diagnosis": p.diagnosis_id, "cluster": p.cluster_id, "status": p.status,
             "operator": p.spec.get("operator"), "files": sorted(p.files), "change": p.spec.get("change", ""),
             "by": "engine" if p.data.get("alternative") else "roles", "alternative": p.data.get("alternative")}
            for p in _service().proposals(diagnosis_id=diagnosis, status=status)]
    if as_json:
        _emit_json(rows)
        return
    table = Table("id", "diagnosis", "cluster", "status", "by", "operator", "change")
    for r in rows:
        table.add_row(r["id"], r["diagnosis"], r["cluster"], r["status"], r["by"], escape(str(r["operator"])),
                      escape(str(r["change"])[:80]))
    out.print(table if rows else "no proposals yet: run `ecdysis diagnose RUN_ID`")


@app.command()
def decide(proposal: str = typer.Argument(...),
           decision: str = typer.Option(..., help="approve | edit | reject"),
           reason: str = typer.Option("", help="why (required to reject)"),
           edited_dir: Optional[str] = typer.Option(None, help="with edit: folder holding the edited files"),
           who: str = typer.Option("cli", help="who decides (stored with the decision)")) -> None:
    """Record a decision on a proposal (the same gate the app and `evolve --review` use)."""
    if decision not in ("approve", "edit", "reject"):  # the user's typo first, before any lookup
        raise EcdysisError(f"unknown --decision {decision!r}", hint="approve, edit or reject")
    svc = _service()
    files = None
    if decision == "edit":
        if not edited_dir:
            raise EcdysisError("an edit needs --edited-dir with the edited files")
        p = svc.get_proposal(proposal)
        files = _read_edited(Path(edited_dir), list(p.files))
    rec = svc.decide(proposal, decision, who=who, reason=reason, files=files)
    out.print(f"{rec.decision} recorded for {proposal}")


def _read_edited(folder: Path, names: list[str]) -> dict[str, str]:
    """The edited versions of `names` found in `folder` (UTF-8 text, as every harness file is)."""
    from ecdysis.errors import InputError
    if not folder.is_dir():
        raise InputError("not a folder", path=str(folder), hint="--edited-dir names the folder holding the edited files")
    files: dict[str, str] = {}
    for name in names:
        path = folder / name
        if path.is_file():
            try:
                files[name] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"not UTF-8 text (byte {exc.start})", path=str(path),
                                 hint="harness files are UTF-8; nothing was recorded") from exc
            except OSError as exc:
                raise InputError(f"cannot read it: {exc.strerror or exc}", path=str(path)) from exc
    return files


@app.command()
def evolve(
    suite: Optional[str] = typer.Option(None, help="suite to evolve on (train/validation/test splits); "
                                                    "not needed with --resume"),
    model: list[str] = typer.Option(None, "--model", help="repeat for several models (cross-model evidence); "
                                                           "default: qwen2.5-coder-0.5b and smollm2"),
    strategy: str = typer.Option("ecdysis", help="ecdysis (batch aggregation) | per-instance | self-evolution "
                                                 "(the paper's baseline)"),
    iterations: int = typer.Option(3, min=1),
    batch_size: int = typer.Option(30, min=1, help="train instances per iteration"),
    val_limit: Optional[int] = typer.Option(40, help="validation instances compared pairwise"),
    test_limit: Optional[int] = typer.Option(None, help="held-out test instances scored at the end"),
    holdout_window: int = typer.Option(0, min=0, help="which --val-limit/--test-limit window of the validation "
                                                      "and test splits (0: the first; 1: the next as many)"),
    harness: Optional[str] = typer.Option(None, help="start version (default: the starter harness)"),
    auto_approve: bool = typer.Option(False, "--auto-approve", help="approve every proposal"),
    review: bool = typer.Option(False, "--review", help="decide each proposal at a terminal prompt"),
    gate: str = typer.Option("paired-sign", help="paired-sign | any-improvement"),
    gate_min_net: int = typer.Option(2, help="paired-sign: minimum net instances gained"),
    gate_k: float = typer.Option(2.0, min=0.0, help="paired-sign: standard errors of no change the net gain "
                                                     "must exceed (1 keeps about one null change in six)"),
    min_gain_per_call: float = typer.Option(0.05, help="accuracy (0-1) a change must gain per model call it adds "
                                                       "per instance, in screening and at the gate"),
    roles: str = typer.Option("heuristic", help="role backend: heuristic, or a model name for LLM roles"),
    max_rounds: int = typer.Option(3, min=1, help="Proposer/Critic rounds per cluster"),
    screen_min_net: int = typer.Option(0, help="screening: the least net gain on the batch that sends a change on "
                                               "to validation (0: drop only what loses there)"),
    screen_min_wins: int = typer.Option(1, min=0, help="screening: the least number of batch outcomes a change "
                                                       "must repair to go on to validation"),
    screen_k: float = typer.Option(2.0, min=0.0, help="screening: a change is screened out for losing, or for not "
                                                      "paying for its calls, only by more than this many standard "
                                                      "errors of its batch outcomes"),
    screen_rounds: int = typer.Option(3, min=1, help="screening rounds: while nothing survives screening, "
                                                     "diagnose the batch again with what failed ruled out"),
    screen_pool: bool = typer.Option(True, "--screen-pool/--no-screen-pool",
                                     help="screening: pool a change's paired outcomes on the earlier batches it was "
                                          "screened on (same harness, already paid for) with this batch's"),
    complements: bool = typer.Option(True, "--complements/--no-complements",
                                     help="screen a change refused on validation without a significant loss "
                                          "composed with a later survivor, and validate the pair first when the "
                                          "batch says it beats that survivor alone"),
    passes: int = typer.Option(2, min=1, max=5, help="refinement passes: the first proposes, later ones review "
                                                     "the endorsed specification (regressions, cost, generality)"),
    concurrency: int = typer.Option(1, min=1, max=256),
    max_model_calls: Optional[int] = typer.Option(None, help="stop cleanly after this many model calls"),
    max_tokens: Optional[int] = typer.Option(None, help="stop cleanly after this many tokens"),
    max_wall: Optional[float] = typer.Option(None, help="stop cleanly after this many seconds"),
    resume: Optional[str] = typer.Option(None, help="continue the stored evolution EVOLUTION_ID"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Evolve a harness: batch, diagnose, gate, apply, validate; K iterations; sealed test at the end."""
    from ecdysis.evolve import EvolveConfig, summary
    if auto_approve and review:
        raise EcdysisError("--auto-approve and --review contradict each other",
                           hint="--review to decide each proposal at the prompt, --auto-approve to approve them all")
    svc = _service()
    reviewer = _terminal_reviewer(svc) if review else None
    sink = None if as_json else _evolve_printer()
    poll_s = 0 if not (review or auto_approve) else 1.0
    if resume:
        overrides = {"max_model_calls": max_model_calls, "max_tokens": max_tokens, "max_wall_s": max_wall}
        evo = svc.run_evolution(resume=resume, events=sink, reviewer=reviewer, poll_s=poll_s, overrides=overrides)
    else:
        if not suite:
            raise EcdysisError("--suite is required", hint="`ecdysis suites` lists them; or --resume EVOLUTION_ID")
        cfg = EvolveConfig(suite=suite, models=list(model or svc.settings.default_models), strategy=strategy,
                           iterations=iterations, batch_size=batch_size, val_limit=val_limit,
                           test_limit=test_limit, holdout_window=holdout_window, harness=harness,
                           auto_approve=auto_approve, gate=gate,
                           gate_min_net=gate_min_net, gate_k=gate_k, role_backend=roles, max_rounds=max_rounds,
                           concurrency=concurrency, max_model_calls=max_model_calls, max_tokens=max_tokens,
                           max_wall_s=max_wall, min_gain_per_call=min_gain_per_call, passes=passes,
                           screen_min_net=screen_min_net, screen_min_wins=screen_min_wins, screen_k=screen_k,
                           screen_rounds=screen_rounds, screen_pool=screen_pool, complements=complements)
        evo = svc.run_evolution(cfg, events=sink, reviewer=reviewer, poll_s=poll_s)
    result = summary(evo)
    if as_json:
        _emit_json(result)
        return
    table = Table("iter", "version", "train", "val", "proposals", "screened", "validated", "kept", "calls", "of which roles+smoke",
                  "tokens", "s")
    for r in result["iterations"]:
        table.add_row(str(r["iteration"]), r["harness_version"], str(r["train_accuracy"]), str(r["val_accuracy"]),
                      str(r["proposals"]), str(r.get("screened", 0)), str(r["applied"]), str(r.get("kept", 0)),
                      str(r["model_calls"]), str(r.get("calls_by_phase", {}).get("diagnose", 0)),
                      str(r["tokens"]), str(r["wall_seconds"]))
    out.print(table)
    for r in result["iterations"]:
        for h in r.get("history", []):
            out.print(f"  iteration {r['iteration']}: {escape(h['operator'] or h['proposal_id'])} — "
                      f"{h['outcome'].replace('_', ' ')}: {escape(h['why'])}")
    out.print(f"evolution {result['evolution_id']}: {result['status']}; final {result['final_version']}; "
              f"test accuracy {result['test_accuracy']} (base {result['base_test_accuracy']})")
    if result.get("stopped"):
        again = f"ecdysis evolve --resume {result['evolution_id']}"
        if result.get("stopped_by"):  # the same budget would stop it again at once
            again += " " + BudgetExceeded.FLAGS.get(result["stopped_by"], BudgetExceeded.FLAGS["calls"])
        out.print(f"[yellow]{escape(result['stopped'])}[/yellow] — `{escape(again)}`")


@app.command()
def evolutions(as_json: bool = typer.Option(False, "--json")) -> None:
    """List stored evolutions, newest first (resume one with `ecdysis evolve --resume ID`)."""
    rows = [{"evolution_id": e.id, "strategy": e.strategy, "suite": e.suite, "models": e.models, "status": e.status,
             "iterations": len(e.rows), "current_version": e.current_version,
             "stopped": e.outcome.stopped} for e in _service().evolutions()]
    if as_json:
        _emit_json(rows)
        return
    table = Table("evolution_id", "strategy", "suite", "models", "status", "iterations", "current_version")
    for r in rows:
        table.add_row(r["evolution_id"], r["strategy"], escape(r["suite"]), escape(", ".join(r["models"])),
                      r["status"], str(r["iterations"]), r["current_version"])
    out.print(table if rows else "no evolutions yet: try `ecdysis evolve --suite boolean --auto-approve`")


def _evolve_printer() -> Callable[[dict[str, Any]], None]:
    def sink(event: dict[str, Any]) -> None:
        if event["type"] == "iteration_done":
            err.print(f"iteration {event['iteration']}: version {event['harness_version']} "
                      f"val {event['val_accuracy']} — {event['gate']}")
    return sink


def _terminal_reviewer(svc: Service) -> Callable[[Any], tuple[str, str, Optional[dict[str, str]]]]:
    import tempfile
    from pathlib import Path

    from ecdysis.diffs import diff_files

    def review(proposal: Any) -> tuple[str, str, Optional[dict[str, str]]]:
        base = svc.harness(proposal.harness_version)
        out.rule(f"proposal {proposal.id} (cluster {proposal.cluster_id})")
        for key in ("change", "root_cause", "expected_effect", "risk", "scope"):
            out.print(f"[bold]{key}[/bold]: {escape(str(proposal.spec.get(key, '')))}")
        for d in diff_files(base.files, {**base.files, **proposal.files}):
            out.print(d.unified, highlight=False, markup=False)
        while True:
            choice = typer.prompt("approve / edit / reject", default="approve").strip().lower()
            if choice in ("a", "approve"):
                return "approve", "", None
            if choice in ("r", "reject"):
                return "reject", typer.prompt("reason"), None
            if choice in ("e", "edit"):
                folder = Path(tempfile.mkdtemp(prefix=f"ecdysis-edit-{proposal.id}-"))
                for name, text in proposal.files.items():
                    (folder / name).parent.mkdir(parents=True, exist_ok=True)
                    (folder / name).write_text(text)
                typer.prompt(f"edit the files in {folder}, then press Enter", default="", show_default=False)
                edited = {name: (folder / name).read_text() for name in proposal.files}
                return "edit", typer.prompt("note on the edit", default="edited"), edited
    return review


@app.command("export")
def export_cmd(version: str = typer.Argument(..., help="harness version id or prefix"),
               output: str = typer.Option(None, "-o", "--output", help="zip path (default VERSION.zip)")) -> None:
    """Write a harness version as a zip that runs on its own (files, manifest, README, run.py)."""
    svc = _service()
    v = svc.harness(version)
    path = output or f"{v.id}.zip"
    data = svc.export_harness(v.id, path)
    out.print(f"wrote {path} ({len(data)} bytes)")


@app.command("import")
def import_cmd(archive: str = typer.Argument(..., help="a harness zip exported by Ecdysis")) -> None:
    """Store a harness zip as a version (refuses unsafe or malformed archives)."""
    from pathlib import Path

    from ecdysis.errors import InputError
    if not Path(archive).is_file():
        raise InputError("no such file", path=archive)
    v = _service().import_harness(Path(archive).read_bytes(), name=archive)
    out.print(f"imported harness version {v.id}")


@app.command("import-suite")
def import_suite_cmd(path: str = typer.Argument(..., help="a JSONL suite file"),
                     name: Optional[str] = typer.Option(None, help="store it under this name (default: the header's, "
                                                                   "else the file name)"),
                     replace: bool = typer.Option(False, "--replace", help="replace a stored suite of this name")) -> None:
    """Check every line of a JSONL suite, then store it under a name for run, evolve and the app."""
    suite = _service().import_suite_file(path, name=name, replace=replace)
    out.print(f"stored suite {escape(suite.name)}: {len(suite.instances)} instances, "
              f"{len(suite.categories)} categories")


@app.command()
def settings() -> None:
    """Show the effective configuration (keys masked)."""
    for key, value in Settings.from_env().public().items():
        out.print(f"{key} = {value}")


def main() -> None:
    try:
        app()
    except EcdysisError as exc:
        # The message may quote a server's body or a file: no Rich markup from it, no credentials.
        line = redact_credentials(exc.message + (f" — {exc.hint}" if exc.hint else ""))
        err.print(f"[red]error:[/red] {escape(' '.join(line.split()))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted; resume with `ecdysis run --resume RUN_ID`")
        sys.exit(130)


if __name__ == "__main__":
    main()

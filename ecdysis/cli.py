"""The `ecdysis` command: a thin face over `ecdysis.service.Service`. Engine errors become one
clear line on stderr (exit 2) here, at the boundary; never a stack trace."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ecdysis.errors import EcdysisError
from ecdysis.service import RunRequest, Service
from ecdysis.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Evolve the runtime harness of LLM agents from batches of failures.")
out = Console()
err = Console(stderr=True)


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
def suites(as_json: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the available task suites with sizes and categories."""
    rows = _service().suites()
    if as_json:
        _emit_json(rows)
        return
    table = Table("suite", "size", "categories", "scorer", "source")
    for r in rows:
        table.add_row(r["name"], str(r["size"]), ", ".join(f"{k} {v}" for k, v in r["categories"].items()),
                      str(r.get("scorer", "")), str(r.get("source", "")))
    out.print(table)


def _summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"run {summary['run_id']}", show_header=False)
    for key in ("suite", "model", "harness_version", "n", "accuracy", "model_calls", "cache_hits",
                "prompt_tokens", "completion_tokens", "wall_seconds"):
        table.add_row(key, str(summary.get(key)))
    for cat, acc in summary.get("accuracy_by_category", {}).items():
        table.add_row(f"  accuracy[{cat}]", f"{acc:.3f}")
    for kind, count in summary.get("errors", {}).items():
        table.add_row(f"  errors[{kind}]", str(count))
    return table


@app.command()
def run(
    suite: Optional[str] = typer.Option(None, help="suite name, bigbench:TASK, or a .jsonl / task.json path"),
    model: Optional[str] = typer.Option(None, help="smollm2 | gemma3-270m | openai:NAME | anthropic:NAME"),
    harness: Optional[str] = typer.Option(None, help="harness version id, 'starter', a folder or a zip"),
    split: str = typer.Option("train", help="train | validation | test | all"),
    limit: Optional[int] = typer.Option(None, help="at most N instances (round-robin over categories)"),
    concurrency: int = typer.Option(1, min=1, max=256, help="instances in parallel"),
    resume: Optional[str] = typer.Option(None, help="finish the stored run RUN_ID"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not read or write the response cache"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run a batch of task instances through a harness on one model."""
    svc = _service()
    if resume:
        run_id = svc.get_run(resume).id
    else:
        if not suite:
            raise EcdysisError("--suite is required", hint="`ecdysis suites` lists them")
        req = RunRequest(suite=suite, model=model or svc.settings.default_model, harness=harness,
                         split=split, limit=limit, concurrency=concurrency, use_cache=not no_cache)
        run_id = svc.create_run(req).id
    if as_json:
        summary = svc.execute_run(run_id, use_cache=not no_cache)
        _emit_json(summary.to_json())
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        task_id = progress.add_task(f"run {run_id}", total=None)
        summary = svc.execute_run(run_id, use_cache=not no_cache, events=_progress_sink(progress, task_id))
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
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
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
        table.add_row(r["id"], str(r["parent"] or ""), r["status"], r["note"], ", ".join(r["files"]))
    out.print(table)


@app.command()
def settings() -> None:
    """Show the effective configuration (keys masked)."""
    for key, value in Settings.from_env().public().items():
        out.print(f"{key} = {value}")


def main() -> None:
    try:
        app()
    except EcdysisError as exc:
        err.print(f"[red]error:[/red] {exc.message}" + (f" — {exc.hint}" if exc.hint else ""), highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted; resume with `ecdysis run --resume RUN_ID`")
        sys.exit(130)


if __name__ == "__main__":
    main()

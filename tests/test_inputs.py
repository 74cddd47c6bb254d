"""Bad inputs are refused with one clear line and store nothing, as a careless or hostile user
would type them (real CLI subprocesses on a data folder in tmp); the small probes of issue 12
(credentials in URLs, a stale "budget ran out", a hint naming a missing command) are here too."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ecdysis.errors import ConfigError, InputError
from ecdysis.export import read_zip
from ecdysis.harness import starter_files, validate_files
from ecdysis.suites import scorers
from ecdysis.suites.jsonl import MAX_LINE_BYTES, load_jsonl

ROOT = Path(__file__).resolve().parent.parent


def ecdysis(home: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith(("ECDYSIS_", "OPENAI_", "ANTHROPIC_"))}
    env.update(ECDYSIS_HOME=str(home), PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run([sys.executable, "-m", "ecdysis.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert needle in lines[0], lines[0]


def stored(home: Path, table: str) -> int:
    db = home / "ecdysis.db"
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return int(con.execute(f"select count(*) from {table}").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


# ---------------------------------------------------------------- limits

@pytest.mark.parametrize("args, needle", [
    (["run", "--suite", "boolean", "--limit", "0"], "--limit must be at least 1, not 0"),
    (["run", "--suite", "boolean", "--limit", "-5"], "--limit must be at least 1, not -5"),
    (["evolve", "--suite", "boolean", "--val-limit", "0"], "--val-limit must be at least 1, not 0"),
    (["evolve", "--suite", "boolean", "--test-limit", "-5"], "--test-limit must be at least 1, not -5"),
    (["evolve", "--suite", "boolean", "--holdout-window", "1"], "--holdout-window needs --val-limit and --test-limit"),
    (["evolve", "--suite", "boolean", "--test-limit", "5", "--holdout-window", "1"],
     "window 1 of 40 instances of the validation split needs 80; boolean has 15"),
])
def test_a_limit_below_one_is_refused_and_nothing_is_stored(ecdysis_home: Path, args: list[str], needle: str) -> None:
    one_line_error(ecdysis(ecdysis_home, *args), needle)
    assert stored(ecdysis_home, "run") == 0 and stored(ecdysis_home, "evolution") == 0


# ---------------------------------------------------------------- JSONL suites

def test_a_jsonl_line_over_the_cap_is_refused_naming_the_line(tmp_path: Path, ecdysis_home: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"input": "ok", "target": "1"}) + "\n"
                    + json.dumps({"input": "x" * (MAX_LINE_BYTES + 1), "target": "1"}) + "\n")
    with pytest.raises(InputError, match=r"big.jsonl:2: the line is longer than 256 KiB"):
        load_jsonl(path)
    one_line_error(ecdysis(ecdysis_home, "run", "--suite", str(path), "--split", "all"), "longer than 256 KiB")
    assert stored(ecdysis_home, "run") == 0


def test_an_integer_target_beyond_4300_digits_is_one_line(tmp_path: Path, ecdysis_home: Path) -> None:
    path = tmp_path / "digits.jsonl"
    path.write_text('{"input": "how many?", "target": ' + "9" * 5000 + "}\n")
    one_line_error(ecdysis(ecdysis_home, "run", "--suite", str(path), "--split", "all"), "digits.jsonl:1: a number is too long")


def test_a_catastrophic_regex_scorer_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "redos.jsonl"
    header = {"ecdysis_suite": {"name": "redos", "scorer": {"kind": "regex", "options": {"pattern": "^(a+)+$"}}}}
    path.write_text(json.dumps(header) + "\n" + json.dumps({"input": "?", "target": "a" * 40 + "!"}) + "\n")
    started = time.monotonic()
    with pytest.raises(InputError, match=r"redos.jsonl:1: .*nests quantifiers"):
        load_jsonl(path)
    assert time.monotonic() - started < 2.0
    for safe in (r"\d+", r"(?:yes|no)", r"\d{1,3}(,\d{3})*", r"(?>(a+)+)", r"(a++)+"):
        scorers.check_pattern(safe)
    with pytest.raises(ConfigError):  # a suite stored before this check is refused when scored
        scorers.regex("a" * 40 + "!", None, {"pattern": "(x+x+)+y"})  # type: ignore[arg-type]


# ---------------------------------------------------------------- harness.toml

def _toml(old: str, new: str) -> dict[str, str]:
    files = starter_files()
    assert old in files["harness.toml"]
    return {**files, "harness.toml": files["harness.toml"].replace(old, new)}


BAD_TOMLS = [
    (_toml('[harness]\nname = "starter"', 'harness = "oops"\n[x]\nname = "starter"'), "`harness` must be a table"),
    (_toml("max_tokens = 96", 'max_tokens = "many"'), "params.max_tokens = 'many' must be a whole number"),
    (_toml("temperature = 0.0", "temperature = [1]"), "params.temperature = [1] must be a number"),
    (_toml("stop = []", "stop = 5"), "params.stop = 5 must be a list of strings"),
    ({**starter_files(), "harness.toml": "params = 5\n" + starter_files()["harness.toml"].split("[params]")[0]},
     "`params` must be a table"),
    (_toml('entry = "harness.py:solve"', 'entry = "harness.py:answer"'), "defines no function 'answer'"),
]


@pytest.mark.parametrize("files, needle", BAD_TOMLS, ids=["harness-string", "max_tokens-str", "temperature-list",
                                                          "stop-int", "params-int", "no-entry-function"])
def test_a_bad_harness_toml_is_refused_at_import_and_at_apply(files: dict[str, str], needle: str, tmp_path: Path,
                                                              ecdysis_home: Path) -> None:
    with pytest.raises(InputError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        validate_files(files)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(f"harness/{name}", text)
    archive = tmp_path / "bad.zip"
    archive.write_bytes(buf.getvalue())
    one_line_error(ecdysis(ecdysis_home, "import", str(archive)), needle)
    assert stored(ecdysis_home, "harness_version") == 0
    # At apply: an edit of a proposal that breaks harness.toml is refused by the gate.
    from ecdysis.gate import decide
    from ecdysis.harness import ensure_starter
    from ecdysis.store import ProposalRecord
    from storage import open_store
    store = open_store()
    try:
        base = ensure_starter(store)
        store.save_proposal(ProposalRecord(id="p1", diagnosis_id="d1", cluster_id="c1", harness_version=base.id,
                                           spec={}, files={"harness.toml": base.files["harness.toml"] + "\n"}))
        with pytest.raises(InputError):
            decide(store, "p1", "edit", who="t", files={"harness.toml": files["harness.toml"]})
        assert store.list_decisions("p1") == [] and store.get_proposal("p1").status == "pending"  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_zip_entry_that_aliases_another_is_refused() -> None:
    files = starter_files()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(f"harness/{name}", text)
        zf.writestr("harness/./harness.py", "def solve(task, model, harness):\n    return 'pwned'\n")
    with pytest.raises(InputError, match=r"'harness/\./harness\.py' is not a plain path"):
        read_zip(buf.getvalue())


# ---------------------------------------------------------------- settings and paths

def test_a_negative_instance_timeout_is_refused(ecdysis_home: Path) -> None:
    one_line_error(ecdysis(ecdysis_home, "run", "--suite", "boolean", "--limit", "1", ECDYSIS_INSTANCE_TIMEOUT="-5"),
                   "ECDYSIS_INSTANCE_TIMEOUT='-5' must be a positive number of seconds")
    assert stored(ecdysis_home, "run") == 0


def test_export_to_a_missing_folder_a_folder_or_an_unwritable_place_is_one_line(tmp_path: Path,
                                                                                ecdysis_home: Path) -> None:
    assert ecdysis(ecdysis_home, "harnesses").returncode == 0  # stores the starter
    one_line_error(ecdysis(ecdysis_home, "export", "starter", "-o", str(tmp_path / "nope" / "h.zip")),
                   "its folder does not exist")
    one_line_error(ecdysis(ecdysis_home, "export", "starter", "-o", str(tmp_path)), "is a folder")
    one_line_error(ecdysis(ecdysis_home, "export", "starter", "-o", "/proc/h.zip"), "cannot write it")
    ok = ecdysis(ecdysis_home, "export", "starter", "-o", str(tmp_path / "h.zip"))
    assert ok.returncode == 0 and zipfile.is_zipfile(tmp_path / "h.zip")


def test_decide_with_an_edited_file_that_is_not_utf8_is_one_line(tmp_path: Path, ecdysis_home: Path) -> None:
    from ecdysis.harness import ensure_starter
    from ecdysis.store import ProposalRecord
    from storage import open_store
    store = open_store()
    base = ensure_starter(store)
    store.save_proposal(ProposalRecord(id="p1", diagnosis_id="d1", cluster_id="c1", harness_version=base.id,
                                       spec={}, files={"system.md": base.files["system.md"] + "\nBe brief.\n"}))
    store.close()
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "system.md").write_bytes(b"Be brief \xff\xfe.\n")
    one_line_error(ecdysis(ecdysis_home, "decide", "p1", "--decision", "edit", "--edited-dir", str(edited)),
                   "not UTF-8 text")
    assert stored(ecdysis_home, "decision") == 0


def test_a_corrupt_database_file_is_one_line(ecdysis_home: Path) -> None:
    ecdysis_home.mkdir(parents=True, exist_ok=True)
    (ecdysis_home / "ecdysis.db").write_bytes(b"this is not a database" * 400)
    one_line_error(ecdysis(ecdysis_home, "runs"), "file is not a database")


def test_proposals_with_an_unknown_status_is_refused(ecdysis_home: Path) -> None:
    one_line_error(ecdysis(ecdysis_home, "proposals", "--status", "weird"), "unknown proposal status 'weird'")


def test_credentials_in_a_base_url_are_never_shown_or_stored(ecdysis_home: Path) -> None:
    url = "http://user:S3cretPASS@127.0.0.1:9/v1"
    shown = ecdysis(ecdysis_home, "settings", OPENAI_BASE_URL=url)
    assert shown.returncode == 0 and "openai_base_url = http://***@127.0.0.1:9/v1" in shown.stdout
    assert "S3cretPASS" not in shown.stdout + shown.stderr
    run = ecdysis(ecdysis_home, "run", "--suite", "boolean", "--limit", "2", "--model", "openai:stub", "--json",
                  OPENAI_BASE_URL=url, OPENAI_API_KEY="k", ECDYSIS_MAX_RETRIES="0", ECDYSIS_MODEL_TIMEOUT="5")
    assert "S3cretPASS" not in run.stdout + run.stderr
    con = sqlite3.connect(ecdysis_home / "ecdysis.db")
    try:
        dump = "\n".join(con.iterdump())
    finally:
        con.close()
    assert "127.0.0.1:9" in dump or "model_error" in dump, "the failed calls are on record"
    assert "S3cretPASS" not in dump


def test_the_not_found_hint_names_a_command_that_exists(ecdysis_home: Path) -> None:
    missing = ecdysis(ecdysis_home, "evolve", "--resume", "e000000")
    one_line_error(missing, "`ecdysis evolutions` lists them")
    listed = ecdysis(ecdysis_home, "evolutions", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []


def test_a_resume_that_finishes_after_a_budget_stop_no_longer_says_a_budget_ran_out(ecdysis_home: Path) -> None:
    from ecdysis.evolve import EvolveConfig, Evolver, summary
    from ecdysis.models.registry import register_backend
    from ecdysis.models.scripted import ScriptedBackend
    from ecdysis.service import Service
    from storage import open_store
    register_backend(ScriptedBackend(model_id="unsure", default="I am not sure."))
    svc = Service(open_store())
    try:
        evolver = Evolver(svc, poll_s=0)
        evo = evolver.create(EvolveConfig(suite="boolean", models=["unsure"], iterations=1, batch_size=4, val_limit=4,
                                          test_limit=2, auto_approve=True, max_model_calls=2))
        stopped = evolver.run(evo.id)
        assert stopped.status == "stopped" and "budget" in str(stopped.result.get("stopped"))
        done: Any = Evolver(svc, poll_s=0).run(evo.id, overrides={"max_model_calls": 10_000})
        assert done.status == "done"
        assert summary(done)["stopped"] is None
        assert svc.get_evolution(evo.id).result.get("stopped") is None
    finally:
        svc.store.close()  # type: ignore[attr-defined]

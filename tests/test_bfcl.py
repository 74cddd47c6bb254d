"""BFCL single-turn suites on the real data of the pinned `bfcl-eval` wheel, fetched by
scripts/fetch_bfcl.py into a temporary folder (from a local copy of the wheel, so the tests run
offline), or read from the machine's fetched folder.

Invariants checked:
- each of the five suites has every entry of its BFCL file, with the raw id, user text, function
  docs and possible answer, and every instance in a split;
- every possible answer, written as JSON calls and as Python calls, with its optional parameters
  left out and given, scores correct: the checker accepts what BFCL's answers allow;
- a hand-made wrong answer for each of BFCL's rules scores wrong, with that rule as the reason;
- malformed and hostile replies score wrong (right, for irrelevance: no call was made), never
  raise, never run anything;
- the fetch script is idempotent, keeps only the data and the environments' source, and refuses a
  wheel with the wrong sha256 or an unsafe member; `ecdysis suites --json` lists the five suites.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ecdysis.errors import ConfigError, NotFound
from ecdysis.records import Instance, SPLITS
from ecdysis.suites import describe_suites, load_suite
from ecdysis.suites.bfcl import SUITES, bfcl_dir, canonical, check_calls, is_fetched, score_bfcl
from ecdysis.suites.calls import calls_to_json, calls_to_python, parse_calls
from ecdysis.suites.scorers import score

ROOT = Path(__file__).resolve().parent.parent
WHEEL_NAME = "bfcl_eval-2026.3.23-py3-none-any.whl"
SIZES = {"bfcl-simple": 400, "bfcl-multiple": 200, "bfcl-parallel": 200, "bfcl-parallel_multiple": 200,
         "bfcl-irrelevance": 240}


def fetch_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_bfcl", ROOT / "scripts" / "fetch_bfcl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def local_wheel() -> Path | None:
    """A copy of the pinned wheel on this machine: $ECDYSIS_BFCL_WHEEL, or /tmp/bfcl's download."""
    for candidate in (os.environ.get("ECDYSIS_BFCL_WHEEL"), f"/tmp/bfcl/{WHEEL_NAME}"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def bfcl_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real BFCL files: fetched from a local wheel into a temporary folder, else the folder set-up
    filled; the tests that need them are skipped when there is neither."""
    wheel = local_wheel()
    if wheel is not None:
        dest = tmp_path_factory.mktemp("bfcl") / "bfcl_eval"
        assert fetch_script().main(["--wheel", str(wheel), "--dest", str(dest)]) == 0
        return dest
    if is_fetched(bfcl_dir()):
        return bfcl_dir()
    pytest.skip(f"no BFCL data: neither {bfcl_dir()} (scripts/fetch_bfcl.py) nor a local {WHEEL_NAME} "
                "(set ECDYSIS_BFCL_WHEEL)")


@pytest.fixture
def bfcl(bfcl_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ECDYSIS_BFCL_DIR", str(bfcl_root))
    return bfcl_root


def raw(root: Path, category: str, folder: str = "") -> dict[str, Any]:
    path = root / "data" / folder / f"BFCL_v4_{category}.json"
    return {e["id"]: e for e in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if e}


def instance(suite: str, instance_id: str) -> Instance:
    return next(i for i in load_suite(suite).instances if i.id == instance_id)


# ---------------------------------------------------------------- rendering a possible answer

def _first(allowed: list[Any]) -> Any:
    return next(v for v in allowed if v != "")


def _value(allowed: list[Any], spec: dict[str, Any]) -> Any:
    """The first allowed value; a dict parameter's answer lists allowed values per key, so it is
    written out key by key (likewise each dict of a list of dicts)."""
    value = _first(allowed)
    item_type = (spec.get("items") or {}).get("type")
    if spec.get("type") == "dict" and isinstance(value, dict):
        return _dict_value(value)
    if spec.get("type") == "array" and item_type == "dict" and isinstance(value, list):
        return [_dict_value(d) for d in value]
    return value


def _dict_value(allowed: dict[str, list[Any]]) -> dict[str, Any]:
    return {k: _first(v) for k, v in allowed.items() if any(x != "" for x in v)}


def render(inst: Instance, *, minimal: bool) -> list[dict[str, Any]]:
    """The calls the possible answer describes: each parameter with its first allowed value, and,
    with `minimal`, the omissible ones ("" allowed, not required) left out. Parameters the answer
    lists but the function does not declare are left out (two BFCL answers list one)."""
    calls = []
    for want in json.loads(inst.target):
        (name, params), = want.items()
        doc = next(f for f in inst.fields["functions"] if f["name"] == name)
        properties, required = doc["parameters"]["properties"], doc["parameters"].get("required", [])
        args = {p: _value(allowed, properties[p]) for p, allowed in params.items()
                if p in properties and any(v != "" for v in allowed)
                and not (minimal and "" in allowed and p not in required)}
        calls.append({"name": name, "arguments": args})
    return calls


# ---------------------------------------------------------------- the suites

@pytest.mark.parametrize("name", list(SUITES))
def test_each_suite_holds_every_bfcl_entry_as_it_is_written(bfcl: Path, name: str) -> None:
    category = SUITES[name]
    suite = load_suite(name)
    entries = raw(bfcl, category)
    answers = raw(bfcl, category, "possible_answer") if category != "irrelevance" else {}
    assert len(suite.instances) == len(entries) == SIZES[name]
    assert suite.scorer.kind == "bfcl_ast" and suite.source.startswith("bfcl:")
    assert suite.categories == {category: SIZES[name]}
    for inst in suite.instances:
        entry = entries[inst.id]
        assert inst.input == entry["question"][0][-1]["content"].strip()
        assert inst.fields["functions"] == entry["function"]
        assert inst.fields["answer_form"]["kind"] == "json"
        want = answers[inst.id]["ground_truth"] if answers else []
        assert json.loads(inst.target) == want and inst.target == canonical(want)
        assert inst.split in SPLITS and inst.choices is None
    assert all(len(suite.split(s)) > 0 for s in SPLITS)
    assert set(suite.instances[0].task_view()) == {"input", "choices", "category", "fields"}


@pytest.mark.parametrize("name", list(SUITES))
def test_every_possible_answer_scores_correct_as_json_and_as_python(bfcl: Path, name: str) -> None:
    suite = load_suite(name)
    wrong = []
    for inst in suite.instances:
        for minimal in (True, False):
            calls = render(inst, minimal=minimal)
            for text in (calls_to_json(calls), calls_to_python(calls), calls_to_json(calls[::-1])):
                if not score(text, inst, suite.scorer):
                    wrong.append((inst.id, text[:120], score_bfcl(text, inst)))
    assert wrong == [], f"{len(wrong)} of {len(suite.instances) * 6} round trips scored wrong: {wrong[:3]}"


def test_the_other_call_shapes_a_model_writes_are_read(bfcl: Path) -> None:
    inst = instance("bfcl-simple", "simple_python_0")  # calculate_triangle_area(base=10, height=5)
    args = {"base": 10, "height": 5}
    for text in [json.dumps({"name": "calculate_triangle_area", "arguments": args}),
                 json.dumps({"calculate_triangle_area": args}),
                 json.dumps([{"type": "function", "function": {"name": "calculate_triangle_area",
                                                                "arguments": json.dumps(args)}}]),
                 json.dumps({"tool_calls": [{"name": "calculate_triangle_area", "parameters": args}]}),
                 '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}\n</tool_call>',
                 "```python\ncalculate_triangle_area(base=10, height=5)\n```",
                 "calculate_triangle_area(base=2*5, height=5, unit='Units')",
                 "calculate_triangle_area(height=5, base=10, unit=\"UNITS.\")"]:
        assert score_bfcl(text, inst).correct, text


# ---------------------------------------------------------------- each rule, broken by hand

def verdict(suite: str, instance_id: str, text: str) -> str:
    result = score_bfcl(text, instance(suite, instance_id))
    assert result.correct == (result.reason == "")
    return result.reason or "correct"


@pytest.mark.parametrize("suite, instance_id, text, reason", [
    # simple_python_0: calculate_triangle_area(base: integer, height: integer, unit: string), base and height required
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=10, height=5)", "correct"),
    ("bfcl-simple", "simple_python_0", "triangle_area(base=10, height=5)", "wrong_function"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=10)", "missing_required"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=10, height=5, colour='red')",
     "unexpected_parameter"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base='10', height=5)", "wrong_type"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=10.0, height=5)", "wrong_type"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=True, height=5)", "wrong_type"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=11, height=5)", "wrong_value"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=10, height=5, unit='metres')", "wrong_value"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(10, 5)", "positional_arguments"),
    ("bfcl-simple", "simple_python_0", "calculate_triangle_area(base=10, height=5)\n"
                                       "calculate_triangle_area(base=10, height=5)", "wrong_count"),
    ("bfcl-simple", "simple_python_0", "[]", "wrong_count"),
    # simple_python_5: root_type is optional in the schema, but the answer needs "all"
    ("bfcl-simple", "simple_python_5", "solve_quadratic(a=3, b=-11, c=-4)", "missing_parameter"),
    ("bfcl-simple", "simple_python_5", "solve_quadratic(a=3, b=-11, c=-4, root_type='All')", "correct"),
    # simple_python_13: interval is an array of floats, [[1.0, 3.0]]; function strings compare squashed
    ("bfcl-simple", "simple_python_13", "calculate_area_under_curve(function='x^2', interval=[1.0, 3.0])",
     "correct"),
    ("bfcl-simple", "simple_python_13", "calculate_area_under_curve(function='x**2', interval=(1.0, 3.0))",
     "wrong_type"),  # a tuple is no array
    ("bfcl-simple", "simple_python_13", "calculate_area_under_curve(function='x**2', interval=[1, 3])",
     "wrong_type"),  # BFCL turns an int into a float for a float parameter, not inside an array
    ("bfcl-simple", "simple_python_13", "calculate_area_under_curve(function='x**2', interval=[1.0, 4.0])",
     "wrong_value"),
    # simple_python_83: coord1 and coord2 are tuples of floats
    ("bfcl-simple", "simple_python_83",
     "calculate_distance(coord1=(33.4484, -112.074), coord2=(34.0522, -118.2437), unit='miles')", "correct"),
    # multiple_0: triangle_properties.get among several functions; integer sides accept no float
    ("bfcl-multiple", "multiple_0", '[{"name": "triangle_properties.get", "arguments": '
                                    '{"side1": 5, "side2": 4, "side3": 3}}]', "correct"),
    ("bfcl-multiple", "multiple_0", '[{"name": "circle_properties.get", "arguments": {"radius": 5}}]',
     "wrong_function"),
    # parallel_0: spotify.play twice, any order
    ("bfcl-parallel", "parallel_0", "[spotify.play(artist='Maroon 5', duration=15), "
                                    "spotify.play(artist='taylor swift', duration=20)]", "correct"),
    ("bfcl-parallel", "parallel_0", "[spotify.play(artist='Taylor Swift', duration=20)]", "wrong_count"),
    ("bfcl-parallel", "parallel_0", "[spotify.play(artist='Taylor Swift', duration=20), "
                                    "spotify.play(artist='Maroon 5', duration=15), "
                                    "spotify.play(artist='Adele', duration=5)]", "wrong_count"),
    ("bfcl-parallel", "parallel_0", "[spotify.play(artist='Taylor Swift', duration=20), "
                                    "spotify.play(artist='Taylor Swift', duration=20)]", "wrong_value"),
    ("bfcl-parallel", "parallel_0", "[spotify.play(artist='Taylor Swift', duration=20), "
                                    "spotify.play(artist='Maroon 5', duration=20)]", "wrong_value"),
    # parallel_multiple_1: area_rectangle.calculate(length, breadth: float) and area_circle.calculate(radius)
    ("bfcl-parallel_multiple", "parallel_multiple_1",
     "area_circle.calculate(radius=5)\narea_rectangle.calculate(length=7, breadth=3)", "correct"),
    ("bfcl-parallel_multiple", "parallel_multiple_1",
     "area_circle.calculate(radius=5)\nvolume_cylinder.calculate(radius=7.0, height=3.0)", "wrong_function"),
    # irrelevance_0: no function applies
    ("bfcl-irrelevance", "irrelevance_0", "I cannot help with that using the functions given.", "correct"),
    ("bfcl-irrelevance", "irrelevance_0", "[]", "correct"),
    ("bfcl-irrelevance", "irrelevance_0", "", "correct"),
    ("bfcl-irrelevance", "irrelevance_0", "determine_body_mass_index(weight=10.0, height=5.0)",
     "called_when_irrelevant"),
    ("bfcl-irrelevance", "irrelevance_0", '{"name": "determine_body_mass_index", "arguments": {}}',
     "called_when_irrelevant"),
])
def test_each_rule_broken_by_hand_scores_wrong_for_that_reason(bfcl: Path, suite: str, instance_id: str,
                                                               text: str, reason: str) -> None:
    assert verdict(suite, instance_id, text) == reason


# ---------------------------------------------------------------- malformed and hostile replies

def hostile_replies(marker: Path) -> list[str]:
    return [
        "not a call at all",
        "Sure! calculate_triangle_area(base=10, height=5)",
        "calculate_triangle_area(base=10, height=5",
        '{"name": "calculate_triangle_area", "arguments": {"base": 10,',
        f"__import__('os').system('touch {marker}')",
        f"calculate_triangle_area(base=__import__('os').system('touch {marker}'), height=5)",
        f"calculate_triangle_area(base=open('{marker}', 'w'), height=5)",
        f"calculate_triangle_area(base=(lambda: open('{marker}', 'w'))(), height=5)",
        "calculate_triangle_area(base=10**10**10, height=5)",
        "calculate_triangle_area(base=" + "9*" * 3000 + "9, height=5)",
        "calculate_triangle_area(**{'base': 10, 'height': 5})",
        "import os; os.system('true')",
        "base = 10",
        "[" * 50_000 + "]" * 50_000,
        "calculate_triangle_area(base=" + "[" * 500 + "]" * 500 + ", height=5)",
        '[{"name": "calculate_triangle_area", "arguments": {"base": ' + "[" * 5000 + "]" * 5000 + "}}]",
        "{" * 100_000,
        "x" * 200_000,
        "calculate_triangle_area(base=1" + "0" * 5000 + ", height=5)",
        "\x00\udcff",
    ]


@pytest.mark.parametrize("suite, instance_id", [("bfcl-simple", "simple_python_0"), ("bfcl-parallel", "parallel_0"),
                                                ("bfcl-irrelevance", "irrelevance_0")])
def test_malformed_and_hostile_replies_score_wrong_and_run_nothing(bfcl: Path, tmp_path: Path, suite: str,
                                                                   instance_id: str) -> None:
    inst = instance(suite, instance_id)
    marker = tmp_path / "ran"
    for text in hostile_replies(marker):
        started = time.perf_counter()
        result = score_bfcl(text, inst)
        assert time.perf_counter() - started < 2.0, text[:60]
        if suite == "bfcl-irrelevance":
            # BFCL: a reply that holds no call, readable or not, is right where no function applies
            assert result.correct or result.reason == "called_when_irrelevant", text[:60]
        else:
            assert not result.correct, text[:60]
    assert not marker.exists()


def test_parse_calls_reads_literals_only() -> None:
    assert parse_calls("f(a=1, b='x', c=[1, (2, 3)], d={'k': None}, e=-2.5, g=True)") == [
        {"name": "f", "arguments": {"a": 1, "b": "x", "c": [1, (2, 3)], "d": {"k": None}, "e": -2.5, "g": True}}]
    assert parse_calls("m.f(a=x)\nm.g(b=h(1))") == [{"name": "m.f", "arguments": {"a": "x"}},
                                                    {"name": "m.g", "arguments": {"b": "h(1)"}}]
    assert parse_calls("f(1, a=2)") == [{"name": "f", "arguments": {"a": 2}, "positional": [1]}]
    for text in ("f(a=lambda: 1)", "f(a={*s})", "f(a=[i for i in x])", "f(a=1/0)", "g()(a=1)", "x = f(a=1)",
                 "f(a=1) if y else g()", '{"arguments": {"a": 1}}', '[{"name": "f", "arguments": [1]}]', None, 42):
        assert parse_calls(text) is None, text
    assert parse_calls("") == [] and parse_calls("  []  ") == [] and parse_calls("```json\n[]\n```") == []


def test_parallel_calls_pair_one_to_one_in_any_order() -> None:
    """Each expected call needs a call of its own: a call that fits two expected calls is given to
    the one that has no other (BFCL pairs greedily, in answer order, and would refuse this reply)."""
    functions = [{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "string"}},
                                              "required": ["x"]}}]
    expected = [{"f": {"x": ["a", "b"]}}, {"f": {"x": ["a"]}}]
    assert check_calls(parse_calls("f(x='a')\nf(x='b')"), expected, functions).correct
    assert check_calls(parse_calls("f(x='b')\nf(x='a')"), expected, functions).correct
    assert check_calls(parse_calls("f(x='a')\nf(x='a')"), expected, functions).correct
    assert check_calls(parse_calls("f(x='b')\nf(x='b')"), expected, functions).reason == "wrong_value"
    assert check_calls(parse_calls("f(x='a')\nf(x='c')"), expected, functions).reason == "wrong_value"
    assert check_calls(parse_calls("f(x='a')"), expected, functions).reason == "wrong_count"


def test_the_scorer_names_a_suite_without_function_docs() -> None:
    inst = Instance(id="x", input="q", target="[]", fields={})
    with pytest.raises(ConfigError, match="functions"):
        score_bfcl("[]", inst)
    with pytest.raises(ConfigError, match="JSON list"):
        score_bfcl("[]", Instance(id="y", input="q", target="no", fields={"functions": []}))


# ---------------------------------------------------------------- listing and fetching

def ecdysis(*args: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "ecdysis.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_ecdysis_suites_json_lists_the_five_bfcl_suites(bfcl: Path, tmp_path: Path) -> None:
    """The five categories, their mixture (200 of each, the first in file order), and the
    multi-turn suite."""
    env = {"ECDYSIS_HOME": str(tmp_path / "home"), "ECDYSIS_BFCL_DIR": str(bfcl),
           "ECDYSIS_BIGBENCH_DIR": str(tmp_path / "no-bigbench")}
    proc = ecdysis("suites", "--json", env_extra=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout) if r["name"].startswith("bfcl-")}
    mixture = rows.pop("bfcl-single_turn")
    assert mixture["categories"] == {SUITES[n]: 200 for n in SIZES} and mixture["scorer"] == "bfcl_ast"
    multi_turn = rows.pop("bfcl-multi_turn_base")  # tests/test_bfcl_multi_turn.py checks it
    assert multi_turn["scorer"] == "bfcl_multi_turn" and multi_turn["size"] == 200
    assert {n: r["size"] for n, r in rows.items()} == SIZES
    for name, row in rows.items():
        assert row["scorer"] == "bfcl_ast" and row["source"].startswith("bfcl:")
        assert row["categories"] == {SUITES[name]: SIZES[name]}
        assert row["answer_forms"] == {SUITES[name]: {"kind": "json", "declared": True}}
        assert sum(row["splits"].values()) == SIZES[name]
    assert "fetch_bfcl" not in proc.stderr
    filtered = json.loads(ecdysis("suites", "--json", "--source", "bfcl", env_extra=env).stdout)
    assert sorted(r["name"] for r in filtered) == sorted([*SIZES, "bfcl-single_turn", "bfcl-multi_turn_base"])


def test_without_the_data_the_suites_say_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_BFCL_DIR", str(tmp_path / "nowhere"))
    assert not [r for r in describe_suites(bigbench=False) if r["name"].startswith("bfcl-")]
    with pytest.raises(NotFound) as err:
        load_suite("bfcl-simple")
    assert "fetch_bfcl.py" in str(err.value.hint)
    with pytest.raises(NotFound) as err:
        load_suite("bfcl-nonsense")
    assert "fetch_bfcl.py" in str(err.value.hint) and "bfcl-simple" in str(err.value.hint)
    proc = ecdysis("suites", "--json", env_extra={"ECDYSIS_HOME": str(tmp_path / "home"),
                                                  "ECDYSIS_BFCL_DIR": str(tmp_path / "nowhere"),
                                                  "ECDYSIS_BIGBENCH_DIR": str(tmp_path / "no-bigbench")})
    assert proc.returncode == 0 and "scripts/fetch_bfcl.py" in proc.stderr
    assert not [r for r in json.loads(proc.stdout) if r["name"].startswith("bfcl-")]


def test_the_env_var_moves_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_BFCL_DIR", str(tmp_path / "mine"))
    assert bfcl_dir() == tmp_path / "mine"
    monkeypatch.delenv("ECDYSIS_BFCL_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert bfcl_dir() == Path.home() / ".cache" / "ecdysis" / "bfcl" / "bfcl_eval"


def fake_wheel(path: Path, extra: dict[str, bytes] | None = None) -> Path:
    members = {
        "bfcl_eval/__init__.py": b"",
        "bfcl_eval/data/BFCL_v4_simple_python.json": b'{"id": "simple_python_0"}\n',
        "bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json": b'{"id": "simple_python_0"}\n',
        "bfcl_eval/data/multi_turn_func_doc/math_api.json": b"{}\n",
        "bfcl_eval/eval_checker/multi_turn_eval/func_source_code/math_api.py": b"class MathAPI: pass\n",
        "bfcl_eval/eval_checker/multi_turn_eval/func_source_code/__pycache__/m.cpython-311.pyc": b"x",
        "bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py": b"import numpy\n",
        "bfcl_eval/eval_checker/ast_eval/ast_checker.py": b"import re\n",
        "bfcl_eval-2026.3.23.dist-info/METADATA": b"Name: bfcl-eval\n",
        **(extra or {}),
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, body in members.items():
            archive.writestr(zipfile.ZipInfo(name), body)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_fetch_keeps_only_data_and_environment_sources_and_is_idempotent(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    script = fetch_script()
    wheel = fake_wheel(tmp_path / WHEEL_NAME)
    dest = tmp_path / "cache" / "bfcl_eval"
    assert script.fetch(dest, wheel, sha256=digest(wheel)) == 4
    assert files_under(tmp_path / "cache") == [
        "bfcl_eval/data/BFCL_v4_simple_python.json", "bfcl_eval/data/multi_turn_func_doc/math_api.json",
        "bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json",
        "bfcl_eval/ecdysis-fetch.json", "bfcl_eval/eval_checker/multi_turn_eval/func_source_code/math_api.py"]
    assert "extracted 4 BFCL files" in capsys.readouterr().out
    before = (dest / "ecdysis-fetch.json").stat().st_mtime_ns
    assert script.fetch(dest, wheel, sha256=digest(wheel)) == 0  # already there: nothing read or written
    assert "nothing to do" in capsys.readouterr().out
    assert (dest / "ecdysis-fetch.json").stat().st_mtime_ns == before


def test_fetch_refuses_a_wheel_with_the_wrong_sha256(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / WHEEL_NAME)
    dest = tmp_path / "cache" / "bfcl_eval"
    with pytest.raises(SystemExit, match="sha256"):
        fetch_script().main(["--wheel", str(wheel), "--dest", str(dest)])
    assert not dest.exists() and list((tmp_path / "cache").iterdir()) == []  # no partial folder left


@pytest.mark.parametrize("member", ["bfcl_eval/data/../../escape.json", "/bfcl_eval/data/abs.json",
                                    "../bfcl_eval/data/up.json"])
def test_fetch_refuses_a_member_with_an_unsafe_path(tmp_path: Path, member: str) -> None:
    wheel = fake_wheel(tmp_path / WHEEL_NAME, {member: b"{}"})
    dest = tmp_path / "cache" / "bfcl_eval"
    with pytest.raises(SystemExit, match="unsafe path"):
        fetch_script().fetch(dest, wheel, sha256=digest(wheel))
    assert not dest.exists() and list((tmp_path / "cache").iterdir()) == []
    assert not (tmp_path / "escape.json").exists()


def test_fetch_from_the_real_wheel_is_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = local_wheel()
    if wheel is None:
        pytest.skip(f"no local {WHEEL_NAME} (set ECDYSIS_BFCL_WHEEL)")
    script = fetch_script()
    dest = tmp_path / "bfcl_eval"
    assert script.main(["--wheel", str(wheel), "--dest", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["data", "ecdysis-fetch.json", "eval_checker"]
    assert (dest / "data" / "multi_turn_func_doc" / "gorilla_file_system.json").is_file()
    assert (dest / "eval_checker" / "multi_turn_eval" / "func_source_code" / "gorilla_file_system.py").is_file()
    assert is_fetched(dest) and json.loads((dest / "ecdysis-fetch.json").read_text())["sha256"] == script.SHA256
    capsys.readouterr()
    assert script.main(["--wheel", str(wheel), "--dest", str(dest)]) == 0
    assert "nothing to do" in capsys.readouterr().out


# ---------------------------------------------------------------- the starter agent harness

AGENT = ROOT / "ecdysis" / "starter_agent"


def test_the_starter_agent_carries_the_engines_parser() -> None:
    assert (AGENT / "calls.py").read_text() == (ROOT / "ecdysis" / "suites" / "calls.py").read_text()


def agent_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("starter_agent_harness", AGENT / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("reply, names", [
    ('[{"name": "f", "arguments": {"x": 1}}]', ["f"]),
    ('Sure, I will call it:\n```json\n[{"name": "f", "arguments": {"x": 1}}]\n```\nDone.', ["f"]),
    ("The calls are [f(x=1), g.h(y='a')] as asked.", ["f", "g.h"]),
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', ["f"]),
    ("None of the functions can do that. []", []),
    ("I do not know.", None),
])
def test_the_starter_agent_reads_calls_out_of_a_wordy_reply(reply: str, names: list[str] | None) -> None:
    from ecdysis.suites import calls
    found = agent_module().read_calls(reply, calls)
    assert (None if found is None else [c["name"] for c in found]) == names


def test_a_run_through_the_starter_agent_presents_the_tools_and_scores_the_calls(bfcl: Path, tmp_path: Path) -> None:
    """`ecdysis run --suite bfcl-simple` with no --harness runs the starter agent (a function-calling
    suite's default starter), with a scripted model that answers each question right, in three of
    the shapes models write (JSON, Python in a fence after prose, Qwen's <tool_call>)."""
    suite = load_suite("bfcl-simple")
    rules = []
    for n, inst in enumerate(sorted(suite.instances, key=lambda i: -len(i.input))):
        calls = render(inst, minimal=True)
        reply = [calls_to_json(calls), f"Here are the calls:\n```python\n{calls_to_python(calls)}\n```",
                 "".join(f"<tool_call>{calls_to_json([c])[1:-1]}</tool_call>\n" for c in calls)][n % 3]
        rules.append({"match": inst.input, "text": reply})
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"rules": rules, "default": "no rule matched"}))
    home = tmp_path / "home"
    proc = ecdysis("run", "--suite", "bfcl-simple", "--model", f"scripted:{script}", "--limit", "3", "--json",
                   env_extra={"ECDYSIS_HOME": str(home), "ECDYSIS_BFCL_DIR": str(bfcl)})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["n"] == 3 and summary["accuracy"] == 1.0, summary
    con = sqlite3.connect(home / "ecdysis.db")
    results = con.execute("select instance_id, answer from instance_result").fetchall()
    requests = [json.loads(r[0]) for r in con.execute("select request from model_call").fetchall()]
    con.close()
    by_id = {i.id: i for i in suite.instances}
    for instance_id, answer in results:
        inst = by_id[instance_id]
        assert [c["name"] for c in json.loads(answer)] == [next(iter(w)) for w in json.loads(inst.target)]
    prompts = [" ".join(m["content"] for m in r["messages"]) for r in requests]
    assert len(prompts) == 3
    for instance_id, _ in results:
        inst = by_id[instance_id]
        name = inst.fields["functions"][0]["name"]
        assert any(name in p and inst.input in p and "JSON list" in p for p in prompts), name


def test_the_default_starter_follows_the_suite(bfcl: Path, store) -> None:
    """No harness named: a function-calling suite gets the starter agent, others the plain starter;
    both can be named (`starter`, `starter-agent`)."""
    from ecdysis.harness import STARTER_AGENT_DIR, read_dir, starter_files
    from ecdysis.harness_refs import resolve
    agent = resolve(store, None, suite=load_suite("bfcl-simple"))
    assert agent.files == read_dir(STARTER_AGENT_DIR) and "calls.py" in agent.files
    assert resolve(store, None, suite=load_suite("reasoning-mix")).files == starter_files()
    assert resolve(store, "starter-agent").id == agent.id and resolve(store, "starter").files == starter_files()

"""Property-based tests (hypothesis) over every importer and over the diff/patch round trip.

Invariants:
- an importer given anything (valid files, near-valid files, junk bytes) either returns its result
  or raises `InputError`; never another exception;
- what an importer accepts can be used: every instance of an accepted suite can be scored without
  an error, and its target scores as right (regex suites excepted: there the pattern decides);
- nothing is half-stored: on a real SQLite store, a refused import leaves every table's row count
  unchanged, an accepted one adds exactly its own row, which reads back equal;
- `apply_diffs(old, diff_files(old, new))` gives `new` exactly; applied to any other harness it
  either applies or reports which file and hunk did not, never raising.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
import os
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ecdysis.diffs import FileDiff, apply_diffs, diff_files
from ecdysis.errors import InputError
from ecdysis.export import export_zip, import_zip, read_zip
from ecdysis.harness import starter_files
from ecdysis.suites.bigbench import load_task_file
from ecdysis.suites.jsonl import import_jsonl, load_jsonl
from ecdysis.suites.scorers import score

def props(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TABLES = ("suite", "harness_version", "run", "instance_result", "model_call", "cache_entry", "job", "diagnosis",
          "proposal", "decision", "evolution")


@pytest.fixture(scope="module")
def shared_store():
    """One real SQLite store for all examples of a test module: examples only add rows, and each
    counts the rows before and after itself."""
    from storage import open_store
    folder = tempfile.mkdtemp(prefix="ecdysis-props-")
    store = open_store(f"sqlite:///{folder}/props.db")
    yield store
    store.close()


def row_counts(store: Any) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {t: conn.exec_driver_sql(f"select count(*) from {t}").scalar_one() for t in TABLES}


def _write(data: bytes, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix, prefix="ecdysis-prop-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return Path(name)


# ---------------------------------------------------------------- strategies

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=10)
short_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=16)
words = st.sampled_from(["4", "True", "False", "blue", "A", "3.5", "1,000", "seven", "", " x ", "\u2028", "é"])

scorer_json = st.one_of(
    st.sampled_from(["exact", "numeric", "multiple_choice", "regex", "by_category", "nope"]),
    st.fixed_dictionaries({"kind": st.sampled_from(["exact", "numeric", "multiple_choice", "regex", "by_category"])},
                          optional={"options": st.one_of(
                              json_values,
                              st.fixed_dictionaries({}, optional={
                                  "tol": st.one_of(st.floats(0, 1), st.text(max_size=3), st.none()),
                                  "pattern": st.one_of(st.sampled_from(["\\d+", "(", "[a-z]+", ""]), json_values),
                                  "ignore_case": json_values,
                                  "aliases": st.one_of(json_values, st.dictionaries(short_text, st.lists(words))),
                                  "categories": st.one_of(json_values, st.dictionaries(
                                      st.sampled_from(["c", "d", "default"]),
                                      st.sampled_from(["exact", "numeric", {"kind": "regex"}, 3]))),
                                  "default": st.one_of(json_values, st.sampled_from(["exact", "numeric"])),
                              }))}),
    json_values)


@st.composite
def instance_lines(draw: st.DrawFn) -> Any:
    """Mostly well-formed instance objects, each field sometimes replaced by something wrong."""
    obj: dict[str, Any] = {}
    if draw(st.booleans()):
        obj["id"] = draw(st.one_of(short_text, json_values))
    obj["input"] = draw(st.one_of(short_text, short_text, json_values))
    target = draw(st.one_of(words, st.integers(-5, 5), st.floats(-3, 3, allow_nan=False), json_values))
    obj["target"] = target
    if draw(st.booleans()):
        choices = draw(st.lists(words, max_size=4))
        if draw(st.booleans()) and isinstance(target, str):
            choices = choices + [target]
        obj["choices"] = draw(st.one_of(st.just(choices), json_values))
    for key, strategy in (("category", st.one_of(st.sampled_from(["c", "d"]), json_values)),
                          ("split", st.sampled_from(["train", "validation", "test", "dev", ""])),
                          ("fields", st.one_of(st.dictionaries(short_text, json_values, max_size=3), json_values)),
                          ("extra", json_values)):
        if draw(st.integers(0, 4)) == 0:
            obj[key] = draw(strategy)
    if draw(st.integers(0, 5)) == 0:
        obj.pop(draw(st.sampled_from(["input", "target"])), None)
    return obj


@st.composite
def jsonl_files(draw: st.DrawFn) -> bytes:
    lines: list[str] = []
    if draw(st.booleans()):
        header: dict[str, Any] = {}
        for key, strategy in (("name", st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), json_values)),
                              ("scorer", scorer_json), ("description", st.one_of(short_text, json_values))):
            if draw(st.booleans()):
                header[key] = draw(strategy)
        lines.append(json.dumps({"ecdysis_suite": header}, ensure_ascii=draw(st.booleans())))
    for obj in draw(st.lists(instance_lines(), max_size=6)):
        lines.append(json.dumps(obj, ensure_ascii=draw(st.booleans())))
    for _ in range(draw(st.integers(0, 2))):  # junk: blank lines, broken JSON, non-objects, a late header
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(
            ["", "   ", "{", "[1, 2]", "null", "\"text\"", '{"ecdysis_suite": {}}', "\ufeff{}", "{\"input\": \"\\ud800\", \"target\": \"x\"}"])))
    text = draw(st.sampled_from(["\n", "\r\n"])).join(lines)
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 0:
        data = draw(st.binary(max_size=64)) + data
    return data


# ---------------------------------------------------------------- JSONL


def _check_usable(suite: Any) -> None:
    for inst in suite.instances:
        score("", inst, suite.scorer)                         # never raises on any answer
        if "regex" not in json.dumps(suite.scorer.kind) + json.dumps(suite.scorer.options, default=str):
            assert score(inst.target, inst, suite.scorer), (inst, suite.scorer)
        json.dumps(asdict(inst), ensure_ascii=False).encode("utf-8")  # stored, piped, sent to a model


@props(250)
@given(jsonl_files())
@example(b'{"input": "q", "target": "4"}\n')
@example(("[" * 100_000).encode())
@example('{"input": "a\u2028b", "target": "x"}\n'.encode())
@example(b'{"ecdysis_suite": {"scorer": {"kind": "by_category", "options": {"categories": [1]}}}}\n'
         b'{"input": "q", "target": "4"}\n')
@example(b'{"ecdysis_suite": {"scorer": {"kind": "numeric", "options": {"tol": "x"}}}}\n{"input": "q", "target": "4"}\n')
@example(b'{"ecdysis_suite": {"scorer": {"kind": "regex", "options": {"pattern": "("}}}}\n{"input": "q", "target": "4"}\n')
@example(b'{"ecdysis_suite": {"scorer": {"kind": "exact", "options": {"aliases": [1]}}}}\n{"input": "q", "target": "4"}\n')
@example(b'{"input": "q", "target": "x", "id": "\\ud800"}\n')
def test_jsonl_loader_accepts_or_names_the_problem(data: bytes) -> None:
    path = _write(data, ".jsonl")
    try:
        suite = load_jsonl(path)
    except InputError as exc:
        assert str(path) in str(exc)  # names the file (and the line, where there is one)
        return
    finally:
        path.unlink()
    assert suite.instances
    assert len({i.id for i in suite.instances}) == len(suite.instances)
    _check_usable(suite)


valid_instances = st.lists(st.fixed_dictionaries(
    {"input": st.text(max_size=30), "target": st.text(min_size=1, max_size=10)},
    optional={"category": st.text(min_size=1, max_size=8), "fields": st.dictionaries(st.text(max_size=5), json_values,
                                                                                      max_size=3),
              "split": st.sampled_from(["train", "validation", "test"])}), min_size=1, max_size=5)


@props(200)
@given(objs=valid_instances, ascii_only=st.booleans(), newline=st.sampled_from(["\n", "\r\n"]))
@example(objs=[{"input": "a\u2028b\x85c\u2029", "target": "x\x0cy"}], ascii_only=False, newline="\n")
def test_a_valid_jsonl_file_loads_back_exactly(objs: list[dict[str, Any]], ascii_only: bool, newline: str) -> None:
    """Any instances json.dumps can write, one per line, load back as written (ids default to line-N)."""
    text = newline.join(json.dumps(o, ensure_ascii=ascii_only) for o in objs) + newline
    path = _write(text.encode("utf-8"), ".jsonl")
    try:
        suite = load_jsonl(path)
    finally:
        path.unlink()
    assert [(i.id, i.input, i.target, i.category, i.split, i.fields) for i in suite.instances] == [
        (f"line-{n}", o["input"], o["target"], o.get("category", "default"), o.get("split"), o.get("fields", {}))
        for n, o in enumerate(objs, start=1)]


@props(150)
@given(data=jsonl_files(), name=st.from_regex(r"p[a-z0-9]{6}", fullmatch=True))
def test_jsonl_import_stores_all_or_nothing(shared_store: Any, data: bytes, name: str) -> None:
    path = _write(data, ".jsonl")
    before = row_counts(shared_store)
    try:
        suite = import_jsonl(path, store=shared_store, name=name)
    except InputError:
        assert row_counts(shared_store) == before
        return
    finally:
        path.unlink()
    after = row_counts(shared_store)
    assert after == {**before, "suite": before["suite"] + 1}
    stored = shared_store.get_suite(name)
    assert stored is not None and stored.instances == suite.instances and stored.scorer == suite.scorer


# ---------------------------------------------------------------- BIG-bench task.json


@st.composite
def task_files(draw: st.DrawFn) -> Any:
    def example_obj() -> Any:
        ex: dict[str, Any] = {"input": draw(st.one_of(short_text, short_text, json_values))}
        if draw(st.booleans()):
            ex["target"] = draw(st.one_of(words, st.lists(words, max_size=3), json_values))
        if draw(st.booleans()):
            ex["target_scores"] = draw(st.one_of(
                st.dictionaries(words, st.one_of(st.integers(0, 1), st.floats(0, 1)), max_size=4), json_values))
        if draw(st.integers(0, 4)) == 0:
            ex["task_prefix"] = draw(json_values)
        return ex if draw(st.integers(0, 9)) else draw(json_values)

    task: dict[str, Any] = {"name": draw(st.one_of(st.from_regex(r"[a-z_]{1,10}", fullmatch=True), json_values)),
                            "description": draw(st.one_of(short_text, json_values))}
    if draw(st.integers(0, 5)):
        task["examples"] = [example_obj() for _ in range(draw(st.integers(0, 5)))]
    if draw(st.booleans()):
        task["preferred_score"] = draw(st.sampled_from(["multiple_choice_grade", "exact_str_match", 3]))
    for key in ("example_input_prefix", "append_choices_to_input", "output_regex"):
        if draw(st.integers(0, 5)) == 0:
            task[key] = draw(json_values)
    return task if draw(st.integers(0, 9)) else draw(json_values)


@props(300)
@given(task=task_files(), raw=st.one_of(st.none(), st.binary(max_size=40)))
@example(task={"name": "t", "examples": [{"input": "q", "target_scores": {"a": 1, "b": 0}}]}, raw=None)
@example(task={"name": "t", "examples": [{"input": "\ud800", "target": "x"}]}, raw=None)
@example(task=None, raw=b"[" * 100_000)
@example(task=None, raw=b'{"examples": [{"input": "q", "target_scores": {"a": NaN, "b": NaN}}]}')
def test_bigbench_task_file_loads_or_names_the_problem(task: Any, raw: bytes | None) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ecdysis-bb-"))
    path = folder / "task.json"
    path.write_bytes(raw if raw is not None else json.dumps(task).encode("utf-8", "surrogatepass"))
    try:
        suite = load_task_file(path)
    except InputError as exc:
        assert str(path) in str(exc)
        return
    finally:
        path.unlink()
        folder.rmdir()
    assert suite.instances and len({i.id for i in suite.instances}) == len(suite.instances)
    _check_usable(suite)


# ---------------------------------------------------------------- harness zips


def _zip(entries: list[tuple[str, bytes, int, int]]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")  # duplicate names are one of the things tried
        for name, data, method, attr in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = method
            info.external_attr = attr
            zf.writestr(info, data)
    return buf.getvalue()


STARTER = starter_files()
entry_names = st.one_of(
    st.sampled_from([f"harness/{n}" for n in STARTER] + ["manifest.json", "run.py", "README.md", "harness/",
                     "harness/../evil.py", "/abs.py", "harness/a\\b.py", "harness/x.bin", "harness/sub/notes.md",
                     "harness/C:evil.md", "harness/.hidden.md", "other/harness.toml"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20))
entry_data = st.one_of(st.sampled_from([v.encode() for v in STARTER.values()]),
                       st.sampled_from([b"", b"\x00", b"\xff\xfe", b"def solve(:\n", b"[harness]\nentry = 'x.py:f'\n",
                                        b'{"lineage": [1]}', b"[", b"x = [" * 2000, b"(" * 500,
                                        b"def solve(task, model, harness):\n    return '\x00'\n"]),
                       st.binary(max_size=200))


@st.composite
def zips(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    entries = [(f"harness/{n}", v.encode(), zipfile.ZIP_DEFLATED, 0o644 << 16)
               for n, v in STARTER.items() if draw(st.integers(0, 5))]
    for _ in range(draw(st.integers(0, 4))):
        entries.insert(draw(st.integers(0, len(entries))), (
            draw(entry_names), draw(entry_data), draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED,
                                                                       zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])),
            draw(st.sampled_from([0, 0o644 << 16, 0o120777 << 16, 0o40755 << 16]))))
    data = bytearray(_zip(entries))
    for _ in range(draw(st.integers(0, 3)) if draw(st.booleans()) else 0):  # corrupt a few bytes
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def _corrupt_deflate() -> bytes:
    """A zip whose central directory is fine but whose harness.py deflate stream is damaged."""
    data = bytearray(_zip([(f"harness/{n}", v.encode(), zipfile.ZIP_DEFLATED, 0) for n, v in STARTER.items()]))
    at = data.index(b"harness/harness.py") + len("harness/harness.py") + 5
    data[at:at + 8] = b"\xff" * 8
    return bytes(data)


@props(300)
@given(zips())
@example(_corrupt_deflate())
@example(_zip([("harness/harness.toml", STARTER["harness.toml"].encode(), zipfile.ZIP_DEFLATED, 0),
               ("harness/harness.py", b"def solve(task, model, harness):\n    return '\x00'\n", zipfile.ZIP_DEFLATED, 0)]))
@example(_zip([(f"harness/{n}", v.encode(), zipfile.ZIP_DEFLATED, 0) for n, v in STARTER.items()]
              + [("manifest.json", b"[" * 100_000, zipfile.ZIP_DEFLATED, 0)]))
@example(_zip([("harness/harness.toml", b"x = " + b"[" * 5000, zipfile.ZIP_DEFLATED, 0),
               ("harness/harness.py", b"def solve(t, m, h):\n    return 1\n", zipfile.ZIP_DEFLATED, 0)]))
def test_harness_zip_imports_or_is_refused_storing_nothing(shared_store: Any, data: bytes) -> None:
    before = row_counts(shared_store)
    try:
        files, manifest = read_zip(data)
    except InputError:
        read_ok = False
    else:
        read_ok = True
        assert files and isinstance(manifest, dict)
    try:
        version = import_zip(shared_store, data)
    except InputError:
        assert row_counts(shared_store) == before
        return
    assert read_ok
    after = row_counts(shared_store)
    assert after["harness_version"] - before["harness_version"] in (0, 1)  # 0: that version was stored already
    assert {k: v for k, v in after.items() if k != "harness_version"} == \
           {k: v for k, v in before.items() if k != "harness_version"}
    assert shared_store.get_harness(version.id).files == version.files


def test_a_zip_entry_without_a_name_is_refused_storing_nothing(store: Any) -> None:
    """An example the property test above found: zipfile itself raises IndexError on such an
    entry, so it was a crash, not a refusal."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("harness/user.md", "{input}")
        with zf.open(zipfile.ZipInfo(""), "w") as fh:
            fh.write(b"x")
    before = row_counts(store)
    with pytest.raises(InputError, match="an entry has no name"):
        import_zip(store, buf.getvalue())
    assert row_counts(store) == before


def test_an_exported_zip_imports_back_as_the_same_version(store: Any) -> None:
    from ecdysis.harness import ensure_starter
    starter = ensure_starter(store)
    again = import_zip(store, export_zip(store, starter.id))
    assert again.id == starter.id and again.files == starter.files


# ---------------------------------------------------------------- diffs and patches


file_names = st.sampled_from(["harness.toml", "harness.py", "system.md", "user.md", "notes/extra.md"])
file_text = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(["def solve():\n", "    return x\n", "line\n", "\n", "é ü 漢字\n", "{{input}}\n",
                              "%20 %%\n", "@@ -1 +1 @@\n", "\t\r\n", "a" * 40 + "\n"]), max_size=30).map("".join))
harnesses = st.dictionaries(file_names, file_text, max_size=5)


@st.composite
def edited(draw: st.DrawFn, files: dict[str, str]) -> dict[str, str]:
    """`files` with some files changed a little, some replaced, some deleted, some added."""
    out = dict(files)
    for name in list(out):
        choice = draw(st.integers(0, 4))
        if choice == 0:
            del out[name]
        elif choice == 1:
            out[name] = draw(file_text)
        elif choice == 2 and out[name]:
            at = draw(st.integers(0, len(out[name])))
            out[name] = out[name][:at] + draw(st.text(max_size=20)) + out[name][at + draw(st.integers(0, 10)):]
    for name in draw(st.lists(file_names, max_size=2)):
        out.setdefault(name, draw(file_text))
    return out


@props(500)
@given(st.data())
def test_diff_then_apply_gives_the_new_files_exactly(data: st.DataObject) -> None:
    old = data.draw(harnesses)
    new = data.draw(edited(old))
    diffs = diff_files(old, new)
    assert {d.path for d in diffs} == {p for p in set(old) | set(new) if old.get(p) != new.get(p)}
    result = apply_diffs(old, diffs)
    assert result.ok, result.failures
    assert result.files == new
    # The stored form (JSON) applies the same.
    again = apply_diffs(old, [FileDiff.from_json(json.loads(json.dumps(d.to_json()))) for d in diffs])
    assert again.files == new


@props(300)
@given(st.data())
def test_a_patch_on_another_harness_applies_or_says_where_not(data: st.DataObject) -> None:
    old = data.draw(harnesses)
    new = data.draw(edited(old))
    other = data.draw(st.one_of(edited(old), harnesses))
    result = apply_diffs(other, diff_files(old, new))
    if result.ok:
        assert result.files is not None
        assert set(result.files) >= {p for p in new if p not in old}  # added files are there
    else:
        assert result.files is None and result.failures
        assert all(any(f.startswith(d) for d in set(old) | set(new)) for f in result.failures)

"""The evolution loop on a small world whose truth is known: a JSONL suite of arithmetic, counting
and yes/no questions, a scripted model that always answers correctly but wraps the answer in a
sentence ("Let me think. The answer is 7."), and the starter harness, which takes the first line as
the answer and so fails every instance for a harness-level reason (answer extraction). The gate's
three decisions, rollback, resume, the sealed test split, export/import and hostile archives."""

from __future__ import annotations

import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ecdysis.errors import InputError
from ecdysis.evolve import EvolveConfig, Evolver, summary
from ecdysis.export import export_zip, import_zip, read_zip
from ecdysis.models.registry import register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.service import Service

MODEL = "scripted-evolve"


def write_suite(path: Path) -> Path:
    lines = [json.dumps({"ecdysis_suite": {"name": "tiny", "scorer": {"kind": "numeric"}}})]
    for i in range(48):
        a, b = 3 + i, 5 + (i * 7) % 11
        kind = ("add", "count", "diff")[i % 3]
        if kind == "add":
            q, t = f"Tom has {a} apples and buys {b} more. How many apples does he have?", a + b
        elif kind == "count":
            q, t = f"A box holds {a} red and {b} blue balls. How many balls are in the box?", a + b
        else:
            q, t = f"Ann is {a + b} years old and Bob is {b}. How many years older is Ann?", a
        lines.append(json.dumps({"id": f"q{i:02d}", "input": q, "target": str(t), "category": kind}))
    path.write_text("\n".join(lines) + "\n")
    return path


def scripted_for(suite_path: Path) -> ScriptedBackend:
    rules = []
    for line in suite_path.read_text().splitlines()[1:]:
        row = json.loads(line)
        rules.append(Rule(text=f"Let me think.\nThe answer is {row['target']}.", match=row["input"]))
    backend = ScriptedBackend(rules, model_id=MODEL, default="I do not know.")
    register_backend(backend)
    return backend


@pytest.fixture
def world(tmp_path: Path, store):
    suite = write_suite(tmp_path / "tiny.jsonl")
    backend = scripted_for(suite)
    return Service(store), str(suite), backend


def config(suite: str, **kw) -> EvolveConfig:
    base = dict(suite=suite, models=[MODEL], iterations=2, batch_size=12, val_limit=12, test_limit=12,
                auto_approve=True)
    base.update(kw)
    return EvolveConfig(**base)


def test_auto_approved_evolution_fixes_the_harness_level_failure(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite)).id)
    out = summary(evo)
    assert evo.status == "done", out
    first = out["iterations"][0]
    assert first["train_accuracy"] == 0.0
    assert first["proposals"] >= 1 and first["applied"] >= 1
    assert not first["rolled_back"]
    assert first["val_accuracy"] > 0.5
    assert out["final_version"] != out["base_version"]
    assert out["test_accuracy"] > out["base_test_accuracy"]
    final = svc.harness(out["final_version"])
    assert final.parent == out["base_version"] and final.status == "kept"
    applied = final.metrics["applied"]
    assert applied and applied[0]["predicted"] and applied[0]["measured"]["val_delta"] > 0
    for key in ("iteration", "harness_version", "train_accuracy", "val_accuracy", "proposals", "applied",
                "rolled_back", "model_calls", "tokens", "wall_seconds"):
        assert key in first


def test_test_split_is_only_scored_at_the_end(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, iterations=1)).id)
    test_runs = [r for r in svc.runs() if r.split == "test"]
    # exactly once per version scored (final and base), and only after the last iteration
    assert {r.harness_version for r in test_runs} == {evo.current_version, evo.base_version}
    last_other = max(r.created_at for r in svc.runs() if r.split != "test")
    assert all(r.created_at >= last_other for r in test_runs)


def test_gate_waits_then_reject_is_stored_and_nothing_applied(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc, poll_s=0)
    evo = evolver.run(evolver.create(config(suite, auto_approve=False, iterations=1)).id)
    assert evo.status == "waiting"
    pending = svc.proposals(status="pending")
    assert pending
    with pytest.raises(InputError):
        svc.decide(pending[0].id, "reject", who="alice", reason="")  # a rejection needs a reason
    for p in pending:
        svc.decide(p.id, "reject", who="alice", reason="too broad")
    evo = Evolver(svc, poll_s=0).run(evo.id)
    assert evo.status == "done"
    assert evo.iterations[0]["applied"] == 0
    assert evo.current_version == evo.base_version
    decisions = svc.decisions()
    assert {d.decision for d in decisions} == {"reject"} and all(d.who == "alice" for d in decisions)
    assert all(d.reason == "too broad" and d.at > 0 for d in decisions)


def test_edit_applies_the_edited_text(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc, poll_s=0)
    evo = evolver.run(evolver.create(config(suite, auto_approve=False, iterations=1)).id)
    first, *rest = svc.proposals(status="pending")
    edited = {name: text + "\n# reviewed by bob\n" if name.endswith(".py") else text
              for name, text in first.files.items()}
    svc.decide(first.id, "edit", who="bob", reason="added a note", files=edited)
    for p in rest:
        svc.decide(p.id, "approve", who="bob")
    evo = Evolver(svc, poll_s=0).run(evo.id)
    decision = [d for d in svc.decisions(first.id)][0]
    assert decision.decision == "edit" and decision.files_as_applied == edited
    candidate = svc.harness(evo.iterations[0]["candidate_version"])
    assert any("# reviewed by bob" in candidate.files[n] for n in edited if n.endswith(".py"))


def test_rollback_when_the_gate_says_noise(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, iterations=1, gate_min_net=1000)).id)
    row = evo.iterations[0]
    assert row["rolled_back"] is True and "below the minimum" in row["gate"]
    assert evo.current_version == evo.base_version
    assert svc.harness(row["candidate_version"]).status == "rolled_back"


def test_budget_stop_then_resume_finishes_without_repeating_work(world, tmp_path) -> None:
    svc, suite, backend = world
    evolver = Evolver(svc)
    # Out of budget in the middle of the first train batch (12 instances). A validation the budget
    # cannot finish is never started (see test_strategies), so a later stop would change the path.
    evo = evolver.run(evolver.create(config(suite, max_model_calls=6)).id)
    assert evo.status == "stopped" and "budget" in evo.result["stopped"]
    evo = Evolver(svc).run(evo.id, overrides={"max_model_calls": 10_000})
    assert evo.status == "done"
    # the same evolution uninterrupted, on a fresh store, makes the same number of backend calls
    from storage import open_store
    fresh = Service(open_store(f"sqlite:///{tmp_path / 'fresh.db'}"))
    backend2 = scripted_for(Path(suite))
    ev2 = Evolver(fresh)
    ref = ev2.run(ev2.create(config(suite)).id)
    # interrupted + resumed costs what one uninterrupted evolution costs (one in-flight call of slack)
    assert len(backend.history) <= len(backend2.history) + 1
    assert summary(evo)["test_accuracy"] == summary(ref)["test_accuracy"]
    runs = svc.runs(limit=500)
    keys = [(r.harness_version, r.model, tuple(r.instance_ids)) for r in runs]
    assert len(keys) == len(set(keys)), "a batch was run twice"


class _FixedServer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        text = "Let me think.\nThe answer is 12." if "12" in prompt else "Let me think.\nThe answer is 3."
        payload = json.dumps({"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 5, "completion_tokens": 7}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


def test_export_import_round_trip_and_standalone_run(world, tmp_path, store) -> None:
    import subprocess
    import sys
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, iterations=1)).id)
    path = tmp_path / "h.zip"
    export_zip(svc.store, evo.current_version, path)
    files, manifest = read_zip(path.read_bytes())
    assert manifest["harness_version"] == evo.current_version
    assert [v["id"] for v in manifest["lineage"]] == [evo.current_version, evo.base_version]
    assert manifest["applied_specifications"] and manifest["models"] == [MODEL]
    with zipfile.ZipFile(path) as zf:
        assert {"README.md", "run.py", "manifest.json", "harness/harness.toml"} <= set(zf.namelist())
    from storage import open_store
    other = open_store(f"sqlite:///{tmp_path / 'other.db'}")
    imported = import_zip(other, path)
    assert imported.id == evo.current_version and imported.files == svc.harness(evo.current_version).files
    # the zip runs on its own against any OpenAI-compatible server
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FixedServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        unpacked = tmp_path / "unpacked"
        zipfile.ZipFile(path).extractall(unpacked)
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text(json.dumps({"input": "What is 5 + 7? (12)"}) + "\n")
        proc = subprocess.run([sys.executable, str(unpacked / "run.py"), str(tasks), "--base-url",
                               f"http://127.0.0.1:{server.server_port}/v1"], capture_output=True, text=True,
                              timeout=60)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["answer"] == "12"


def _zip(entries: dict[str, bytes], *, link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


GOOD_TOML = b'[harness]\nentry = "harness.py:solve"\n'
GOOD_PY = b"def solve(task, model, harness):\n    return 'x'\n"


@pytest.mark.parametrize("data, needle", [
    (b"definitely not a zip", "not a zip"),
    (_zip({"harness/harness.toml": GOOD_TOML, "../evil.py": GOOD_PY}), "leaves the archive"),
    (_zip({"harness/harness.toml": GOOD_TOML, "/abs/harness.py": GOOD_PY}), "leaves the archive"),
    (_zip({"harness/harness.toml": GOOD_TOML, "harness/harness.py": GOOD_PY}, link="harness/link.py"), "link"),
    (_zip({"harness/harness.toml": GOOD_TOML, "harness/harness.py": b"x" * 400_000}), "limit"),
    (_zip({"harness/harness.py": GOOD_PY}), "harness.toml is missing"),
    (_zip({"harness/harness.toml": b"[[[", "harness/harness.py": GOOD_PY}), "harness.toml"),
    (_zip({"harness/harness.toml": GOOD_TOML, "harness/harness.py": b"def solve(:\n"}), "syntax error"),
    (_zip({"harness/harness.toml": GOOD_TOML, "harness/harness.py": b"\xff\xfe\x00"}), "UTF-8"),
    (_zip({"readme.txt": b"hello"}), "no harness/ folder"),
])
def test_hostile_archives_are_refused_and_nothing_is_stored(store, data: bytes, needle: str) -> None:
    before = len(store.list_harnesses())
    with pytest.raises(InputError) as exc:
        import_zip(store, data, origin="upload.zip")
    assert needle in str(exc.value)
    assert len(store.list_harnesses()) == before


def test_per_instance_strategy_repairs_one_instance_at_a_time(world) -> None:
    svc, suite, _ = world
    evolver = Evolver(svc)
    evo = evolver.run(evolver.create(config(suite, strategy="per-instance", iterations=2)).id)
    assert evo.status == "done"
    # the first repair fixes every instance of this world, so later batches may have nothing to try
    assert 1 <= len(evo.result["tried_instances"]) <= 2
    assert evo.iterations[0]["applied"] == 1
    for row in evo.iterations:
        if not row["diagnosis_id"]:
            assert row["train_accuracy"] == 1.0  # no failing instance left to search on
            continue
        report = svc.get_diagnosis(row["diagnosis_id"]).report
        assert row["proposals"] <= 1
        instances = {i for c in report["clusters"] for i in c["instances"]}
        assert len(instances) == 1, "per-instance feedback must come from one instance alone"

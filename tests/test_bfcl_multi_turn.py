"""BFCL's multi-turn suite (`bfcl-multi_turn_base`) on the real data of the pinned `bfcl-eval`
wheel, read from the machine's fetched folder (the tests that need it are skipped without it).

Invariants checked:
- the suite holds every entry of BFCL's file: its turns, initial state, classes, their function
  docs and the ground truth, in BFCL's category, every instance in a split;
- every entry's ground truth, replayed as a model's answer, scores correct (all 200);
- hand-broken answers score wrong for the reason BFCL gives (a call left out, a wrong value, an
  extra call that changes the state, a read left out, an empty turn) and fail in the taxonomy's
  type for them (stopped_early, wrong_argument, call_count, wrong_function, env_error, step_limit...);
- a name that is not a public method of an involved class (a dunder, a private method, a builtin,
  a dotted path) is refused with an error result and changes nothing; hostile model text run
  through the starter agent in the sandbox executes nothing;
- a call that runs away ends the replay process, not the engine: the instance fails, the next
  replay works;
- the harness sandbox reads the environments' source but not the possible answers beside it;
- the starter agent carries the engine's `envs.py`; a scripted model run through the engine on
  one entry scores it right, and one that never calls fails as stopped_early;
- (slow) SmolLM2 runs one entry end to end through `Service.run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from ecdysis.failures import FAILURE_TITLES, MULTI_TURN_TYPES, extract_failures, is_agent_instance, to_failure
from ecdysis.harness import STARTER_AGENT_DIR, read_dir
from ecdysis.records import SPLITS, Instance, InstanceResult, ModelCall
from ecdysis.sandbox import SandboxLimits, WorkerPool, isolation
from ecdysis.suites import describe_suites, load_suite
from ecdysis.suites import bfcl_multi_turn
from ecdysis.suites.bfcl import bfcl_dir, canonical
from ecdysis.suites.bfcl_multi_turn import (MULTI_TURN_SUITES, Replayer, env_source_dir, is_multi_turn_fetched,
                                            score_multi_turn)
from ecdysis.suites.calls import calls_to_json, parse_calls
from ecdysis.suites.envs import CLASS_MODULES, Environment

ROOT = Path(__file__).resolve().parent.parent
SUITE = "bfcl-multi_turn_base"
FAST = SandboxLimits(timeout_s=30.0, memory_mb=768)


@pytest.fixture(scope="module")
def root() -> Path:
    if not is_multi_turn_fetched():
        pytest.skip(f"the BFCL multi-turn files are not in {bfcl_dir()} (scripts/fetch_bfcl.py)")
    return bfcl_dir()


@pytest.fixture(scope="module")
def suite(root: Path):
    return load_suite(SUITE)


def entry(suite, instance_id: str = "multi_turn_base_0") -> Instance:
    return next(i for i in suite.instances if i.id == instance_id)


def lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def ground_truth(inst: Instance) -> list[list[dict[str, Any]]]:
    """The target's calls, read as a model's calls would be (JSON: tuples become lists)."""
    return [[json.loads(json.dumps(parse_calls(text)[0])) for text in turn] for turn in json.loads(inst.target)]


def record(turns: list[list[dict[str, Any]]], stopped: dict[int, str] | None = None,
           replies: dict[int, str] | None = None) -> str:
    """An answer as the starter agent writes it."""
    return json.dumps({"turns": [{"calls": calls, "steps": 1, "stopped": (stopped or {}).get(n, "no_call"),
                                  "reply": (replies or {}).get(n, "[]")} for n, calls in enumerate(turns)]})


def result(inst: Instance, answer: str) -> InstanceResult:
    call = ModelCall(seq=0, model="m", request={"messages": [{"role": "user", "content": inst.input}],
                                                "max_tokens": 384},
                     text="[]", prompt_tokens=1, completion_tokens=1, latency_s=0.0, finish_reason="stop",
                     cache_hit=False)
    return InstanceResult(run_id="r", instance_id=inst.id, category=inst.category, model="m", answer=answer,
                          target=inst.target, correct=False, score=0.0, calls=[call])


# ---------------------------------------------------------------- the suite

def test_the_suite_holds_every_entry_as_bfcl_writes_it(root: Path, suite) -> None:
    entries = {e["id"]: e for e in lines(root / "data" / "BFCL_v4_multi_turn_base.json")}
    answers = {e["id"]: e["ground_truth"]
               for e in lines(root / "data" / "possible_answer" / "BFCL_v4_multi_turn_base.json")}
    docs = {c: lines(root / "data" / "multi_turn_func_doc" / f"{stem}.json") for c, stem in CLASS_MODULES.items()}
    assert len(suite.instances) == len(entries) == 200
    assert suite.scorer.kind == "bfcl_multi_turn" and suite.categories == {"multi_turn_base": 200}
    assert all(len(suite.split(s)) > 0 for s in SPLITS)
    for inst in suite.instances:
        raw = entries[inst.id]
        assert inst.fields["turns"] == raw["question"] and len(inst.fields["turns"]) == len(answers[inst.id])
        assert inst.fields["initial_config"] == raw["initial_config"]
        assert inst.fields["involved_classes"] == raw["involved_classes"]
        assert inst.fields["functions"] == [d for c in raw["involved_classes"] for d in docs[c]]
        assert inst.fields["env_dir"] == str(env_source_dir().resolve())
        assert inst.input == raw["question"][0][0]["content"].strip()
        assert inst.target == canonical(answers[inst.id]) and inst.split in SPLITS
        assert inst.fields["answer_form"]["kind"] == "json" and not is_agent_instance(inst)
    assert set(suite.instances[0].task_view()) == {"input", "choices", "category", "fields"}  # no target, no id


def test_the_suite_is_listed_and_runs_the_starter_agent(root: Path, store) -> None:
    from ecdysis.harness_refs import resolve
    rows = {r["name"]: r for r in describe_suites(bigbench=False)}
    row = rows[SUITE]
    assert (row["size"], row["scorer"], row["categories"]) == (200, "bfcl_multi_turn", {"multi_turn_base": 200})
    assert row["source"].startswith("bfcl:") and set(MULTI_TURN_SUITES) == {SUITE}
    assert resolve(store, None, suite=load_suite(SUITE)).files == read_dir(STARTER_AGENT_DIR)


def test_the_starter_agent_carries_the_engines_environment_runner() -> None:
    assert (STARTER_AGENT_DIR / "envs.py").read_text() == (ROOT / "ecdysis" / "suites" / "envs.py").read_text()


# ---------------------------------------------------------------- scoring

def test_every_ground_truth_replayed_as_the_answer_scores_correct(suite) -> None:
    started = time.perf_counter()
    wrong = []
    for inst in suite.instances:
        turns = ground_truth(inst)
        for answer in (record(turns), json.dumps({"turns": turns})):  # a turn may be a bare list of calls
            check = score_multi_turn(answer, inst)
            if not check.correct:
                wrong.append((inst.id, check.reason, check.detail))
    assert wrong == [], f"{len(wrong)} of 400 replays scored wrong: {wrong[:3]}"
    assert time.perf_counter() - started < 30


def _drop(turn: int, index: int) -> Callable[[list], None]:
    return lambda t: t[turn].pop(index)


def _set(turn: int, index: int, **values: Any) -> Callable[[list], None]:
    return lambda t: t[turn][index]["arguments"].update(values)


def _rename(turn: int, index: int, name: str) -> Callable[[list], None]:
    return lambda t: t[turn][index].update(name=name)


# multi_turn_base_0: [cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf',
# destination='temp')], [cd(folder='temp'), grep(file_name=..., pattern='budget analysis')],
# [sort('final_report.pdf')], [cd(folder='..'), mv(...), cd(folder='temp'), diff(...)]
@pytest.mark.parametrize("edit, stopped, reason, turn, kind, mechanism", [
    (_drop(0, 2), {}, "state_mismatch", 0, "stopped_early", "missing call"),
    (_drop(0, 2), {0: "step_limit"}, "state_mismatch", 0, "step_limit", "calls until the step limit"),
    (_set(0, 2, destination="archive"), {}, "state_mismatch", 0, "wrong_argument", "a value differs"),
    (lambda t: t[0].append({"name": "touch", "arguments": {"file_name": "notes.txt"}}), {}, "state_mismatch", 0,
     "call_count", "extra call"),
    (_drop(1, 1), {}, "response_mismatch", 1, "stopped_early", "missing call"),
    (lambda t: t[2].clear(), {}, "empty_turn", 2, "stopped_early", "no call in the turn"),
    (_rename(0, 1, "make_dir"), {}, "state_mismatch", 0, "wrong_function", "an invented function"),
    (lambda t: t[0][1].update(arguments={"name": "temp"}), {}, "state_mismatch", 0, "wrong_argument",
     "arguments the function does not take"),
    (_set(0, 0, folder="documents"), {}, "state_mismatch", 0, "env_error", "a call returned an error"),
])
def test_a_broken_answer_scores_wrong_for_the_right_reason(suite, edit: Callable[[list], None], stopped: dict[int, str],
                                                           reason: str, turn: int, kind: str, mechanism: str) -> None:
    inst = entry(suite)
    turns = ground_truth(inst)
    edit(turns)
    answer = record(turns, stopped)
    check = score_multi_turn(answer, inst)
    assert (check.correct, check.reason, check.turn) == (False, reason, turn), check.detail
    failure = to_failure(result(inst, answer), inst, suite=SUITE, harness_version="h")
    assert (failure.type, failure.detail["mechanism"], failure.shape) == (kind, mechanism, "calls")
    assert FAILURE_TITLES[kind] and failure.detail["turn"] == turn
    # The signature names the mechanism in words shared across tools, never a function.
    assert mechanism in failure.signature and not {"mkdir", "mv", "grep", "touch"} & set(failure.signature.split())


def test_a_turn_whose_reply_is_broken_calls_and_an_answer_that_is_no_record_are_unparsable(suite) -> None:
    inst = entry(suite)
    turns = ground_truth(inst)
    turns[2] = []
    answer = record(turns, {2: "text"}, {2: "sort(file_name='final_report.pdf'"})
    failure = to_failure(result(inst, answer), inst, suite=SUITE, harness_version="h")
    assert (failure.type, failure.detail["mechanism"]) == ("unparsable_call", "broken call syntax")
    for answer in ("[]", "I moved the file.", json.dumps({"turn": []}), calls_to_json(ground_truth(inst)[0])):
        assert score_multi_turn(answer, inst).reason == "unreadable_answer"
        failure = to_failure(result(inst, answer), inst, suite=SUITE, harness_version="h")
        assert (failure.type, failure.detail["mechanism"]) == ("unparsable_call", "the answer is no record of turns")
    assert set(MULTI_TURN_TYPES) <= set(FAILURE_TITLES)


# ---------------------------------------------------------------- hostile calls and text

HOSTILE_CALLS: list[Any] = [
    {"name": "__init__", "arguments": {}},
    {"name": "__class__", "arguments": {}},
    {"name": "_load_scenario", "arguments": {"scenario": {}}},
    {"name": "__import__", "arguments": {"name": "os"}},
    {"name": "eval", "positional": ["__import__('os').system('touch MARKER')"]},
    {"name": "os.system", "arguments": {"command": "touch MARKER"}},
    {"name": "root.__class__", "arguments": {}},
    {"name": "cd.__globals__", "arguments": {}},
    {"name": "root", "arguments": {}},
    {"name": "", "arguments": {}},
    {"name": "cd", "arguments": {"folder": "document", "__class__": 1}},
    {"name": "cd", "arguments": ["document"]},
    {"name": 7, "arguments": {}},
    "cd(folder='document')",
    None,
]


def test_a_name_that_is_not_a_public_method_is_refused_and_changes_nothing(suite, tmp_path: Path) -> None:
    inst = entry(suite)
    fields = inst.fields
    env = Environment.create(fields["env_dir"], fields["involved_classes"], fields["initial_config"])
    fresh = Environment.create(fields["env_dir"], fields["involved_classes"], fields["initial_config"])
    marker = tmp_path / "MARKER"
    for call in HOSTILE_CALLS:
        if isinstance(call, dict) and "positional" in call:
            call = {**call, "positional": [p.replace("MARKER", str(marker)) for p in call["positional"]]}
        outcome = env.execute(call)
        assert outcome.status in ("unknown", "malformed", "bad_arguments"), (call, outcome)
        assert outcome.result.startswith("Error during execution: ")
    assert env.state() == fresh.state() and not marker.exists()
    assert all(not name.startswith("_") for name in env.functions)
    # In an answer the refused calls are errors, which BFCL's checks do not count: the record of
    # the right calls around them still scores right, and nothing of them ran.
    turns = ground_truth(inst)
    turns[0] = [c for c in HOSTILE_CALLS if isinstance(c, dict)] + turns[0]
    check = score_multi_turn(record(turns), inst)
    assert check.correct, check.detail
    assert set(check.turns[0].statuses[:len(HOSTILE_CALLS) - 3]) <= {"unknown", "malformed", "bad_arguments"}


def run_harness(inst: Instance, reply: Callable[[list[dict[str, str]]], str],
                limits: SandboxLimits = FAST) -> tuple[str | None, list[dict[str, Any]]]:
    """The starter agent on one task in the sandbox; the model answers with `reply(messages)`."""
    requests: list[dict[str, Any]] = []

    def on_generate(request: dict[str, Any]) -> dict[str, Any]:
        requests.append(request)
        return {"op": "completion", "text": reply(request["messages"]), "finish_reason": "stop",
                "prompt_tokens": 1, "completion_tokens": 1}

    pool = WorkerPool(read_dir(STARTER_AGENT_DIR), limits)
    try:
        outcome = pool.solve(inst.task_view(), on_generate)
    finally:
        pool.close()
    assert outcome.error_type is None, (outcome.error_message, outcome.traceback)
    return outcome.answer, requests


def test_hostile_model_text_runs_nothing_in_the_harness(suite, tmp_path: Path) -> None:
    """Outside bwrap (a plain child process, which can see the host folder) so that a file the
    attacks wrote would show here."""
    inst = entry(suite)
    marker = tmp_path / "MARKER"
    attacks = [f"__import__('os').system('touch {marker}')",
               f"[cd(folder=__import__('os').system('touch {marker}'))]",
               f'[{{"name": "__import__", "arguments": {{"name": "os"}}}}, {{"name": "eval", "arguments": '
               f'{{"source": "open(\'{marker}\', \'w\')"}}}}]',
               f"[_load_scenario(scenario={{}}), __init__(), exec('open(\"{marker}\", \"w\")')]",
               "[cd(folder='document'), mkdir(dir_name='temp')]"]
    queue = list(attacks)

    def reply(messages: list[dict[str, str]]) -> str:
        return queue.pop(0) if queue else "[]"

    answer, requests = run_harness(inst, reply, SandboxLimits(timeout_s=30.0, memory_mb=768, isolation="process"))
    assert not marker.exists()
    turns = json.loads(answer or "")["turns"]
    assert len(turns) == 4 and turns[0]["stopped"] == "text" and turns[0]["calls"] == []  # prose: no call
    ran = [c for t in turns for c in t["calls"]]
    assert [c["status"] for c in ran] == ["error", "unknown", "unknown", "unknown", "unknown", "unknown", "ok", "ok"]
    assert ran[0]["arguments"]["folder"].startswith("__import__")  # the nested call is only text
    assert all(c["result"].startswith("Error during execution") for c in ran[1:6])
    assert "What your calls returned" in requests[2]["messages"][-1]["content"]


def test_a_runaway_call_ends_the_replay_process_not_the_engine(suite, monkeypatch: pytest.MonkeyPatch) -> None:
    math_entry = next(i for i in suite.instances if "MathAPI" in i.fields["involved_classes"])
    short = Replayer(timeout_s=2.0, memory_mb=512)
    monkeypatch.setattr(bfcl_multi_turn, "_replayer", short)
    try:
        turns = ground_truth(math_entry)
        turns[0] = [{"name": "logarithm", "arguments": {"value": 2, "base": 3, "precision": 100_000_000}}] + turns[0]
        started = time.perf_counter()
        check = score_multi_turn(record(turns), math_entry)
        assert (check.correct, check.reason) == (False, "replay_failed")
        assert time.perf_counter() - started < 15
        failure = to_failure(result(math_entry, record(turns)), math_entry, suite=SUITE, harness_version="h")
        assert (failure.type, failure.detail["mechanism"]) == ("env_error", "the replay ran out of time or memory")
        assert score_multi_turn(record(ground_truth(math_entry)), math_entry).correct  # a new process took over
    finally:
        short.close()


# ---------------------------------------------------------------- the sandbox and the engine

def test_the_sandbox_reads_the_environments_but_not_the_answers(root: Path) -> None:
    if isolation().mode != "bwrap":
        pytest.skip("bubblewrap is not available: harness code sees the host's files")
    files = {"harness.toml": '[harness]\nname = "peek"\nentry = "harness.py:solve"\n',
             "harness.py": (
                 "import json, os\n"
                 "def solve(task, model, harness):\n"
                 "    f = task['fields']\n"
                 "    def readable(path):\n"
                 "        try:\n"
                 "            open(path).read(10)\n"
                 "            return True\n"
                 "        except OSError:\n"
                 "            return False\n"
                 "    return json.dumps({'env': sorted(os.listdir(f['env_dir'])),\n"
                 "                       'source': readable(os.path.join(f['env_dir'], 'math_api.py')),\n"
                 "                       'answers': readable(f['answers']), 'questions': readable(f['questions'])})\n")}
    task = {"input": "", "choices": None, "category": "x",
            "fields": {"env_dir": str(env_source_dir().resolve()),
                       "answers": str(root / "data" / "possible_answer" / "BFCL_v4_multi_turn_base.json"),
                       "questions": str(root / "data" / "BFCL_v4_multi_turn_base.json")}}
    pool = WorkerPool(files, FAST)
    try:
        outcome = pool.solve(task, lambda request: {"op": "model_error", "message": "no model here"})
    finally:
        pool.close()
    seen = json.loads(outcome.answer or "{}")
    assert "math_api.py" in seen["env"] and seen["source"]
    assert seen["answers"] is False and seen["questions"] is False


def scripted(path: Path, inst: Instance, replies: list[str] | None = None) -> str:
    """A script that answers each turn's first step with the ground truth's calls of that turn
    (or with `replies`), and every later step, where the last message is the calls' results, with []."""
    turns = json.loads(inst.target)
    texts = replies or [calls_to_json([parse_calls(c)[0] for c in turn]) for turn in turns]
    rules = [{"match": "What your calls returned", "text": "[]"}]
    rules += [{"match": bfcl_multi_turn.turn_text(turn), "text": text}
              for turn, text in zip(inst.fields["turns"], texts)]
    path.write_text(json.dumps({"rules": rules, "default": "[]"}))
    return f"scripted:{path}"


def test_a_scripted_model_through_the_engine_scores_the_entry(root: Path, tmp_path: Path) -> None:
    from ecdysis.runner import pick_instances
    from ecdysis.service import RunRequest, Service
    from storage import open_store
    suite = load_suite(SUITE)
    inst = pick_instances(suite, "train", 1)[0]
    svc = Service(open_store())
    summary = svc.run(RunRequest(suite=SUITE, model=scripted(tmp_path / "right.json", inst), limit=1))
    assert (summary.n, summary.accuracy, summary.errors) == (1, 1.0, {})
    res, = svc.results(summary.run_id)
    answer = json.loads(res.answer or "")
    n = len(inst.fields["turns"])
    assert len(answer["turns"]) == n and all(t["stopped"] == "no_call" and t["steps"] == 2 for t in answer["turns"])
    assert [c["name"] for t in answer["turns"] for c in t["calls"]] == [
        c.split("(")[0] for turn in json.loads(inst.target) for c in turn]
    assert set(answer["state"]) == set(inst.fields["involved_classes"])
    assert len(res.calls) == 2 * n  # per turn: the calls, then [] after their results
    system = res.calls[0].request["messages"][0]["content"]
    assert all(f["name"] + "(" in system for f in inst.fields["functions"])
    # A model that never calls anything: every turn stops at once, and the failure says so.
    summary = svc.run(RunRequest(suite=SUITE, model=scripted(tmp_path / "idle.json", inst, ["[]"] * n), limit=1))
    assert summary.accuracy == 0.0
    failures = extract_failures(svc.results(summary.run_id), {inst.id: inst}, suite=SUITE)
    assert [(f.type, f.detail["mechanism"], f.detail["turn"]) for f in failures] == [
        ("stopped_early", "no call in the turn", 0)]


def test_the_cli_lists_the_suite(root: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(ECDYSIS_HOME=str(tmp_path / "home"), ECDYSIS_BIGBENCH_DIR=str(tmp_path / "no-bigbench"))
    proc = subprocess.run([sys.executable, "-m", "ecdysis.cli", "suites", "--json", "--source", "bfcl"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in json.loads(proc.stdout) if r["name"] == SUITE)
    assert row["scorer"] == "bfcl_multi_turn" and row["answer_forms"] == {"multi_turn_base": {"kind": "json",
                                                                                                "declared": True}}


@pytest.mark.slow
def test_a_real_model_runs_an_entry_end_to_end(root: Path) -> None:
    """SmolLM2 on one entry through Service.run: a result is stored for it, with the model's calls
    recorded per turn, and a failure is typed by the multi-turn taxonomy."""
    from ecdysis.service import RunRequest, Service
    from storage import open_store
    svc = Service(open_store())
    summary = svc.run(RunRequest(suite=SUITE, model="smollm2", limit=1))
    res, = svc.results(summary.run_id)
    inst = next(i for i in load_suite(SUITE).instances if i.id == res.instance_id)
    assert res.calls and res.calls[0].request["messages"][0]["content"].startswith("You are an assistant")
    if res.error_type is None:
        answer = json.loads(res.answer or "")
        assert len(answer["turns"]) == len(inst.fields["turns"])
        assert all(t["steps"] >= 1 and t["stopped"] in ("no_call", "text", "step_limit") for t in answer["turns"])
        assert set(answer["state"]) == set(inst.fields["involved_classes"])
    for failure in extract_failures([res], {inst.id: inst}, suite=SUITE):
        if failure.type not in ("exception", "timeout", "crash", "model_error"):
            assert failure.shape == "calls" and failure.detail["mechanism"], failure

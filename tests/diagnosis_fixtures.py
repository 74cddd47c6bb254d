"""A planted world for the diagnosis tests, whose truth is known by construction.

Suite `planted`: five categories (arithmetic, dates with options, word-sorting, object-counting,
boolean), six train instances each plus two validation instances. Two models, `alpha` and `beta`,
"ran" the starter harness on the train instances; their replies are written here, not generated:

- pattern H (harness-level): on instances 0-2 of EVERY category BOTH models reply
  "Sure! Here is my answer: <answer>" — the starter's first-line extraction keeps the prose;
- pattern M (model-specific): on instances 3-4 of every category only `beta` replies
  "Let me think step by step about this problem first." while `alpha` answers correctly;
- noise: `alpha` answers arithmetic instance 5 off by one (a single wrong answer);
- everything else is answered correctly by both, so instances 5 (except arithmetic) are the
  sanctioned few-shot exemplars (passing train instances).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ecdysis.harness import new_version, starter_files
from ecdysis.records import Completion, Instance, InstanceResult, ModelCall, RunRecord, ScorerSpec, Suite
from ecdysis.store import DiagnosisRecord, HarnessVersion, ProposalRecord

CATEGORIES = ("arithmetic", "dates", "word-sorting", "object-counting", "boolean")
H_PREFIX = "Sure! Here is my answer:"
M_REPLY = "Let me think step by step about this problem first."
_NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lucia", "Omar", "Priya", "Lars"]
_WORDS = ["quartz", "meadow", "falcon", "lantern", "pebble", "orchid", "walnut", "zipper", "anchor",
          "velvet", "glacier", "hammer", "koala", "nutmeg", "ribbon", "thistle"]
_THINGS = ["apples", "pianos", "carrots", "rabbits", "drums", "plums", "goats", "onions"]


def _instance(category: str, i: int) -> Instance:
    split = "train" if i < 6 else "validation"
    iid = f"{category}-{i:03d}"
    name = _NAMES[i % len(_NAMES)]
    if category == "arithmetic":
        a, b = 11 + 7 * i, 23 + 5 * i
        return Instance(iid, f"{name} has {a} marbles and wins {b} more at the fair on day {i}. "
                             f"How many marbles does {name} have now?", str(a + b), category, split=split)
    if category == "dates":
        day = 3 + i
        options = (f"04/{day:02d}/2021", f"04/{day + 1:02d}/2021", f"05/{day:02d}/2021", f"03/{day:02d}/2021")
        return Instance(iid, f"Today is April {day - 1}, 2021 and {name} leaves tomorrow. "
                             f"What is the date tomorrow in MM/DD/YYYY?", options[0], category,
                        choices=options, split=split)
    if category == "word-sorting":
        words = [_WORDS[(i * 3 + k) % len(_WORDS)] for k in range(4)]
        return Instance(iid, f"Sort the following words alphabetically: {' '.join(words)}",
                        " ".join(sorted(words)), category, split=split)
    if category == "object-counting":
        n, m = 2 + i % 3, 1 + i % 4
        thing, other = _THINGS[i % len(_THINGS)], _THINGS[(i + 3) % len(_THINGS)]
        return Instance(iid, f"{name} owns {n} {thing}, {m} {other} and a kite from set {i}. "
                             f"How many {thing} does {name} own?", str(n), category, split=split)
    value = i % 2 == 0
    expr = {True: "not ( False and True ) or False", False: "not True and ( True or False )"}[value]
    return Instance(iid, f"Case {i} for {name}: evaluate {expr} and answer True or False.", str(value),
                    category, split=split)


def planted_suite() -> Suite:
    instances = [_instance(c, i) for c in CATEGORIES for i in range(8)]
    scorer = ScorerSpec("by_category", {"categories": {
        "arithmetic": {"kind": "numeric"}, "object-counting": {"kind": "numeric"},
        "dates": {"kind": "multiple_choice"}, "word-sorting": {"kind": "exact"}, "boolean": {"kind": "exact"}}})
    return Suite(name="planted", instances=instances, scorer=scorer, source="test")


def answer_form(inst: Instance) -> str:
    """What a well-behaved model would reply: the option letter, or the target itself."""
    if inst.choices:
        return chr(ord("A") + list(inst.choices).index(inst.target))
    return inst.target


def planted_reply(model: str, inst: Instance, patterns: set[str]) -> str:
    index = int(inst.id.rsplit("-", 1)[1])
    if "H" in patterns and index <= 2:
        return f"{H_PREFIX} {answer_form(inst)}\nI hope this helps."
    if "M" in patterns and model == "beta" and index in (3, 4):
        return M_REPLY
    if "noise" in patterns and model == "alpha" and inst.category == "arithmetic" and index == 5:
        return str(int(inst.target) + 1)
    return answer_form(inst)


def _correct(inst: Instance, answer: str) -> bool:
    if inst.choices:
        return answer == answer_form(inst)
    return answer.strip().lower() == inst.target.lower()


def result_for(run_id: str, model: str, inst: Instance, reply: str, finish: str = "stop") -> InstanceResult:
    answer = next((line.strip() for line in reply.splitlines() if line.strip()), "")
    call = ModelCall(seq=0, model=model, request={"messages": [], "max_tokens": 96}, text=reply,
                     prompt_tokens=20, completion_tokens=len(reply.split()), latency_s=0.0,
                     finish_reason=finish, cache_hit=False)
    return InstanceResult(run_id=run_id, instance_id=inst.id, category=inst.category, model=model,
                          answer=answer, target=inst.target, correct=_correct(inst, answer),
                          score=1.0 if _correct(inst, answer) else 0.0, calls=[call])


def MemoryStore() -> Any:
    """A real store (the SQL implementation) on an in-memory SQLite database: exact, fast, and the
    same code the product runs, not a stand-in."""
    from storage import open_store
    return open_store("sqlite://")

def plant(store: Any, *, models: tuple[str, ...] = ("alpha", "beta"), patterns: set[str] | None = None,
          files: dict[str, str] | None = None) -> tuple[list[str], Suite, HarnessVersion]:
    """Store one run per model of the planted replies; returns (run ids, suite, harness version)."""
    patterns = {"H", "M", "noise"} if patterns is None else patterns
    suite = planted_suite()
    version = store.put_harness(new_version(files or starter_files(), parent=None, note="planted"))
    train = [i for i in suite.instances if i.split == "train"]
    run_ids = []
    for n, model in enumerate(models):
        run = RunRecord(id=f"run-{model}", suite=suite.name, model=model, harness_version=version.id,
                        split="train", instance_ids=[i.id for i in train], status="done",
                        created_at=time.time() + n)
        store.create_run(run)
        for inst in train:
            store.save_result(result_for(run.id, model, inst, planted_reply(model, inst, patterns)))
        run_ids.append(run.id)
    return run_ids, suite, version


def planted_batch(store: Any = None, **kwargs: Any) -> tuple[list[Any], Any]:
    """The planted runs as diagnosis sees them: (typed failures, the batch context)."""
    from ecdysis.aggregate import BatchContext
    from ecdysis.failures import extract_failures
    store = store if store is not None else MemoryStore()
    run_ids, suite, version = plant(store, **kwargs)
    by_id = {i.id: i for i in suite.instances}
    pairs, failures = [], []
    for rid in run_ids:
        results = store.get_results(rid)
        pairs += [(suite.name, r) for r in results]
        failures += extract_failures(results, by_id, suite=suite.name, harness_version=version.id)
    return failures, BatchContext.build(pairs, failures)


def solve_in_sandbox(files: dict[str, str], task: dict, replies: list[str],
                     limits: Any = None) -> tuple[str | None, list[dict]]:
    """Run a harness on one task in the real sandbox; the model answers from `replies` in order
    (the last one again once they run out). Returns the answer and the requests the harness made."""
    queue = list(replies)

    def respond(request: dict) -> dict:
        text = queue.pop(0) if len(queue) > 1 else queue[0]
        return {"op": "completion", "text": text, "finish_reason": "stop", "prompt_tokens": 1,
                "completion_tokens": 1}

    return solve_responding(files, task, respond, limits)


def solve_responding(files: dict[str, str], task: dict, respond: Any,
                     limits: Any = None) -> tuple[str | None, list[dict]]:
    """Run a harness on one task in the real sandbox; `respond(request)` is the engine's answer to
    each model request (a completion, or {"op": "model_error", ...}). Returns the answer and the
    requests the harness made."""
    from ecdysis.sandbox import SandboxLimits, WorkerPool
    requests: list[dict] = []

    def on_generate(request: dict) -> dict:
        requests.append(request)
        return respond(request)

    pool = WorkerPool(files, limits or SandboxLimits(timeout_s=10.0, memory_mb=512))
    try:
        outcome = pool.solve(task, on_generate)
    finally:
        pool.close()
    assert outcome.error_type is None, outcome.error_message
    return outcome.answer, requests

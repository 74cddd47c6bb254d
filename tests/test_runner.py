"""Runner on a small real world: a built-in suite, the starter harness, a SQLite store in a temp
folder and the scripted model for exact expectations."""

from __future__ import annotations

import pytest

from ecdysis.errors import ConfigError, NotFound
from ecdysis.models.registry import register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.runner import CallBudget, pick_instances
from ecdysis.service import RunRequest, Service
from ecdysis.suites import load_suite


def scripted(default: str = "I am not sure.") -> ScriptedBackend:
    backend = ScriptedBackend([Rule(text="True\nbecause", match="True and True")],
                              model_id="scripted-test", default=default)
    register_backend(backend)
    return backend


def starter_plus(folder, code: str):
    """The starter harness with `code` appended to its harness.py, written to `folder`."""
    from ecdysis.harness import starter_files, write_dir
    files = starter_files()
    files["harness.py"] += code
    return write_dir(files, folder)


def test_pick_instances_round_robins_over_categories() -> None:
    suite = load_suite("reasoning-mix")
    picked = pick_instances(suite, "train", 10)
    assert len(picked) == 10
    assert len({i.category for i in picked}) == len(suite.categories)
    assert all(i.split == "train" for i in picked)


def test_a_window_of_a_split_is_the_next_as_many_and_must_be_there_in_full() -> None:
    from ecdysis.errors import InputError
    suite = load_suite("reasoning-mix")
    first, second = pick_instances(suite, "test", 10), pick_instances(suite, "test", 10, window=1)
    assert len(second) == 10 and not {i.id for i in first} & {i.id for i in second}
    assert [i.id for i in first + second] == [i.id for i in pick_instances(suite, "test", 20)]
    assert len({i.category for i in second}) == len(suite.categories)  # still round-robin
    size = len(suite.split("test"))
    with pytest.raises(InputError, match=f"needs {2 * size}; reasoning-mix has {size}"):
        pick_instances(suite, "test", size, window=1)
    with pytest.raises(InputError):
        pick_instances(suite, "test", None, window=1)


def test_run_stores_every_instance_and_call(store) -> None:
    scripted()
    svc = Service(store)
    summary = svc.run(RunRequest(suite="reasoning-mix", model="scripted-test", limit=15))
    assert summary.n == 15
    assert summary.model_calls == 15
    results = svc.results(summary.run_id)
    assert len(results) == 15
    assert all(len(r.calls) == 1 and r.calls[0].text for r in results)
    assert all(r.answer is not None for r in results)
    run = svc.get_run(summary.run_id)
    assert run.status == "done"
    assert run.summary["accuracy"] == summary.accuracy
    assert set(summary.accuracy_by_category) == set(load_suite("reasoning-mix").categories)


def test_identical_rerun_is_served_from_cache(store) -> None:
    backend = scripted()
    svc = Service(store)
    first = svc.run(RunRequest(suite="boolean", model="scripted-test", limit=6))
    calls_after_first = len(backend.history)
    second = svc.run(RunRequest(suite="boolean", model="scripted-test", limit=6))
    assert first.cache_hits == 0
    assert second.cache_hits == second.model_calls == 6
    assert len(backend.history) == calls_after_first  # the backend was not called again
    assert second.accuracy == first.accuracy


def test_resume_runs_only_missing_instances(store) -> None:
    backend = scripted()
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="scripted-test", limit=8, use_cache=False))
    stop_after = {"n": 0}

    def cancel() -> bool:
        stop_after["n"] += 1
        return stop_after["n"] > 3  # three instances submitted, then the "process dies"

    partial = svc.execute_run(run.id, use_cache=False, cancelled=cancel)
    assert partial.n == 3
    assert svc.get_run(run.id).status == "cancelled"
    before = len(backend.history)
    final = svc.resume(run.id)
    assert final.n == 8
    assert len(backend.history) - before == 5  # nothing done twice
    assert svc.get_run(run.id).status == "done"


def test_a_resumed_runs_time_is_all_its_executions_and_resuming_a_finished_run_changes_nothing(store) -> None:
    """A user who resumed a run that had already finished saw its time drop to 0.0 s: the summary
    held the last execution's time alone. It is the sum of every execution's, and a finished run
    resumed keeps its record as it was."""
    backend = scripted()
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="scripted-test", limit=6, use_cache=False))
    calls = {"n": 0}
    partial = svc.execute_run(run.id, use_cache=False, cancelled=lambda: (calls.__setitem__("n", calls["n"] + 1)
                                                                          or calls["n"] > 2))
    first = svc.get_run(run.id).summary["wall_seconds"]
    assert partial.n == 2 and first > 0
    final = svc.resume(run.id)
    done = svc.get_run(run.id)
    assert final.n == 6 and done.status == "done"
    assert done.summary["wall_seconds"] == pytest.approx(done.summary["wall_seconds_total"], abs=1e-3)
    assert done.summary["wall_seconds"] > first
    before, asked = dict(done.summary), len(backend.history)
    again = svc.resume(run.id)
    after = svc.get_run(run.id)
    assert len(backend.history) == asked  # nothing asked again
    assert again.n == 6 and again.accuracy == final.accuracy
    assert again.wall_seconds == pytest.approx(before["wall_seconds"], abs=1e-3)
    assert after.summary == before and after.status == "done" and after.finished_at == done.finished_at


def test_concurrent_run_gives_the_same_results(store) -> None:
    scripted()
    svc = Service(store)
    serial = svc.run(RunRequest(suite="reasoning-mix", model="scripted-test", limit=12, use_cache=False))
    parallel = svc.run(RunRequest(suite="reasoning-mix", model="scripted-test", limit=12, concurrency=4,
                                  use_cache=False))
    key = lambda rs: sorted((r.instance_id, r.answer, r.correct) for r in rs)  # noqa: E731
    assert key(svc.results(serial.run_id)) == key(svc.results(parallel.run_id))


def test_budget_stops_a_run_cleanly_and_resume_finishes(store) -> None:
    scripted()
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="reasoning-mix", model="scripted-test", limit=10, use_cache=False))
    summary = svc.execute_run(run.id, use_cache=False, budget=CallBudget(max_calls=4))
    assert summary.n <= 10
    assert summary.model_calls <= 4 + 1  # in-flight calls may finish, none start after the budget
    assert svc.get_run(run.id).status == "pending"
    assert svc.resume(run.id).n == 10


def test_an_instance_whose_call_the_budget_refused_is_not_stored_and_a_resume_runs_it(store, tmp_path) -> None:
    """A harness may carry on past a refused call (here the first reply stands when asking again
    fails, as call_schema's does) and return an answer: not the one it gives with its calls. The
    instance is left for the resume, which runs it whole; stored, it would pass for the harness's
    outcome and the resume would skip it."""
    backend = scripted()
    folder = starter_plus(tmp_path / "twice", "\n\n_first = solve\n\nclass _Twice:\n"
                          "    def __init__(self, model):\n        self._model = model\n"
                          "    def generate(self, messages, **options):\n"
                          "        reply = self._model.generate(messages, **options)\n"
                          "        try:\n            return self._model.generate(messages + [{'role': 'user', "
                          "'content': 'Sure?'}], **options)\n"
                          "        except Exception:\n            return reply\n\n"
                          "def solve(task, model, harness):\n    return _first(task, _Twice(model), harness)\n")
    svc = Service(store)
    run = svc.create_run(RunRequest(suite="boolean", model="scripted-test", harness=str(folder), limit=1,
                                    use_cache=False))
    svc.execute_run(run.id, use_cache=False, budget=CallBudget(max_calls=1))
    assert len(backend.history) == 1  # the second call was refused, not made
    assert svc.results(run.id) == [] and svc.get_run(run.id).status == "pending"
    summary = svc.resume(run.id)
    assert summary.n == 1 and svc.get_run(run.id).status == "done"
    [result] = svc.results(run.id)
    assert result.error_type is None and len(result.calls) == 2 and not any(c.error for c in result.calls)


def test_harness_errors_are_data_not_exceptions(store, tmp_path) -> None:
    scripted()
    from ecdysis.harness import starter_files, write_dir
    files = starter_files()
    files["harness.py"] = "def solve(task, model, harness):\n    raise RuntimeError('broken harness')\n"
    folder = write_dir(files, tmp_path / "broken")
    svc = Service(store)
    summary = svc.run(RunRequest(suite="boolean", model="scripted-test", harness=str(folder), limit=4))
    assert summary.n == 4 and summary.accuracy == 0.0
    assert summary.errors == {"exception": 4}
    assert all("broken harness" in (r.error_message or "") for r in svc.results(summary.run_id))


def test_unknown_model_and_missing_key_are_clear_errors(store) -> None:
    svc = Service(store)
    with pytest.raises(ConfigError) as exc:
        svc.create_run(RunRequest(suite="boolean", model="gpt-17"))
    assert exc.value.hint and "openai:NAME" in exc.value.hint
    with pytest.raises(ConfigError) as exc:
        svc.create_run(RunRequest(suite="boolean", model="anthropic:claude"))
    assert "ANTHROPIC_API_KEY" in exc.value.message
    with pytest.raises(NotFound):
        svc.create_run(RunRequest(suite="no-such-suite", model="scripted-test"))


def test_a_harness_that_calls_itself_is_cut_off_at_the_per_instance_call_limit(store, tmp_path) -> None:
    """A wrapper applied twice calls itself: each level asks the model once more. The instance stops
    at MAX_CALLS_PER_SOLVE calls, fails with that reason, and the run goes on."""
    from ecdysis.models.gateway import MAX_CALLS_PER_SOLVE
    backend = scripted(default="")
    folder = starter_plus(tmp_path / "loops", "\n\n_before = solve\n\ndef solve(task, model, harness):\n"
                          "    model.generate([{'role': 'user', 'content': task['input']}])\n"
                          "    return _before(task, model, harness)\n\n_before = solve\n")
    svc = Service(store)
    summary = svc.run(RunRequest(suite="boolean", model="scripted-test", harness=str(folder), limit=2,
                                 use_cache=False))
    assert summary.n == 2 and summary.errors == {"model_error": 2}
    assert len(backend.history) == 2 * MAX_CALLS_PER_SOLVE  # the refused call is recorded, not made
    for result in svc.results(summary.run_id):
        assert result.error_type is not None and len([c for c in result.calls if not c.error]) == MAX_CALLS_PER_SOLVE
        assert any("the most one solve() may make" in (c.error or "") for c in result.calls)


def test_a_budget_that_charges_cached_calls_refuses_a_cached_one_it_cannot_pay(store) -> None:
    """Benchmarks charge a replayed answer as a call: once their budget is spent, a cache hit is
    refused like any other call, before it is charged."""
    from ecdysis.errors import BudgetExceeded
    from ecdysis.models.gateway import ModelGateway
    from ecdysis.records import CompletionRequest
    backend = scripted()
    request = CompletionRequest.make([{"role": "user", "content": "True and True"}])
    ModelGateway(backend, store).complete(request)  # cached now
    free = CallBudget(max_calls=1)
    free.charge(1, 0)
    assert ModelGateway(backend, store, budget=free).complete(request).cache_hit  # free hits need no budget
    others = [CompletionRequest.make([{"role": "user", "content": text}]) for text in ("False or True", "not True")]
    for other in others:
        ModelGateway(backend, store).complete(other)
    paid = CallBudget(max_calls=2, charge_cached=True)
    gateway = ModelGateway(backend, store, budget=paid)
    assert gateway.complete(request).cache_hit and gateway.complete(others[0]).cache_hit
    with pytest.raises(BudgetExceeded):
        gateway.complete(others[1])
    assert paid.calls == 2 and len(backend.history) == 3


def test_a_request_a_budget_already_paid_for_replays_free(store) -> None:
    """A benchmark charges a cached answer once per job, as the job's own cache would have made it
    once: asking the same request again costs nothing, even on a spent budget, while another
    request is charged (and refused once nothing is left). Without the cache a repeat is a real
    call, and charged again."""
    from ecdysis.errors import BudgetExceeded
    from ecdysis.models.gateway import ModelGateway
    from ecdysis.records import CompletionRequest
    backend = scripted()
    asked = CompletionRequest.make([{"role": "user", "content": "True and True"}])
    other = CompletionRequest.make([{"role": "user", "content": "not False"}])
    ModelGateway(backend, store).complete(other)  # someone else's, cached
    budget = CallBudget(max_calls=1, charge_cached=True)
    gateway = ModelGateway(backend, store, budget=budget)
    assert not gateway.complete(asked).cache_hit  # made and paid for here
    for _ in range(3):
        assert gateway.complete(asked).cache_hit
    assert (budget.calls, budget.exhausted, budget.paid_for(asked.cache_key(backend.model_id))) == (1, True, True)
    with pytest.raises(BudgetExceeded):
        gateway.complete(other)  # cached, but not paid for by this budget
    uncached = CallBudget(charge_cached=True)
    bare = ModelGateway(backend, store, use_cache=False, budget=uncached)
    bare.complete(asked)
    bare.complete(asked)
    assert uncached.calls == 2 and len(backend.history) == 4
    saved = budget.snapshot()[3]
    assert saved == [asked.cache_key(backend.model_id)[:16]]  # short keys: saved with every save of a job
    for keys in (saved, [asked.cache_key(backend.model_id)]):  # and whole ones, as saved before
        restarted = CallBudget(max_calls=0, charge_cached=True)
        restarted.mark_paid(keys)
        assert ModelGateway(backend, store, budget=restarted).complete(asked).cache_hit and restarted.calls == 0


def test_a_reused_block_of_calls_is_charged_only_as_far_as_the_budget_reaches() -> None:
    """A finished run borrowed whole is charged as if made call by call: a block that fits is
    charged exactly; one the budget runs out inside is charged up to the limit, in proportion for
    tokens and seconds, and stops the job; a spent budget refuses the next block outright."""
    from ecdysis.errors import BudgetExceeded
    budget = CallBudget(max_calls=100)
    budget.charge_block(60, 600, 6.0)
    assert (budget.calls, budget.tokens, budget.seconds) == (60, 600, 6.0)
    with pytest.raises(BudgetExceeded, match="does not fit in the 40 left"):
        budget.charge_block(80, 800, 8.0)
    assert (budget.calls, budget.tokens, budget.seconds) == (100, 1000, 10.0)
    with pytest.raises(BudgetExceeded):
        budget.charge_block(1, 1, 0.1)
    assert budget.calls == 100
    unlimited = CallBudget()
    unlimited.charge_block(500, 5, 0.5)
    assert (unlimited.calls, unlimited.tokens, unlimited.seconds) == (500, 5, 0.5)


def test_a_spent_budget_says_which_limit_ran_out() -> None:
    """The limit that stopped a job travels with the error (what a face suggests raising depends on
    it), and the first limit reached is the one named, whatever the message says."""
    from ecdysis.errors import BudgetExceeded
    calls = CallBudget(max_calls=2, max_tokens=10)
    calls.charge(2, 5)
    tokens = CallBudget(max_calls=10, max_tokens=10)
    tokens.charge(1, 10)
    wall = CallBudget(max_calls=10, deadline=0.0)
    room = CallBudget(max_calls=10, max_tokens=10, deadline=float("inf"))
    for budget, limit in ((calls, "calls"), (tokens, "tokens"), (wall, "wall")):
        assert budget.spent_limit() == limit and budget.exhausted
        with pytest.raises(BudgetExceeded) as stopped:
            budget.check()
        assert stopped.value.limit == limit
    assert room.spent_limit() is None and not room.exhausted
    room.check()
    with pytest.raises(ValueError, match="unknown budget limit"):
        BudgetExceeded("spent", limit="dollars")

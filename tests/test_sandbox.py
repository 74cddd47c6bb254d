"""The sandbox contract: harness code that raises, hangs, exhausts memory, exits, prints
megabytes or returns junk costs one failed instance with a typed error; the worker is replaced."""

from __future__ import annotations

import pytest

from ecdysis.harness import starter_files
from ecdysis.sandbox.harness_box import OUTPUT_MARK
from ecdysis.sandbox import HarnessWorker, SandboxLimits, WorkerPool
from ecdysis.sandbox.zygote import OutputTail

TASK = {"input": "What is 2 + 2?", "choices": None, "category": "arithmetic", "fields": {}}
FAST = SandboxLimits(timeout_s=3.0, memory_mb=512)


def files_with(code: str) -> dict[str, str]:
    files = starter_files()
    files["harness.py"] = code
    return files


def echo_model(calls: list[dict]):
    def on_generate(request: dict) -> dict:
        calls.append(request)
        return {"op": "completion", "text": "4\nbecause", "finish_reason": "stop",
                "prompt_tokens": 5, "completion_tokens": 2}
    return on_generate


def test_starter_harness_calls_model_and_extracts_first_line() -> None:
    calls: list[dict] = []
    pool = WorkerPool(starter_files(), FAST)
    try:
        out = pool.solve(TASK, echo_model(calls))
    finally:
        pool.close()
    assert out.error_type is None, out.error_message
    assert out.answer == "4"
    assert len(calls) == 1
    assert calls[0]["messages"][0]["role"] == "system"
    assert "What is 2 + 2?" in calls[0]["messages"][1]["content"]


def test_worker_is_reused_across_instances() -> None:
    code = "import os\ndef solve(task, model, harness):\n    return str(os.getpid())\n"
    pool = WorkerPool(files_with(code), FAST)
    try:
        pids = {pool.solve(TASK, echo_model([])).answer for _ in range(3)}
    finally:
        pool.close()
    assert len(pids) == 1


@pytest.mark.parametrize("code, kind, needle", [
    ("def solve(task, model, harness):\n    raise ValueError('boom')\n", "exception", "ValueError: boom"),
    ("def solve(task, model, harness):\n    while True:\n        pass\n", "timeout", "exceeded"),
    ("def solve(task, model, harness):\n    x = bytearray(2 * 1024 ** 3)\n    return 'no'\n", "memory", "MemoryError"),
    ("import os\ndef solve(task, model, harness):\n    os._exit(3)\n", "crash", "code 3"),
    ("def solve(task, model, harness):\n    return object()\n", "bad_output", "solve() returned"),
    ("import sys\ndef solve(task, model, harness):\n    sys.exit(1)\n", "exception", "SystemExit"),
])
def test_hostile_harness_is_one_typed_failure(code: str, kind: str, needle: str) -> None:
    pool = WorkerPool(files_with(code), FAST)
    try:
        out = pool.solve(TASK, echo_model([]))
        assert out.answer is None
        assert out.error_type == kind, out
        assert needle in (out.error_message or ""), out.error_message
        # the pool recovers: the next instance gets a working (or fresh) worker
        again = pool.solve(TASK, echo_model([]))
        assert again.error_type == kind
    finally:
        pool.close()


def test_a_template_the_harness_does_not_have_fails_the_instance_by_name() -> None:
    """Rendering a missing template is a typed failure naming it and the files there are, never an
    empty prompt sent to the model (a Qwen 1.5B edit once named a sentence as the template, and every
    question went out as the same empty messages)."""
    name = "Replace the system prompt with a prompt that asks for the whole task and for a final Answer: line."
    code = starter_files()["harness.py"].replace('harness.render("system.md"', f'harness.render("{name}"')
    assert code != starter_files()["harness.py"]
    calls: list[dict] = []
    pool = WorkerPool(files_with(code), FAST)
    try:
        out = pool.solve(TASK, echo_model(calls))
    finally:
        pool.close()
    assert out.answer is None and out.error_type == "exception", out
    assert "FileNotFoundError: the harness has no template 'Replace the system prompt" in (out.error_message or "")
    assert "system.md, user.md" in (out.error_message or "") and calls == []


def test_megabytes_of_output_are_cut_to_a_tail() -> None:
    code = "def solve(task, model, harness):\n    print('x' * 5_000_000)\n    print('END')\n    return 'ok'\n"
    pool = WorkerPool(files_with(code), FAST)
    try:
        out = pool.solve(TASK, echo_model([]))
    finally:
        pool.close()
    assert out.answer == "ok"
    assert out.output_tail.strip().endswith("END")
    assert len(out.output_tail) <= FAST.output_tail


def test_output_tail_survives_a_mark_read_on_its_own() -> None:
    """Under load the runtime's end mark can arrive in a read of its own after a full 64 KiB read
    of output; the tail must still be the last characters printed (CI once stored it empty)."""
    tail = OutputTail(4000)
    tail.add(b"x" * 65536)
    tail.add(b"x" * 60000 + b"END OF FLOOD\n")
    tail.add(OUTPUT_MARK.encode())
    assert tail.marked
    text = tail.take()
    assert text.endswith("END OF FLOOD\n") and len(text) == 4000
    tail.add(b"small\n")
    assert tail.take() == "small\n"


def test_harness_that_fails_to_import_fails_each_instance_quickly() -> None:
    code = "import module_that_does_not_exist\ndef solve(task, model, harness):\n    return 'x'\n"
    worker = HarnessWorker(files_with(code), FAST)
    assert worker.load_error is not None
    assert "ModuleNotFoundError" in (worker.load_error.error_message or "")
    pool = WorkerPool(files_with(code), FAST)
    assert pool.solve(TASK, echo_model([])).error_type == "exception"
    pool.close()


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value-123")
    monkeypatch.setenv("ECDYSIS_DATABASE_URL", "postgresql://u:pw@h/db")
    code = "import os\ndef solve(task, model, harness):\n    return repr(sorted(os.environ.items()))\n"
    pool = WorkerPool(files_with(code), FAST)
    try:
        out = pool.solve(TASK, echo_model([]))
    finally:
        pool.close()
    assert out.answer is not None
    assert "sk-secret-value-123" not in out.answer
    assert "postgresql" not in out.answer
    assert "OPENAI_API_KEY" not in out.answer


def test_model_time_does_not_count_against_the_harness_timeout() -> None:
    import time

    def slow_model(request: dict) -> dict:
        time.sleep(1.5)
        return {"op": "completion", "text": "4", "finish_reason": "stop"}

    code = ("def solve(task, model, harness):\n"
            "    return ''.join(model.generate([{'role': 'user', 'content': 'q'}]).text for _ in range(3))\n")
    pool = WorkerPool(files_with(code), SandboxLimits(timeout_s=2.0))
    try:
        out = pool.solve(TASK, slow_model)
    finally:
        pool.close()
    assert out.error_type is None, out.error_message
    assert out.answer == "444"
    assert out.model_seconds >= 4.0


def test_model_error_reaches_harness_as_exception() -> None:
    def failing(request: dict) -> dict:
        return {"op": "model_error", "message": "rate limited"}

    pool = WorkerPool(starter_files(), FAST)
    try:
        out = pool.solve(TASK, failing)
    finally:
        pool.close()
    assert out.error_type == "exception"
    assert "ModelCallError" in (out.error_message or "") and "rate limited" in (out.error_message or "")


def test_harness_code_imports_the_runtime_by_name_in_the_box() -> None:
    """The sandbox loads the harness API as the module `harness_runtime`, so harness code can catch
    its ModelCallError; the sandbox side (fork server, reaper) is not part of that module."""
    code = ("import harness_runtime\nfrom harness_runtime import ModelCallError\n"
            "def solve(task, model, harness):\n"
            "    assert not hasattr(harness_runtime, 'zygote') and not hasattr(harness_runtime, 'serve')\n"
            "    try:\n        return model.generate([{'role': 'user', 'content': 'hi'}]).text\n"
            "    except ModelCallError as exc:\n        return 'fallback: ' + str(exc)\n")
    pool = WorkerPool(files_with(code), FAST)
    try:
        out = pool.solve(TASK, lambda request: {"op": "model_error", "message": "rate limited"})
    finally:
        pool.close()
    assert out.error_type is None, out.error_message
    assert out.answer == "fallback: rate limited"


def test_the_exported_runtime_runs_alone_and_carries_no_sandbox_code(tmp_path) -> None:
    import subprocess
    import sys

    from ecdysis.harness import write_dir
    from ecdysis.sandbox import RUNTIME
    text = RUNTIME.read_text()
    assert "def zygote" not in text and "setresuid" not in text and "recv_fds" not in text
    write_dir(files_with("from harness_runtime import Reply\ndef solve(task, model, harness):\n"
                         "    return Reply.__module__\n"), tmp_path / "harness")
    (tmp_path / "run.py").write_text(text)
    (tmp_path / "tasks.jsonl").write_text('{"input": "x"}\n')
    done = subprocess.run([sys.executable, "run.py", "tasks.jsonl"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"answer": "__main__"' in done.stdout

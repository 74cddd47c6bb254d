"""BFCL's multi-turn category `multi_turn_base` as the suite `bfcl-multi_turn_base`, and the
`bfcl_multi_turn` scorer. The files are those `scripts/fetch_bfcl.py` keeps (see `bfcl.py`); the
environments' source is run from them, the package is never installed.

How an entry maps onto an instance:

- `id` is BFCL's id ("multi_turn_base_0"), `category` BFCL's category ("multi_turn_base");
- `input` is the first turn's user text (the whole conversation is in the fields);
- `fields`: "turns" (BFCL's `question`: a list of turns, each a list of messages),
  "initial_config", "involved_classes", "functions" (the function docs of those classes, from
  `multi_turn_func_doc`), "env_dir" (the environments' source folder, which the harness sandbox
  mounts read-only: harness code runs the agent's calls there) and the answer form `json`;
- `target` is the ground truth as canonical JSON: per turn, the list of calls as BFCL writes them
  (Python call syntax, "cd(folder='document')").

A harness answers with a JSON object recording what it did, {"turns": [{"calls": [{"name",
"arguments", "positional"?, "result"?}, ...], ...}, ...], ...} (a turn may also be a bare list of
calls). The scorer trusts none of it but the calls: it replays them, each turn on fresh instances
of BFCL's classes, beside the ground truth's calls (read with `parse_calls`, never evaluated), and
applies BFCL's per-turn checks (`envs.check`): a turn that needs calls holds some, every public
attribute of every instance equals the ground truth's, and every result of the ground truth's
calls is among the model's results so far. The replay runs in a child process (`Replayer`), so a
call that runs away costs that process and fails the instance, never the engine.

Where BFCL and this differ: a nested call or a variable in an argument is kept as its source text
(BFCL would evaluate it); a call's name must be a public method of an involved class, so
"Class.method" is refused as BFCL's `eval` would refuse it; error texts are worded here, and no
ground-truth call errs, so no verdict depends on them.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecdysis.errors import ConfigError, InputError, NotFound
from ecdysis.records import Instance, ScorerSpec, Suite
from ecdysis.suites.bfcl import FETCH_HINT, _answers, _json_lines, answer_file, bfcl_dir, canonical, question_file
from ecdysis.suites.calls import parse_calls
from ecdysis.suites.envs import CLASS_MODULES

MULTI_TURN_SUITES: dict[str, str] = {"bfcl-multi_turn_base": "multi_turn_base"}  # suite -> BFCL category
DESCRIPTIONS = {
    "multi_turn_base": "BFCL multi-turn base: a conversation of user turns over stateful tools (a file system, "
                       "trading, travel, messaging, a car...); each turn is done by calling functions whose results "
                       "come back, and is judged by the tools' state and results against the ground truth's.",
}
ENV_SOURCE = ("eval_checker", "multi_turn_eval", "func_source_code")  # below bfcl_dir()
ENVS_FILE = Path(__file__).resolve().parent / "envs.py"
MAX_ANSWER = 4_000_000  # characters; a longer answer is not read


def env_source_dir(root: Path | None = None) -> Path:
    """The folder of BFCL's environment classes, below `bfcl_dir()`."""
    return (root or bfcl_dir()).joinpath(*ENV_SOURCE)


def func_doc_file(class_name: str, root: Path | None = None) -> Path:
    return (root or bfcl_dir()) / "data" / "multi_turn_func_doc" / f"{CLASS_MODULES[class_name]}.json"


def is_multi_turn_fetched(root: Path | None = None) -> bool:
    """True when the questions, answers, function docs and environments' source are all there."""
    root = root or bfcl_dir()
    return all(question_file(c, root).is_file() and answer_file(c, root).is_file()
               for c in MULTI_TURN_SUITES.values()) \
        and all(func_doc_file(c, root).is_file() for c in CLASS_MODULES) \
        and all((env_source_dir(root) / f"{stem}.py").is_file() for stem in CLASS_MODULES.values())


def load_multi_turn(name: str, *, root: Path | None = None) -> Suite:
    """The suite `name` (a key of `MULTI_TURN_SUITES`) from the files under `root` (default `bfcl_dir()`)."""
    if name not in MULTI_TURN_SUITES:
        raise NotFound(f"no BFCL multi-turn suite named {name!r}", hint=f"known: {', '.join(MULTI_TURN_SUITES)}")
    root = root or bfcl_dir()
    category = MULTI_TURN_SUITES[name]
    questions = question_file(category, root)
    if not is_multi_turn_fetched(root):
        raise NotFound(f"the BFCL multi-turn files are not all at {root}", hint=FETCH_HINT)
    answers = _answers(answer_file(category, root))
    docs = {c: [doc for _, doc in _json_lines(func_doc_file(c, root))] for c in CLASS_MODULES}
    env_dir = str(env_source_dir(root).resolve())
    instances = [_instance(entry, category, answers, docs, env_dir, questions, line)
                 for line, entry in _json_lines(questions)]
    return Suite(name=name, instances=instances, scorer=ScorerSpec("bfcl_multi_turn"),
                 description=DESCRIPTIONS[category], source=f"bfcl:{root.resolve()}")


def _instance(entry: Any, category: str, answers: dict[str, Any], docs: dict[str, list[dict[str, Any]]],
              env_dir: str, path: Path, line: int) -> Instance:
    def bad(message: str) -> InputError:
        return InputError(message, path=str(path), line=line, hint=FETCH_HINT)

    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        raise bad("an entry needs a string `id`")
    turns = entry.get("question")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, list) for t in turns):
        raise bad(f"entry {entry['id']}: `question` must be a list of turns")
    classes = entry.get("involved_classes")
    if not isinstance(classes, list) or not all(c in CLASS_MODULES for c in classes):
        raise bad(f"entry {entry['id']}: `involved_classes` must name BFCL's environment classes")
    expected = answers.get(entry["id"])
    if not isinstance(expected, list) or len(expected) != len(turns) \
            or not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in expected):
        raise bad(f"entry {entry['id']} has no ground truth of one list of calls per turn")
    fields = {"turns": turns, "initial_config": entry.get("initial_config") or {}, "involved_classes": classes,
              "functions": [doc for c in classes for doc in docs[c]], "env_dir": env_dir,
              "answer_form": {"kind": "json"}}
    return Instance(id=entry["id"], input=turn_text(turns[0]), target=canonical(expected), category=category,
                    fields=fields)


def turn_text(turn: list[Any]) -> str:
    """A turn's user messages, joined by blank lines."""
    texts = [str(m.get("content", "")).strip() for m in turn if isinstance(m, dict) and m.get("role") == "user"]
    return "\n\n".join(t for t in texts if t)


# ---------------------------------------------------------------- the scorer

@dataclass(frozen=True)
class TurnReplay:
    """One turn as the scorer replayed it: the model's calls with each one's result and status
    (`envs.Outcome`), and the ground truth's calls (as BFCL writes them) with their results."""

    calls: tuple[dict[str, Any], ...]
    results: tuple[str, ...]
    statuses: tuple[str, ...]
    expected: tuple[str, ...]
    expected_results: tuple[str, ...]


@dataclass(frozen=True)
class MultiTurnCheck:
    """The verdict on a multi-turn answer. `reason` ("" when correct): unreadable_answer (not a
    record of turns), replay_failed (the replay ran out of time or memory), or BFCL's first broken
    check: empty_turn, state_mismatch, response_mismatch. `turn` is the failing turn's index;
    `turns` the turns replayed, up to that one."""

    correct: bool
    reason: str = ""
    detail: str = ""
    turn: int | None = None
    turns: tuple[TurnReplay, ...] = ()


def expected_calls(instance: Instance) -> list[list[str]]:
    """The ground truth in the target: per turn, the calls as BFCL writes them."""
    try:
        expected = json.loads(instance.target)
    except ValueError:
        expected = None
    if not isinstance(expected, list) or not all(isinstance(t, list) and all(isinstance(c, str) for c in t)
                                                 for t in expected):
        raise ConfigError(f"instance {instance.id!r}: the bfcl_multi_turn target must be a JSON list of turns, "
                          "each a list of calls", hint='e.g. [["cd(folder=\'docs\')"], ["ls()"]]')
    return expected


def read_turns(answer: str) -> list[list[Any]] | None:
    """The calls of each turn in a harness's answer ({"turns": [{"calls": [...]}, ...]}, a turn may
    also be a bare list of calls), as {"name", "arguments", "positional"} objects; anything else in
    a call (its recorded result) is dropped. None when the answer is not such a record."""
    if not isinstance(answer, str) or len(answer) > MAX_ANSWER:
        return None
    try:
        data = json.loads(answer)
    except (ValueError, RecursionError):
        return None
    turns = data.get("turns") if isinstance(data, dict) else None
    if not isinstance(turns, list):
        return None
    out: list[list[Any]] = []
    for turn in turns:
        calls = turn.get("calls") if isinstance(turn, dict) else turn
        if not isinstance(calls, list):
            return None
        out.append([{k: c[k] for k in ("name", "arguments", "positional") if k in c} if isinstance(c, dict) else c
                    for c in calls])
    return out


def score_multi_turn(answer: str, instance: Instance) -> MultiTurnCheck:
    """The verdict on a harness's answer for a multi-turn instance: its recorded calls replayed
    beside the ground truth in the target, on the involved classes of `fields`."""
    fields = instance.fields
    classes = fields.get("involved_classes")
    if not isinstance(classes, list) or not all(c in CLASS_MODULES for c in classes):
        raise ConfigError(f"instance {instance.id!r} has no fields['involved_classes'] for the bfcl_multi_turn scorer",
                          hint=f"name some of {', '.join(CLASS_MODULES)}")
    written = expected_calls(instance)
    expected = [[_ground_truth_call(text, instance) for text in turn] for turn in written]
    got = read_turns(answer)
    if got is None:
        return MultiTurnCheck(False, "unreadable_answer", "the answer is not a JSON record of turns "
                                                          '({"turns": [{"calls": [...]}, ...]})')
    folder = env_source_dir()
    if not folder.is_dir():
        raise ConfigError(f"BFCL's environments are not at {folder}", hint=FETCH_HINT)
    request = {"folder": str(folder), "classes": classes, "initial_config": fields.get("initial_config") or {},
               "expected": expected, "got": got}
    reply = replayer().check(request)
    if reply is None:
        return MultiTurnCheck(False, "replay_failed", f"replaying the calls took more than {replayer().timeout_s:g}s "
                                                      f"or {replayer().memory_mb} MB")
    if "error" in reply:
        raise ConfigError(f"instance {instance.id!r}: BFCL's environments could not be replayed: {reply['error']}",
                          hint=f"{FETCH_HINT}; the environments need `mpmath` (scripts/setup.sh installs it)")
    turns = tuple(TurnReplay(calls=tuple(got[i]) if i < len(got) else (), results=tuple(t["results"]),
                             statuses=tuple(t["statuses"]), expected=tuple(written[i]),
                             expected_results=tuple(t["expected_results"]))
                  for i, t in enumerate(reply["turns"]))
    return MultiTurnCheck(bool(reply["valid"]), reply["reason"], reply["detail"], reply["turn"], turns)


def _ground_truth_call(text: str, instance: Instance) -> dict[str, Any]:
    calls = parse_calls(text)
    if calls is None or len(calls) != 1:
        raise ConfigError(f"instance {instance.id!r}: the ground-truth call {text!r} is not one call")
    return json.loads(json.dumps(calls[0]))  # tuples as lists: the model's calls reach the replay through JSON too


# ---------------------------------------------------------------- the replay process

class Replayer:
    """A child process running `envs.py --serve`: the scorer's replays run there, one at a time,
    under a memory limit and an alarm of their own. It starts on first use and again after it
    dies; a replay that outlasts `timeout_s` (the child's alarm, then a kill from here) or its
    memory gives None, a failed instance rather than a stuck engine."""

    def __init__(self, *, timeout_s: float = 20.0, memory_mb: int = 1024) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._lock = threading.Lock()

    def check(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """`envs.check(**request)` in the child: its reply, or None when the child did not answer."""
        line = (json.dumps({"check": request}, ensure_ascii=False) + "\n").encode()
        with self._lock:
            for _ in range(2):  # a child that died since the last request is replaced once
                proc = self._started()
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(line)
                    proc.stdin.flush()
                    break
                except OSError:
                    self._stop()
            else:
                return None
            reply = self._read(time.monotonic() + self.timeout_s + 5.0)
            if reply is None:
                self._stop()
            return reply

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        # -I: no user site or environment variables; -B: no bytecode written beside BFCL's files.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(ENVS_FILE), "--serve", "--memory-mb", str(self.memory_mb),
             "--seconds", str(max(1, round(self.timeout_s)))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"},
            start_new_session=True)
        hello = self._read(time.monotonic() + 60.0)
        if not hello or not hello.get("ready"):
            code = self._proc.poll()
            self._stop()
            raise ConfigError(f"the BFCL replay process did not start (exit code {code})",
                              hint=f"run `{sys.executable} {ENVS_FILE} --serve` to see why; `mpmath` must be installed")
        return self._proc

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """One JSON line from the child, None on EOF or when `deadline` passes."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return None
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def _stop(self) -> None:
        proc, self._proc, self._pending = self._proc, None, b""
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        with self._lock:
            self._stop()


_replayer: Replayer | None = None
_replayer_lock = threading.Lock()


def replayer() -> Replayer:
    """This process's replay child (one per engine process; closed at exit)."""
    global _replayer
    with _replayer_lock:
        if _replayer is None:
            _replayer = Replayer()
            atexit.register(_replayer.close)
        return _replayer

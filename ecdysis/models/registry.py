"""Model names -> backends. Adding a backend is one module and one entry in `_FACTORIES`.

Names: the embedded `smollm2`, `gemma3-270m` (optional extra), `qwen2.5-coder-0.5b` and
`qwen2.5-coder-1.5b` (assembled at set-up); `openai:NAME` (any OpenAI-compatible server via
OPENAI_BASE_URL), `anthropic:NAME`, `scripted:PATH` (tests)."""

from __future__ import annotations

import threading
from typing import Callable

from ecdysis.errors import ConfigError
from ecdysis.models.base import ModelBackend
from ecdysis.settings import Settings


def _local(name: str, settings: Settings) -> ModelBackend:
    from ecdysis.models.llamacpp import LlamaCppBackend
    return LlamaCppBackend(name, n_threads=settings.n_threads)


def _openai(model: str, settings: Settings) -> ModelBackend:
    if not model:
        raise ConfigError("openai: needs a model name", hint="use --model openai:gpt-4o-mini")
    if not settings.openai_api_key and not settings.openai_base_url:
        raise ConfigError("OPENAI_API_KEY is not set",
                          hint="export OPENAI_API_KEY=... , or OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 "
                               "for a local OpenAI-compatible server")
    from ecdysis.models.openai_backend import OpenAIBackend
    from ecdysis.models.retry import with_retries
    backend = OpenAIBackend(model, base_url=settings.openai_base_url, api_key=settings.openai_api_key,
                            timeout_s=settings.model_timeout_s, max_concurrency=settings.openai_concurrency)
    return with_retries(backend, max_retries=settings.max_retries)


def _anthropic(model: str, settings: Settings) -> ModelBackend:
    if not model:
        raise ConfigError("anthropic: needs a model name", hint="use --model anthropic:claude-3-5-haiku-latest")
    if not settings.anthropic_api_key:
        raise ConfigError("ANTHROPIC_API_KEY is not set", hint="export ANTHROPIC_API_KEY=...")
    from ecdysis.models.anthropic_backend import AnthropicBackend
    from ecdysis.models.retry import with_retries
    backend = AnthropicBackend(model, base_url=settings.anthropic_base_url,
                               api_key=settings.anthropic_api_key, timeout_s=settings.model_timeout_s,
                               max_concurrency=settings.anthropic_concurrency)
    return with_retries(backend, max_retries=settings.max_retries)


def _scripted(path: str, settings: Settings) -> ModelBackend:
    from ecdysis.models.scripted import ScriptedBackend
    return ScriptedBackend.from_file(path, model_id=f"scripted:{path}")


_FACTORIES: dict[str, Callable[[str, Settings], ModelBackend]] = {
    "openai": _openai,
    "anthropic": _anthropic,
    "scripted": _scripted,
}
LOCAL_NAMES = ("qwen2.5-coder-0.5b", "smollm2", "qwen2.5-coder-1.5b", "gemma3-270m")

_cache: dict[str, ModelBackend] = {}
_cache_lock = threading.Lock()


def create_backend(name: str, settings: Settings | None = None) -> ModelBackend:
    settings = settings or Settings.from_env()
    if name in LOCAL_NAMES:
        return _local(name, settings)
    prefix, sep, rest = name.partition(":")
    factory = _FACTORIES.get(prefix) if sep else None
    if factory is None:
        raise ConfigError(f"unknown model {name!r}",
                          hint=f"use {', '.join(LOCAL_NAMES)}, openai:NAME, anthropic:NAME or scripted:PATH")
    return factory(rest, settings)


def get_backend(name: str, settings: Settings | None = None) -> ModelBackend:
    """A shared backend per name in this process, so a loaded model is loaded once."""
    with _cache_lock:
        if name not in _cache:
            _cache[name] = create_backend(name, settings)
        return _cache[name]


def register_backend(backend: ModelBackend) -> None:
    """Make an already built backend (e.g. a scripted one in a test) resolvable by its model_id."""
    with _cache_lock:
        _cache[backend.model_id] = backend


def forget_backends(*, keep_local: bool = False) -> None:
    """Close and forget resolved backends; with `keep_local`, the embedded models stay loaded
    (loading one takes seconds, and tests share them)."""
    with _cache_lock:
        for name in [n for n in _cache if not (keep_local and n in LOCAL_NAMES)]:
            _cache.pop(name).close()

"""The executor seam: where the instances of a batch run — threads of this process (`local`, the
default) or workers of a Ray cluster (`ray`). The runner keeps the bookkeeping (what is left, the
events, the summary); an executor only runs instances and stores their results.

Adding an executor is one module and one line in `_FACTORIES`."""

from __future__ import annotations

from typing import Callable

from ecdysis.errors import ConfigError
from ecdysis.settings import Settings

from ecdysis.executors.base import Batch, Executor, OnResult, ShouldStop

__all__ = ["Batch", "Executor", "OnResult", "ShouldStop", "create_executor", "executor_names"]


def _local(settings: Settings, database_url: str | None) -> Executor:
    from ecdysis.executors.local import LocalExecutor
    return LocalExecutor()


def _ray(settings: Settings, database_url: str | None) -> Executor:
    from ecdysis.executors.ray_executor import RayExecutor
    return RayExecutor(settings, database_url=database_url or settings.database_url)


_FACTORIES: dict[str, Callable[[Settings, "str | None"], Executor]] = {
    "local": _local,
    "ray": _ray,
}


def executor_names() -> list[str]:
    return list(_FACTORIES)


def create_executor(name: str | None, settings: Settings, *, database_url: str | None = None) -> Executor:
    """The executor called `name` (None: the `executor` setting). `database_url` is where
    workers in other processes open the store (default: the `database_url` setting)."""
    chosen = (name or settings.executor or "local").strip().lower()
    factory = _FACTORIES.get(chosen)
    if factory is None:
        raise ConfigError(f"unknown executor {chosen!r}",
                          hint=f"use {' or '.join(_FACTORIES)} (--executor or ECDYSIS_EXECUTOR)")
    return factory(settings, database_url)

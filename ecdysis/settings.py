"""One `Settings` object read from the environment; `ecdysis settings` shows it (keys masked).

Keys are read here and handed to backends in memory only: they are never stored, logged or
exported, and the harness sandbox gets a scrubbed environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        from ecdysis.errors import ConfigError
        raise ConfigError(f"{name}={raw!r} is not a whole number", hint=f"unset {name} or give an integer")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        from ecdysis.errors import ConfigError
        raise ConfigError(f"{name}={raw!r} is not a number", hint=f"unset {name} or give a number")


def cache_dir(env: str, *parts: str) -> Path:
    """A machine-wide folder outside the clone: `$env` if set, else ~/.cache/ecdysis/PARTS (or
    under XDG_CACHE_HOME). For what is fetched or shared once per machine, not once per checkout."""
    configured = os.environ.get(env)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").joinpath("ecdysis", *parts)


def _env_names(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = os.environ.get(name)
    names = tuple(dict.fromkeys(n.strip() for n in (raw or "").split(",") if n.strip()))
    return names or default


def _env_positive(name: str, default: float) -> float:
    value = _env_float(name, default)
    if not value > 0 or value == float("inf"):
        from ecdysis.errors import ConfigError
        raise ConfigError(f"{name}={os.environ.get(name)!r} must be a positive number of seconds",
                          hint=f"unset {name} (default {default:g}) or give a number above 0")
    return value


# "scheme://user:password@host" -> "scheme://***@host": credentials in a URL never reach a screen,
# a log line or a stored error.
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s'\"<>]+@")


def redact_credentials(text: str) -> str:
    """`text` with the user and password of every URL in it replaced by ***."""
    return _URL_CREDENTIALS.sub(r"\1***@", text) if "@" in text else text


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    instance_timeout_s: float
    instance_memory_mb: int
    model_timeout_s: float
    max_retries: int
    default_model: str
    # The two-model batch of the app and `evolve`: the subject first, then a second model whose
    # passes and failures on the same instances are the cross-model evidence for attribution.
    default_models: tuple[str, ...] = ("qwen2.5-coder-0.5b", "smollm2")
    openai_base_url: str | None = field(default=None, repr=False)
    openai_api_key: str | None = field(default=None, repr=False)
    anthropic_base_url: str | None = field(default=None, repr=False)
    anthropic_api_key: str | None = field(default=None, repr=False)
    bigbench_dir: Path | None = None
    bfcl_dir: Path | None = None
    n_threads: int = 2
    sandbox: str = "auto"   # auto | bwrap | process: how harness code is contained (ecdysis.sandbox)
    openai_concurrency: int = 64
    anthropic_concurrency: int = 16
    executor: str = "local"
    ray_address: str | None = None
    ray_workers: int = 0
    lease_ttl_s: float = 60.0   # a lease not renewed for this long is free (ecdysis.leases)

    @staticmethod
    def from_env() -> "Settings":
        home = Path(os.environ.get("ECDYSIS_HOME") or Path.cwd() / "data").expanduser().resolve()
        db = os.environ.get("ECDYSIS_DATABASE_URL") or f"sqlite:///{home / 'ecdysis.db'}"
        bb = os.environ.get("ECDYSIS_BIGBENCH_DIR")
        bfcl = os.environ.get("ECDYSIS_BFCL_DIR")
        return Settings(
            home=home,
            database_url=db,
            instance_timeout_s=_env_positive("ECDYSIS_INSTANCE_TIMEOUT", 120.0),
            instance_memory_mb=_env_int("ECDYSIS_INSTANCE_MEMORY_MB", 1024),
            model_timeout_s=_env_positive("ECDYSIS_MODEL_TIMEOUT", 60.0),
            max_retries=_env_int("ECDYSIS_MAX_RETRIES", 4),
            default_model=os.environ.get("ECDYSIS_MODEL") or "qwen2.5-coder-0.5b",
            default_models=_env_names("ECDYSIS_MODELS", ("qwen2.5-coder-0.5b", "smollm2")),
            openai_base_url=os.environ.get("OPENAI_BASE_URL"),
            openai_api_key=os.environ.get("OPENAI_API_KEY"),
            anthropic_base_url=os.environ.get("ANTHROPIC_BASE_URL"),
            anthropic_api_key=os.environ.get("ANTHROPIC_API_KEY"),
            bigbench_dir=Path(bb).expanduser() if bb else None,
            bfcl_dir=Path(bfcl).expanduser() if bfcl else None,
            n_threads=_env_int("ECDYSIS_THREADS", min(4, os.cpu_count() or 2)),
            sandbox=os.environ.get("ECDYSIS_SANDBOX") or "auto",
            openai_concurrency=max(1, _env_int("ECDYSIS_OPENAI_CONCURRENCY", 64)),
            anthropic_concurrency=max(1, _env_int("ECDYSIS_ANTHROPIC_CONCURRENCY", 16)),
            executor=os.environ.get("ECDYSIS_EXECUTOR") or "local",
            ray_address=os.environ.get("ECDYSIS_RAY_ADDRESS") or None,
            ray_workers=max(0, _env_int("ECDYSIS_RAY_WORKERS", 0)),
            lease_ttl_s=_env_positive("ECDYSIS_LEASE_TTL", 60.0),
        )

    def public(self) -> dict[str, str]:
        """Every setting as text, secrets masked, for `ecdysis settings` and the UI."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("api_key"):
                value = "set" if value else "not set"
            elif isinstance(value, tuple):
                value = ",".join(value)
            elif isinstance(value, str):
                value = redact_credentials(value)
            out[f.name] = "" if value is None else str(value)
        return out


# Names of environment variables that must never reach harness code.
SECRET_ENV_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "DATABASE_URL", "CREDENTIAL")

"""What a harness sandbox is given and gives back: its limits, the paths inside the box, the
scrubbed environment, and the outcome of one solve."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


# The harness API (also an exported zip's run.py) and the sandbox side that loads it (harness_box.py).
RUNTIME = Path(__file__).resolve().parent.parent / "harness_runtime.py"
HARNESS_BOX = Path(__file__).resolve().parent / "harness_box.py"

# Inside the bwrap sandbox: where those two files, the worker folder and HOME are.
BOX_RUNTIME = "/opt/ecdysis/harness_runtime.py"
BOX_HARNESS_BOX = "/opt/ecdysis/harness_box.py"
BOX_WORK = "/sandbox"
BOX_HOME = "/tmp"
# A root engine runs each worker's harness code as its own uid from this range (no passwd entry
# needed), so RLIMIT_NPROC, which the kernel never enforces for root, counts one worker's processes.
SANDBOX_UID_BASE = 1_600_000_000
SANDBOX_UID_SPAN = 1 << 24
# The few files of /etc that Python and the C library read; the rest of /etc stays out.
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120.0   # harness time per instance, not counting time spent in model calls
    memory_mb: int = 1024
    file_mb: int = 16
    cpu_s: int = 3600          # per worker process, a backstop behind the wall-clock timeout
    output_tail: int = 4000    # characters of what the harness printed that are kept
    processes: int = 32        # RLIMIT_NPROC of the harness (threads count too): stops a fork bomb
    tmp_mb: int = 64           # size of the private /tmp (and HOME) tmpfs under bwrap
    isolation: str | None = None  # auto | bwrap | process; None: the ECDYSIS_SANDBOX setting


@dataclass
class SolveOutcome:
    answer: str | None
    error_type: str | None = None       # exception | timeout | memory | crash | bad_output
    error_message: str | None = None
    output_tail: str = ""
    traceback: str = ""
    model_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# The model handler gets the request the harness sent and returns the reply dict to send back.
ModelHandler = Callable[[dict[str, Any]], dict[str, Any]]


def scrubbed_env(home: str) -> dict[str, str]:
    """No inherited variables at all: keys, tokens and database URLs cannot reach harness code."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}

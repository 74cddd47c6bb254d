"""Runs harness code isolated from the engine: a separate process per worker with memory, file
size, CPU and process limits, a wall-clock timeout per instance, a scrubbed environment and a temp
folder. Model calls come back to the engine over the pipe, so the harness holds no key and no database.

Where bubblewrap works (`bwrap`, Debian package `bubblewrap`), each worker also runs in its own
mount, PID, network, IPC and UTS namespaces: only the system and Python folders are visible
(read-only), and the source of BFCL's multi-turn environments when fetched (read-only: harnesses
run calls in them); the data folder is not mounted at all, /tmp and HOME are a private tmpfs, the
harness folder is the only writable host folder, there is no network (not even the host's loopback), and an
engine running as root runs harness code as an unprivileged uid of its own, so the process limit
holds. `isolation()` says which boundary this machine gets; without bwrap it is a plain child process
(rlimits and a scrubbed environment only), recorded as a note on every run.

A harness that raises, hangs, exhausts memory, forks or dies costs one failed instance, never the run.
"""

from ecdysis.sandbox.boundary import Isolation, isolation
from ecdysis.sandbox.limits import BOX_WORK, RUNTIME, SandboxLimits, SolveOutcome, scrubbed_env
from ecdysis.sandbox.pool import HarnessWorker, WorkerPool

__all__ = ["BOX_WORK", "RUNTIME", "HarnessWorker", "Isolation", "SandboxLimits", "SolveOutcome", "WorkerPool",
           "isolation", "scrubbed_env"]

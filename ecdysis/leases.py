"""Exactly one executor per run, evolution and diagnosis: a lease in the store (owner, heartbeat,
expiry) taken before the work starts, renewed by a daemon thread while it runs, released at the
end. A second executor is refused with one line naming the holder; a holder that crashed stops
renewing, its lease lapses after `Settings.lease_ttl_s`, and a resume then takes it over.

Expiry compares wall clocks: processes on several machines sharing PostgreSQL need their clocks
in step to within a fraction of the lease time (NTP does that)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from types import TracebackType

from ecdysis.store import Lease, Store


def run_key(run_id: str) -> str:
    return f"run:{run_id}"


def evolution_key(evolution_id: str) -> str:
    return f"evolution:{evolution_id}"


def diagnosis_key(run_ids: list[str]) -> str:
    """One diagnosis at a time over the same runs (a second would store a duplicate)."""
    return "diagnosis:" + ",".join(sorted(set(run_ids)))


def owner_name(role: str = "") -> str:
    """Who holds a lease, as the refusal names it: the process, the machine, and a token so that
    two threads of one process (the app's job manager) are two owners."""
    return f"{_this_process()}{' (' + role + ')' if role else ''} #{uuid.uuid4().hex[:6]}"


def _this_process() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def held_here(owner: str) -> bool:
    """Whether a lease's owner (as `owner_name` wrote it) is this process: the app's own jobs hold
    their runs under it, and a page must not call its own work "running elsewhere"."""
    here = _this_process()
    return owner == here or owner.startswith(here + " ")


class Held:
    """A lease held for a `with` block: taken on entry (raises `Conflict` naming the holder),
    renewed every third of its time, released on exit. `lost` turns True if a renewal found that
    another executor took it over (this process stalled past the expiry); the work should stop."""

    def __init__(self, store: Store, key: str, *, ttl_s: float, role: str = "") -> None:
        self.store = store
        self.key = key
        self.ttl_s = ttl_s
        self.owner = owner_name(role)
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Held:
        self.lease: Lease = self.store.acquire_lease(self.key, self.owner, self.ttl_s)
        self._thread = threading.Thread(target=self._beat, name=f"ecd-lease-{self.key}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.store.release_lease(self.key, self.owner)
        except Exception:  # the store gone: the lease lapses by itself; never hide the real error
            pass

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.store.renew_lease(self.key, self.owner, self.ttl_s):
                    self.lost = True
                    return
            except Exception:  # a database hiccup: try again next beat, the lease has time left
                continue
            except BaseException:  # the process is going down: stop beating, quietly
                return

"""What a harness reference names, for every face that takes one (`--harness`, the app's pickers):
a stored version id or a unique prefix of one, `starter`, `starter-agent`, a harness folder on
disk or an exported zip (both stored on use), or nothing (the starter that fits the suite).

Its own module because it spans both sides of the format: the folder and the starters
(`ecdysis.harness`) and the zip (`ecdysis.export`), which builds on `harness`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ecdysis.errors import NotFound
from ecdysis.export import import_zip
from ecdysis.harness import calls_functions, ensure_starter, ensure_starter_agent, new_version, read_dir
from ecdysis.store import HarnessVersion, Store


def resolve(store: Store, ref: str | None, *, suite: Any = None) -> HarnessVersion:
    """A version id (or unique prefix), `starter`, `starter-agent`, or a harness folder on disk
    (stored on use). No ref: the starter that fits `suite` (the agent harness for function calls)."""
    if ref in (None, ""):
        return ensure_starter_agent(store) if calls_functions(suite) else ensure_starter(store)
    if ref == "starter":
        return ensure_starter(store)
    if ref == "starter-agent":
        return ensure_starter_agent(store)
    assert ref is not None
    path = Path(ref)
    if path.is_dir():
        files = read_dir(path)
        version = new_version(files, parent=None, note=f"from folder {path.name}", status="imported")
        return store.get_harness(version.id) or store.put_harness(version)
    if path.suffix == ".zip" and path.exists():
        return import_zip(store, path)
    exact = store.get_harness(ref)
    if exact:
        return exact
    matches = [v for v in store.list_harnesses() if v.id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise NotFound(f"harness version prefix {ref!r} is ambiguous",
                       hint="give more characters: " + ", ".join(v.id for v in matches[:5]))
    raise NotFound(f"no harness version {ref!r}", hint="`ecdysis harnesses` lists them; or give a folder")

"""What every repair operator shares: its input and result, the protocol it follows, and the
helpers that edit harness files (a marked code block, a [params] entry). The text-answer catalogue
(`roles.operators`) and the agent catalogue (`roles.agent_operators`) are both built on these."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from ecdysis.aggregate import Cluster
from ecdysis.roles.base import Exemplar, ModificationSpec

MARK = "# --- ecdysis operator: {name} ---"


@dataclass(frozen=True)
class RepairInput:
    """What an operator sees: the current files, the cluster it repairs, the sanctioned exemplars,
    and the Investigator's root cause (quoted in the spec)."""

    files: Mapping[str, str]
    cluster: Cluster
    exemplars: Sequence[Exemplar] = ()
    root_cause: str = ""


@dataclass(frozen=True)
class RepairResult:
    operator: str
    files: dict[str, str]
    spec: ModificationSpec


class RepairOperator(Protocol):
    """A generic repair. `present(files)` says whether it is already in the harness;
    `unavailable(inp)` gives the reason it cannot apply (None when it can); `apply(inp)` returns
    the spec and the full new file set."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    def present(self, files: Mapping[str, str]) -> bool: ...

    def unavailable(self, inp: RepairInput) -> str | None: ...

    def apply(self, inp: RepairInput) -> RepairResult: ...


# ---------------------------------------------------------------- file editing helpers

def marker(name: str) -> str:
    return MARK.format(name=name)


def set_param(toml_text: str, key: str, value: str, comment: str) -> str:
    """harness.toml with `key = value  # comment` in [params] (replaced or added), all else kept."""
    lines = toml_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "[params]"), None)
    entry = f"{key} = {value}  # {comment}"
    if start is None:
        return toml_text.rstrip("\n") + f"\n\n[params]\n{entry}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    for i in range(start + 1, end):
        if re.match(rf"\s*{re.escape(key)}\s*=", lines[i]):
            lines[i] = entry
            break
    else:
        insert_at = end
        while insert_at > start + 1 and not lines[insert_at - 1].strip():
            insert_at -= 1
        lines.insert(insert_at, entry)
    out = "\n".join(lines) + "\n"
    tomllib.loads(out)  # an operator must never write a harness.toml that does not parse
    return out


def params_of(files: Mapping[str, str]) -> dict[str, Any]:
    try:
        return dict(tomllib.loads(files.get("harness.toml", "")).get("params", {}))
    except tomllib.TOMLDecodeError:
        return {}


def defines(code: str, name: str) -> bool:
    return re.search(rf"^def {name}\(", code, re.M) is not None


def cluster_scope(cluster: Cluster) -> str:
    cats = ", ".join(cluster.categories)
    models = ", ".join(cluster.models)
    return (f"The cluster spans {len(cluster.instances)} instances in {len(cluster.categories)} categories "
            f"({cats}) and {len(cluster.models)} model(s) ({models})")


@dataclass(frozen=True)
class CodeRepair:
    """Base for repairs that append a marked block to harness.py rebinding the functions it
    builds on (`needs`, the first of them the one it wraps): present when its marker is there,
    unavailable when harness.py does not define one of them at the top level."""

    name: str = ""
    title: str = ""
    needs: tuple[str, ...] = ("solve",)

    def present(self, files: Mapping[str, str]) -> bool:
        return marker(self.name) in files.get("harness.py", "")

    def unavailable(self, inp: RepairInput) -> str | None:
        code = inp.files.get("harness.py", "")
        for function in self.needs:
            if not defines(code, function):
                return f"harness.py defines no top-level {function}() to build on"
        return None


"""A Proposer's output made into harness files: explicit files, else find-and-replace edits, else
the named catalogue operator applied to the case's harness (its own spec filling what the output
leaves out). What cannot become files is a `ProposalError`, which the roles answer with a revision."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ecdysis.roles.base import CaseFile, Draft, ModificationSpec
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.repairs import RepairInput


class ProposalError(ValueError):
    """A Proposer output that cannot become harness files (unknown operator, edit that misses)."""


def _apply_edits(files: dict[str, str], edits: Sequence[Mapping[str, str]]) -> dict[str, str]:
    out = dict(files)
    for edit in edits:
        path, find, replace = str(edit["path"]), str(edit["find"]), str(edit["replace"])
        if path not in out:
            if find:
                raise ProposalError(f"edit targets {path}, which the harness does not have")
            out[path] = replace  # an empty `find` on a new path creates the file
            continue
        count = out[path].count(find) if find else 0
        if count != 1:
            raise ProposalError(f"edit on {path}: the text to find occurs {count} times (it must occur once)")
        out[path] = out[path].replace(find, replace, 1)
    return out


def repair_input(case: CaseFile) -> RepairInput:
    """What a catalogue operator sees of this case: its harness, cluster, exemplars and the
    Investigator's root cause."""
    return RepairInput(case.files, case.cluster, case.exemplars, str((case.investigation or {}).get("root_cause", "")))


def closed_operators(case: CaseFile) -> dict[str, str]:
    """Catalogue operators a draft of this case may not name, each with the reason: already in
    the harness, ruled out on it by an earlier iteration (`CaseFile.ruled_out`), or unable to apply
    to the cluster. The novelty check refuses the first two and `materialize` the third, so an LLM
    Proposer is never offered them: each such draft cost a Critic's turn and a revision round."""
    inp = repair_input(case)
    out: dict[str, str] = {}
    for name, op in OPERATORS.items():
        if op.present(case.files):
            out[name] = "already present in the harness"
        elif name in case.ruled_out:
            out[name] = f"{case.ruled_out[name]} on this harness"
        elif (why := op.unavailable(inp)):
            out[name] = f"cannot apply: {why}"
    return out


def materialize(output: Mapping[str, Any], case: CaseFile) -> Draft:
    """Turn a schema-valid Proposer output into a `Draft`: explicit `files` win, then `edits`, then
    the named catalogue `operator` (whose own spec fills any field the output leaves out)."""
    from ecdysis.harness import check_name

    spec_data = dict(output.get("spec") or {})
    name = output.get("operator")
    files = dict(case.files)
    if output.get("files"):
        for path, text in dict(output["files"]).items():
            files[check_name(str(path))] = str(text)
    elif output.get("edits"):
        files = _apply_edits(files, list(output["edits"]))
    elif name:
        op = OPERATORS.get(str(name))
        if op is None:
            raise ProposalError(f"unknown operator {name!r}; the catalogue has {', '.join(OPERATORS)}")
        inp = repair_input(case)
        reason = op.unavailable(inp)
        if reason:
            raise ProposalError(f"operator {name} cannot apply: {reason}")
        result = op.apply(inp)
        files = result.files
        spec_data = {**result.spec.to_json(), **{k: v for k, v in spec_data.items() if v}}
        spec_data["exemplars"] = list(result.spec.exemplars)
    else:
        raise ProposalError("the proposal names no operator and gives no edits or files")
    spec_data["operator"] = str(name) if name else None
    return Draft(spec=ModificationSpec.from_json(spec_data), files=files,
                 replies=[str(r) for r in output.get("replies") or []])

"""Per-file harness diffs: computed and applied with diff-match-patch, shown as unified text.

A proposal's patch is the diff from its base harness version; it applies to another version only
if every diff-match-patch hunk applies (fuzzy matching could otherwise apply half a patch).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from diff_match_patch import diff_match_patch

from ecdysis.records import from_fields

Change = str  # "modified" | "added" | "deleted"


def patcher() -> diff_match_patch:
    """The one diff-match-patch set-up every diff in the product uses (engine and app)."""
    dmp = diff_match_patch()
    dmp.Diff_Timeout = 2.0
    return dmp


@dataclass(frozen=True)
class FileDiff:
    """One changed file: the diff-match-patch patch text (what applies) and the unified diff
    (what a reviewer reads). `old`/`new` are None for an added/deleted file."""

    path: str
    change: Change
    patch: str
    unified: str
    old: str | None = None
    new: str | None = None

    def added_lines(self) -> list[str]:
        """Lines the change introduces (the text leakage checks look at)."""
        return [line[1:] for line in self.unified.splitlines()
                if line.startswith("+") and not line.startswith("+++")]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "FileDiff":
        return from_fields(FileDiff, data)


@dataclass
class ApplyResult:
    """The patched files when every hunk of every file applied; otherwise `files` is None and
    `failures` says which file and which hunks did not apply."""

    files: dict[str, str] | None
    hunk_flags: dict[str, list[bool]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.files is not None and not self.failures


def unified_text(path: str, old: str | None, new: str | None) -> str:
    before = (old or "").splitlines(keepends=True)
    after = (new or "").splitlines(keepends=True)
    # A missing final newline would glue two lines together in the unified text.
    before = [line if line.endswith("\n") else line + "\n" for line in before]
    after = [line if line.endswith("\n") else line + "\n" for line in after]
    source = f"a/{path}" if old is not None else "/dev/null"
    target = f"b/{path}" if new is not None else "/dev/null"
    return "".join(difflib.unified_diff(before, after, fromfile=source, tofile=target))


def diff_file(path: str, old: str | None, new: str | None) -> FileDiff:
    dmp = patcher()
    patches = dmp.patch_make(old or "", new or "")
    change: Change = "added" if old is None else ("deleted" if new is None else "modified")
    return FileDiff(path=path, change=change, patch=dmp.patch_toText(patches),
                    unified=unified_text(path, old, new), old=old, new=new)


def diff_files(old: Mapping[str, str], new: Mapping[str, str]) -> list[FileDiff]:
    """One `FileDiff` per file that differs, in path order."""
    diffs: list[FileDiff] = []
    for path in sorted(set(old) | set(new)):
        before, after = old.get(path), new.get(path)
        if before != after:
            diffs.append(diff_file(path, before, after))
    return diffs


def apply_diffs(files: Mapping[str, str], diffs: list[FileDiff]) -> ApplyResult:
    """Apply every diff to `files`; all or nothing."""
    dmp = patcher()
    out = dict(files)
    result = ApplyResult(files=None)
    for d in diffs:
        if d.change == "added" and d.path in out:
            result.failures.append(f"{d.path}: added by the patch but already exists")
            continue
        if d.change != "added" and d.path not in out:
            result.failures.append(f"{d.path}: the patch changes it but the harness has no such file")
            continue
        text, flags = dmp.patch_apply(dmp.patch_fromText(d.patch), out.get(d.path, ""))
        result.hunk_flags[d.path] = list(flags)
        if not all(flags):
            failed = [i + 1 for i, ok in enumerate(flags) if not ok]
            result.failures.append(f"{d.path}: hunk(s) {failed} of {len(flags)} do not apply")
            continue
        if d.change == "deleted":
            if text.strip():
                result.failures.append(f"{d.path}: deleting it would discard text the patch does not know")
                continue
            out.pop(d.path, None)
        else:
            out[d.path] = text
    if not result.failures:
        result.files = out
    return result


def render_html(d: FileDiff) -> str:
    """A character-level HTML rendering (diff-match-patch's pretty HTML) for the UI's diff view."""
    dmp = patcher()
    diffs = dmp.diff_main(d.old or "", d.new or "")
    dmp.diff_cleanupSemantic(diffs)
    return dmp.diff_prettyHtml(diffs)

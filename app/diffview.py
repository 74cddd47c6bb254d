"""Diff rendering for review: side-by-side and inline HTML from diff-match-patch (line diff, then
character highlights inside changed lines), long unchanged stretches folded. Pure text in, HTML out."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable

from ecdysis.diffs import patcher

CONTEXT_LINES = 3
_STYLE = """<style>
.ecd-diff{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;line-height:1.45;
 border:1px solid #e3e0da;border-radius:6px;overflow:hidden;width:100%;border-collapse:collapse;table-layout:fixed}
.ecd-diff td{padding:0 6px;vertical-align:top;white-space:pre-wrap;word-break:break-word}
.ecd-diff td.n{width:3.2em;color:#9a968c;text-align:right;user-select:none;background:#faf9f7}
.ecd-diff tr.fold td{background:#f3f1ed;color:#7b766c;font-style:italic;text-align:center;padding:2px}
.ecd-diff td.del{background:#fbe9eb}.ecd-diff td.add{background:#e6f4ec}
.ecd-diff del{background:#f3b8bf;text-decoration:none}.ecd-diff ins{background:#a9dcbd;text-decoration:none}
.ecd-diff td.empty{background:#f6f5f2}
.ecd-diff td.sign{width:1.2em;color:#7b766c;user-select:none}
.ecd-diff tbody.ecd-hidden{display:none}
.ecd-diff tbody.ecd-fold:has(input:checked)+tbody.ecd-hidden{display:table-row-group}
.ecd-diff tr.fold label{cursor:pointer;display:block}
.ecd-diff tr.fold input{position:absolute;opacity:0;pointer-events:none}
.ecd-diff tr.fold .hide,.ecd-diff tbody.ecd-fold:has(input:checked) .show{display:none}
.ecd-diff tbody.ecd-fold:has(input:checked) .hide{display:inline}
</style>"""


@dataclass(frozen=True)
class Row:
    """One aligned line pair; `kind` is equal | change | delete | insert | fold. A fold row
    carries the unchanged rows it stands for, so the reader can unfold them in place."""

    kind: str
    old_no: int | None = None
    old: str = ""
    new_no: int | None = None
    new: str = ""
    hidden: tuple["Row", ...] = ()

    @property
    def folded(self) -> int:
        return len(self.hidden)


def line_diff(old: str, new: str) -> list[tuple[int, list[str]]]:
    """diff-match-patch in line mode: (op, lines) with op -1 delete, 0 equal, 1 insert."""
    dmp = patcher()
    # A missing final newline would make the last line differ from itself.
    old, new = (t if not t or t.endswith("\n") else t + "\n" for t in (old, new))
    a, b, table = dmp.diff_linesToChars(old, new)
    diffs = dmp.diff_main(a, b, False)
    dmp.diff_charsToLines(diffs, table)
    return [(op, text.splitlines()) for op, text in diffs if text]


def align(old: str, new: str) -> list[Row]:
    """Line pairs for a side-by-side view: a deletion followed by an insertion is paired line by
    line as changes; the rest stand alone."""
    rows: list[Row] = []
    o = n = 1
    ops = line_diff(old, new)
    i = 0
    while i < len(ops):
        op, lines = ops[i]
        if op == 0:
            rows += [Row("equal", o + k, line, n + k, line) for k, line in enumerate(lines)]
            o, n = o + len(lines), n + len(lines)
        elif op == -1 and i + 1 < len(ops) and ops[i + 1][0] == 1:
            added = ops[i + 1][1]
            for k in range(max(len(lines), len(added))):
                left, right = k < len(lines), k < len(added)
                kind = "change" if left and right else ("delete" if left else "insert")
                rows.append(Row(kind, o + k if left else None, lines[k] if left else "",
                                n + k if right else None, added[k] if right else ""))
            o, n = o + len(lines), n + len(added)
            i += 1
        elif op == -1:
            rows += [Row("delete", o + k, line) for k, line in enumerate(lines)]
            o += len(lines)
        else:
            rows += [Row("insert", None, "", n + k, line) for k, line in enumerate(lines)]
            n += len(lines)
        i += 1
    return rows


def fold(rows: list[Row], context: int = CONTEXT_LINES) -> list[Row]:
    """Keep `context` unchanged lines around each change; fold longer unchanged runs into one row."""
    changed = [i for i, r in enumerate(rows) if r.kind != "equal"]
    if not changed:
        return [Row("fold", hidden=tuple(rows))] if rows else []
    keep = {j for i in changed for j in range(i - context, i + context + 1)}
    out: list[Row] = []
    hidden: list[Row] = []
    for i, r in enumerate(rows):
        if i in keep:
            if hidden:
                out.append(Row("fold", hidden=tuple(hidden)))
                hidden = []
            out.append(r)
        else:
            hidden.append(r)
    if hidden:
        out.append(Row("fold", hidden=tuple(hidden)))
    return out


def _marked(old: str, new: str) -> tuple[str, str]:
    """HTML for a changed line pair with character-level <del>/<ins> highlights."""
    dmp = patcher()
    diffs = dmp.diff_main(old, new)
    dmp.diff_cleanupSemantic(diffs)
    left, right = [], []
    for op, text in diffs:
        esc = html.escape(text)
        if op == 0:
            left.append(esc)
            right.append(esc)
        elif op == -1:
            left.append(f"<del>{esc}</del>")
        else:
            right.append(f"<ins>{esc}</ins>")
    return "".join(left), "".join(right)


def _fold_row(hidden: int, columns: int) -> str:
    plural = "s" if hidden != 1 else ""
    return (f'<tr class="fold"><td colspan="{columns}"><label><input type="checkbox">⋯ {hidden} unchanged '
            f'line{plural} <span class="show">· show</span><span class="hide">· hide</span></label></td></tr>')


def _folded(r: Row, columns: int, render: Callable[[Row], str]) -> str:
    """A fold row in its own table section, followed by the section of the lines it hides; the
    checkbox in the fold row shows them (CSS only: `st.html` runs no script)."""
    return (f'</tbody><tbody class="ecd-fold">{_fold_row(r.folded, columns)}</tbody>'
            f'<tbody class="ecd-hidden">{"".join(render(h) for h in r.hidden)}</tbody><tbody>')


def _num(value: int | None) -> str:
    return "" if value is None else str(value)


def _side_row(r: Row) -> str:
    if r.kind == "fold":
        return _folded(r, 4, _side_row)
    if r.kind == "change":
        left, right = _marked(r.old, r.new)
    else:
        left, right = html.escape(r.old), html.escape(r.new)
    lcls = {"equal": "", "change": "del", "delete": "del", "insert": "empty"}[r.kind]
    rcls = {"equal": "", "change": "add", "delete": "empty", "insert": "add"}[r.kind]
    return (f'<tr><td class="n">{_num(r.old_no)}</td><td class="{lcls}">{left}</td>'
            f'<td class="n">{_num(r.new_no)}</td><td class="{rcls}">{right}</td></tr>')


def side_by_side_html(old: str | None, new: str | None, context: int = CONTEXT_LINES) -> str:
    rows = fold(align(old or "", new or ""), context)
    body = "".join(_side_row(r) for r in rows)
    cols = '<colgroup><col style="width:3.2em"><col><col style="width:3.2em"><col></colgroup>'
    return f'{_STYLE}<table class="ecd-diff">{cols}<tbody>{body}</tbody></table>'


def _inline_rows(r: Row) -> list[str]:
    if r.kind == "fold":
        return [_folded(r, 3, lambda h: "".join(_inline_rows(h)))]
    if r.kind == "equal":
        return [f'<tr><td class="n">{_num(r.new_no)}</td><td class="sign"> </td><td>{html.escape(r.new)}</td></tr>']
    left, right = _marked(r.old, r.new) if r.kind == "change" else (html.escape(r.old), html.escape(r.new))
    out = []
    if r.kind in ("change", "delete"):
        out.append(f'<tr><td class="n">{_num(r.old_no)}</td><td class="sign del">−</td>'
                   f'<td class="del">{left}</td></tr>')
    if r.kind in ("change", "insert"):
        out.append(f'<tr><td class="n">{_num(r.new_no)}</td><td class="sign add">+</td>'
                   f'<td class="add">{right}</td></tr>')
    return out


def inline_html(old: str | None, new: str | None, context: int = CONTEXT_LINES) -> str:
    rows = fold(align(old or "", new or ""), context)
    body = "".join(line for r in rows for line in _inline_rows(r))
    cols = '<colgroup><col style="width:3.2em"><col style="width:1.2em"><col></colgroup>'
    return f'{_STYLE}<table class="ecd-diff">{cols}<tbody>{body}</tbody></table>'


def stats(old: str | None, new: str | None) -> tuple[int, int]:
    """(lines added, lines removed), for a file's header."""
    added = removed = 0
    for op, lines in line_diff(old or "", new or ""):
        if op == 1:
            added += len(lines)
        elif op == -1:
            removed += len(lines)
    return added, removed

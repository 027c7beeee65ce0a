"""Building and applying fixes.

Rules describe repairs with the helpers below; each returns a :class:`~torchlint.findings.Fix`
made of text edits computed from libcst node positions, so the rest of the file (formatting,
comments) is untouched.  :func:`apply_fixes` applies non-overlapping edits; the engine re-lints
and repeats (bounded) until nothing more can be fixed.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from .findings import Edit, Fix, Position


def _line_text(mm, line: int) -> str:
    lines = mm.text.splitlines(True)
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _indent_of(mm, line: int) -> str:
    t = _line_text(mm, line)
    return t[: len(t) - len(t.lstrip(" \t"))]


def _eol(mm) -> str:
    return "\r\n" if "\r\n" in mm.text[:10000] else "\n"


def _indent_unit(mm) -> str:
    for ln in mm.text.splitlines():
        s = ln[: len(ln) - len(ln.lstrip(" \t"))]
        if s:
            return s if s.startswith("\t") else " " * min(len(s), 4)
    return "    "


def insert_before_stmt(mm, op, code: str, message: str, applicability: str) -> Optional[Fix]:
    stmt = op.stmt if op.stmt is not None else op.node
    line = mm.span_of(stmt)[0]
    ind = _indent_of(mm, line)
    return Fix(message, (Edit(Position(line, 0), Position(line, 0), f"{ind}{code}{_eol(mm)}"),), applicability)


def insert_first_in_loop(mm, loop, code: str, message: str, applicability: str) -> Optional[Fix]:
    body = loop.node.body
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        return None
    first = body.body[0]
    line = mm.span_of(first)[0]
    ind = _indent_of(mm, line)
    return Fix(message, (Edit(Position(line, 0), Position(line, 0), f"{ind}{code}{_eol(mm)}"),), applicability)


def insert_before_loop_or_stmt(mm, fn, op, code: str, message: str, applicability: str) -> Optional[Fix]:
    """Before the outermost loop around ``op`` inside ``fn`` (or before ``op``'s statement)."""
    loop = op.loop
    while loop is not None and loop.parent is not None:
        loop = loop.parent
    target = loop.node if loop is not None else (op.stmt or op.node)
    # step out of a `with torch.no_grad():` that wraps the loop directly
    line = mm.span_of(target)[0]
    ind = _indent_of(mm, line)
    return Fix(message, (Edit(Position(line, 0), Position(line, 0), f"{ind}{code}{_eol(mm)}"),), applicability)


def wrap_in_with(mm, stmt_node, ctx: str, message: str, applicability: str) -> Optional[Fix]:
    if "torch" not in mm.imports.names:
        return None
    sl, _, el, ec = mm.span_of(stmt_node)
    lines = mm.text.splitlines(True)
    ind = _indent_of(mm, sl)
    unit = _indent_unit(mm)
    block = lines[sl - 1: el]
    new = [f"{ind}with {ctx}:{_eol(mm)}"]
    for ln in block:
        new.append(unit + ln if ln.strip() else ln)
    end_line = el + 1
    return Fix(message, (Edit(Position(sl, 0), Position(end_line, 0), "".join(new)),), applicability)


def replace_node(mm, node, new_code: str, message: str, applicability: str) -> Fix:
    sl, sc, el, ec = mm.span_of(node)
    return Fix(message, (Edit(Position(sl, sc), Position(el, ec), new_code),), applicability)


def add_keyword(mm, call: cst.Call, kw: str, message: str, applicability: str) -> Fix:
    """Append ``kw`` (e.g. ``shuffle=True``) to a call's arguments."""
    sl, sc, el, ec = mm.span_of(call)
    # insert before the closing parenthesis
    text = mm.code_for(call)
    inner = text[text.index("(") + 1: -1] if "(" in text else ""
    sep = "" if not inner.strip() else (", " if not inner.rstrip().endswith(",") else " ")
    pos = Position(el, ec - 1)
    return Fix(message, (Edit(pos, pos, f"{sep}{kw}"),), applicability)


# ------------------------------------------------------------------ applying
def _offset_table(text: str):
    starts = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            starts.append(i + 1)
    return starts


def apply_fixes(text: str, fixes) -> tuple[str, int]:
    """Apply fixes whose edits do not overlap earlier ones; returns (text, fixes applied)."""
    starts = _offset_table(text)

    def off(p: Position) -> int:
        if p.line - 1 >= len(starts):
            return len(text)
        return min(starts[p.line - 1] + p.column, len(text))

    taken: list[tuple[int, int]] = []
    chosen = []
    applied = 0
    for fix in fixes:
        spans = [(off(e.start), off(e.end), e.content) for e in fix.edits]
        if any(_overlap(a, b, s, t) for a, b, _ in spans for s, t in taken):
            continue
        taken.extend((a, b) for a, b, _ in spans)
        chosen.extend(spans)
        applied += 1
    out = text
    for a, b, content in sorted(chosen, key=lambda x: (x[0], x[1]), reverse=True):
        out = out[:a] + content + out[b:]
    return out, applied


def _overlap(a: int, b: int, s: int, t: int) -> bool:
    if a == b and s == t:
        return a == s
    if a == b:
        return s < a < t
    if s == t:
        return a < s < b
    return a < t and s < b

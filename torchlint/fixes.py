"""Building and applying fixes.

Rules describe repairs with the helpers below; each returns a :class:`~torchlint.findings.Fix`
made of text edits computed from libcst node positions, so the rest of the file (formatting,
comments) is untouched.  :func:`apply_fixes` applies non-overlapping edits; the engine re-lints
and repeats (bounded) until nothing more can be fixed.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .findings import Edit, Fix, Position


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def split_lines(text: str) -> list:
    """Lines with their endings, split the way libcst counts lines (\\r\\n, \\r, \\n only)."""
    return _LINE.findall(text)


def _line_text(mm, line: int) -> str:
    lines = getattr(mm, "_fix_lines", None)
    if lines is None:
        lines = split_lines(mm.text)
        try:
            mm._fix_lines = lines
        except AttributeError:  # pragma: no cover - slotted models
            pass
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


def _above_comments(mm, stmt, line: int) -> int:
    """The first line of the comment block directly above ``stmt`` (its ``leading_lines``).

    Code inserted "before a statement" goes above the comments that describe it, so the
    comment stays attached to its statement.
    """
    for el in reversed(list(getattr(stmt, "leading_lines", ()) or ())):
        if getattr(el, "comment", None) is None or line <= 1:
            break
        line -= 1
    return line


def _insert_before(mm, stmt, code: str, message: str, applicability: str) -> Fix:
    first = mm.span_of(stmt)[0]
    ind = _indent_of(mm, first)
    line = _above_comments(mm, stmt, first)
    return Fix(message, (Edit(Position(line, 0), Position(line, 0), f"{ind}{code}{_eol(mm)}"),), applicability)


def insert_before_stmt(mm, op, code: str, message: str, applicability: str) -> Optional[Fix]:
    stmt = getattr(op, "stmt", None) or getattr(op, "node", None) or op
    return _insert_before(mm, stmt, code, message, applicability)


def insert_first_in_loop(mm, loop, code: str, message: str, applicability: str) -> Optional[Fix]:
    body = loop.node.body
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        return None
    return _insert_before(mm, body.body[0], code, message, applicability)


def _holds(mm, outer, inner) -> bool:
    """``inner``'s start lies within ``outer`` (libcst nodes)."""
    sl, sc, el, ec = mm.span_of(outer)
    return (sl, sc) <= mm.span_of(inner)[:2] <= (el, ec)


def insert_in_loop_after(mm, loop, op, code: str, message: str, applicability: str, undone_by=()) -> Optional[Fix]:
    """``code`` in ``loop`` (around ``op``) where none of the ``undone_by`` nodes (what would
    undo it, e.g. calls that switch the model to eval mode) runs between it and ``op``: at the
    start of the loop when none of them runs before ``op`` in an iteration; else before the
    statement of the loop's body that holds ``op``, or inside it when that statement runs one
    of them before ``op`` itself (a nested loop; otherwise right before ``op``'s statement)."""
    at = mm.span_of(op.node)[:2]
    pending = [n for n in undone_by if _holds(mm, loop.node, n) and mm.span_of(n)[:2] < at]
    if not pending:
        return insert_first_in_loop(mm, loop, code, message + " at the start of the loop", applicability)
    body = loop.node.body
    stmt = next((s for s in getattr(body, "body", ()) if _holds(mm, s, op.node)), None)
    if stmt is None:
        return None
    if not any(_holds(mm, stmt, n) for n in pending):
        return _insert_before(mm, stmt, code, message + " before the training step", applicability)
    inner = op.loop
    while inner is not None and inner.node is not stmt:
        inner = inner.parent
    if inner is not None:
        return insert_in_loop_after(mm, inner, op, code, message, applicability, undone_by)
    return _insert_before(mm, op.stmt or op.node, code, message + " before the training step", applicability)


def insert_before_loop_or_stmt(mm, fn, op, code: str, message: str, applicability: str,
                               undone_by=()) -> Optional[Fix]:
    """Before the outermost loop around ``op`` inside ``fn`` (or before ``op``'s statement),
    but inside any loop that also runs one of the ``undone_by`` nodes (what would undo the
    inserted code, e.g. the ``model.train()`` at the top of the epoch loop) or trains: the
    code goes where ``op`` runs, after what undoes it."""
    from .model.queries import trains

    def stays_outside(loop) -> bool:
        return not trains(mm, loop.body) and not any(_holds(mm, loop.node, n) for n in undone_by)

    loop = op.loop
    if loop is not None and not stays_outside(loop):
        loop = None  # it would be undone before each evaluation: right before it instead
    while loop is not None and loop.parent is not None and stays_outside(loop.parent):
        loop = loop.parent
    target = loop.node if loop is not None else (op.stmt or op.node)
    return _insert_before(mm, target, code, message, applicability)


def _string_interior_lines(mm) -> set:
    """Lines that start inside a multi-line string (re-indenting them would change the string)."""
    cached = getattr(mm, "_fix_string_lines", None)
    if cached is not None:
        return cached
    import io
    import tokenize

    out: set = set()
    text = mm.text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.start[0] < tok.end[0] and tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
                if tok.type == tokenize.STRING or tokenize.tok_name.get(tok.type, "").startswith("FSTRING"):
                    out.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    try:
        mm._fix_string_lines = out
    except AttributeError:  # pragma: no cover
        pass
    return out


def torch_spelling(mm, dotted_name: str) -> Optional[str]:
    """How ``torch.x.y`` is spelled in this module (``torch.no_grad``, ``T.no_grad``, ``no_grad``)."""
    names = getattr(getattr(mm, "imports", None), "names", {}) or {}
    if names.get("torch") == "torch" or ("torch" in names and names["torch"] == "torch"):
        return dotted_name
    for local, qual in names.items():
        if qual == dotted_name:
            return local
    for local, qual in names.items():
        if qual == "torch":
            return local + dotted_name[len("torch"):]
    if "torch" in names:
        return dotted_name
    return None


def wrap_in_with(mm, stmt_node, ctx: str, message: str, applicability: str) -> Optional[Fix]:
    """Wrap a compound statement (a loop) in ``with ctx:``, re-indenting its lines.

    ``ctx`` is written with the ``torch.`` prefix (``torch.no_grad()``) and respelled for the
    module's imports; lines inside multi-line strings keep their indentation.
    """
    if ctx.startswith("torch."):
        head, paren, rest = ctx.partition("(")
        spelled = torch_spelling(mm, head)
        if spelled is None:
            return None
        ctx = spelled + paren + rest
    sl, _, el, ec = mm.span_of(stmt_node)
    ind = _indent_of(mm, sl)
    unit = None
    body = getattr(stmt_node, "body", None)
    if isinstance(body, cst.IndentedBlock) and body.body:
        inner = _indent_of(mm, mm.span_of(body.body[0])[0])
        if inner.startswith(ind) and len(inner) > len(ind):
            unit = inner[len(ind):]
    if unit is None:
        unit = _indent_unit(mm)
    skip = _string_interior_lines(mm)
    new = [f"{ind}with {ctx}:{_eol(mm)}"]
    for ln in range(sl, el + 1):
        text = _line_text(mm, ln)
        new.append(unit + text if text.strip() and ln not in skip else text)
    if new and not new[-1].endswith(("\n", "\r")):
        new[-1] += _eol(mm)
    return Fix(message, (Edit(Position(sl, 0), Position(el + 1, 0), "".join(new)),), applicability)


def replace_node(mm, node, new_code: str, message: str, applicability: str) -> Fix:
    sl, sc, el, ec = mm.span_of(node)
    return Fix(message, (Edit(Position(sl, sc), Position(el, ec), new_code),), applicability)


def add_keyword(mm, call: cst.Call, kw: str, message: str, applicability: str) -> Fix:
    """Append ``kw`` (e.g. ``shuffle=True``) to a call's arguments.

    Inserted right after the last argument's value, so a trailing comma, a comment or a
    closing parenthesis on its own line stay where they are.
    """
    if call.args:
        _, _, el, ec = mm.span_of(call.args[-1].value)
        pos = Position(el, ec)
        return Fix(message, (Edit(pos, pos, f", {kw}"),), applicability)
    sl, sc, el, ec = mm.span_of(call)
    pos = Position(el, ec - 1)
    return Fix(message, (Edit(pos, pos, kw),), applicability)


def _line_has_eol(mm, line: int) -> bool:
    return _line_text(mm, line).endswith(("\n", "\r"))


def _insert_line(mm, line: int, ind: str, code: str) -> Edit:
    """An edit inserting ``ind + code`` as a new line before line ``line`` (past the end: appended)."""
    n = len(split_lines(mm.text))
    if line > n:
        prefix = "" if n == 0 or _line_has_eol(mm, n) else _eol(mm)
        pos = Position(n + 1, 0) if prefix == "" else Position(n, len(_line_text(mm, n)))
        return Edit(pos, pos, f"{prefix}{ind}{code}{_eol(mm)}")
    return Edit(Position(line, 0), Position(line, 0), f"{ind}{code}{_eol(mm)}")


def simple_statement(op) -> Optional[cst.SimpleStatementLine]:
    """The statement line of ``op`` when it holds nothing but ``op`` (an expression statement).

    Fixes that move or delete a call only do so when this is true: ``a(); b()`` or
    ``if x: b()`` are left alone.
    """
    stmt = getattr(op, "stmt", None)
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Expr) and small.value is op.node:
        return stmt
    return None


def statement_code(mm, stmt) -> Optional[str]:
    """The source of a one-line statement without its indentation and line ending."""
    sl, sc, el, ec = mm.span_of(stmt)
    if sl != el:
        return None
    return _line_text(mm, sl)[sc:].rstrip("\r\n").rstrip()


def delete_statement_edit(mm, stmt) -> Edit:
    """Remove the whole lines of ``stmt`` (with their trailing comment)."""
    sl, _, el, _ = mm.span_of(stmt)
    return Edit(Position(sl, 0), Position(el + 1, 0), "")


def insert_after_stmt(mm, op_or_stmt, code: str, message: str, applicability: str) -> Optional[Fix]:
    """Insert ``code`` on a new line after a statement, at the statement's indentation."""
    stmt = getattr(op_or_stmt, "stmt", None) or getattr(op_or_stmt, "node", None) or op_or_stmt
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    sl, _, el, _ = mm.span_of(stmt)
    return Fix(message, (_insert_line(mm, el + 1, _indent_of(mm, sl), code),), applicability)


def move_statement(mm, stmt, anchor, message: str, applicability: str, after: bool = False) -> Optional[Fix]:
    """Move a one-line statement before (or after) the statement ``anchor``.

    The moved line takes ``anchor``'s indentation and keeps its trailing comment.
    """
    code = statement_code(mm, stmt)
    if code is None or not isinstance(anchor, cst.CSTNode) or anchor is stmt:
        return None
    asl, _, ael, _ = mm.span_of(anchor)
    ind = _indent_of(mm, asl)
    line = ael + 1 if after else _above_comments(mm, anchor, asl)
    sl, _, el, _ = mm.span_of(stmt)
    if sl <= line <= el + 1 and (line == sl or line == el + 1):
        return None  # already there
    return Fix(message, (delete_statement_edit(mm, stmt), _insert_line(mm, line, ind, code)), applicability)


def move_lines(mm, stmt, anchor, message: str, applicability: str, after: bool = False) -> Optional[Fix]:
    """Move the statement ``stmt`` (its lines, the comment block directly above it included)
    before the statement ``anchor`` (above its comments) or right after it, re-indented to
    ``anchor``'s indentation; ``None`` when a line of ``stmt`` cannot be re-indented (a
    continuation line left of the statement, a multi-line string)."""
    sl, _, el, _ = mm.span_of(stmt)
    first = _above_comments(mm, stmt, sl)
    asl, _, ael, _ = mm.span_of(anchor)
    ind, new_ind = _indent_of(mm, sl), _indent_of(mm, asl)
    line = ael + 1 if after else _above_comments(mm, anchor, asl)
    if first <= line <= el + 1:
        return None  # already there, or inside itself
    skip = _string_interior_lines(mm)
    out = []
    for ln in range(first, el + 1):
        text = _line_text(mm, ln)
        if ind != new_ind:
            if ln in skip or not text.startswith(ind):
                return None
            text = new_ind + text[len(ind):]
        out.append(text if text.endswith(("\n", "\r")) else text + _eol(mm))
    pos = Position(line, 0)
    if line > len(split_lines(mm.text)):
        return None
    return Fix(message, (Edit(Position(first, 0), Position(el + 1, 0), ""), Edit(pos, pos, "".join(out))),
               applicability)


def enclosing_statements(root, stmt) -> Optional[list]:
    """The compound statements of ``root`` around ``stmt``, outermost first (``None`` when
    ``stmt`` is not under ``root``)."""
    stack = [(root, ())]
    while stack:
        n, path = stack.pop()
        if n is stmt:
            return list(path[1:])
        if isinstance(n, (cst.SimpleStatementLine, cst.BaseExpression)):
            continue
        inner = path + (n,) if isinstance(n, cst.BaseCompoundStatement) or n is root else path
        stack.extend((c, inner) for c in n.children)
    return None


def statement_block(root, stmt) -> Optional[list]:
    """The statement list (a block's ``body``) under ``root`` that holds ``stmt`` itself."""
    stack = [root]
    while stack:
        n = stack.pop()
        body = getattr(n, "body", None)
        if isinstance(body, (list, tuple)) and any(s is stmt for s in body):
            return list(body)
        if isinstance(n, (cst.SimpleStatementLine, cst.BaseExpression)):
            continue  # no blocks inside
        stack.extend(n.children)
    return None


def move_after_sibling(mm, root, stmts, holds, message: str, applicability: str,
                       kinds=(cst.SimpleStatementLine, cst.With)) -> Optional[Fix]:
    """Move the one-line statements ``stmts`` (consecutive, in one block of ``root``) after the
    later statement of the same block that holds the node ``holds``; only when that statement
    is one of ``kinds`` (a loop or a branch around ``holds`` would change how often the moved
    code runs)."""
    block = statement_block(root, stmts[0])
    if block is None:
        return None
    i = next(k for k, s in enumerate(block) if s is stmts[0])
    if [id(s) for s in block[i:i + len(stmts)]] != [id(s) for s in stmts]:
        return None
    anchor = next((s for s in block[i + len(stmts):] if _holds(mm, s, holds)), None)
    if anchor is None or not isinstance(anchor, kinds):
        return None
    codes = [statement_code(mm, s) for s in stmts]
    if any(c is None for c in codes):
        return None
    ind = _indent_of(mm, mm.span_of(stmts[0])[0])
    el = mm.span_of(anchor)[2]
    eol = _eol(mm)
    edits = [delete_statement_edit(mm, s) for s in stmts]
    edits.append(_insert_line(mm, el + 1, ind, eol.join(ind + c if k else c for k, c in enumerate(codes))))
    return Fix(message, tuple(edits), applicability)


def delete_lines(mm, node, message: str, applicability: str) -> Fix:
    """Remove the whole lines of ``node`` (a statement, a decorator)."""
    return Fix(message, (delete_statement_edit(mm, node),), applicability)


def delete_statement(mm, root, stmt, message: str, applicability: str) -> Optional[Fix]:
    """Remove a one-line statement; ``pass`` takes its place when it is alone in its block."""
    block = statement_block(root, stmt)
    if block is None or statement_code(mm, stmt) is None:
        return None
    if len(block) == 1:
        sl, sc, el, ec = mm.span_of(stmt)
        return Fix(message, (Edit(Position(sl, sc), Position(el, len(_line_text(mm, el).rstrip("\r\n"))), "pass"),),
                   applicability)
    return Fix(message, (delete_statement_edit(mm, stmt),), applicability)


def unwrap_with(mm, with_node, message: str, applicability: str, drop=()) -> Optional[Fix]:
    """Replace a one-item ``with`` statement by its body, dedented one level (without the
    lines of the statements ``drop``)."""
    if not isinstance(with_node, cst.With) or len(with_node.items) != 1 \
            or not isinstance(with_node.body, cst.IndentedBlock) or not with_node.body.body:
        return None
    sl, _, el, _ = mm.span_of(with_node)
    ind = _indent_of(mm, sl)
    first = mm.span_of(with_node.body.body[0])[0]
    inner = _indent_of(mm, first)
    if not inner.startswith(ind) or len(inner) <= len(ind) or first <= sl:
        return None
    unit = inner[len(ind):]
    skip = _string_interior_lines(mm)
    dropped = set()
    for stmt in drop:
        dsl, _, del_, _ = mm.span_of(stmt)
        dropped.update(range(dsl, del_ + 1))
    out = []
    for ln in range(sl + 1, el + 1):
        if ln in dropped:
            continue
        text = _line_text(mm, ln)
        if ln not in skip and text.startswith(ind + unit):
            text = ind + text[len(ind) + len(unit):]
        out.append(text)
    if out and not out[-1].endswith(("\n", "\r")):
        out[-1] += _eol(mm)
    return Fix(message, (Edit(Position(sl, 0), Position(el + 1, 0), "".join(out)),), applicability)


# ------------------------------------------------------------------ applying
def _offset_table(text: str):
    starts = [0]
    for ln in split_lines(text):
        starts.append(starts[-1] + len(ln))
    return starts


def _dominant_eol(text: str) -> str:
    crlf = text.count("\r\n")
    lf = text.count("\n") - crlf
    cr = text.count("\r") - crlf
    if crlf >= lf and crlf >= cr and crlf:
        return "\r\n"
    return "\r" if cr > lf else "\n"


def _normalize_eol(content: str, eol: str) -> str:
    if eol == "\n" or ("\n" not in content and "\r" not in content):
        return content
    return re.sub(r"\r\n|\r|\n", lambda m: eol, content)


def apply_fixes(text: str, fixes) -> tuple[str, int]:
    """Apply fixes whose edits do not overlap earlier ones; returns (text, fixes applied)."""
    out, chosen = apply_fixes_detailed(text, fixes)
    return out, len(chosen)


def apply_fixes_detailed(text: str, fixes) -> tuple[str, list]:
    """Like :func:`apply_fixes`; returns (text, indices of the fixes applied)."""
    starts = _offset_table(text)
    eol = _dominant_eol(text)

    def off(p: Position) -> int:
        if p.line - 1 >= len(starts):
            return len(text)
        return min(starts[p.line - 1] + p.column, len(text))

    taken: list[tuple[int, int]] = []
    chosen = []
    applied = []
    for i, fix in enumerate(fixes):
        spans = [(off(e.start), off(e.end), _normalize_eol(e.content, eol)) for e in fix.edits]
        if any(b < a for a, b, _ in spans):
            continue
        # edits of one fix must not overlap each other either
        if any(_overlap(*spans[j][:2], *spans[k][:2]) for j in range(len(spans)) for k in range(j)):
            continue
        if any(_overlap(a, b, s, t) for a, b, _ in spans for s, t in taken):
            continue
        taken.extend((a, b) for a, b, _ in spans)
        chosen.extend(spans)
        applied.append(i)
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

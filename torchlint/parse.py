"""Parsing a module with libcst, a run of top-level statements at a time.

libcst's native parser builds its own tree of the whole file (tokens, a "deflated" and an
"inflated" tree) before it converts it into Python nodes, so a parse holds several times
the Python tree in memory, and it gets slower per line as files grow (a 4,000-line module
costs more per line than a 400-line one: the working set leaves the CPU caches). Parsing a
large file in pieces of about ``CHUNK_LINES`` lines, each a run of whole top-level
statements, and joining the pieces' statements into one ``Module`` gives the same code, the
same statements and the same nodes, at a fraction of the peak memory and faster.

Where to cut needs no tokenizer of our own: a piece may only begin at a line that starts in
column 0 with code (not a comment, not a closing bracket, not ``else``/``elif``/``except``/
``finally``, not after a decorator) outside any string, and a piece that parses on its own
proves its boundary: a prefix of a file that ends inside a string, a bracket or a backslash
continuation does not parse. A piece that does not parse is joined to the next one and
tried again; a file where that keeps failing (a real syntax error), or whose pieces disagree
on the file's indentation or line ending, is parsed whole, so errors are reported exactly
as libcst reports them for the whole file.

Two kinds of statement are long enough to matter alone, and are split further when they
reach BIG_LINES lines: a table (``op_db: list[OpInfo] = [...]``, ``data = {key: {...}}``),
parsed a group of elements at a time, and a class of hundreds of methods, parsed a group of
members at a time inside ``if 1:`` blocks indented as its real enclosing blocks (so that
relative indentation, comments and footers come out as in the whole file). Lines between
two pieces go where libcst puts them: the comments libcst gives to the footer of the block
before stay with that piece, the others lead the next statement.

The result equals libcst's tree of the whole file (``deep_equals``), which is checked on
every file of the torch source and, with pieces of a few lines, on this repository.
"""

from __future__ import annotations

import re
from typing import Optional

CHUNK_LINES = 50  # a piece is at least this long (a file shorter than twice this is parsed whole)
BIG_LINES = 500  # a statement (or an element) this long is parsed a few of its literal's elements at a time
_MAX_RETRIES = 4  # pieces that fail to parse before the file is parsed whole

# Comments and strings are matched (and skipped) so that a line inside a triple-quoted
# string is never taken for a statement; the last alternative is a line that may begin a
# top-level statement. Loops are "unrolled" (no nested quantifiers) so that a string that
# never ends costs linear time, not exponential.
_STRING = (
    r'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
    r"|'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
    r"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'"
)
_SCAN = re.compile(r"#[^\n]*|" + _STRING + r"|^(?=[^\s#)\]}])(?!(?:else|elif|except|finally)\b)", re.M | re.S)
# Inside one statement: brackets and commas outside strings and comments.
_TOKEN = re.compile(r"#[^\n]*|" + _STRING + r"|[\[\](){},]", re.S)
# What may separate two tokens inside brackets: blanks, newlines, comments, continuations.
_GAP = re.compile(r"(?:[ \t\f]+|\\?\r?\n|#[^\n]*)*")
_DEF_START = re.compile(r"@|(?:async[ \t]+)?def\b|class\b")
_ASSIGNED = re.compile(r"(?<![=<>!:+\-*/%&|^@])=[ \t]*$")


def _cuts(text: str, at_defs: bool = False) -> list:
    """Offsets where a piece of about CHUNK_LINES lines may begin (the first is 0). A
    statement of BIG_LINES lines or more gets a piece of its own (see ``_split_literal`` and
    ``_split_class``). With ``at_defs``, every top-level ``def``, ``class`` and decorated
    statement begins a piece too: where pieces begin then depends on the text around them, not
    on how many lines come before, so an edit leaves the other pieces' text as it was (see
    ``parse_module``'s ``memo``)."""
    cuts = [0]
    line = 1  # line of offset ``pos``
    pos = 0
    start_line = 1  # line where the current piece begins
    prev_at, prev_line = 0, 1  # the last place a statement may begin
    after_decorator = False
    for m in _SCAN.finditer(text):
        if m.end() != m.start():  # a comment or a string
            continue
        at = m.start()
        decorator = text.startswith("@", at)
        if after_decorator:
            after_decorator = decorator
            continue
        after_decorator = decorator
        line += text.count("\n", pos, at)
        pos = at
        if line - prev_line >= BIG_LINES and prev_at > cuts[-1]:
            cuts.append(prev_at)
            start_line = prev_line
        if (line - start_line >= CHUNK_LINES or at_defs and _DEF_START.match(text, at)) and at > cuts[-1]:
            cuts.append(at)
            start_line = line
        prev_at, prev_line = at, line
    if line + text.count("\n", pos) - prev_line >= BIG_LINES and prev_at > cuts[-1]:
        cuts.append(prev_at)
    return cuts


def piece_starts(text: str) -> list:
    """Offsets where the pieces of a parse with a memo may begin (the first is 0): top-level
    statements, outside strings (see ``_cuts``)."""
    return _cuts(text, at_defs=True)


def _split_literal(piece: str):
    """The module of a piece that is one long ``name[: T] = [...]`` or ``= {...}`` statement
    (a table of test cases, tuning data...), its literal parsed CHUNK_LINES lines of elements
    at a time (``_literal``) and joined: the statement's own parse would hold a whole libcst
    tree of it in memory at once. None where the piece is anything else."""
    import libcst as cst

    # the literal opens on the statement's first line, after its ``=``
    found = _open_literal(piece, 0, piece.find("\n"), lambda at: _ASSIGNED.search(piece, 0, at))
    if found is None:
        return None
    try:
        at, close_at, starts = found
        skeleton = cst.parse_module(piece[:at] + "0" + piece[close_at + 1:])
        stmt = skeleton.body[0] if len(skeleton.body) == 1 else None
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not isinstance(small, (cst.Assign, cst.AnnAssign)) or not _is_zero(small.value):
            return None
        value = _literal(piece, at, close_at, starts)
        return skeleton.with_changes(body=[stmt.with_changes(body=[small.with_changes(value=value)])])
    except Exception:  # not a plain list or dict (a comprehension...), or a syntax error:
        return None    # the piece is parsed whole, which reports the error if there is one


def _open_literal(text: str, start: int, end: int, here):
    """The first list, dict or set literal at bracket depth 0 in ``text[start:end]`` whose
    opening bracket ``here(offset)`` accepts: (its bracket, its closing bracket, where its
    elements begin), or None."""
    depth = 0
    for m in _TOKEN.finditer(text, start, end):
        at = m.start()
        ch = text[at]
        if ch in "[{(":
            if depth == 0 and ch != "(" and here(at):
                found = _elements(text, at)
                return None if found is None else (at, *found)
            depth += 1
        elif ch in "]})":
            depth -= 1
    return None


def _elements(text: str, open_at: int):
    """For the bracket at ``open_at``: the offset of its closing bracket and where each of its
    elements begins (past the blanks and comments before it); None if it does not close or
    holds nothing."""
    depth = 0
    commas = []  # offsets just after each comma between the elements
    for m in _TOKEN.finditer(text, open_at):
        ch = text[m.start()]
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth == 0:
                close_at = m.start()
                break
        elif ch == "," and depth == 1:
            commas.append(m.end())
    else:
        return None
    starts = [_GAP.match(text, open_at + 1).end()]
    for c in commas:
        nxt = _GAP.match(text, c).end()
        if nxt < close_at:
            starts.append(nxt)
    if starts[0] >= close_at:
        return None
    return close_at, starts


def _is_zero(node) -> bool:
    import libcst as cst

    return isinstance(node, cst.Integer) and node.value == "0" and not node.lpar


def _literal(text: str, open_at: int, close_at: int, starts: list):
    """The List, Dict or Set node of ``text[open_at:close_at + 1]``, parsed a group of about
    CHUNK_LINES lines of elements at a time; an element of BIG_LINES lines or more that is,
    or maps a key to, a list or dict literal (a nested table) is split the same way."""
    import libcst as cst

    opener, closer = text[open_at], text[close_at]
    tail = "rbracket" if opener == "[" else "rbrace"
    elements = []
    first = last = None
    for i, j in _groups(text, starts + [close_at]):
        begin = open_at + 1 if i == 0 else starts[i]  # the first group keeps the blanks after the bracket
        end = starts[j] if j < len(starts) else close_at
        inner = _nested(text, starts[i], end) if j == i + 1 else None
        if inner is not None:
            o, c, inner_starts = inner
            node = cst.parse_expression(opener + text[begin:o] + "0" + text[c + 1:end] + closer)
            el = node.elements[0]
            if not _is_zero(el.value):
                raise ValueError("not a nested literal")
            got = [el.with_changes(value=_literal(text, o, c, inner_starts))]
        else:
            node = cst.parse_expression(opener + text[begin:end] + closer)
            got = list(node.elements)
        if first is None:
            first = node
        elif type(node) is not type(first):
            raise ValueError("elements of another kind of literal")
        if j < len(starts):  # the blank lines after the group's last comma belong to that comma
            ws = getattr(node, tail).whitespace_before
            got[-1] = got[-1].with_changes(comma=got[-1].comma.with_changes(whitespace_after=ws))
        elements.extend(got)
        last = node
    return first.with_changes(elements=elements, **{tail: getattr(last, tail)})


def _groups(text: str, bounds: list) -> list:
    """Consecutive spans ``bounds[i]..bounds[i + 1]`` gathered into groups of about
    CHUNK_LINES lines, as index pairs ``(i, j)`` (the group runs from ``bounds[i]`` to
    ``bounds[j]``); a span of CHUNK_LINES lines or more is a group of its own (it may be
    split further)."""
    out = []
    i, last = 0, len(bounds) - 1
    while i < last:
        j = i + 1
        while j < last and text.count("\n", bounds[i], bounds[j]) < CHUNK_LINES \
                and text.count("\n", bounds[j], bounds[j + 1]) < CHUNK_LINES:
            j += 1
        out.append((i, j))
        i = j
    return out


def _nested(text: str, start: int, end: int):
    """For the element ``text[start:end]`` (with its comma) of BIG_LINES lines or more that is
    a list or dict literal, or ``key: <literal>``: that literal's bracket, closing bracket
    and element starts; else None."""
    if text.count("\n", start, end) < BIG_LINES:
        return None
    # the element itself, or the value of ``key:``
    found = _open_literal(text, start, end, lambda at: at == start or text[start:at].rstrip().endswith(":"))
    if found is None:
        return None
    at, close_at, starts = found
    rest = _GAP.match(text, close_at + 1).end()
    if text.startswith(",", rest):
        rest = _GAP.match(text, rest + 1).end()
    return (at, close_at, starts) if rest >= end else None


class _NotSplit(Exception):
    pass


# Inside a class: comments, strings, brackets, and the indentation of each line of code.
_LINES = re.compile(r"#[^\n]*|" + _STRING + r"|[\[\](){}]|^([ \t]*)(?=[^\s#)\]}])", re.M | re.S)
_CLAUSE = re.compile(r"(?:else|elif|except|finally)\b")
_NOTHING = re.compile(r"[ \t]*(?:#[^\n]*)?\n")  # a blank or comment-only line


def _split_class(piece: str):
    """The module of a piece that is one long top-level ``class`` statement (a test suite of
    hundreds of methods...), its body parsed CHUNK_LINES lines of members at a time
    (``_class``). None where the piece is anything else."""
    import libcst as cst

    if not re.match(r"(?:@[^\n]*\n)*class\b", piece):  # (a decorator's arguments may span lines:
        return None                                     #  such a class is parsed whole)
    # the class ends where libcst ends it: with the indented comments after its last line
    end = _member_cut(piece, len(piece), 0, "")
    try:
        skeleton, node, (footer,) = _class(piece, 0, end, [])
        if end < len(piece):
            rest = cst.parse_module(piece[end:])
            footer = [*footer, *rest.header, *rest.footer]
        return skeleton.with_changes(body=[node], footer=footer, has_trailing_newline=piece.endswith("\n"))
    except (_NotSplit, cst.ParserSyntaxError):
        return None


def _members(text: str, start: int, end: int, own: str):
    """The indentation of the body of the compound statement ``text[start:end]`` (its own
    lines at indentation ``own``) and the offsets where its statements begin; None if the
    body is not an indented block that reaches to ``end``."""
    depth = 0
    ind = None
    starts = []
    after_decorator = False
    for m in _LINES.finditer(text, start, end):
        g = m.group(1)
        if g is None:
            ch = text[m.start()]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            continue
        if depth:
            continue
        if ind is None:
            if g == own:  # the decorators and the line of the statement itself
                continue
            if len(g) <= len(own) or not g.startswith(own):
                return None
            ind = g
        if g != ind:
            if len(g) < len(ind):
                return None
            continue
        at = m.start() + len(g)
        if _CLAUSE.match(text, at):
            continue
        decorator = text.startswith("@", at)
        if after_decorator:
            after_decorator = decorator
            continue
        after_decorator = decorator
        starts.append(m.start())
    return (ind, starts) if ind is not None and starts else None


def _leading_lines(text: str, at: int, floor: int) -> int:
    """``at`` moved back over the blank and comment lines just above it, not before ``floor``."""
    while at > floor:
        prev = text.rfind("\n", 0, at - 1) + 1
        if prev < floor or not _NOTHING.fullmatch(text, prev, at):
            break
        at = prev
    return at


def _member_cut(text: str, at: int, floor: int, ind: str) -> int:
    """Where the piece of the member statement at ``at`` (indentation ``ind``) begins: before
    the blank and comment lines above it, except those libcst gives to the footer of the
    member before it (up to the last comment indented deeper than ``ind``). Not before
    ``floor``."""
    first = _leading_lines(text, at, floor)
    cut = first
    pos = first
    while pos < at:
        nl = text.index("\n", pos) + 1
        line = text[pos:nl]
        body = line.lstrip(" \t")
        if body.startswith("#") and len(line) - len(body) > len(ind):
            cut = nl
        pos = nl
    return cut


def _risky_tail(text: str) -> bool:
    """Whether ``text`` ends with an indented comment among its last blank and comment lines:
    libcst 1.9 may drop a blank line before such a comment at the end of what it parses
    (``x = 1\\n\\n    # c\\n`` comes back without its blank line), so a piece that ends so
    is checked (its code regenerated) before it is used."""
    end = len(text)
    while end > 0:
        prev = text.rfind("\n", 0, end - 1) + 1
        line = text[prev:end]
        if not _NOTHING.fullmatch(line):
            return False
        if line[:1] in (" ", "\t") and line.lstrip(" \t").startswith("#"):
            return True
        end = prev
    return False


def _wrapped(levels: list, body: str):
    """Parse ``body`` (lines at indentation ``levels[-1]``) inside ``if 1:`` blocks indented
    as the real enclosing blocks are, so every node is built in the context it will live in.
    Return the innermost block's statements and the footers libcst gave to the module and to
    each block, outermost first (what follows the last statement: the caller places them)."""
    import libcst as cst

    outer = ["", *levels[:-1]]
    src = "".join(ind + "if 1:\n" for ind in outer) + body
    module = cst.parse_module(src)
    if _risky_tail(body) and module.code != src:
        raise _NotSplit
    if module.header or len(module.body) != 1:
        raise _NotSplit
    footers = [module.footer]
    node = module.body[0]
    for _ in range(len(levels) - 1):
        footers.append(node.body.footer)
        if len(node.body.body) != 1:
            raise _NotSplit
        node = node.body.body[0]
    footers.append(node.body.footer)
    return list(node.body.body), footers


def _class(text: str, start: int, end: int, levels: list):
    """The class statement ``text[start:end]`` at indentation ``levels[-1]`` (or the top
    level), its header parsed with a ``pass`` for a body, its members a group of about
    CHUNK_LINES lines at a time, and a member class of BIG_LINES lines or more the same way.
    Returns (the module, or the statements, its header was parsed in; the ClassDef; the
    footers of the module and of the enclosing blocks, outermost first, from its last lines)."""
    import libcst as cst

    found = _members(text, start, end, levels[-1] if levels else "")
    if found is None:
        raise _NotSplit
    ind, starts = found
    # the lines between the header and the first member all lead that member
    cuts = [_leading_lines(text, starts[0], start)] + [_member_cut(text, s, start, ind) for s in starts[1:]] + [end]
    groups = [(cuts[i], cuts[j]) for i, j in _groups(text, cuts)]
    head = text[start:cuts[0]] + ind + "pass\n"  # the members replace the ``pass``
    if levels:
        stmts, footers = _wrapped(levels, head)
        skeleton = stmts
    else:
        skeleton = cst.parse_module(head)
        stmts, footers = list(skeleton.body), [skeleton.footer]
    node = stmts[0] if len(stmts) == 1 else None
    if any(footers) or not isinstance(node, cst.ClassDef) or not isinstance(node.body, cst.IndentedBlock) \
            or node.body.footer:
        raise _NotSplit
    members = []
    inner = [*levels, ind]
    for k, (a, b) in enumerate(groups):
        got = None
        if text.count("\n", a, b) >= BIG_LINES:
            at = a
            while (blank := _NOTHING.match(text, at)) is not None:
                at = blank.end()
            if text.startswith(("class ", "@"), at + len(ind)):
                try:
                    _, sub, footers = _class(text, a, b, inner)
                    got = [sub]
                except _NotSplit:
                    got = None
        if got is None:
            got, footers = _wrapped(inner, text[a:b])
        if k < len(groups) - 1 and any(footers):
            raise _NotSplit  # (libcst would have made them leading lines of the next member)
        members.extend(got)
    # the last group's footers: the innermost is this class's, the others its enclosers'
    body = node.body.with_changes(body=members, footer=footers[-1])
    return skeleton, node.with_changes(body=body), footers[:-1]


def _parse_in_pieces(text: str, memo: Optional[dict] = None):
    """``libcst.parse_module(text)``, in pieces for a long file (see the module docstring)."""
    import libcst as cst

    if text.count("\n") < 2 * CHUNK_LINES:
        return cst.parse_module(text)
    cuts = _cuts(text, at_defs=memo is not None)
    if len(cuts) < 2:
        return cst.parse_module(text)
    cuts.append(len(text))
    parts = []
    used = {} if memo is not None else None
    i, retries = 0, 0
    while i < len(cuts) - 1:
        j = i + 1
        while True:
            try:
                piece = text[cuts[i]:cuts[j]]
                # (a piece met twice in one text is parsed twice: a node is in a tree once)
                module = memo.get(piece) if memo is not None and piece not in used else None
                if module is None:
                    if piece.count("\n") >= BIG_LINES and "\r" not in piece:
                        module = _split_literal(piece) or _split_class(piece)
                    module = module or cst.parse_module(piece)
                if j < len(cuts) - 1 and _risky_tail(piece) and module.code != piece:
                    raise _NotSplit  # joined to the next piece, where the comment is not last
                parts.append(module)
                if used is not None:
                    used[piece] = module
                break
            except (cst.ParserSyntaxError, _NotSplit):
                retries += 1
                if j == len(cuts) - 1 or retries > _MAX_RETRIES:
                    return cst.parse_module(text)  # the whole file: libcst's own error
                j += 1
        i = j
    module = _join(parts, memo, used)
    if module is None:
        return cst.parse_module(text)
    if memo is not None:  # the pieces of this text, for the next parse of an edit of it
        memo.clear()
        memo.update(used)
    return module


def parse_module(text: str, memo: Optional[dict] = None):
    """``libcst.parse_module``, in pieces for a long file, without re-validating every node the
    parser builds.

    Each libcst node checks its own fields when constructed (``CSTNode.__post_init__`` ->
    ``_validate``: whitespace regexes, parenthesis balance...). Nodes the parser produces are
    valid by construction, and those checks are ~14% of a parse (libcst's own comment there
    suggests moving them out of parsing). They are switched off for the parse only: nodes built
    later (fixes) are validated as usual.

    Both rely on libcst's internals, so they are used only with the libcst versions they are
    tested with (``TESTED_LIBCST``, the range ``pyproject.toml`` pins); with any other,
    this is plain ``libcst.parse_module``.

    ``memo`` (a dict the caller keeps from one parse of a document to the next: the language
    server) makes the parse of an edited text reuse the pieces whose text the edit left alone:
    pieces then begin at every top-level ``def``/``class`` (``_cuts``), a piece's module is
    taken from the memo when its text is there, and the memo is left holding this text's
    pieces. A piece's module depends on its text alone (a piece is parsed as a file of its own,
    and the pieces before it parsing whole proves it begins at the top level), so the tree is
    the one a parse without memo builds, with the same nodes shared between the two trees
    (libcst's nodes are immutable)."""
    import libcst as cst

    if not _tested_libcst():
        return cst.parse_module(text)
    node_cls = getattr(cst, "CSTNode", None)
    if node_cls is None or "__post_init__" not in node_cls.__dict__:
        return _parse_in_pieces(text, memo)
    if not _POST_INIT:  # libcst's own, remembered before the first swap (threads: see below)
        _POST_INIT.append(node_cls.__dict__["__post_init__"])
    node_cls.__post_init__ = _no_validation
    try:
        return _parse_in_pieces(text, memo)
    finally:
        # always libcst's, never what was installed when this parse began: a parse in another
        # thread that ends first only makes this one validate
        node_cls.__post_init__ = _POST_INIT[0]


def _no_validation(self) -> None:
    return None


# the (major, minor) versions of libcst the pieces and the validation switch are tested with
# (``tests/test_parse.py`` checks that ``pyproject.toml`` pins this range)
TESTED_LIBCST = ((1, 9),)
_TESTED: list = []


def libcst_version() -> tuple:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(x) for x in version("libcst").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return ()


def _tested_libcst() -> bool:
    if not _TESTED:
        _TESTED.append(libcst_version() in TESTED_LIBCST)
    return _TESTED[0]


_POST_INIT: list = []


def _join(parts: list, memo: Optional[dict] = None, used: Optional[dict] = None):
    """One Module of the pieces' statements, or None if the pieces disagree on the
    indentation or the line ending their nodes leave to the module. With a ``memo`` (see
    ``parse_module``), a piece's first statement given the same leading lines as in the last
    parse is the same node as then."""
    import libcst as cst

    first = parts[0]
    indent = None
    body = []
    pending: list = []  # blank lines and comments waiting for the next statement
    for m in parts:
        if m.default_newline != first.default_newline:
            return None
        if any(isinstance(s, cst.BaseCompoundStatement) for s in m.body):
            if indent is None:
                indent = m.default_indent
            elif m.default_indent != indent:
                return None
        stmts = list(m.body)
        lead = pending + list(m.header) if m is not first else []
        if lead:
            if not stmts:
                pending = lead + list(m.footer)
                continue
            key = (id(stmts[0]), tuple(_line_key(ln) for ln in lead)) if memo is not None else None
            got = memo.get(key) if key is not None else None
            if got is not None and got[0] is stmts[0]:
                stmts[0] = got[1]
            else:
                got = (stmts[0], stmts[0].with_changes(leading_lines=[*lead, *stmts[0].leading_lines]))
                stmts[0] = got[1]
            if used is not None:
                used[key] = got
        body.extend(stmts)
        pending = list(m.footer)
    return first.with_changes(body=body, footer=pending, default_indent=indent or first.default_indent,
                              has_trailing_newline=parts[-1].has_trailing_newline)


def _line_key(line) -> tuple:
    """What an ``EmptyLine`` (a blank or comment line) is made of."""
    c = line.comment
    return (line.indent, line.whitespace.value, c.value if c is not None else None, line.newline.value)

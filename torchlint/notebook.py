"""Jupyter notebooks: code cells linted as one program, in cell order, as IPython runs them.

Each code cell is turned into Python the way IPython's input transformers see it, line for
line (a cell keeps its number of lines, so positions map back):

* CRLF line endings are read as Jupyter's editor splits lines (a ``\\`` before ``\\r``
  continues the line);
* the indentation all its lines share is removed (a uniformly indented cell);
* ``%%time``/``%%timeit``/``%%capture``/``%%prun``/``%%debug``/``%%memit`` cells are their body,
  transformed in turn; other cell magics (``%%writefile``, ``%%bash``, ``%%html`` ...) hold
  no Python and are skipped;
* at the start of a logical line (not inside brackets, a string or a ``\\`` continuation)
  ``!cmd``, ``%magic``, ``?obj``, ``obj?``/``obj??`` and IPython's ``/ , ;`` autocall
  escapes become ``pass`` (their ``\\``-continued lines blank); ``%time stmt``,
  ``%timeit stmt``, ``%prun stmt``, ``%memit stmt`` and ``%debug stmt`` become ``stmt``;
  ``x = !cmd`` and ``x = %magic`` become ``x = ...``;
* IPython's automagic: a logical line that starts with the name of a line magic without its
  ``%`` (``pip install diffusers``, ``cd ..``, ``time train(model)``) and is not Python (it
  does not parse on its own) is that magic, transformed as above. A line that parses
  (``pip = 3``, ``ls -la``) is left as Python.

Leading tabs mixed with spaces in a way CPython accepts become spaces at tab size 8 (libcst's
tokenizer rejects some such mixes); a mix CPython rejects is left to be reported.

A cell that still does not parse is reported once (TL001, at its own cell and line) and left
out of the program, so the other cells are linted. Findings carry ``cell`` (1-based, counting
code cells as ruff does) and the line and column inside that cell; line numbers that messages
cite become ``cell N, line M``. :meth:`Notebook.raw_position` maps a cell position to the line
and column of the ``.ipynb`` file (SARIF, GitHub annotations, LSP). Fixes are applied back
into each cell's source (outputs and metadata are kept); a fix that would touch a transformed
line is not offered.
"""
from __future__ import annotations

import ast
import difflib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

# cell magics whose body is Python run in the kernel's namespace
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "memit"})
# line magics whose argument is a Python statement (``%time train(model)``)
_PYTHON_LINE_MAGICS = frozenset({"time", "timeit", "prun", "memit", "debug"})
_ESCAPES = "!%?,;/"  # IPython's escaped commands, at the start of a logical line
_HELP_END = re.compile(r"%{0,2}(?!\d)[\w*]+(?:\.[\w*]+|\[[^\]]*\])*\?{1,2}$")
_CELL_MAGIC = re.compile(r"%%\s*(\w*)")
_LINE_MAGIC_STMT = re.compile(r"%(\w+)[ \t]+(?=\S)")
# line magics and aliases IPython runs without their ``%`` (automagic is on by default)
_AUTOMAGIC = re.compile(
    r"(?:pip|conda|mamba|cd|pwd|ls|ll|env|set_env|load_ext|reload_ext|unload_ext|matplotlib|config"
    r"|who|whos|history|mkdir|rmdir|cat|rm|cp|mv|run|load|store|autoreload|aimport|tensorboard"
    r"|sx|sc|bookmark|pushd|popd|dhist|alias|xmode|pdb|precision|reset|pinfo|pinfo2|psearch|pycat"
    r"|less|more|man|clear|time|timeit|prun|memit|debug)[ \t]+(?=[\w\-./~'\"$])")


class NotebookError(Exception):
    pass


@dataclass
class Notebook:
    path: str
    doc: dict
    code_cells: list  # indices into doc["cells"]
    text: str  # the concatenated program
    # global line (1-based) -> (code cell number 1-based, line in cell 1-based)
    line_map: list = field(default_factory=list)
    # global line (1-based) -> how many columns the cell's line has before the program's
    # text (a uniformly indented cell, ``%time `` in front of a statement)
    offsets: list = field(default_factory=list)
    # global lines (1-based) whose text is not the cell's (magics replaced): no fix edits there
    synthetic: set = field(default_factory=set)
    sources: list = field(default_factory=list)  # each code cell's source text
    cell_text: list = field(default_factory=list)  # each code cell as Python (lines joined)
    raw: str = ""  # the .ipynb file's text
    _raw_index: Optional[dict] = None

    def raw_position(self, cell: int, line: int, column: int):
        """(line 1-based, column 0-based) in the .ipynb file's text of a position inside a code
        cell's source, or None when the file's text cannot be matched to the cell."""
        if self._raw_index is None:
            self._raw_index = _source_tokens(self.raw, [self.doc["cells"][i] for i in self.code_cells])
        tokens = self._raw_index.get(cell)
        if tokens is None or not 1 <= cell <= len(self.sources):
            return None
        src = self.sources[cell - 1]
        lines = src.split("\n")
        if not 1 <= line <= len(lines):
            return None
        index = sum(len(x) + 1 for x in lines[:line - 1]) + min(max(column, 0), len(lines[line - 1]))
        for k, (start, text) in enumerate(tokens):
            if index < len(text) or (index == len(text) and k == len(tokens) - 1):
                off = start + _raw_width(self.raw, start, index)
                nl = self.raw.rfind("\n", 0, off)
                return self.raw.count("\n", 0, off) + 1, off - (nl + 1)
            index -= len(text)
        return None


def _cell_source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


# ------------------------------------------------------------------ IPython's transforms
def _scan(line: str, depth: int, quote: Optional[str]):
    """The state after ``line``: (bracket depth, open string delimiter, ``\\``-continued)."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            i += 1
            continue
        if c == "#":
            return depth, None, False
        if c in "'\"":
            quote = c * 3 if line.startswith(c * 3, i) else c
            i += len(quote)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
        i += 1
    cont = line.endswith("\\")
    if quote is not None and len(quote) == 1 and not cont:
        quote = None  # an unterminated one-line string: Python reports it
    return depth, quote, cont and quote is None


def _assignment_end(code: str) -> int:
    """The index just after the first top-level ``=`` of an assignment in ``code``, or -1."""
    depth, quote, i, n = 0, None, 0, len(code)
    while i < n:
        c = code[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if code.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
        elif c == "#":
            return -1
        elif c in "'\"":
            quote = c * 3 if code.startswith(c * 3, i) else c
            i += len(quote)
            continue
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "=" and depth == 0:
            prev = code[i - 1] if i else ""
            if prev in "=<>!+-*/%&|^@:" or code[i + 1:i + 2] == "=":
                return -1  # a comparison, an augmented assignment or a walrus
            return i + 1
        i += 1
    return -1


def _escaped(line: str):
    """A logical line's IPython syntax as Python: (new text, extra column offset, whether it
    swallows ``\\``-continued lines), or None for plain Python."""
    code = line.lstrip(" \t")
    indent = line[:len(line) - len(code)]
    if not code:
        return None
    if code[0] in _ESCAPES and not (code[0] in ",;/" and not (code[1:2].isalpha() or code[1:2] == "_")):
        m = _LINE_MAGIC_STMT.match(code)
        if m and m.group(1) in _PYTHON_LINE_MAGICS and not code.endswith("\\") and \
                not code[m.end():].startswith("-") and not code.rstrip().endswith("?"):
            return indent + code[m.end():], m.end(), False
        return indent + "pass", None, True
    if code.endswith("?") and _HELP_END.match(code.rstrip()):
        return indent + "pass", None, True
    k = _assignment_end(code)
    if k > 0:
        rest = code[k:].lstrip(" \t")
        if rest[:1] in ("!", "%"):
            return indent + code[:k] + " ...", None, True
    if _AUTOMAGIC.match(code) and not _parses(code):
        new, extra, swallows = _escaped(indent + "%" + code)
        return new, (None if extra is None else extra - 1), swallows
    return None


def _parses(code: str) -> bool:
    try:
        ast.parse(code.rstrip("\\"))
    except (SyntaxError, ValueError):
        return False
    return True


def transform_cell(lines: list):
    """A cell's lines as Python, line for line: (lines, column offsets, synthetic line indices,
    the name of a cell magic that holds no Python or None)."""
    # Jupyter's editor splits lines on CRLF too: a cell saved from Windows runs as LF lines
    # (a ``\\`` before ``\r`` still continues the line); columns before the ``\r`` do not move
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    out = list(lines)
    off = [0] * len(lines)
    synthetic = set()
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        return out, off, synthetic, None
    # IPython removes the indentation all lines share (``textwrap.dedent``)
    margin = os.path.commonprefix([re.match(r"[ \t]*", ln).group(0) for ln in lines if ln.strip(" \t")])
    if margin:
        for i in range(first, len(lines)):
            if lines[i].strip(" \t"):
                out[i] = lines[i][len(margin):]
                off[i] = len(margin)
    cm = _CELL_MAGIC.match(out[first])
    if cm:
        if cm.group(1) not in PYTHON_CELL_MAGICS:
            return [""] * len(lines), [0] * len(lines), set(range(len(lines))), cm.group(1) or "%%"
        body, boff, bsyn, bskip = transform_cell(out[first + 1:])
        if bskip is not None:
            return [""] * len(lines), [0] * len(lines), set(range(len(lines))), bskip
        out[first] = "pass"
        synthetic.add(first)
        for k, (b, o) in enumerate(zip(body, boff)):
            out[first + 1 + k] = b
            off[first + 1 + k] += o
        synthetic |= {first + 1 + k for k in bsyn}
        return out, off, synthetic, None
    depth, quote, cont = 0, None, False
    i = 0
    while i < len(out):
        line = out[i]
        if depth == 0 and quote is None and not cont:
            esc = _escaped(line)
            if esc is not None:
                new, extra, swallows = esc
                out[i] = new
                if extra is None:
                    synthetic.add(i)
                else:
                    off[i] += extra
                if swallows:
                    while line.endswith("\\") and i + 1 < len(out):
                        i += 1
                        line = out[i]
                        out[i] = ""
                        synthetic.add(i)
                i += 1
                continue
        depth, quote, cont = _scan(line, depth, quote)
        i += 1
    _expand_mixed_indentation(out, off)
    return out, off, synthetic, None


def _expand_mixed_indentation(out: list, off: list) -> None:
    """Indentation that mixes tabs and spaces in a way CPython accepts (it compares columns at
    tab size 8 and 1 and runs the cell when both agree) but libcst's tokenizer rejects: the
    tabs of each leading indentation become spaces at tab size 8, as CPython counts them, and
    the column offsets take the shift. A mix CPython rejects (``TabError``) is left alone, so
    the cell is still reported."""
    indents = [ln[:len(ln) - len(ln.lstrip(" \t"))] for ln in out]
    tabbed = [i for i, ind in enumerate(indents) if "\t" in ind]
    if not tabbed or all(" " not in ind for ind in indents):
        return  # no tabs, or tabs only: libcst reads those as CPython does
    try:
        compile("\n".join(out) + "\n", "<cell>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return
    for i in tabbed:
        indent = indents[i]
        code = out[i][len(indent):]
        wide = indent.expandtabs(8)
        out[i] = wide + code
        off[i] -= len(wide) - len(indent)


# ------------------------------------------------------------------ loading
def load(path: str, data: Optional[bytes] = None) -> Notebook:
    try:
        if data is None:
            with open(path, "rb") as fh:
                data = fh.read()
        raw = data.decode("utf-8")
        doc = json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NotebookError(f"{path}: not a readable notebook: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise NotebookError(f"{path}: not a notebook (no `cells` list)")
    lang = (doc.get("metadata", {}).get("language_info", {}) or {}).get("name", "python")
    if lang not in ("python", "", None):
        raise NotebookError(f"{path}: not a Python notebook (language {lang!r})")
    code_cells = [idx for idx, cell in enumerate(doc["cells"])
                  if isinstance(cell, dict) and cell.get("cell_type") == "code"]
    return build(path, doc, code_cells, [_cell_source(doc["cells"][i]) for i in code_cells], raw)


def build(path: str, doc: dict, code_cells: list, sources, raw: str = "") -> Notebook:
    """The notebook whose code cells (``doc["cells"][i]`` for ``i`` in ``code_cells``) have
    the sources ``sources``, as the program IPython runs."""
    nb = Notebook(path, doc, list(code_cells), "", raw=raw)
    parts = []
    for n, src in enumerate(sources, 1):
        nb.sources.append(src)
        lines, off, synthetic, _ = transform_cell(src.split("\n"))
        base = len(parts)
        parts.extend(lines)
        nb.cell_text.append("\n".join(lines) + "\n")
        nb.line_map.extend((n, j) for j in range(1, len(lines) + 1))
        nb.offsets.extend(off)
        nb.synthetic |= {base + k + 1 for k in synthetic}
    nb.text = "\n".join(parts) + "\n"
    return nb


def program(sources) -> tuple:
    """The program the code cells ``sources`` make and its line map: global line (1-based) ->
    (code cell 1-based, line in cell 1-based)."""
    nb = build("", {"cells": []}, [], sources)
    return nb.text, nb.line_map


def sources(nb: Notebook) -> tuple:
    """The code cells' sources, in order."""
    return tuple(nb.sources)


def module_name(path: str) -> str:
    return os.path.basename(path)[:-6].replace("-", "_")


def _cell_lines(nb: Notebook, cell: int) -> range:
    """The global lines (1-based) of a code cell."""
    first = next(i for i, (c, _) in enumerate(nb.line_map, 1) if c == cell)
    n = sum(1 for c, _ in nb.line_map if c == cell)
    return range(first, first + n)


def to_cell(nb: Notebook, line: int) -> tuple:
    if 1 <= line <= len(nb.line_map):
        return nb.line_map[line - 1]
    return (len(nb.code_cells) or 1, 1)


def _column(nb: Notebook, line: int, column: int) -> int:
    return column + (nb.offsets[line - 1] if 1 <= line <= len(nb.offsets) else 0)


# ------------------------------------------------------------------ linting
def lint_notebook(path: str, opts, project, shown: str, data: Optional[bytes] = None):
    from .engine import FileResult

    try:
        nb = load(path, data)
    except NotebookError as exc:
        return FileResult(shown, error=str(exc))
    return lint_cells(nb, opts, project, shown)


def _python_errors(nb: Notebook) -> dict:
    """cell -> (line in cell, column in cell, message) for the cells this Python cannot parse."""
    from .engine import _stdlib_syntax_error

    broken = {}
    for c, text in enumerate(nb.cell_text, 1):
        err = _stdlib_syntax_error(text, "<notebook cell>")  # (a real file name makes CPython read it)
        if err is not None:
            broken[c] = _cell_error(nb, c, *err)
    return broken


def broken_cells(cells) -> set:
    """The code cells (numbers) of the sources ``cells`` that do not parse as Python."""
    return set(_python_errors(build("", {"cells": []}, [], cells)))


def lint_cells(nb: Notebook, opts, project, shown: str, memo=None, exports: bool = True):
    """Lint a notebook's code cells as one program (a cell that does not parse is one TL001
    and is left out); findings in cell positions, in cell order. ``memo`` and ``exports`` are
    ``engine.lint_text``'s (the language server keeps a ``DocumentMemo`` per open notebook)."""
    from .engine import lint_text
    from .findings import Finding, Span
    from .rule import SyntaxErrorRule

    path = nb.path
    broken = _python_errors(nb)
    while True:
        program = _without_cells(nb, broken)
        res = lint_text(path, program, opts, project, module_name=module_name(path), shown=shown, raw=True,
                        memo=memo, exports=exports)
        bad = [f for f in res.findings if f.code == "TL001"]
        if not bad or not 1 <= bad[0].line <= len(nb.line_map):
            break
        # libcst rejects what this Python accepts: find the cells it rejects and leave them out
        # too (its error may be reported in a later cell, after an unclosed bracket)
        newly = _libcst_errors(nb, broken)
        if not newly:
            c, _ = to_cell(nb, bad[0].line)
            if c in broken:
                break
            rel = bad[0].line - _cell_lines(nb, c)[0] + 1
            newly[c] = _cell_error(nb, c, rel, bad[0].column, bad[0].message.replace("syntax error: ", "", 1))
        broken.update(newly)
    findings = list(res.findings)
    to_cells(nb, findings, shown)
    for c, (line, col, msg) in broken.items():
        f = Finding("TL001", SyntaxErrorRule.name, f"syntax error: {msg}", shown, Span.of(line, col, line, col))
        f.cell = c
        findings.append(f)
    findings.sort(key=lambda f: (f.cell or 0, f.line, f.column, f.code, f.message))
    res.findings = findings
    if res.noqa is not None:
        res.noqa = _noqa_to_cells(nb, res.noqa)
    return res  # raw, as ``lint_text``'s: ``engine.select_result`` gives what is reported


def _noqa_to_cells(nb: Notebook, record: dict) -> dict:
    """A ``noqa_record`` of the program in cell positions (the finding's and the fix's
    positions of an unused directive, as ``to_cells`` moves findings)."""
    from .findings import Edit, Fix, Position

    out = []
    for line, start, end, codes, _, keep_start, drop_start, fix_end in record["d"]:
        if not 1 <= line <= len(nb.line_map):
            continue
        cell, cline = to_cell(nb, line)
        starts = []
        for s in (keep_start, drop_start):
            fix = _fix_to_cells(nb, Fix("", (Edit(Position(line, s), Position(line, fix_end), ""),)))
            starts.append(fix.edits[0] if fix is not None and len(fix.edits) == 1 else None)
        if None in starts:
            k = d = e = None
        else:
            k, d, e = starts[0].start.column, starts[1].start.column, starts[0].end.column
        out.append([cline, _column(nb, line, start), _column(nb, line, end), codes, cell, k, d, e])
    return {"exempt": record["exempt"], "d": out}


def _libcst_errors(nb: Notebook, broken) -> dict:
    """The cells (not already ``broken``) that libcst cannot parse on their own."""
    import libcst as cst

    out = {}
    for c, text in enumerate(nb.cell_text, 1):
        if c in broken:
            continue
        try:
            cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            msg = str(getattr(exc, "message", exc)).strip().splitlines()[0]
            out[c] = _cell_error(nb, c, exc.raw_line, max(exc.raw_column, 0), msg)
        except RecursionError:
            out[c] = (1, 0, "the cell nests too deeply to parse")
    return out


def _cell_error(nb: Notebook, cell: int, line: int, column: int, msg: str):
    """A syntax error at (line, column) of a cell's Python: its position in the cell's source."""
    g = _cell_lines(nb, cell)[0] + line - 1
    return line, _column(nb, g, column), msg


# the first line of a cell left out of the program (it does not parse): a comment, so lines and
# positions stay; the model reads it as "some code of this module is not seen"
# (``ModuleModel.has_unseen_code``: a name used only there is not known to be unused)
LEFT_OUT = "# torchlint: cell left out (syntax error)"


def _without_cells(nb: Notebook, cells) -> str:
    if not cells:
        return nb.text
    lines = nb.text.split("\n")
    for c in cells:
        for k, g in enumerate(_cell_lines(nb, c)):
            lines[g - 1] = LEFT_OUT if k == 0 else ""
    return "\n".join(lines)


def _cite(nb: Notebook, message: str, names) -> str:
    """Line numbers of the program that a message cites, as ``cell N, line M``."""
    def cell_line(m):
        line = int(next(g for g in m.groups() if g is not None))
        if not 1 <= line <= len(nb.line_map):
            return m.group(0)
        c, j = nb.line_map[line - 1]
        return f"cell {c}, line {j}"

    # "at line 57", and "`evaluate()` (nb.ipynb:57)" for a function of this notebook
    refs = re.compile("|".join([re.escape(n) + r":(\d+)\b" for n in sorted(names, key=len, reverse=True)]
                               + [r"\bline (\d+)\b"]))
    message = refs.sub(cell_line, message)
    return " ".join(message.split()) if "\n" in message else message


def to_cells(nb: Notebook, findings, shown: Optional[str] = None) -> None:
    """Give the findings of a lint of ``nb.text`` cell positions, citations and cell-relative fixes."""
    for f in findings:
        _to_cell_position(nb, f, shown or f.path)


def _to_cell_position(nb: Notebook, f, shown: str) -> None:
    from .findings import Related, Span

    sl, sc = f.span.start.line, f.span.start.column
    el, ec = f.span.end.line, f.span.end.column
    cell, line = to_cell(nb, sl)
    end_cell, end_line = to_cell(nb, el)
    f.cell = cell
    if end_cell != cell:
        end_line, el, ec = line, sl, sc
    f.span = Span.of(line, _column(nb, sl, sc), end_line, _column(nb, el, ec))
    names = {shown, nb.path}
    f.message = _cite(nb, f.message, names)
    if f.related:
        rel = []
        for r in f.related:
            if r.path in names and 1 <= r.line <= len(nb.line_map):
                c, j = nb.line_map[r.line - 1]
                r = Related(r.path, j, _cite(nb, r.message, names), c)
            rel.append(r)
        f.related = tuple(rel)
    if f.fix is not None:
        f.fix = _fix_to_cells(nb, f.fix)


def _fix_to_cells(nb: Notebook, fix):
    """Re-express a fix on the program text as edits carrying (cell, line) positions.

    Each edit's positions become cell-relative; a fix whose edits span two cells or touch a
    line IPython syntax was replaced on (or, in a shifted line, its indentation or more than
    one line) is dropped (the finding stays, the fix is not offered)."""
    from .findings import Edit, Fix, Position

    edits = []
    cell = None
    for e in fix.edits:
        c1, l1 = to_cell(nb, e.start.line)
        # an end at column 0 of the next line belongs to the previous cell's last line end
        c2, l2 = to_cell(nb, e.end.line) if e.end.line <= len(nb.line_map) else (c1, l1 + 1)
        if c1 != c2:
            if e.end.column == 0 and c2 == c1 + 1:
                c2, l2 = c1, len([1 for c, _ in nb.line_map if c == c1]) + 1
            else:
                return None
        if cell is not None and c1 != cell:
            return None
        cell = c1
        touched = range(e.start.line, max(e.end.line, e.start.line) + 1)
        if any(g in nb.synthetic for g in touched if not (g == e.end.line and e.end.column == 0 and g > e.start.line)):
            return None
        shifted = [g for g in touched if 1 <= g <= len(nb.offsets) and nb.offsets[g - 1]]
        if shifted:
            line_text = nb.text.split("\n")[e.start.line - 1]
            indent = len(line_text) - len(line_text.lstrip())
            if e.end.line != e.start.line or "\n" in e.content or e.start.column < indent:
                return None
        sc = _column(nb, e.start.line, e.start.column)
        ec = _column(nb, e.end.line, e.end.column) if e.end.line <= len(nb.line_map) else e.end.column
        edits.append(Edit(Position(l1, sc), Position(l2, ec), e.content))
    return Fix(fix.message, tuple(edits), fix.applicability, cell)


# ------------------------------------------------------------------ fixes and diffs
def apply_to_cells(cells: tuple, fixes) -> tuple:
    """Apply cell-relative fixes to the code cells' sources ``cells``: the new sources and the
    indices of the fixes applied (those that do not overlap one applied before, per cell)."""
    from .fixes import apply_fixes_detailed

    by_cell: dict = {}
    for i, fx in enumerate(fixes):
        if fx is not None and fx.cell is not None and 1 <= fx.cell <= len(cells):
            by_cell.setdefault(fx.cell, []).append((i, fx))
    out, chosen = list(cells), []
    for c, group in sorted(by_cell.items()):
        src = cells[c - 1]
        new, idx = apply_fixes_detailed(src + ("\n" if not src.endswith("\n") else ""), [fx for _, fx in group])
        if not src.endswith("\n") and new.endswith("\n"):
            new = new[:-1]
        out[c - 1] = new
        chosen.extend(group[j][0] for j in idx)
    return tuple(out), sorted(chosen)


def with_sources(nb: Notebook, data: bytes, cells: tuple) -> bytes:
    """The notebook file ``data`` (of ``nb``) with its code cells' sources replaced by
    ``cells`` (outputs, metadata and the other cells as they were)."""
    for c, idx in enumerate(nb.code_cells):
        cell = nb.doc["cells"][idx]
        if _cell_source(cell) != cells[c]:
            lines = cells[c].split("\n")
            cell["source"] = [ln + "\n" for ln in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    indent = 1
    m = re.search(rb'\n( +)"', data)
    if m:
        indent = len(m.group(1))
    return (json.dumps(nb.doc, indent=indent, ensure_ascii=False) + "\n").encode("utf-8")


def apply_fixes(path: str, fixes) -> int:
    """Apply cell-relative fixes (from ``lint_notebook``) to the notebook file, atomically."""
    from .fixer import write_atomic

    with open(path, "rb") as fh:
        data = fh.read()
    nb = load(path, data)
    cells, applied = apply_to_cells(sources(nb), fixes)
    if cells != sources(nb):
        write_atomic(path, with_sources(nb, data, cells))
    return len(applied) if cells != sources(nb) else 0


def cells_diff(shown: str, old: tuple, new: tuple) -> str:
    """A unified diff of the code cells that changed, each one file pair named ``path:cell N``
    (as ruff shows notebooks)."""
    out = []
    for c, (a, b) in enumerate(zip(old, new), 1):
        if a == b:
            continue
        name = f"{shown}:cell {c}"
        from .fixer import diff_text
        from .fixes import split_lines

        out.append(diff_text(difflib.unified_diff(split_lines(a), split_lines(b), name, name)))
    return "".join(out)


# ------------------------------------------------------------------ positions in the .ipynb file
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _source_tokens(raw: str, cells: list) -> dict:
    """{cell: [(raw offset of the string's first character, decoded text), ...]}: where each
    code cell's ``source`` strings are in the file's text (matched by their decoded value, in
    order, so any indentation, key order or escaping works)."""
    out = {}
    pos = 0
    for n, cell in enumerate(cells, 1):
        want = cell.get("source", "")
        items = want if isinstance(want, list) else [want]
        while True:
            k = raw.find('"source"', pos)
            if k < 0:
                return out
            pos = k + 8
            j = pos
            while j < len(raw) and raw[j] in " \t\r\n":
                j += 1
            if j >= len(raw) or raw[j] != ":":
                continue
            j += 1
            while j < len(raw) and raw[j] in " \t\r\n":
                j += 1
            found = []
            if raw.startswith("[", j):
                j += 1
                while True:
                    while j < len(raw) and raw[j] in " \t\r\n,":
                        j += 1
                    if j >= len(raw) or raw[j] != '"':
                        break
                    m = _JSON_STRING.match(raw, j)
                    if m is None:
                        break
                    found.append((m.start() + 1, m.group(0)))
                    j = m.end()
            else:
                m = _JSON_STRING.match(raw, j)
                if m is not None:
                    found.append((m.start() + 1, m.group(0)))
                    j = m.end()
            try:
                decoded = [json.loads(tok) for _, tok in found]
            except ValueError:
                continue
            if decoded == [str(x) for x in items]:
                out[n] = [(start, text) for (start, _), text in zip(found, decoded)]
                pos = j
                break
    return out


def _raw_width(raw: str, start: int, count: int) -> int:
    """How many characters of ``raw`` from ``start`` (inside a JSON string) encode the first
    ``count`` decoded characters."""
    i = start
    for _ in range(count):
        if raw[i] == "\\":
            if raw[i + 1] == "u":
                code = int(raw[i + 2:i + 6], 16)
                i += 6
                if 0xD800 <= code < 0xDC00 and raw.startswith("\\u", i):
                    i += 6  # a surrogate pair: one character
            else:
                i += 2
        else:
            i += 1
    return i - start


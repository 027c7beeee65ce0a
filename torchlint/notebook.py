"""Jupyter notebooks: code cells linted as one program, in cell order.

IPython magics (``%time``, ``%%capture``), shell escapes (``!pip install``) and help
(``x?``) are replaced by ``pass`` at the same indentation, so no position moves.  Findings
carry ``cell`` (1-based, counting code cells as ruff does) and the line inside that cell;
``raw_line`` maps a cell line to its line in the ``.ipynb`` file so SARIF and LSP consumers
can open it.  Fixes are applied back into each cell's source; outputs and metadata are kept.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

_MAGIC = re.compile(r"^(\s*)(%%?|!|\?\?|\?)")
_HELP_SUFFIX = re.compile(r"^\s*[\w.]+\?\??\s*$")


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
    raw_lines: dict = field(default_factory=dict)  # (cell, line) -> line in the .ipynb file


def _cell_source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _neutralise(line: str, in_cell_magic: bool) -> str:
    if in_cell_magic:
        return ""
    m = _MAGIC.match(line)
    if m or _HELP_SUFFIX.match(line):
        indent = line[: len(line) - len(line.lstrip())]
        return indent + "pass"
    return line


def load(path: str, data: Optional[bytes] = None) -> Notebook:
    try:
        if data is None:
            with open(path, "rb") as fh:
                data = fh.read()
        doc = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NotebookError(f"{path}: not a readable notebook: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise NotebookError(f"{path}: not a notebook (no `cells` list)")
    lang = (doc.get("metadata", {}).get("language_info", {}) or {}).get("name", "python")
    if lang not in ("python", "", None):
        raise NotebookError(f"{path}: not a Python notebook (language {lang!r})")
    code_cells = [idx for idx, cell in enumerate(doc["cells"])
                  if isinstance(cell, dict) and cell.get("cell_type") == "code"]
    text, line_map = program([_cell_source(doc["cells"][i]) for i in code_cells])
    nb = Notebook(path, doc, code_cells, text, line_map)
    nb.raw_lines = _raw_line_index(data.decode("utf-8", "replace"), doc, code_cells)
    return nb


def program(sources) -> tuple:
    """The program the code cells ``sources`` make (magics neutralised in place) and its
    line map: global line (1-based) -> (code cell 1-based, line in cell 1-based)."""
    parts, line_map = [], []
    for n, src in enumerate(sources, 1):
        lines = src.split("\n")
        cell_magic = bool(lines) and lines[0].lstrip().startswith("%%")
        for j, ln in enumerate(lines, 1):
            parts.append(_neutralise(ln, cell_magic and j > 1) if not (cell_magic and j == 1) else "pass")
            line_map.append((n, j))
    return "\n".join(parts) + "\n", line_map


def sources(nb: Notebook) -> tuple:
    """The code cells' sources, in order."""
    return tuple(_cell_source(nb.doc["cells"][i]) for i in nb.code_cells)


def module_name(path: str) -> str:
    return os.path.basename(path)[:-6].replace("-", "_")


def _raw_line_index(raw: str, doc: dict, code_cells: list) -> dict:
    """(cell, line) -> 1-based line of the .ipynb file holding that source line."""
    out = {}
    raw_lines = raw.split("\n")
    pos = 0
    for n, idx in enumerate(code_cells, 1):
        src = doc["cells"][idx].get("source", "")
        items = src if isinstance(src, list) else str(src).splitlines(True)
        for j, item in enumerate(items, 1):
            needle = json.dumps(item)[1:-1]
            k = pos
            while k < len(raw_lines) and needle not in raw_lines[k]:
                k += 1
            if k < len(raw_lines):
                out[(n, j)] = k + 1
                pos = k + 1
    return out


def to_cell(nb: Notebook, line: int) -> tuple:
    if 1 <= line <= len(nb.line_map):
        return nb.line_map[line - 1]
    return (len(nb.code_cells) or 1, 1)


def lint_notebook(path: str, opts, project, shown: str, data: Optional[bytes] = None):
    from .engine import FileResult, lint_text

    try:
        nb = load(path, data)
    except NotebookError as exc:
        return FileResult(shown, error=str(exc))
    res = lint_text(path, nb.text, opts, project, module_name=module_name(path), shown=shown, raw=True)
    to_cells(nb, res.findings)
    return res


def to_cells(nb: Notebook, findings) -> None:
    """Give the findings of a lint of ``nb.text`` cell positions and cell-relative fixes."""
    from .findings import Span

    for f in findings:
        cell, line = to_cell(nb, f.line)
        end_cell, end_line = to_cell(nb, f.span.end.line)
        f.cell = cell
        f.span = Span.of(line, f.span.start.column, end_line if end_cell == cell else line,
                         f.span.end.column if end_cell == cell else f.span.start.column)
        if f.fix is not None:
            f.fix = _fix_to_cells(nb, f.fix)


def _fix_to_cells(nb: Notebook, fix):
    """Re-express a fix on the program text as edits carrying (cell, line) positions.

    Each edit's positions become cell-relative; edits spanning two cells are dropped (the
    fix is then not offered)."""
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
        edits.append(Edit(Position(l1, e.start.column), Position(l2, e.end.column), e.content))
    return Fix(fix.message, tuple(edits), fix.applicability, cell)


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
    from .fixes import apply_fixes as apply_text

    with open(path, "rb") as fh:
        data = fh.read()
    nb = load(path, data)
    by_cell: dict = {}
    for fx in fixes:
        if fx is not None and fx.cell is not None:
            by_cell.setdefault(fx.cell, []).append(fx)
    applied = 0
    for c, cell_fixes in by_cell.items():
        cell = nb.doc["cells"][nb.code_cells[c - 1]]
        src = _cell_source(cell)
        new, n = apply_text(src + ("\n" if not src.endswith("\n") else ""), cell_fixes)
        if not src.endswith("\n") and new.endswith("\n"):
            new = new[:-1]
        if n and new != src:
            applied += n
            lines = new.split("\n")
            cell["source"] = [ln + "\n" for ln in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    if applied:
        indent = 1
        m = re.search(rb'\n( +)"', data)
        if m:
            indent = len(m.group(1))
        out = json.dumps(nb.doc, indent=indent, ensure_ascii=False) + "\n"
        from .fixer import write_atomic

        write_atomic(path, out.encode("utf-8"))
    return applied

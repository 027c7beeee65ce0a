"""The language server's lint of an edited document (``engine.DocumentMemo``: the pieces an
edit left alone are not parsed again, positions of unchanged functions are reused) says
exactly what a lint of the same text from scratch says, edit after edit."""
import glob
import os
import random

import libcst as cst
import pytest

from torchlint.engine import DocumentMemo, LintOptions, lint_text
from torchlint.parse import parse_module
from torchlint.selection import enabled_codes, preview_codes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _long_module(min_lines: int) -> str:
    """Real training scripts of the fixtures (one after another: a long module with many
    findings, functions of the same name, repeated imports), at least ``min_lines`` long."""
    parts, n = [], 0
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "bad", "*.py"))):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if "\r" in text or not text.endswith("\n"):
            continue
        parts.append(text + "\n\n")
        n += text.count("\n") + 2
        if n >= min_lines:
            break
    return "".join(parts)


def _opts():
    return LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))


def _key(res):
    return [(f.code, f.line, f.column, f.span.end.line, f.span.end.column, f.message, f.fingerprint,
             None if f.fix is None else [(e.start.line, e.start.column, e.end.line, e.end.column, e.content)
                                         for e in f.fix.edits])
            for f in res.findings]


def _top_level_defs(lines):
    return [i for i, ln in enumerate(lines) if ln.startswith(("def ", "class "))]


def _edit(lines, rng, step):
    """One edit as typing makes them: a comment, a new line, a deleted line, an unfinished
    string (then closed again), a duplicated function, a decorator, an indented line."""
    i = rng.randrange(len(lines))
    kind = step % 8
    if kind == 0:
        lines[i] = lines[i].rstrip("\n") + "  # note\n"
    elif kind == 1:
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        lines.insert(i, indent + "optimizer.zero_grad()\n" if indent else "\n")
    elif kind == 2:
        del lines[i]
    elif kind == 3:
        lines.insert(i, 'note = """unfinished\n')  # the rest of the file is inside a string
    elif kind == 4:
        for j, ln in enumerate(lines):
            if ln.startswith('note = """unfinished'):
                del lines[j]
                break
    elif kind == 5:  # a function copied: the same text twice
        defs = _top_level_defs(lines)
        if defs:
            a = rng.choice(defs)
            b = next((d for d in defs if d > a), len(lines))
            lines[b:b] = lines[a:b]
    elif kind == 6:
        defs = _top_level_defs(lines)
        if defs:
            lines.insert(rng.choice(defs), "@torch.no_grad()\n")
    elif kind == 7:
        lines[i] = "    " + lines[i] if lines[i].strip() else lines[i]
    defs = _top_level_defs(lines)
    if defs and step % 3 == 0:  # a comment between two functions: leads the next piece
        lines.insert(rng.choice(defs), "# ---- section\n")


def test_the_parse_of_an_edit_reuses_the_untouched_pieces_and_equals_a_fresh_parse():
    text = _long_module(600)
    memo: dict = {}
    first = parse_module(text, memo)
    assert first.deep_equals(cst.parse_module(text)) and first.code == text
    kept = {id(v) for k, v in memo.items() if isinstance(k, str)}
    assert len(kept) > 10  # a piece per top-level def and class
    lines = text.splitlines(True)
    i = next(i for i, ln in enumerate(lines) if "loss.backward()" in ln)
    lines[i] = lines[i].rstrip("\n") + "  # edited\n"
    edited = "".join(lines)
    again = parse_module(edited, memo)
    assert again.code == edited and again.deep_equals(cst.parse_module(edited))
    reused = {id(v) for k, v in memo.items() if isinstance(k, str)}
    assert len(kept & reused) >= len(kept) - 1  # only the edited piece was parsed again


@pytest.mark.parametrize("seed", range(3))
def test_incremental_lint_equals_a_full_lint_over_a_sequence_of_edits(tmp_path, seed):
    rng = random.Random(seed)
    path = str(tmp_path / "train.py")
    opts = _opts()
    lines = _long_module(400).splitlines(True)
    memo = DocumentMemo()
    pieces: dict = {}
    seen_findings = seen_error = 0
    for step in range(24):
        text = "".join(lines)
        try:
            tree = parse_module(text, pieces)
        except cst.ParserSyntaxError:
            pass
        else:
            assert tree.code == text and tree.deep_equals(cst.parse_module(text)), (seed, step)
        inc = lint_text(path, text, opts, memo=memo, exports=False)
        full = lint_text(path, text, opts)
        assert _key(inc) == _key(full), (seed, step, text)
        seen_findings += bool(full.findings)
        seen_error += any(f.code == "TL001" for f in full.findings)
        _edit(lines, rng, step)
    assert seen_findings and seen_error  # the sequence went through buggy and broken texts


def test_a_memo_left_by_another_text_changes_nothing(tmp_path):
    """A memo is only a cache: linting an unrelated document with it, or the same text
    twice, gives the fresh lint's findings."""
    path = str(tmp_path / "train.py")
    opts = _opts()
    memo = DocumentMemo()
    a = _long_module(300)
    b = a.replace("def ", "def renamed_", 3)
    for text in (a, b, a, a):
        assert _key(lint_text(path, text, opts, memo=memo, exports=False)) == _key(lint_text(path, text, opts))


def test_disable_for_this_line_reads_only_the_statements_around_the_line():
    """The server tokenizes the run of top-level statements around a finding's line, not the
    whole file; the ``# noqa`` it adds is the one ``--add-noqa`` adds, on every line."""
    pytest.importorskip("pygls")
    from torchlint.fixer import noqa_line, noqa_text
    from torchlint.lsp import _noqa_facts

    class Server:
        docs: dict = {}

    text = _long_module(300)
    text = text.replace("import torch\n", 'import torch  # noqa: TL101\nDOC = """\nx = 1  # not a comment\n"""\n', 1)
    lines = text.splitlines(True)
    for n in range(1, len(lines) + 1):
        want = noqa_text(text, {n: {"TL103"}})[0].splitlines(True)[n - 1]
        assert noqa_line(lines[n - 1], n, {"TL103"}, _noqa_facts(Server(), "file:///t.py", text, n))[0] == want, n


# ------------------------------------------------------------------ notebooks in the editor
def _notebook_cells(min_lines: int) -> list:
    """The code cells of the fixtures' notebooks (magics, shell escapes, a broken cell), then
    training scripts of the fixtures as cells, until the program has ``min_lines`` lines."""
    from torchlint import notebook

    cells = []
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "notebooks", "*.ipynb"))):
        cells.extend(notebook.sources(notebook.load(path)))
    for text in _long_module(min_lines).split("\n\n\n"):
        if sum(c.count("\n") + 1 for c in cells) >= min_lines:
            break
        cells.append(text)
    return cells


def _lint_cells(path, cells, opts, memo=None):
    from torchlint import notebook
    from torchlint.engine import select_result
    from torchlint.findings import path_token

    doc = {"cells": [{"cell_type": "code", "source": c} for c in cells]}
    nb = notebook.build(path, doc, list(range(len(cells))), cells)
    return select_result(notebook.lint_cells(nb, opts, None, path_token(path), memo=memo, exports=memo is None), opts)


def _cell_key(res):
    return [(f.cell,) + k for f, k in zip(res.findings, _key(res))]


def test_a_notebook_edited_cell_by_cell_lints_as_from_scratch_and_reuses_the_other_cells(tmp_path):
    """The language server keeps a DocumentMemo per open notebook: a cell edit re-parses the
    pieces of the program it touched; the findings (cell, line, fix) are those of a fresh lint."""
    seed = 0
    rng = random.Random(seed)
    path = str(tmp_path / "lab.ipynb")
    opts = _opts()
    cells = _notebook_cells(150)
    memo = DocumentMemo()
    first = _lint_cells(path, cells, opts, memo)
    assert _cell_key(first) == _cell_key(_lint_cells(path, cells, opts))
    kept = {id(v) for k, v in memo.pieces.items() if isinstance(k, str)}
    assert len(kept) > 10
    seen_broken = 0
    for step in range(12):
        c = rng.randrange(len(cells))
        lines = cells[c].split("\n")
        _edit(lines, rng, step)  # the same edits as a module's, inside one cell
        cells[c] = "\n".join(lines)
        inc = _lint_cells(path, cells, opts, memo)
        full = _lint_cells(path, cells, opts)
        assert _cell_key(inc) == _cell_key(full), (seed, step, c, cells[c])
        seen_broken += any(f.code == "TL001" for f in full.findings)
    assert seen_broken and any(f.code != "TL001" for f in full.findings)
    # one comment in one cell: every other piece of the program is the one parsed before
    memo_ids = {id(v) for k, v in memo.pieces.items() if isinstance(k, str)}
    c = next(i for i, text in enumerate(cells) if "loss.backward()" in text and '"""' not in text)
    cells[c] = cells[c].replace("loss.backward()", "loss.backward()  # edited", 1)
    _lint_cells(path, cells, opts, memo)
    assert len(memo_ids & {id(v) for k, v in memo.pieces.items() if isinstance(k, str)}) >= len(memo_ids) - 2

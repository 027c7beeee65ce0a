"""Applying fixes to files: `--fix`, `--unsafe-fixes`, `--diff`, `--show-fixes` and `--add-noqa`.

A fix is a set of text edits computed from libcst node positions (:mod:`torchlint.fixes`), so
everything it does not touch — formatting, comments — stays byte for byte.  One file is fixed
in passes: lint, apply every fix that does not overlap an earlier one (in source order), check
the result still parses, lint again and repeat until nothing more can be fixed (at most
:data:`MAX_PASSES` passes).  A fix whose result does not parse, or after which its finding is
still reported, is undone and not tried again.  Files are written atomically (a temporary file in
the same directory, then ``os.replace``) in their original encoding, BOM and line endings, with
their permissions; a file that nothing changed is not touched.
"""
from __future__ import annotations

import difflib
import io
import os
import stat
import sys
import tempfile
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import click
import libcst as cst

from .engine import lint_text, run, select_result
from .findings import path_token, render_text
from .findings import SAFE, UNSAFE, Finding
from .fixes import apply_fixes_detailed, split_lines
from .project import ProjectIndex, Workspace
from .source import SourceError, SourceFile, encode, read_source
from .suppress import _NOQA, _CODE

MAX_PASSES = 10
_NOT_FIXABLE = ("TL000", "TL001", "TL003")


# ------------------------------------------------------------------ results
@dataclass
class AppliedFix:
    code: str
    name: str
    line: int  # the finding's line in the text the fix was applied to
    message: str  # the fix's message
    applicability: str
    fingerprint: Optional[str] = None  # the finding's (stable across line shifts)
    reported_line: Optional[int] = None  # the line where the lint of the original text reported it


@dataclass
class FileFix:
    path: str  # the path as shown
    original: str
    fixed: str
    applied: list = field(default_factory=list)  # AppliedFix
    discarded: list = field(default_factory=list)  # AppliedFix whose result did not parse or did not help
    error: Optional[str] = None

    @property
    def changed(self) -> bool:
        return self.fixed != self.original


@dataclass
class FixReport:
    files: list = field(default_factory=list)  # FileFix, only files with something to fix
    notebooks: list = field(default_factory=list)  # notebooks (as shown) whose cells the fixes change

    @property
    def changed(self) -> list:
        """Paths (as shown) whose text the fixes change."""
        return [f.path for f in self.files if f.changed and f.error is None] + self.notebooks

    notebook_fixes: int = 0  # fixes written into notebook cells

    @property
    def applied(self) -> int:
        return sum(len(f.applied) for f in self.files if f.changed and f.error is None)

    @property
    def fixed(self) -> int:
        """Fixes written (files and notebooks)."""
        return self.applied + self.notebook_fixes

    def failed_fixes(self) -> set:
        """(path as shown, code, fingerprint) of the fixes tried and undone."""
        return {(f.path, a.code, a.fingerprint) for f in self.files for a in f.discarded}


def is_fixable(f: Finding, unsafe: bool, allowed=None) -> bool:
    if f.fix is None or f.code in _NOT_FIXABLE or not f.fix.edits:
        return False
    if allowed is not None and f.code not in allowed:
        return False
    return f.fix.applicability == SAFE or (unsafe and f.fix.applicability == UNSAFE)


def fixable_codes(cfg) -> Optional[frozenset]:
    """The codes the configuration's ``fixable``/``unfixable`` lists allow fixing (None: all)."""
    from .rule import all_rules
    from .selection import _matches

    fixable = list(getattr(cfg, "fixable", None) or ["TL"])
    unfixable = list(getattr(cfg, "unfixable", None) or [])
    if fixable == ["TL"] and not unfixable:
        return None
    out = set()
    for code in all_rules():
        m = _matches(code, fixable)
        if m >= 0 and not _matches(code, unfixable) >= m:
            out.add(code)
    return frozenset(out)


def _parses(text: str) -> bool:
    try:
        cst.parse_module(text)
        return True
    except Exception:
        return False


def _fix_key(f: Finding) -> tuple:
    return (f.code, f.fingerprint, f.fix.message, tuple(e.content for e in f.fix.edits))


def _identity(f: Finding) -> tuple:
    return (f.code, f.fingerprint or f"{f.line}:{f.message}")


# ------------------------------------------------------------------ what check reported
def _map_position(p, cell, edits):
    """Where the position ``p`` (of code cell ``cell``, None in a module) is after ``edits``
    (non-overlapping ``(cell, Edit)``, positions in the text before them); None when an edit
    replaced the text around it."""
    for ecell, e in sorted(edits, key=lambda x: (x[1].start, x[1].end), reverse=True):
        if ecell != cell or p < e.start:
            continue
        if p < e.end:
            return None
        content = e.content.replace("\r\n", "\n").replace("\r", "\n")
        nl = content.count("\n")
        tail = len(content) - content.rfind("\n") - 1 if nl else len(content)
        if p.line == e.end.line:
            p = type(p)(e.start.line + nl, (tail if nl else e.start.column + tail) + p.column - e.end.column)
        else:
            p = type(p)(p.line + e.start.line + nl - e.end.line, p.column)
    return p


class _Reported:
    """The findings the lint of the original text reported (what ``check`` reports), followed
    through the edits of each pass: a later pass fixes only those, never a finding that the
    fixes made appear (a loop wrapped in ``no_grad`` becoming evaluation code that a rule then
    wants in eval mode). A finding is recognised at the place its original was moved to, or,
    where an edit rewrote that place (a block re-indented), by its fingerprint."""

    def __init__(self, findings):
        # [code, cell, position or None, fingerprint, line reported]
        self.items = [[f.code, f.cell, f.span.start, f.fingerprint, f.line] for f in findings]

    def match(self, findings) -> dict:
        """``{id(finding): item}`` for the findings of ``findings`` that are reported ones."""
        free = list(self.items)
        out = {}
        for by_place in (True, False):
            for f in findings:
                if id(f) in out:
                    continue
                for it in free:
                    if it[0] == f.code and (it[1:3] == [f.cell, f.span.start] if by_place
                                            else it[3] and it[3] == f.fingerprint and it[1] == f.cell):
                        out[id(f)] = it
                        free.remove(it)
                        break
        return out

    def advance(self, fixed, edits) -> None:
        """The fixes of the items ``fixed`` were applied with ``edits``: the others move."""
        gone = {id(it) for it in fixed}
        self.items = [it for it in self.items if id(it) not in gone]
        for it in self.items:
            if it[2] is not None:
                it[2] = _map_position(it[2], it[1], edits)


# ------------------------------------------------------------------ one text
class _Text:
    """A module's text being fixed: linted as it is, fixes applied as text edits."""

    def __init__(self, path: str, opts, project, shown: str):
        self.path, self.opts, self.project, self.shown = path, opts, project, shown

    def lint(self, text: str) -> list:
        return lint_text(self.path, text, self.opts, self.project, shown=self.shown).findings

    @staticmethod
    def apply(text: str, fixes) -> tuple:
        return apply_fixes_detailed(text, fixes)

    @staticmethod
    def parses(text: str) -> bool:
        return _parses(text)


class _Cells(_Text):
    """A notebook's code cells being fixed (a tuple of their sources): each lint is one of the
    program they make, as ``lint_notebook`` lints it, with its fixes moved into the cells."""

    def __init__(self, path: str, nb, opts, project, shown: str):
        from . import notebook

        super().__init__(path, opts, project, shown)
        self.nb = nb
        # cells that did not parse before any fix: left out of the program, not a reason to stop
        self.broken = notebook.broken_cells(notebook.sources(nb))

    def lint(self, cells: tuple) -> list:
        from . import notebook

        nb = notebook.build(self.path, self.nb.doc, self.nb.code_cells, cells)
        res = select_result(notebook.lint_cells(nb, self.opts, self.project, self.shown), self.opts)
        return [f for f in res.findings if not (f.code == "TL001" and f.cell in self.broken)]

    @staticmethod
    def apply(cells: tuple, fixes) -> tuple:
        from .notebook import apply_to_cells

        return apply_to_cells(cells, fixes)

    def parses(self, cells: tuple) -> bool:
        """No cell that parsed before the fixes stops parsing."""
        from .notebook import broken_cells

        return broken_cells(cells) <= self.broken


def fix_text(path: str, text: str, opts, unsafe: bool = False, project: Optional[ProjectIndex] = None,
             shown: Optional[str] = None, max_passes: int = MAX_PASSES,
             first: Optional[list] = None, allowed=None) -> FileFix:
    """Fix ``text`` (the contents of ``path``) in passes; returns what changed.

    ``first`` may hold the findings of a lint of exactly ``text`` with the same options and
    project (saves one lint).
    """
    shown = shown or path_token(path)
    return _fix_passes(_Text(path, opts, project, shown), text, unsafe, shown, max_passes, first, allowed)


def _fix_passes(doc, text, unsafe: bool, shown: str, max_passes: int = MAX_PASSES, first: Optional[list] = None,
                allowed=None) -> FileFix:
    """Fix ``text`` (a module's text, or a notebook's cells: ``doc`` lints it and applies
    fixes to it) in passes: every edit applied is one of a lint of exactly the text it is
    applied to, of a finding the lint of ``text`` reported (``_Reported``), and stays only if
    the result parses and its finding is gone."""
    result = FileFix(render_text(shown), text, text)
    bad: set = set()
    # fixes judged useless next to other fixes of the same pass: tried again alone before they
    # are given up (another fix of the pass may have uncovered a finding just like theirs, e.g.
    # a `no_grad` block removed around a second `total += loss`)
    alone: set = set()
    seen = {text}
    findings = first
    cur = text
    reported = None
    for _ in range(max_passes):
        if findings is None:
            findings = doc.lint(cur)
        if any(f.code == "TL001" for f in findings):
            break
        if reported is None:
            reported = _Reported(findings)
        origin = reported.match(findings)
        cands = [f for f in findings if is_fixable(f, unsafe, allowed) and _fix_key(f) not in bad
                 and id(f) in origin]
        if not cands:
            break
        cands.sort(key=lambda f: (f.span.start, f.span.end, f.code))
        solo = [f for f in cands if _fix_key(f) in alone]
        if solo:
            cands = solo[:1]
        new, idx = doc.apply(cur, [f.fix for f in cands])
        chosen = [cands[i] for i in idx]
        if not chosen:
            break
        if not doc.parses(new):
            # find the culprits: keep, in order, each fix that leaves the file parseable
            keep = []
            for f in chosen:
                trial, _ = doc.apply(cur, [g.fix for g in keep + [f]])
                if doc.parses(trial):
                    keep.append(f)
                else:
                    bad.add(_fix_key(f))
                    result.discarded.append(_applied(f))
            if not keep:
                continue  # the findings still describe `cur`; the discarded fixes are skipped now
            chosen = keep
            new, _ = doc.apply(cur, [f.fix for f in chosen])
        after = doc.lint(new)
        # a fix must make its finding go away; otherwise undo it and never try it again
        before_n = Counter(_identity(f) for f in findings)
        after_n = Counter(_identity(f) for f in after)
        fixed_n = Counter(_identity(f) for f in chosen)
        useless = [f for f in chosen if after_n[_identity(f)] > before_n[_identity(f)] - fixed_n[_identity(f)]]
        if useless:
            for f in useless:
                if len(chosen) > 1 and _fix_key(f) not in alone:
                    alone.add(_fix_key(f))
                    continue
                bad.add(_fix_key(f))
                result.discarded.append(_applied(f))
            chosen = [f for f in chosen if f not in useless]
            if not chosen:
                continue
            new, _ = doc.apply(cur, [f.fix for f in chosen])
            if not doc.parses(new):  # pragma: no cover - subsets of parseable fixes normally parse
                break
            after = None
        if new in seen:  # a cycle: two fixes undoing each other
            break
        seen.add(new)
        result.applied.extend(_applied(f, origin[id(f)][4]) for f in chosen)
        reported.advance([origin[id(f)] for f in chosen], [(f.fix.cell, e) for f in chosen for e in f.fix.edits])
        cur = new
        findings = after
    result.fixed = cur
    return result


def _applied(f: Finding, reported_line: Optional[int] = None) -> AppliedFix:
    return AppliedFix(f.code, f.name, f.line, f.fix.message, f.fix.applicability, f.fingerprint, reported_line)


# ------------------------------------------------------------------ files
class HardLinkError(OSError):
    """A file ``--fix`` leaves alone: it has other hard links."""

    def __init__(self, links: int):
        super().__init__(f"it has {links} hard links, which replacing it would split; left alone "
                         "(fix a copy, or run `--diff` and apply the patch)")


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path``'s contents: a temporary file in the same directory, then ``os.replace``.

    Keeps the file's owner (where allowed) and then its mode bits, setuid and setgid included
    (a ``chown`` clears them, so it comes first); a symlink is followed, so the link stays a
    link. A file with several hard links is refused (``HardLinkError``): replacing it would
    split the links, and writing it in place could leave it half-written.
    """
    real = os.path.realpath(path)
    d = os.path.dirname(real) or "."
    st = os.stat(real)
    if st.st_nlink > 1:
        raise HardLinkError(st.st_nlink)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(real) + ".", suffix=".torchlint-tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if hasattr(os, "chown"):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except OSError:
                pass
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_if_unchanged(src: SourceFile, path: str, text: str) -> Optional[str]:
    """Write ``text`` back; returns an error message instead of raising."""
    try:
        data = encode(src, text)
    except (UnicodeEncodeError, LookupError) as exc:
        return f"{path}: the fixed text cannot be written in {src.encoding}: {exc}"
    try:
        with open(path, "rb") as fh:
            if fh.read() != src.data:
                return f"{path}: changed while it was being fixed; left alone"
        write_atomic(path, data)
    except HardLinkError as exc:
        return f"{path}: not fixed: {exc}"
    except OSError as exc:
        return f"{path}: cannot write: {exc.strerror or exc}"
    return None


def unified_diff(path: str, old: str, new: str) -> str:
    return diff_text(difflib.unified_diff(split_lines(old), split_lines(new), fromfile=path, tofile=path,
                                          lineterm="\n"))


def diff_text(diff_lines) -> str:
    """The lines of a unified diff as text where every line ends with a newline: a last line
    without one is followed by ``\\ No newline at end of file`` (as diff and git write it), and
    a line that ends with a lone carriage return (old Mac line endings) gets a newline after
    it, so the next line of the diff, or the "Would fix" line after it, starts a line."""
    out = []
    for line in diff_lines:
        if line.endswith("\r"):
            line += "\n"
        elif not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def fix_files(runner, files, unsafe: bool = False, diff: bool = False, show: bool = False) -> FixReport:
    """Fix ``files`` with ``runner``'s options (``--fix`` / ``--diff``); returns a :class:`FixReport`.

    With ``diff`` the fixes are printed as a unified diff on stdout and nothing is written.
    """
    report = FixReport()
    files = list(files)
    opts = runner.opts
    # the workspace of ``check``: the same module table, exports and calls between modules
    workspace = Workspace(files)
    results = run(files, opts, jobs=runner.jobs or 1, cache=runner.cache,
                  workspace=workspace)
    project = workspace.index
    allowed = fixable_codes(runner.cfg) if runner.cfg is not None else None
    diffs = []
    nb_fixed = 0
    for path, res in zip(files, results):
        if path.endswith(".ipynb") and not res.error:
            n, text = _fix_notebook(runner, path, res, unsafe, allowed, project, diff)
            diffs.append(text)
            if n:
                nb_fixed += n
                report.notebooks.append(res.path)
            continue
        if res.error:
            if diff:
                click.echo(f"torchlint: error: {res.error}", err=True)
                runner.had_error = True
            continue
        if path.endswith(".ipynb") or not any(is_fixable(f, unsafe, allowed) for f in res.findings):
            continue
        try:
            src = read_source(path)
        except SourceError as exc:
            click.echo(f"torchlint: error: {exc}", err=True)
            runner.had_error = True
            continue
        try:
            ff = fix_text(path, src.text, opts, unsafe=unsafe, project=project, shown=res.path, allowed=allowed)
        except Exception as exc:  # a bug in a fix must not lose the user's file
            if os.environ.get("TORCHLINT_DEBUG"):
                import traceback

                traceback.print_exc()
            click.echo(f"torchlint: error: {res.path}: fixing failed: {type(exc).__name__}: {exc}", err=True)
            runner.had_error = True
            continue
        if not ff.changed:
            if ff.discarded:
                report.files.append(ff)  # for its failed fixes
            continue
        report.files.append(ff)
        if diff:
            diffs.append(unified_diff(res.path, ff.original, ff.fixed))
        else:
            err = _write_if_unchanged(src, path, ff.fixed)
            if err:
                ff.error = err
                click.echo(f"torchlint: error: {err}", err=True)
                runner.had_error = True
    if diff:
        if diffs:
            sys.stdout.write("".join(diffs))
            sys.stdout.flush()
        n = report.applied + nb_fixed
        if n:
            click.echo(f"Would fix {n} error{'s' if n != 1 else ''}.", err=True)
    else:
        report.notebook_fixes = nb_fixed  # the caller's summary says how many were fixed
    if show and report.applied:
        click.echo(_show(report, diff), err=True)
    return report


def _fix_notebook(runner, path: str, res, unsafe: bool, allowed, project, diff: bool = False) -> tuple:
    """Fix a notebook's code cells as a module is fixed (passes of a fresh lint of the cells as
    they are, each fix kept only if the program still parses and its finding is gone) and
    write them back into the cells; outputs and metadata stay. With ``diff``, write nothing.
    Returns (fixes applied, the diff of the changed cells with ``diff``, else "")."""
    from . import notebook

    if not any(is_fixable(f, unsafe, allowed) for f in res.findings):
        return 0, ""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        nb = notebook.load(path, data)
        ff = _fix_passes(_Cells(path, nb, runner.opts, project, res.path), notebook.sources(nb), unsafe, res.path,
                         allowed=allowed)
        if not ff.changed:
            return 0, ""
        if diff:
            return len(ff.applied), notebook.cells_diff(res.path, ff.original, ff.fixed)
        out = notebook.with_sources(nb, data, ff.fixed)
        with open(path, "rb") as fh:
            if fh.read() != data:
                click.echo(f"torchlint: error: {res.path}: changed while it was being fixed; left alone", err=True)
                runner.had_error = True
                return 0, ""
        write_atomic(path, out)
    except Exception as exc:  # never lose the notebook
        if os.environ.get("TORCHLINT_DEBUG"):
            import traceback

            traceback.print_exc()
        msg = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        click.echo(f"torchlint: error: {res.path}: fixing failed: {msg}", err=True)
        runner.had_error = True
        return 0, ""
    return len(ff.applied), ""


def _show(report: FixReport, diff: bool) -> str:
    lines = ["Would apply these fixes:" if diff else "Applied fixes:"]
    for ff in report.files:
        if not ff.changed or ff.error:
            continue
        lines.append(f"- {ff.path}:")
        for a in ff.applied:
            tag = " (unsafe)" if a.applicability == UNSAFE else ""
            lines.append(f"    {a.code} ({a.name}) line {a.line}: {a.message}{tag}")
    return "\n".join(lines)


# ------------------------------------------------------------------ noqa
def _line_facts(text: str):
    """(lines whose end can take a comment, {line: (start col, comment text)})."""
    norm = text.replace("\r\n", "\n").replace("\r", "\n")
    ends, comments = set(), {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(norm).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL):
                ends.add(tok.start[0])
            elif tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = (tok.start[1], tok.string)
            elif tok.type == tokenize.ENDMARKER:
                ends.add(tok.start[0] - 1 if tok.start[1] == 0 else tok.start[0])
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None, {}
    return ends, comments


def noqa_line_facts(text: str) -> tuple:
    """What ``noqa_line`` needs to know of ``text``: (the lines whose end can take a comment,
    or None when the text does not tokenize; {line: (start col, comment)})."""
    return _line_facts(text)


def noqa_line(raw: str, line: int, codes, facts: tuple) -> tuple[str, int]:
    """Line ``line`` (``raw``, with its line ending) with ``# noqa: CODES`` added (merged with
    a directive it has), and how many codes were added; ``facts`` are ``noqa_line_facts`` of
    the text."""
    ends, comments = facts
    if ends is None or line not in ends:
        return raw, 0
    body = raw.rstrip("\r\n")
    eol = raw[len(body):]
    com = comments.get(line)
    m = _NOQA.search(com[1]) if com else None
    if m is not None:
        if not m.group("codes"):
            return raw, 0  # a bare `# noqa` already silences every code
        have = [c.upper() for c in _CODE.findall(m.group("codes"))]
        new = [c for c in sorted(codes) if c not in have]
        if not new:
            return raw, 0
        directive = f"# noqa: {', '.join(have + new)}"
        start = com[0] + m.start()
        end = com[0] + m.end()
        return body[:start] + directive + body[end:] + eol, len(new)
    return body.rstrip(" \t") + f"  # noqa: {', '.join(sorted(codes))}" + eol, len(codes)


def noqa_text(text: str, codes_by_line: dict) -> tuple[str, int]:
    """Add ``# noqa: CODES`` to the given lines (merging with existing directives)."""
    facts = _line_facts(text)
    if facts[0] is None:
        return text, 0
    lines = split_lines(text)
    added = 0
    for line, codes in codes_by_line.items():
        if not (0 < line <= len(lines)):
            continue
        lines[line - 1], n = noqa_line(lines[line - 1], line, codes, facts)
        added += n
    return "".join(lines), added


def add_noqa(findings) -> int:
    """Add ``# noqa: TLxxx`` for every finding on its line; returns how many codes were added."""
    by_path: dict = {}
    for f in findings:
        if f.code in _NOT_FIXABLE or f.cell is not None or f.path.endswith(".ipynb"):
            continue
        by_path.setdefault(f.path, {}).setdefault(f.line, set()).add(f.code)
    total = 0
    for path, codes in sorted(by_path.items()):
        try:
            src = read_source(path)
        except SourceError as exc:
            click.echo(f"torchlint: error: {exc}", err=True)
            continue
        new, n = noqa_text(src.text, codes)
        if n and new != src.text:
            if not _parses(new):
                click.echo(f"torchlint: error: {path}: adding noqa comments would break the file; left alone",
                           err=True)
                continue
            err = _write_if_unchanged(src, path, new)
            if err:
                click.echo(f"torchlint: error: {err}", err=True)
                continue
            total += n
    return total

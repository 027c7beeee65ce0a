"""Glue between the CLI and the pipeline: discover, lint, fix, filter, report, exit code."""
from __future__ import annotations

import os
import sys
from typing import Optional

import click

from .cache import Cache
from .discover import discover
from .engine import LintOptions, run
from .findings import Finding
from .output import WRITERS, shown, valid_utf8, write_statistics
from .selection import enabled_codes

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class Runner:
    def __init__(self, cfg, select, ignore, extend_select, jobs=None, cache: Optional[str] = None,
                 verbose=False, progress=True, force_exclude=False):
        self.force_exclude = force_exclude
        self.cfg = cfg
        self.enabled = frozenset(enabled_codes(select, ignore, extend_select))
        self.opts = LintOptions(self.enabled, cfg.rule_settings(), cfg.per_file_ignores, cfg.root)
        self.jobs = jobs if jobs else (os.cpu_count() or 1)
        self.cache = Cache(cache) if cache else None
        self.verbose = verbose
        self.progress = progress
        self.had_error = False
        self._color = False

    def files(self, paths):
        d = discover(paths, exclude=list(self.cfg.exclude) + list(self.cfg.extend_exclude),
                     respect_gitignore=self.cfg.respect_gitignore, follow_symlinks=self.cfg.follow_symlinks,
                     force_exclude=self.force_exclude)
        for p, msg in d.errors:
            click.echo(f"torchlint: error: {shown(p)}: {msg}", err=True)
            self.had_error = True
        return d.files

    def lint(self, files) -> list:
        bar = _Progress(len(files)) if self.progress and _Progress.wanted(len(files)) else None
        try:
            results = run(files, self.opts, jobs=self.jobs, cache=self.cache, progress=bar)
        finally:
            if bar is not None:
                bar.close()
        findings = []
        for r in results:
            if r.error:
                click.echo(f"torchlint: error: {shown(r.error)}", err=True)
                self.had_error = True
            if r.internal_error:
                self.had_error = True
            findings.extend(r.findings)
        findings.sort(key=Finding.sort_key)
        return findings

    def main(self, paths, output_format="text", output_file=None, statistics=False, exit_zero=False,
             quiet=False, fix=False, unsafe_fixes=False, diff=False, show_fixes=False, baseline=None,
             write_baseline=None, add_noqa=False, changed_since=None, color=None, dynamic=False,
             device="cpu", entry=None, steps=3, timeout=120.0, probe_all=False) -> int:
        if changed_since:
            from .vcs import changed_files

            try:
                files = changed_files(self.files(paths), changed_since, self)
            except Exception as exc:
                click.echo(f"torchlint: error: --changed-since {changed_since}: {exc}", err=True)
                return EXIT_ERROR
        else:
            files = self.files(paths)
        fixed = 0
        if fix or diff:
            from .fixer import fix_files

            fixed_report = fix_files(self, files, unsafe=unsafe_fixes, diff=diff, show=show_fixes)
            if diff:
                return EXIT_FINDINGS if fixed_report.changed else (EXIT_ERROR if self.had_error else EXIT_OK)
            fixed = fixed_report.fixed
            if fixed and self.cache is not None:
                # the fixed files changed under this run's memo of content hashes: look again
                self.cache = Cache(self.cache.dir)
        findings = self.lint(files)
        if fix:
            findings = _without_failed_fixes(findings, fixed_report)
        if add_noqa:
            from .fixer import add_noqa as _add_noqa

            n = _add_noqa(findings)
            click.echo(f"Added {n} noqa directive{'s' if n != 1 else ''}.", err=True)
            return EXIT_ERROR if self.had_error else EXIT_OK
        if write_baseline:
            from .baseline import write as _write_baseline

            _write_baseline(write_baseline, findings)
            click.echo(f"Wrote a baseline of {len(findings)} finding(s) to {write_baseline}.", err=True)
            return EXIT_ERROR if self.had_error else EXIT_OK
        if baseline:
            from .baseline import BaselineError, filter_new

            try:
                findings = filter_new(baseline, findings)
            except BaselineError as exc:
                click.echo(f"torchlint: error: {exc}", err=True)
                return EXIT_ERROR
        if dynamic:
            try:
                from .dynamic import MissingDependency, confirm_findings
            except ImportError as exc:
                click.echo(f"torchlint: error: the dynamic mode is unavailable: {exc}", err=True)
                return EXIT_ERROR
            try:
                findings = confirm_findings(findings, files, device=device, entry=entry, steps=steps,
                                            timeout=timeout, probe_all=probe_all,
                                            progress=None if quiet else (lambda line: click.echo(line, err=True)))
            except MissingDependency as exc:
                click.echo(f"torchlint: error: {exc}", err=True)
                return EXIT_ERROR
        out = valid_utf8(self.render(findings, output_format, statistics, quiet, color, output_file, unsafe_fixes,
                                     fixed), output_format)
        self.emit(out, output_file)
        if fixed and (output_format not in ("text", "concise") or statistics or quiet):
            click.echo(f"Fixed {fixed} error{'s' if fixed != 1 else ''}.", err=True)
        if self.had_error:
            return EXIT_ERROR
        if findings and not exit_zero:
            return EXIT_FINDINGS
        return EXIT_OK

    def emit(self, out: str, output_file) -> None:
        if output_file:
            from .reportfile import write_report

            write_report(output_file, out)
        else:
            click.echo(out, nl=False, color=bool(self._color))

    def main_stdin(self, name: str, output_format="text", output_file=None, statistics=False, exit_zero=False,
                   quiet=False, fix=False, unsafe_fixes=False, diff=False, show_fixes=False, baseline=None,
                   color=None) -> int:
        """Lint the source read from stdin as if it were the file ``name`` (ruff's
        ``--stdin-filename``; ``-`` without one). With ``--fix`` the fixed source goes to stdout
        and what remains to stderr; with ``--diff`` the diff goes to stdout."""
        from .engine import display_path, lint_text
        from .source import SourceError, decode

        shown = name if name == "-" else display_path(name)
        path = os.path.abspath(name)
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        if self.force_exclude and name != "-":
            from .discover import force_excluded

            if force_excluded(path, list(self.cfg.exclude) + list(self.cfg.extend_exclude)):
                if fix:  # the source goes through unchanged (an editor replaces the buffer with it)
                    sys.stdout.buffer.write(data)
                    sys.stdout.flush()
                return EXIT_OK
        if name.endswith(".ipynb"):
            from .notebook import lint_notebook

            if fix or diff:
                click.echo("torchlint: error: --fix and --diff do not apply to a notebook read from stdin",
                           err=True)
                return EXIT_ERROR
            from .engine import select_result

            res = select_result(lint_notebook(path, self.opts, None, shown, data=data), self.opts)
            if res.error:
                click.echo(f"torchlint: error: {res.error}", err=True)
                return EXIT_ERROR
            text = None
        else:
            try:
                src = decode(data, shown)
            except SourceError as exc:
                click.echo(f"torchlint: error: {exc}", err=True)
                return EXIT_ERROR
            text = src.text
            res = lint_text(path, text, self.opts, shown=shown)
        if res.error:
            click.echo(f"torchlint: error: {res.error}", err=True)
            self.had_error = True
        if res.internal_error:
            self.had_error = True
        findings = sorted(res.findings, key=Finding.sort_key)
        fixed = 0
        if text is not None and (fix or diff):
            from .fixer import fix_text, fixable_codes, unified_diff

            ff = fix_text(path, text, self.opts, unsafe=unsafe_fixes, shown=shown, first=res.findings,
                          allowed=fixable_codes(self.cfg))
            if diff:
                sys.stdout.write(unified_diff(shown, ff.original, ff.fixed))
                sys.stdout.flush()
                n = len(ff.applied)
                if n:
                    click.echo(f"Would fix {n} error{'s' if n != 1 else ''}.", err=True)
                return EXIT_FINDINGS if ff.changed else (EXIT_ERROR if self.had_error else EXIT_OK)
            sys.stdout.write(ff.fixed)
            sys.stdout.flush()
            fixed = len(ff.applied)
            if ff.changed:
                findings = sorted(lint_text(path, ff.fixed, self.opts, shown=shown).findings, key=Finding.sort_key)
        if baseline:
            from .baseline import BaselineError, filter_new

            try:
                findings = filter_new(baseline, findings)
            except BaselineError as exc:
                click.echo(f"torchlint: error: {exc}", err=True)
                return EXIT_ERROR
        out = self.render(findings, output_format, statistics, quiet, color, output_file, unsafe_fixes, fixed)
        if fix and text is not None and not output_file:
            click.echo(out, nl=False, err=True)  # stdout holds the fixed source
        else:
            self.emit(out, output_file)
        if self.had_error:
            return EXIT_ERROR
        if findings and not exit_zero:
            return EXIT_FINDINGS
        return EXIT_OK

    def render(self, findings, fmt, statistics, quiet, color, output_file, unsafe_fixes, fixed=0) -> str:
        if statistics and fmt in ("text", "concise"):
            return write_statistics(findings)
        if fmt in ("text", "concise"):
            if color is None:
                color = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and not output_file
            elif os.environ.get("NO_COLOR"):
                color = False
            self._color = color
            out = WRITERS["text"](findings, color=color, fixed=fixed)
            if self.had_error and not findings and not fixed:
                out = ""  # not "All checks passed!": something could not be checked
            if quiet:
                out = "".join(line + "\n" for line in out.splitlines() if ": TL" in line or line.startswith("    "))
            return out
        if fmt == "sarif":
            return WRITERS["sarif"](findings, root=self.cfg.root if self.cfg.path else os.getcwd())
        return WRITERS[fmt](findings)


def _without_failed_fixes(findings, report) -> list:
    """After ``--fix``: a finding whose fix was tried and undone (its result did not parse, or
    the finding stayed) no longer offers that fix, so no summary counts it as available."""
    failed = report.failed_fixes()
    if not failed:
        return findings
    out = []
    for f in findings:
        if f.fix is not None and (f.path, f.code, f.fingerprint) in failed:
            from dataclasses import replace

            f = replace(f, fix=None)
        out.append(f)
    return out


class _Progress:
    """A progress bar on stderr, only when stderr is a terminal and the run is long."""

    MIN_FILES = 20

    @classmethod
    def wanted(cls, n: int) -> bool:
        return n >= cls.MIN_FILES and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"

    def __init__(self, total: int):
        self.total, self.done, self._last = total, 0, -1
        self.label = "files"
        self._width = 0

    def phase(self, label: str, total: int) -> None:
        """After the first pass over the files: another phase with its own count, so that the
        bar does not sit at 100% while the run goes on."""
        self.total, self.done, self._last, self.label = total, 0, -1, label
        self(0)

    def __call__(self, n: int) -> None:
        self.done += n
        pct = int(100 * self.done / max(self.total, 1))
        if pct != self._last:
            self._last = pct
            width = 30
            fill = width * self.done // max(self.total, 1)
            line = f"[{'#' * fill}{' ' * (width - fill)}] {self.done}/{self.total} {self.label}"
            pad = " " * max(self._width - len(line), 0)
            self._width = len(line)
            sys.stderr.write(f"\r{line}{pad}")
            sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\r" + " " * max(self._width, 60) + "\r")
        sys.stderr.flush()

"""A flake8 plugin: `flake8 --select TL` runs torchlint's rules on each file flake8 checks.

Cross-module effects are not available through flake8 (it checks one file at a time); use
the `torchlint` command for those.
"""
from __future__ import annotations

from typing import Iterator

from . import __version__


class Flake8Plugin:
    name = "torchlint"
    version = __version__

    def __init__(self, tree, filename: str = "stdin", lines=None):
        self.filename = filename
        self.lines = lines

    def run(self) -> Iterator[tuple]:
        from .engine import LintOptions, lint_text
        from .selection import enabled_codes

        if self.lines is None:
            try:
                with open(self.filename, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                return
        else:
            text = "".join(self.lines)
        opts = LintOptions(frozenset(enabled_codes(["TL"], ["TL001"], [])))
        res = lint_text(self.filename, text, opts)
        for f in res.findings:
            # flake8 expects a 1-based line and a 0-based column
            yield f.line, f.column, f"{f.code} {f.message}", type(self)

"""A flake8 plugin: `flake8 --select TL` runs torchlint's rules on each file flake8 checks.

flake8 runs every installed plugin on every file and filters the reports afterwards, so the
plugin asks flake8's own decision engine (its `--select`/`--ignore`/`--extend-select`/
`--extend-ignore` options and configuration files) which TL codes can be reported, and runs
only those rules: `flake8 --select E9` costs nothing more with torchlint installed. With
flake8's `--disable-noqa`, torchlint's `# noqa` comments do not suppress either.

Cross-module effects are not available through flake8 (it checks one file at a time); use
the `torchlint` command for those.
"""
from __future__ import annotations

from typing import Iterator, Optional

from . import __version__


def _selected_codes(options) -> Optional[frozenset]:
    """The TL codes flake8 would report with ``options`` (None: flake8's API is not the one
    expected, run them all and let flake8 filter)."""
    from .codes import CODES

    try:
        from flake8.style_guide import Decision, DecisionEngine

        engine = DecisionEngine(options)
        selected = {c for c in CODES if engine.decision_for(c) is Decision.Selected}
    except Exception:
        return None
    # as with the torchlint command, TL002 (unused noqa) and the preview rules run only when
    # named by their full code
    from .selection import preview_codes

    named = {c.strip().upper() for c in list(getattr(options, "select", None) or ())
             + list(getattr(options, "extend_select", None) or ())}
    selected -= (preview_codes() | {"TL002"}) - named
    return frozenset(selected)


class Flake8Plugin:
    name = "torchlint"
    version = __version__
    # set by flake8 through ``parse_options`` (in every worker process too)
    selected: Optional[frozenset] = None
    disable_noqa = False

    def __init__(self, tree, filename: str = "stdin", lines=None):
        self.filename = filename
        self.lines = lines

    @classmethod
    def parse_options(cls, options) -> None:
        cls.selected = _selected_codes(options)
        cls.disable_noqa = bool(getattr(options, "disable_noqa", False))

    def run(self) -> Iterator[tuple]:
        # TL000 (a rule failed) always shows when any rule runs; TL001 is flake8's E999
        codes = self.selected
        if codes is not None:
            codes = codes - {"TL000", "TL001"}
            if not codes:
                return  # nothing of ours is selected: no parse, no analysis
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
        enabled = frozenset(enabled_codes(["TL"], ["TL001"], [])) if codes is None else codes | {"TL000"}
        opts = LintOptions(enabled, noqa=not self.disable_noqa)
        res = lint_text(self.filename, text, opts)
        for f in res.findings:
            # flake8 expects a 1-based line and a 0-based column
            yield f.line, f.column, f"{f.code} {f.message}", type(self)

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")


@pytest.fixture
def lint_source(tmp_path):
    """Lint one module's source text with every default rule; returns [(code, line), ...]."""
    from torchlint.engine import LintOptions, lint_text
    from torchlint.selection import enabled_codes, preview_codes

    def _lint(text, name="train.py", select=("TL",)):
        p = tmp_path / name
        p.write_text(text)
        # every rule the selection names, preview rules included (rule tests test rules, not the
        # default set; tests of the default set go through the CLI)
        preview = sorted(c for c in preview_codes() if any(c.startswith(p) for p in select))
        opts = LintOptions(frozenset(enabled_codes(list(select), [], preview)))
        res = lint_text(str(p), text, opts, module_name=name[:-3])
        return [(f.code, f.line) for f in res.findings]

    return _lint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

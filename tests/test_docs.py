"""Rule pages are generated from the rules' metadata and must not drift; README stays true."""
import os
import re

import pytest

from torchlint.docs import rule_markdown
from torchlint.rule import all_rules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = all_rules()


@pytest.mark.parametrize("code", sorted(RULES))
def test_rule_page_matches_metadata(code):
    path = os.path.join(ROOT, "docs", "rules", f"{code}.md")
    assert os.path.exists(path), f"missing {path}: run `python -m torchlint.docs docs/rules`"
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == rule_markdown(RULES[code]), "run `python -m torchlint.docs docs/rules`"


def test_code_table_matches_rules():
    """torchlint/codes.py (read on cached runs instead of importing the rules) is generated."""
    from torchlint.docs import codes_module

    with open(os.path.join(ROOT, "torchlint", "codes.py"), encoding="utf-8") as fh:
        assert fh.read() == codes_module(), "run `python -m torchlint.docs docs/rules`"


@pytest.mark.parametrize("code", sorted(c for c in RULES if c not in ("TL000",)))
def test_rule_metadata_is_complete(code):
    r = RULES[code]
    assert re.fullmatch(r"TL\d{3}", r.code)
    assert re.fullmatch(r"[a-z0-9-]+", r.name)
    assert r.summary and r.why and r.example and r.use_instead
    if r.fix_safety:
        assert r.fix_safety in ("safe", "unsafe") and r.fix_doc
    if code not in ("TL001", "TL002", "TL003"):  # the engine's own findings
        assert r.triggers, "rules need prefilter triggers"


def test_rule_examples_parse():
    import libcst as cst

    for r in RULES.values():
        for src in (r.example, r.use_instead):
            if src and r.code != "TL001":
                cst.parse_module(src)


def test_readme_lists_every_rule():
    """README's table of rules is generated too (so a new rule edits no README by hand)."""
    from torchlint.docs import readme_with_table

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert readme == readme_with_table(readme), "run `python -m torchlint.docs docs/rules`"
    for code in RULES:
        if code == "TL000":
            continue
        assert f"[{code}](docs/rules/{code}.md)" in readme


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci = fh.read()
    m = re.search(r"pip install -e '\.\[test\]' 'torch==[\d.]+' && python -m pytest -q", readme)
    assert m, "README test command changed: update this test and .ci/run"
    assert "pip install -q -e '.[test]' 'torch==2.13.0'" in ci and "python -m pytest -q" in ci

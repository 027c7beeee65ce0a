"""The examples on the rule pages are tests: every registered rule's `example` produces that
rule's finding and its `use_instead` produces no finding at all.

The pages under docs/rules/ are generated from the same metadata (tests/test_docs.py checks
that they do not drift), so what a reader sees is what is linted here. Snippets that show no
imports get the ones a reader assumes.
"""
import re

import pytest

from torchlint.engine import LintOptions, lint_text
from torchlint.rule import all_rules
from torchlint.selection import enabled_codes

RULES = all_rules()
HEADER = ("import torch\n"
          "import torch.nn as nn\n"
          "import torch.nn.functional as F\n"
          "from torch.utils.data import DataLoader\n"
          "\n")
NO_EXAMPLE = {"TL000"}  # an internal error: no code should produce it


def _lint(tmp_path, code, src):
    if not re.search(r"^(import|from) ", src, re.M):
        src = HEADER + src
    p = tmp_path / "train.py"
    p.write_text(src)
    # the default rules and this one (opt-in rules such as TL002 are documented too)
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], [])) | {code})
    res = lint_text(str(p), src, opts, module_name="train")
    return [(f.code, f.line, f.message) for f in res.findings]


def test_every_rule_is_covered():
    assert len(RULES) >= 23
    assert all(RULES[c].example and RULES[c].use_instead for c in RULES if c not in NO_EXAMPLE)


@pytest.mark.parametrize("code", sorted(set(RULES) - NO_EXAMPLE))
def test_example_produces_the_rules_finding(tmp_path, code):
    found = _lint(tmp_path, code, RULES[code].example)
    assert any(c == code for c, _, _ in found), f"{code}'s example gives {found}"


@pytest.mark.parametrize("code", sorted(set(RULES) - NO_EXAMPLE))
def test_use_instead_is_clean(tmp_path, code):
    found = _lint(tmp_path, code, RULES[code].use_instead)
    assert found == [], f"{code}'s `use_instead` gives {found}"

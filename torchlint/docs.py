"""Rule documentation, built from each rule's metadata (ruff's page layout)."""
from __future__ import annotations


def rule_markdown(r) -> str:
    parts = [f"# {r.name} ({r.code})", ""]
    fix = {"safe": "Fix is always available (safe).", "unsafe": "Fix is sometimes available (unsafe)."}.get(
        r.fix_safety or "", "")
    if fix:
        parts += [f"*{fix}*", ""]
    if not r.default:
        parts += ["*Preview: off by default; enable it with `--select " + r.code + "` (or `extend-select = [\"" +
                  r.code + "\"]`). " + (f"Why: {r.preview_reason}." if r.preview_reason else
                  "It misses the precision targets on real code (docs/evaluation.md).") + "*", ""]
    parts += ["## What it does", r.summary, "", "## Why is this bad?", r.why, ""]
    if r.exempt_in_tests:
        parts += ["## Test code", "Not reported in test code (`tests/`, `test/`, `test_*.py`, `*_test.py`, "
                  "`*_tests.py`, `conftest.py`, `unittest.TestCase` classes), where such findings are harmless.", ""]
    if r.known_problems:
        parts += ["## Known problems", r.known_problems, ""]
    if r.example:
        parts += ["## Example", "```python", r.example.rstrip("\n"), "```", ""]
    if r.use_instead:
        parts += ["Use instead:", "```python", r.use_instead.rstrip("\n"), "```", ""]
    if r.fix_safety:
        parts += ["## Fix safety", r.fix_doc or f"The fix is {r.fix_safety}.", ""]
    if r.options:
        parts += ["## Options", r.options, ""]
    if r.references:
        parts += ["## References"] + [f"- <{u}>" for u in r.references] + [""]
    return "\n".join(parts)


def codes_module() -> str:
    """The text of ``torchlint/codes.py`` (every code and its name), from the rule classes."""
    from .rule import all_rules

    head = '''"""Every rule code and its name: what the command line needs (selection, output) without
importing the rules, and with them libcst, on a run answered from the cache.

Generated from the rule classes by ``python -m torchlint.docs``; ``tests/test_docs.py`` checks
that it matches them.
"""

DOCS_URL = "https://github.com/torchlint/torchlint/blob/main/docs/rules/{code}.md"

CODES = {
'''
    rules = all_rules()
    preview = ", ".join(f'"{c}"' for c, r in rules.items() if not r.default)
    return head + "".join(f'    "{c}": "{r.name}",\n' for c, r in rules.items()) + "}\n" + \
        "\n# rules off by default (preview): selected only by their full code\n" + \
        f"PREVIEW = frozenset({{{preview}}})\n"


def write_docs(directory: str) -> list:
    """Write docs/rules/<CODE>.md for every rule; returns the paths written."""
    import os

    from .rule import all_rules

    os.makedirs(directory, exist_ok=True)
    out = []
    for code, r in all_rules().items():
        p = os.path.join(directory, f"{code}.md")
        with open(p, "w", encoding="utf-8") as fh:
            fh.write(rule_markdown(r))
        out.append(p)
    return out


if __name__ == "__main__":  # python -m torchlint.docs docs/rules
    import sys

    for p in write_docs(sys.argv[1] if len(sys.argv) > 1 else "docs/rules"):
        print(p)
    import os

    codes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codes.py")
    with open(codes, "w", encoding="utf-8") as fh:
        fh.write(codes_module())
    print(codes)

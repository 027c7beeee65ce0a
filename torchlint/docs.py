"""Rule documentation, built from each rule's metadata (ruff's page layout)."""
from __future__ import annotations


def rule_markdown(r) -> str:
    parts = [f"# {r.name} ({r.code})", ""]
    fix = {"safe": "Fix is always available (safe).", "unsafe": "Fix is sometimes available (unsafe)."}.get(
        r.fix_safety or "", "")
    if fix:
        parts += [f"*{fix}*", ""]
    parts += ["## What it does", r.summary, "", "## Why is this bad?", r.why, ""]
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

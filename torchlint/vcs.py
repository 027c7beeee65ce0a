"""`--changed-since REV`: the files changed since a git revision, plus the modules depending on them."""
from __future__ import annotations

import os
import subprocess


def _git(args, cwd):
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip() or f"git {' '.join(args)} failed")
    return r.stdout


def changed_files(files, rev: str, runner) -> list:
    """Of ``files``, those changed since ``rev`` (committed, staged, unstaged or untracked),
    plus every file that imports one of them (directly or through other files)."""
    if not files:
        return []
    cwd = os.path.dirname(os.path.abspath(files[0])) or "."
    top = _git(["rev-parse", "--show-toplevel"], cwd).strip()
    _git(["rev-parse", "--verify", "--quiet", rev + "^{commit}"], top)
    names = set(_git(["diff", "--name-only", rev, "--"], top).split("\n"))
    names |= set(_git(["ls-files", "--others", "--exclude-standard"], top).split("\n"))
    changed = {os.path.realpath(os.path.join(top, n)) for n in names if n}
    selected = {f for f in files if os.path.realpath(f) in changed}
    # dependents: modules importing a selected module (fixpoint over the import graph)
    from .discover import module_name_for

    mod_of = {f: module_name_for(f)[0] for f in files}
    imports = {f: _imports_of(f, *module_name_for(f)) for f in files}
    frontier = set(selected)
    while frontier:
        mods = {mod_of[f] for f in frontier}
        new = {f for f in files if f not in selected and any(
            i == m or i.startswith(m + ".") or m.startswith(i + ".") for i in imports[f] for m in mods)}
        selected |= new
        frontier = new
    return [f for f in files if f in selected]


def _imports_of(path: str, modname: str = "", is_pkg: bool = False) -> set:
    import re

    def absolute(name: str) -> str:
        if not name.startswith("."):
            return name
        level = len(name) - len(name.lstrip("."))
        base = modname.split(".") if modname else []
        if not is_pkg:
            base = base[:-1]
        base = base[: max(0, len(base) - (level - 1))]
        rest = name.lstrip(".")
        return ".".join(base + ([rest] if rest else []))

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return set()
    out = set()
    for m in re.finditer(r"^\s*(?:from\s+(\.*[\w.]*)\s+import\s+([\w, ]+)|import\s+([\w., ]+))", text, re.M):
        if m.group(1):
            base = absolute(m.group(1))
            out.add(base)
            for n in m.group(2).split(","):
                out.add(f"{base}.{n.strip()}".lstrip("."))
        else:
            for n in m.group(3).split(","):
                out.add(n.strip().split(" as ")[0])
    return out

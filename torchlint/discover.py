"""Paths -> the files to lint (.py, .pyi, .ipynb), in a deterministic order.

Directories are walked recursively, skipping excluded names and what `.gitignore` files
ignore; a file named on the command line is always linted. Symbolic links are not followed
out of the linted roots, and loops are detected.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field

EXTENSIONS = (".py", ".pyi", ".ipynb")


@dataclass
class Discovery:
    files: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # (path, message)


class _GitIgnore:
    def __init__(self, base: str, lines):
        self.base = base
        self.rules = []
        for ln in lines:
            ln = ln.rstrip("\n").rstrip()
            if not ln or ln.startswith("#"):
                continue
            neg = ln.startswith("!")
            if neg:
                ln = ln[1:]
            dir_only = ln.endswith("/")
            ln = ln.rstrip("/")
            anchored = "/" in ln
            ln = ln.lstrip("/")
            self.rules.append((ln, neg, dir_only, anchored))

    def match(self, path: str, is_dir: bool):
        rel = os.path.relpath(path, self.base).replace(os.sep, "/")
        result = None
        for pat, neg, dir_only, anchored in self.rules:
            if dir_only and not is_dir:
                continue
            target = rel if anchored else rel.rsplit("/", 1)[-1]
            if fnmatch.fnmatchcase(target, pat) or (anchored and fnmatch.fnmatchcase(rel, pat + "/**")):
                result = not neg
        return result


def _load_gitignore(d: str):
    p = os.path.join(d, ".gitignore")
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            return _GitIgnore(d, fh.readlines())
    except OSError:
        return None


_EXCLUDE_RE: dict = {}
_GLOB = re.compile(r"[*?\[]")


def _exclude_matchers(patterns):
    """For a pattern list: the literal names (``.git``, ``build``) as a set, and two compiled
    regexes for the glob patterns, one for the base name, one for the path (``pat``,
    ``*/pat`` or ``*/pat/*``). One match per entry instead of 4 per pattern."""
    key = tuple(patterns)
    m = _EXCLUDE_RE.get(key)
    if m is None:
        literal, names, paths = set(), [], []
        for pat in key:
            p = pat.rstrip("/")
            if not _GLOB.search(p) and "/" not in p:
                literal.add(p)
                continue
            names.append(fnmatch.translate(p))
            paths += [fnmatch.translate(p), fnmatch.translate("*/" + p), fnmatch.translate("*/" + p + "/*")]
        never = re.compile(r"(?!)")
        m = (frozenset(literal), re.compile("|".join(names)) if names else never,
             re.compile("|".join(paths)) if paths else never)
        _EXCLUDE_RE[key] = m
    return m


def _excluded(path: str, patterns) -> bool:
    if not patterns:
        return False
    literal, name_re, path_re = _exclude_matchers(patterns)
    name = os.path.basename(path.rstrip(os.sep))
    path = path.replace(os.sep, "/")
    if literal:
        # a literal ``pat`` matches what its three globs match: the name, the whole path, or
        # a component with a folder before and something after it
        parts = path.split("/")
        if name in literal or path in literal or not literal.isdisjoint(parts[1:-1]):
            return True
    return bool(name_re.match(name) or path_re.match(path))


def discover(paths, exclude=(), respect_gitignore=True, follow_symlinks=False,
             force_exclude=False) -> Discovery:
    out = Discovery()
    seen = set()
    roots = [os.path.realpath(p) for p in paths]

    def inside_roots(real: str) -> bool:
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)

    def add(path: str, key: str = None):
        if key is None:
            key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            out.files.append(path)

    for p in paths:
        if not os.path.lexists(p):
            out.errors.append((p, "no such file or directory"))
            continue
        if os.path.isfile(p):
            if force_exclude and _excluded(os.path.relpath(os.path.abspath(p)), exclude):
                continue
            add(p)  # always linted when named (unless --force-exclude)
            continue
        if not os.path.isdir(p):
            out.errors.append((p, "not a file or directory"))
            continue
        ignores = []
        # .gitignore files of the parents up to the repository root
        d = os.path.abspath(p)
        chain = []
        while True:
            chain.append(d)
            if os.path.isdir(os.path.join(d, ".git")):
                break
            parent = os.path.dirname(d)
            if parent == d:
                chain = [os.path.abspath(p)]
                break
            d = parent
        if respect_gitignore:
            for d in reversed(chain[1:]):
                gi = _load_gitignore(d)
                if gi:
                    ignores.append(gi)
        visited_dirs = set()
        _walk(p, exclude, ignores, respect_gitignore, follow_symlinks, inside_roots, visited_dirs, add, out,
              os.path.realpath(p))
    return out


def _ignored(path: str, is_dir: bool, ignores) -> bool:
    res = None
    for gi in ignores:
        r = gi.match(path, is_dir)
        if r is not None:
            res = r
    return bool(res)


def _walk(d, exclude, ignores, respect_gitignore, follow_symlinks, inside_roots, visited, add, out, real):
    """Walk folder ``d`` whose real path is ``real`` (a plain subfolder's real path is its
    parent's joined with its name: ``realpath`` only for symbolic links)."""
    if real in visited:
        return  # a symlink loop
    visited.add(real)
    if respect_gitignore:
        gi = _load_gitignore(d)
        if gi:
            ignores = ignores + [gi]
    try:
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError as exc:
        out.errors.append((d, f"cannot read directory: {exc.strerror or exc}"))
        return
    base = real + os.sep if not real.endswith(os.sep) else real
    for e in entries:
        path = e.path  # d joined with the name
        try:
            is_link = e.is_symlink()
            target = base + e.name
            if is_link:
                target = os.path.realpath(path)
                if not follow_symlinks and not inside_roots(target):
                    continue
            is_dir = e.is_dir(follow_symlinks=True)
        except OSError:
            continue
        if _excluded(path, exclude):
            continue
        if respect_gitignore and _ignored(path, is_dir, ignores):
            continue
        if is_dir:
            if is_link and not os.path.exists(path):
                continue
            _walk(path, exclude, ignores, respect_gitignore, follow_symlinks, inside_roots, visited, add, out, target)
        elif e.name.endswith(EXTENSIONS):
            add(path, target)


def module_name_for(path: str) -> tuple[str, bool]:
    """Dotted module name from the package structure on disk, and whether it is a package."""
    path = abspath(path)
    d, base = os.path.split(path)
    stem = base.rsplit(".", 1)[0]
    is_pkg = stem == "__init__"
    pkg = _package_of(d)
    if is_pkg:
        return pkg, True
    return f"{pkg}.{stem}" if pkg else stem, False


_PACKAGES: dict = {}  # folder -> its dotted package name ("" outside packages), for one run


def forget_packages() -> None:
    """Forget what one run learnt of the disk: folders' packages, absolute paths, the working
    directory."""
    _PACKAGES.clear()
    _ABSPATHS.clear()


_ABSPATHS: dict = {}  # path -> os.path.abspath(path), for one run (it calls getcwd() each time)
_CWD = "\0cwd"  # the working directory's key in _ABSPATHS


def abspath(path: str) -> str:
    """``os.path.abspath``, once per path and run (the cache, the module table and the
    engine each ask for every file of the tree), with ``getcwd()`` once per run."""
    got = _ABSPATHS.get(path)
    if got is None:
        if len(_ABSPATHS) > 200_000:  # a long-lived process (the language server)
            _ABSPATHS.clear()
        if os.name != "posix":
            got = os.path.abspath(path)
        elif os.path.isabs(path):
            got = os.path.normpath(path)
        else:
            cwd = _ABSPATHS.get(_CWD)
            if cwd is None:
                cwd = _ABSPATHS[_CWD] = os.getcwd()
            got = os.path.normpath(os.path.join(cwd, path))
        _ABSPATHS[path] = got
    return got


def _package_of(d: str) -> str:
    got = _PACKAGES.get(d)
    if got is None:
        parent, name = os.path.split(d)
        if name and os.path.isfile(os.path.join(d, "__init__.py")):
            up = _package_of(parent)
            got = f"{up}.{name}" if up else name
        else:
            got = ""
        if len(_PACKAGES) > 50_000:  # a long-lived process (the language server)
            _PACKAGES.clear()
        _PACKAGES[d] = got
    return got

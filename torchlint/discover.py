"""Paths -> the files to lint (.py, .pyi, .ipynb), in a deterministic order.

Directories are walked recursively, skipping excluded names and what git ignores
(`.gitignore` files and `.git/info/exclude`, matched as git does: `torchlint/gitignore.py`);
a file named on the command line is always linted. Symbolic links are not followed
out of the linted roots, and loops are detected.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field

from . import gitignore

EXTENSIONS = (".py", ".pyi", ".ipynb")


@dataclass
class Discovery:
    files: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # (path, message)


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


def force_excluded(path: str, patterns) -> bool:
    """``--force-exclude`` for a path named on the command line (or ``--stdin-filename``):
    excluded when it or one of its folders is, as if the walk had reached it (a pattern
    ``legacy/`` excludes ``legacy/train.py``, which pre-commit names)."""
    if not patterns:
        return False
    rel = os.path.relpath(os.path.abspath(path)).replace(os.sep, "/")
    parts = rel.split("/")
    start = 0
    while start < len(parts) - 1 and parts[start] == "..":
        start += 1  # the folders above the working directory are not the project's
    return any(_excluded("/".join(parts[:i]), patterns) for i in range(start + 1, len(parts) + 1))


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
            if force_exclude and force_excluded(p, exclude):
                continue
            add(p)  # always linted when named (unless --force-exclude)
            continue
        if not os.path.isdir(p):
            out.errors.append((p, "not a file or directory"))
            continue
        visited_dirs = set()
        stack, prefix = _ignores_above(p) if respect_gitignore else ([], "")
        _walk(p, exclude, stack, prefix, respect_gitignore, follow_symlinks, inside_roots, visited_dirs, add, out,
              os.path.realpath(p))
    return out


def _ignores_above(p: str):
    """For a folder ``p`` to walk: the ignore files that apply to what is inside it
    (``info/exclude`` and the ``.gitignore`` files of its parents up to the top of its git
    repository, lowest precedence first) and ``p``'s path relative to that top (``"a/b/"``).
    Outside a repository: none and ``""`` (``p``'s own ``.gitignore`` files still count)."""
    top = os.path.abspath(p)
    chain = []
    while not os.path.lexists(os.path.join(top, ".git")):
        parent = os.path.dirname(top)
        if parent == top:
            return [], ""
        chain.append(os.path.basename(top))
        top = parent
    stack = []
    ex = gitignore.info_exclude(top)
    if ex is not None:
        stack.append(ex)
    prefix = ""
    d = top
    for name in reversed(chain):  # the folders above p, from the top down (p's own is read by the walk)
        gi = gitignore.read(os.path.join(d, ".gitignore"), prefix)
        if gi is not None:
            stack.append(gi)
        d = os.path.join(d, name)
        prefix += name + "/"
    return stack, prefix


def _walk(d, exclude, ignores, prefix, respect_gitignore, follow_symlinks, inside_roots, visited, add, out, real):
    """Walk folder ``d`` whose real path is ``real`` (a plain subfolder's real path is its
    parent's joined with its name: ``realpath`` only for symbolic links). ``ignores``: the
    ignore files that apply in ``d`` (lowest precedence first), whose bases are relative to
    the same top folder as ``prefix``, ``d``'s path (``""`` or ``"a/b/"``)."""
    if real in visited:
        return  # a symlink loop
    visited.add(real)
    try:
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError as exc:
        out.errors.append((d, f"cannot read directory: {exc.strerror or exc}"))
        return
    if respect_gitignore:
        names = {e.name: e for e in entries if e.name in (".git", ".gitignore")}
        if ".git" in names and prefix:  # a repository inside: its own rules, from its top
            ex = gitignore.info_exclude(d)
            ignores, prefix = ([ex] if ex is not None else []), ""
        gi_entry = names.get(".gitignore")
        if gi_entry is not None and not gi_entry.is_symlink():  # git reads no symlinked .gitignore
            gi = gitignore.read(gi_entry.path, prefix)
            if gi is not None:
                ignores = ignores + [gi]
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
        # git sees a symbolic link as a link, never a folder (``build/`` does not match it)
        if ignores and gitignore.ignored(ignores, prefix + e.name, is_dir and not is_link):
            continue
        if is_dir:
            if is_link and not os.path.exists(path):
                continue
            _walk(path, exclude, ignores, prefix + e.name + "/", respect_gitignore, follow_symlinks,
                  inside_roots, visited, add, out, target)
        elif e.name.endswith(EXTENSIONS):
            try:  # regular files only: reading a FIFO named x.py would block the run forever
                regular = e.is_file(follow_symlinks=True)
            except OSError:
                continue
            if regular:
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

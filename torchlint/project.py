"""What the engine knows about the other modules of the linted tree, and which part of it a
module's results depend on.  Free of libcst: a run answered from the cache imports no parser.
"""
from __future__ import annotations

import sys
from typing import Optional

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) - {"test"}
# summary fields that describe a function rather than what it does
_SHAPE_KEYS = frozenset(("name", "qualname", "path", "line", "params", "free"))
# facts a call's value inherits from what the callee returns
RETURN_KEEP = frozenset({"graph", "loss", "probs", "logprobs", "sigmoid", "logits", "moved",
                         "detached", "scalar", "model_out", "fresh", "float"})


def summary_has_effects(summary: Optional[dict]) -> bool:
    """Whether a summary says the function does anything a caller's analysis can use."""
    return bool(summary) and any(v for k, v in summary.items() if k not in _SHAPE_KEYS)


# What a module asked another module, and which part of the answer it used.  A question is
# recorded as ``"<aspect>:<qualname>"`` (``qualname`` alone for "effects"); the engine hashes
# only that part of the answer, so a file is linted again only when something it used changed.
#   effects  what the function does (backward, step, clear, modes, moves ...), not what it returns
#   ret      what the value of a call carries (RETURN_KEEP), for a call with no batch argument
#   retb     the same for a call given a batch (a batch passed through stays a batch)
#   exact    the whole summary (an unknown function is treated unlike a known one that does nothing)
#   class    is it an nn.Module
#   fwd      what its forward returns (probabilities, log-probabilities, ...)
#   mode     is a module class known not to depend on train/eval mode
#   method   which method a name on an imported class resolves to
#   called   is it called from another module (under no_grad only?)
def project_answer(aspect: str, summary: Optional[dict]):
    """The part of ``summary`` a question of ``aspect`` depends on (``None``: as if unknown)."""
    if not summary:
        return None
    if aspect == "exact":
        return summary
    if aspect in ("ret", "retb"):
        keep = RETURN_KEEP | {"param_in", "moved"} if aspect == "retb" else RETURN_KEEP
        return sorted(set(summary.get("returns", ())) & keep) or None
    d = {k: v for k, v in summary.items() if k != "returns"}
    return d if summary_has_effects(d) else None


class _Exports(dict):
    """One of the project's maps of exported names (summaries, classes, re-exports, stars).
    A lookup first reads the pending exports of the modules that could hold the name (a
    cached result not read yet: see ``ProjectIndex.pending``)."""

    __slots__ = ("_project",)

    def __init__(self, project, data=None):
        super().__init__(data or {})
        self._project = project

    def _read(self, key) -> None:
        if self._project.pending:
            self._project.load_pending(key)

    def get(self, key, default=None):
        self._read(key)
        return dict.get(self, key, default)

    def __contains__(self, key):
        self._read(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key):
        self._read(key)
        return dict.__getitem__(self, key)


class ProjectIndex:
    """What the engine knows about the other modules of the linted tree.

    ``modules`` maps module *keys* to files.  A key is the dotted module name, unless two
    files of the tree share that name (``main.py`` in several example folders): then each gets
    ``name@<hash of its import root>`` and an import resolves to the one importable from the
    importer's root (its own folder for a script), or to nothing when that is ambiguous.
    ``summaries`` maps ``key.function`` (``key.Class.method``) to summary dicts produced by
    other workers (empty on the first pass).  ``classes`` maps ``key.Class`` to small class
    facts (is it an ``nn.Module``, its bases and methods, what its forward returns).
    ``reexports`` maps ``key.name`` to the qualified name it stands for (a package
    ``__init__``'s ``from .engine import train``; any module's ``from x import y``);
    ``stars`` maps a key to the modules it ``import *``s from.
    """

    def __init__(self, modules: Optional[dict] = None, summaries: Optional[dict] = None,
                 classes: Optional[dict] = None, reexports: Optional[dict] = None):
        self.called: set = set()
        self.called_under_no_grad: set = set()
        self.modules = modules or {}
        self.summaries = _Exports(self, summaries)
        self.classes = _Exports(self, classes)
        self.reexports = _Exports(self, reexports)
        self.stars: dict = _Exports(self)
        # module key -> a cached result whose exports are read on the first lookup of a name
        # of that module (a run where a few files changed does not read the whole tree's)
        self.pending: dict = {}
        self.by_name: dict = {}  # dotted module name -> [keys]
        self.roots: dict = {}  # key -> import root directory
        self.key_of_path: dict = {}  # absolute path -> key
        for key in self.modules:
            self.by_name.setdefault(key.split("@", 1)[0], []).append(key)

    @classmethod
    def for_files(cls, files) -> "ProjectIndex":
        """The module table of a tree: keys, import roots, files."""
        import hashlib
        import os

        from .discover import abspath, module_name_for

        entries = []
        roots: dict = {}  # folder -> (its package's dotted name, the import root above it)
        for f in files:
            if not f.endswith((".py", ".pyi")):
                continue
            ap = abspath(f)
            folder, base = os.path.split(ap)
            got = roots.get(folder)
            if got is None:
                pkg = module_name_for(os.path.join(folder, "__init__.py"))[0]
                root = folder
                for _ in range(pkg.count(".") + 1 if pkg else 0):
                    root = os.path.dirname(root)
                got = roots[folder] = (pkg, root)
            pkg, root = got
            stem = base.rsplit(".", 1)[0]
            if stem == "__init__":
                name = pkg
            else:
                name = f"{pkg}.{stem}" if pkg else stem
            entries.append((name, root, ap, f))
        first: dict = {}  # name -> the import root of its first file
        shared = set()  # names of files under several import roots
        for name, root, ap, f in entries:
            if first.setdefault(name, root) != root:
                shared.add(name)
        p = cls()
        for name, root, ap, f in entries:
            if name not in shared:
                key = name
            else:
                key = f"{name}@{hashlib.sha1(root.encode()).hexdigest()[:8]}"
            if key in p.modules and not f.endswith(".py"):
                continue  # prefer the .py over a stub
            p.modules[key] = f
            p.roots[key] = root
            p.key_of_path[ap] = key
            keys = p.by_name.setdefault(name, [])
            if key not in keys:
                keys.append(key)
        return p

    def clear_exports(self) -> None:
        for m in (self.summaries, self.classes, self.reexports, self.stars):
            dict.clear(m)
        self.pending = {}

    def add_exports(self, module: str, summaries, classes, reexports, stars) -> None:
        dict.update(self.summaries, summaries)
        dict.update(self.classes, classes)
        dict.update(self.reexports, reexports)
        if stars and module:
            dict.__setitem__(self.stars, module, list(stars))

    def defer(self, result) -> bool:
        """Read ``result``'s exports when a name of its module is first looked up (``False``:
        it cannot wait, read them now)."""
        if not result.module or result.module in self.pending:
            return False
        self.pending[result.module] = result
        return True

    def load_pending(self, name) -> None:
        """Read the pending exports of every module that is ``name`` or a prefix of it."""
        if not isinstance(name, str):
            return
        head = name
        while head:
            r = self.pending.pop(head, None)
            if r is not None:
                self.add_exports(r.module, r.summaries, r.classes, r.reexports, r.stars)
            head = head.rpartition(".")[0]

    def key_for(self, path: str, name: str) -> str:
        from .discover import abspath

        return self.key_of_path.get(abspath(path), name) if path else name

    def module_key(self, name: str, root: Optional[str] = None, here: Optional[str] = None) -> Optional[str]:
        """The key of the tree module an import of ``name`` loads, seen from ``root``."""
        keys = self.by_name.get(name)
        if not keys:
            return None
        if name.partition(".")[0] in _STDLIB:
            # ``import itertools`` loads the standard library's module, not a tree file of
            # that name, unless the importer sits next to it (a script run from its folder)
            keys = [k for k in keys if self.roots.get(k) in (root, here)]
            if not keys:
                return None
        if len(keys) == 1:
            return keys[0]
        for r in (root, here):
            if r is None:
                continue
            hit = [k for k in keys if self.roots.get(k) == r]
            if len(hit) == 1:
                return hit[0]
        return None

    def locate(self, qual: Optional[str], root: Optional[str] = None,
               here: Optional[str] = None) -> Optional[str]:
        """``engine.train`` -> the key-qualified name of a tree member, or ``None``.

        The longest dotted prefix that names a tree module is the module; package
        re-exports and star imports are followed.
        """
        if not qual:
            return None
        parts = qual.split(".")
        for i in range(len(parts) - 1, 0, -1):
            key = self.module_key(".".join(parts[:i]), root, here)
            if key is not None:
                return self.resolve(".".join([key] + parts[i:]))
        return None

    def resolve(self, qual: str) -> Optional[str]:
        """Follow package ``__init__`` re-exports: ``pkg.train`` -> ``pkg.engine.train``."""
        seen = 0
        while seen < 8:
            if qual in self.reexports:
                qual = self.reexports[qual]
            else:
                mod, _, name = qual.rpartition(".")
                for star in self.stars.get(mod, ()):
                    cand = f"{star}.{name}"
                    if cand in self.summaries or cand in self.classes or cand in self.reexports:
                        qual = cand
                        break
                else:
                    # a method reached through a re-exported class: pkg.Trainer.fit
                    head, _, last = qual.rpartition(".")
                    if head in self.reexports and head != qual:
                        qual = f"{self.reexports[head]}.{last}"
                    else:
                        return qual
            seen += 1
        return qual

    def method(self, cls_qual: str, name: str, depth: int = 0) -> Optional[str]:
        """``key.Class`` + method name -> the key-qualified method, following bases."""
        facts = self.classes.get(self.resolve(cls_qual))
        if not facts or depth > 8:
            return None
        if name in facts.get("methods", ()):
            return f"{self.resolve(cls_qual)}.{name}"
        for b in facts.get("bases", ()):
            m = self.method(b, name, depth + 1)
            if m is not None:
                return m
        return None

"""What the engine knows about the other modules of the linted tree, and which part of it a
module's results depend on.  Free of libcst: a run answered from the cache imports no parser.
"""
from __future__ import annotations

import hashlib
import json
import sys
from enum import Enum
from typing import NamedTuple, Optional

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) - {"test"}
# summary fields that describe a function rather than what it does
_SHAPE_KEYS = frozenset(("name", "qualname", "path", "line", "params", "free"))
# facts a call's value inherits from what the callee returns
RETURN_KEEP = frozenset({"graph", "loss", "probs", "logprobs", "sigmoid", "logits", "moved", "indices",
                         "detached", "scalar", "model_out", "fresh", "float", "holds_loss"})
# facts of what a function returns that the project tells its callers (asked as RET/RETB) but
# that their dataflow does not inherit: "cpu_tensor", a tensor the function creates on the CPU
RETURN_TOLD = frozenset({"cpu_tensor"})


def args_entry(qual: str, facts: dict) -> str:
    """A call site of ``qual`` with the facts of its arguments (``model.callsites``), as an
    entry of a module's calls list: ``qual(<json>)``.  It travels and is counted with the
    calls (the pool's replicas, the cache's run snapshot, the language server's index), so a
    callee's question about its call sites is answered from the same counts."""
    return f"{qual}({json.dumps(facts, sort_keys=True, separators=(',', ':'))})"


def split_args_entry(entry: str) -> Optional[tuple]:
    """``qual(<json>)`` -> ``(qual, <json>)``; ``None`` for a plain qualname."""
    i = entry.find("(")
    if i <= 0 or not entry.endswith(")"):
        return None
    return entry[:i], entry[i + 1:-1]


def param_question(qual: str, idx: int, param: str, guess: Optional[str] = None) -> str:
    """The name of a question about what other modules pass for one parameter: ``qual`` (the
    function), ``idx`` (its position among the arguments a call writes: ``self`` not
    counted), ``param`` (its name, for keyword arguments) and ``guess``, the role the asker
    gives it without call sites (its name's): call sites that say only that answer like none,
    so they do not make the asker linted again for nothing."""
    return f"{qual}:{idx}:{param}:{guess or ''}"


def split_param_question(name: str) -> tuple:
    qual, idx, param, guess = name.rsplit(":", 3)
    try:
        return qual, int(idx), param, guess or None
    except ValueError:
        return qual, -1, param, guess or None


def note_args_entry(project, entry: str, present: bool) -> None:
    """Keep ``project.call_sites`` (qualname -> set of distinct call-site facts) in step with
    ``project.called`` for one entry."""
    got = split_args_entry(entry)
    if got is None:
        return
    q, facts = got
    cur = project.call_sites.get(q)
    if present:
        if cur is None:
            cur = project.call_sites[q] = set()
        cur.add(facts)
    elif cur is not None:
        cur.discard(facts)
        if not cur:
            del project.call_sites[q]


def summary_has_effects(summary: Optional[dict]) -> bool:
    """Whether a summary says the function does anything a caller's analysis can use."""
    return bool(summary) and any(v for k, v in summary.items() if k not in _SHAPE_KEYS)


class Aspect(str, Enum):
    """What a module asked about a name of the project, i.e. which part of the answer it used.
    The engine hashes only that part, so a file is linted again only when something it used
    changed (see :meth:`ProjectIndex.answer`)."""

    EFFECTS = "effects"  # what the function does (backward, step, clear, modes, moves ...)
    RET = "ret"  # what the value of a call carries (RETURN_KEEP), for a call with no batch argument
    RETB = "retb"  # the same for a call given a batch (a batch passed through stays a batch)
    EXACT = "exact"  # the whole summary (an unknown function is treated unlike one that does nothing)
    CLASS = "class"  # is it an nn.Module
    FWD = "fwd"  # what its forward returns (probabilities, log-probabilities, ...)
    MODE = "mode"  # is a module class known not to depend on train/eval mode
    ITERABLE = "iterable"  # is a class an iterable-style dataset (a DataLoader cannot shuffle it)
    SHUFFLES = "shuffles"  # which methods of a dataset class permute the samples it holds
    DEVICE = "device"  # does a dataset class put its tensors on a device (or is it known not to)
    METHOD = "method"  # which method a name on an imported class resolves to
    CALLED = "called"  # is it called from another module
    NO_GRAD_CALLERS = "nograd"  # is it called from other modules, all of them under no_grad
    RESOLVE = "resolve"  # where a key-qualified name leads through re-exports and star imports
    STAR = "star"  # what ``from <module> import *`` binds to a name (see ``ProjectIndex.star_binding``)
    MODULES = "modules"  # the tree modules (keys, import roots) under a top-level package name
    ARGS = "args"  # what the call sites in other modules pass to a function's parameters
    OVERRIDES = "overrides"  # the methods of that name that subclasses of a class define in the tree


class Question(NamedTuple):
    """One question a module asked about the project: an aspect and a qualified name."""

    aspect: Aspect
    name: str

    def __str__(self) -> str:
        return f"{self.aspect.value}:{self.name}"

    @staticmethod
    def parse(text: str) -> "Question":
        aspect, sep, name = text.partition(":")
        if not sep:  # the old form of a question about effects
            return Question(Aspect.EFFECTS, text)
        return Question(Aspect(aspect), name)


def questions_of(texts) -> list:
    """Questions from their stored text (``str(q)``)."""
    return [Question.parse(t) for t in texts]


def project_answer(aspect, summary: Optional[dict]):
    """The part of ``summary`` a question of ``aspect`` depends on (``None``: as if unknown)."""
    if not summary:
        return None
    if aspect == Aspect.EXACT:
        return summary
    if aspect in (Aspect.RET, Aspect.RETB):
        keep = RETURN_KEEP | RETURN_TOLD | ({"param_in", "moved"} if aspect == Aspect.RETB else set())
        whole = sorted(set(summary.get("returns", ())) & keep)
        items = [sorted(set(i) & keep) for i in summary.get("returns_items") or ()]
        if any(items):  # a caller unpacking the returned tuple reads each item's facts
            return [whole, items]
        return whole or None
    d = {k: v for k, v in summary.items() if k not in ("returns", "returns_items")}
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
        self.call_sites: dict = {}  # qualname -> {facts json of each distinct call site}
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
        # (dotted name, key) -> the import root of a name a namespace package gives a module
        # (``utils.model`` for ``utils/model.py`` without ``utils/__init__.py``)
        self.alias_roots: dict = {}
        self.tree_top: str = ""  # the folder holding every linted file
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
        # PEP 420 namespace packages: a folder without ``__init__.py`` is importable by its
        # name from the folder above (``from utils.model import get_model`` for
        # ``utils/model.py``): a module is also known by the names the folders above its import
        # root give it, up to two levels and inside the linted tree
        folders = sorted({os.path.dirname(ap) for _, _, ap, _ in entries})
        top = p.tree_top = os.path.commonpath(folders) if folders else ""
        for name, root, ap, f in entries:
            key = p.key_of_path.get(ap)
            if key is None:
                continue
            r, alias = root, name
            for _ in range(2):
                if r == top or not r.startswith(top.rstrip(os.sep) + os.sep):
                    break
                r, head = os.path.split(r)
                if not head.isidentifier():
                    break
                alias = f"{head}.{alias}"
                keys = p.by_name.setdefault(alias, [])
                if key not in keys:
                    keys.append(key)
                p.alias_roots[(alias, key)] = r
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
            keys = [k for k in keys if self.alias_roots.get((name, k), self.roots.get(k)) in (root, here)]
            if not keys:
                return None
        if len(keys) == 1:
            return keys[0]
        for r in (root, here):
            if r is None:
                continue
            hit = [k for k in keys if self.alias_roots.get((name, k), self.roots.get(k)) == r]
            if len(hit) == 1:
                return hit[0]
        # an importer in a namespace package (``utils/model.py`` imported as ``utils.model``)
        # runs with the folder above on ``sys.path``: its imports resolve from there too
        import os

        for r in (root, here):
            for _ in range(2):
                if r is None or not self.tree_top or r == self.tree_top \
                        or not r.startswith(self.tree_top.rstrip(os.sep) + os.sep):
                    break
                r = os.path.dirname(r)
                hit = [k for k in keys if self.alias_roots.get((name, k), self.roots.get(k)) == r]
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
                    # (not a module's own name that its package re-exports: ``pkg.f`` of
                    # ``from .f import f`` is the function, ``pkg.f.f`` the module's member,
                    # whether or not the module ``pkg.f`` is one of the linted files)
                    if head in self.reexports and head != qual and head not in self.modules \
                            and not self.reexports[head].startswith(head + "."):
                        qual = f"{self.reexports[head]}.{last}"
                    else:
                        return qual
            seen += 1
        return qual

    def star_binding(self, qual: str) -> Optional[str]:
        """What ``from <key> import *`` binds to ``name`` (``qual`` is ``key.name``): ``qual``
        itself for a function or class of the tree (defined there or imported from another
        tree module), the qualified name of a library name the module imports (``torch``,
        ``torch.nn.functional``: see ``ModuleModel.export_reexports``), ``None`` when it binds
        nothing the project knows.  Star imports the module makes are followed."""
        r = self.resolve(qual)
        if r in self.summaries or r in self.classes:
            return qual if not qual.rpartition(".")[2].startswith("_") else None
        if r == qual:
            return None
        head = r
        while head:
            if head in self.modules:
                return qual  # a re-export of a tree module or of its member
            head = head.rpartition(".")[0]
        return r

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

    def overrides(self, cls_qual: str, name: str) -> list:
        """``key.Class`` + method name -> the key-qualified methods of that name that the
        classes deriving from it (directly or through other classes of the tree) define,
        sorted; a subclass that inherits the method defines none."""
        for key in list(self.pending):  # every module may hold a subclass
            self.load_pending(key)
        target = self.resolve(cls_qual)
        memo: dict = {}

        def derives(key: str, depth: int = 0) -> bool:
            got = memo.get(key)
            if got is None:
                memo[key] = False  # a cycle of bases derives nothing
                facts = self.classes.get(key) or {}
                got = memo[key] = depth < 8 and any(
                    b == target or derives(b, depth + 1) for b in (self.resolve(b) for b in facts.get("bases", ())))
            return got
        return sorted(f"{key}.{name}" for key, facts in list(self.classes.items())
                      if key != target and name in facts.get("methods", ()) and derives(key))

    # ------------------------------------------------------------------ answers
    def modules_under(self, top: str) -> Optional[str]:
        """A digest of the tree modules (keys and import roots) whose dotted name starts with
        the top-level name ``top`` (``None``: there are none): what resolving an import of a
        name under ``top`` depends on."""
        tops = self.__dict__.get("_tops")
        if tops is None:
            tops = {}
            for name, keys in self.by_name.items():
                tops.setdefault(name.partition(".")[0], []).extend(
                    (k, self.alias_roots.get((name, k), self.roots.get(k, ""))) for k in keys)
            tops = self._tops = {t: hashlib.sha1(json.dumps(sorted(v)).encode()).hexdigest()[:16]
                                 for t, v in tops.items()}
        return tops.get(top)

    def answer(self, q: Question):
        """The part of the project's answer to ``q`` that the asking module used (JSON-able;
        ``None``: as if unknown)."""
        aspect, rest = q
        if aspect is Aspect.CALLED:
            return rest in self.called or None
        if aspect is Aspect.NO_GRAD_CALLERS:
            return rest in self.called_under_no_grad or None
        if aspect is Aspect.ARGS:
            return self.param_sites(rest)
        if aspect is Aspect.OVERRIDES:
            cls_q, _, name = rest.rpartition(".")
            return self.overrides(cls_q, name) or None
        if aspect is Aspect.MODULES:
            return self.modules_under(rest)
        if aspect is Aspect.RESOLVE:
            return self.resolve(rest)
        if aspect is Aspect.STAR:
            return self.star_binding(rest)
        if aspect in (Aspect.CLASS, Aspect.FWD, Aspect.MODE, Aspect.ITERABLE, Aspect.SHUFFLES, Aspect.DEVICE):
            key = self.resolve(rest)
            facts = self.classes.get(key) or {}
            if aspect is Aspect.CLASS:  # is it an nn.Module
                v = ["module"] if facts.get("is_module") else None
            elif aspect is Aspect.FWD:  # what its forward returns (a loss module: what it takes)
                v = sorted(facts.get("forward") or ()) + (
                    ["loss-input:" + facts["loss_input"]] if facts.get("loss_input") else []) + [
                    "item:" + ",".join(i) for i in facts.get("forward_items") or ()] or None
            elif aspect is Aspect.ITERABLE:
                v = ["iterable"] if facts.get("iterable_dataset") else None
            elif aspect is Aspect.SHUFFLES:
                v = sorted(facts.get("shuffles") or ()) or None
            elif aspect is Aspect.DEVICE:
                on = facts.get("on_device")
                v = None if on is None else ["device" if on else "host"]
            else:  # a module class known not to depend on the mode (unknown: it may)
                v = None
                if facts.get("is_module") and facts.get("mode_sensitive") is False:
                    v = ["mode-free"]
                elif facts.get("is_module") and facts.get("mode_free_if"):  # unless built with dropout 0
                    v = ["mode-free-if", json.dumps(facts["mode_free_if"], sort_keys=True)]
                elif facts.get("is_module") is False and facts.get("plain"):  # not a module at all
                    v = ["plain"]
                if facts.get("is_module") and facts.get("mode_layers") is not None:  # a mode-dependent layer is seen in it, or none
                    v = (v or []) + ["mode-layers" if facts["mode_layers"] else "no-mode-layers"]
            return [key] + v if v else None  # an ordinary class answers like an unknown one
        if aspect is Aspect.METHOD:
            cls_q, _, name = rest.rpartition(".")
            m = self.method(cls_q, name)
            m = self.resolve(m) if m else None
            return m if m and summary_has_effects(self.summaries.get(m)) else None
        key = self.resolve(rest)
        v = project_answer(aspect, self.summaries.get(key))
        return [key, v] if v is not None else None  # where it resolves matters only if it does something

    def param_sites(self, name: str):
        """What the call sites in other modules pass for one parameter (``name`` is
        ``qual:position:parameter``, see :func:`param_question`): the fact they all agree on
        (a list), else ``None`` (no site, a site without evidence, sites that disagree, or
        agree only on what the parameter's name says). A callee that gets ``None`` and could
        still use a fact of its own call sites asks whether other modules call it at all
        (``CALLED``): a site that agrees on nothing and one that does not exist differ only
        there, so an ``ARGS`` answer changes only when what the callee takes from it does."""
        qual, idx, param, guess = split_param_question(name)
        texts = self.call_sites.get(qual)
        if not texts:
            return None
        agreed = None
        for text in sorted(texts):
            try:
                d = json.loads(text)
            except ValueError:
                return None
            if not isinstance(d, dict) or "*" in d:
                return None
            v = d.get(param)
            if v is None and idx >= 0:
                v = d.get(str(idx))
            if v is None:
                return None
            if agreed is None:
                agreed = v
            elif v != agreed:
                if v[:1] == agreed[:1] == ["model"]:
                    agreed = ["model", None]  # models of different classes
                else:
                    return None
        return None if agreed == [guess, None] else agreed  # nothing the asker does not know

    def answers(self, queries, memo: Optional[dict] = None) -> str:
        """A hash of the part of the project's answers a file's rules used (see ``answer``).
        Answers a file did not use do not make it linted again. ``memo`` (question -> its
        hashed bytes) is shared by the files of one check (many ask the same questions)."""
        h = hashlib.sha256()
        for q in queries:
            got = memo.get(q) if memo is not None else None
            if got is None:
                v = self.answer(q)
                got = f"{q}={'null' if v is None else json.dumps(v, sort_keys=True)}".encode("utf-8", "surrogatepass")
                if memo is not None:
                    memo[q] = got
            h.update(got)
        return h.hexdigest()[:16]

    def blank(self) -> "ProjectIndex":
        """The same module table without any exports (a worker's replica starts from it)."""
        p = ProjectIndex(dict(self.modules))
        p.roots, p.key_of_path, p.by_name = self.roots, self.key_of_path, self.by_name
        p.alias_roots, p.tree_top = self.alias_roots, self.tree_top
        return p


_CALLERS = (Aspect.CALLED, Aspect.NO_GRAD_CALLERS, Aspect.ARGS, Aspect.OVERRIDES)


def _sites_changed(name: str, sites: Optional[set]) -> bool:
    """An ``ARGS`` question whose function's call sites changed (``sites`` ``None``: unknown)."""
    return sites is None or split_param_question(name)[0] in sites


def may_depend(queries, changed: set, added: set = frozenset(), sites: Optional[set] = None) -> bool:
    """Whether a file's questions concern one of the ``changed`` module keys (whose exports
    changed) or a module of the ``added`` ones (new to the tree); a cached file whose
    questions do not cannot get different answers. ``sites``, when known, are the functions
    whose call sites in the changed modules changed (what ``ARGS`` questions depend on)."""
    tops = {k.partition("@")[0].partition(".")[0] for k in added}
    if len(changed) <= 4:  # a few edited files: prefix tests instead of walking each name
        dotted = tuple(c + "." for c in changed)
        for aspect, name in queries:
            if aspect is Aspect.ARGS:
                if _sites_changed(name, sites):
                    return True
                continue
            if aspect in _CALLERS:
                return True  # callers come from every module: recheck
            if aspect is Aspect.MODULES:
                if name in tops:
                    return True
                continue
            if name in changed or name.startswith(dotted):
                return True
        return False
    for aspect, name in queries:
        if aspect is Aspect.ARGS:
            if _sites_changed(name, sites):
                return True
            continue
        if aspect in _CALLERS:
            return True
        if aspect is Aspect.MODULES:
            if name in tops:
                return True
            continue
        head = name
        while head:
            if head in changed:
                return True
            head = head.rpartition(".")[0]
    return False


class ProjectView:
    """The project as a module's model and rules see it: read-only, and every accessor
    records the question it answers (``asked``: an :class:`Aspect` and a qualified name), so
    nothing can read a fact of another module without the engine knowing that the module's
    results depend on it (the answer check, ``may_depend`` and the cache use ``asked``)."""

    __slots__ = ("_index", "asked", "_resolved")

    def __init__(self, index: Optional[ProjectIndex] = None):
        self._index = index if index is not None else ProjectIndex()
        self.asked: set = set()
        self._resolved: dict = {}

    def _ask(self, aspect: Aspect, name: str) -> None:
        self.asked.add(Question(aspect, name))

    # the module table
    def key_for(self, path: str, name: str) -> str:
        """This module's own key (``name``, or ``name@<root hash>`` when several files share it)."""
        self._ask(Aspect.MODULES, name.partition(".")[0])
        return self._index.key_for(path, name)

    def root_of(self, key: str, default: Optional[str] = None) -> Optional[str]:
        self._ask(Aspect.MODULES, key.partition("@")[0].partition(".")[0])
        return self._index.roots.get(key, default)

    def has_module(self, key: str) -> bool:
        self._ask(Aspect.MODULES, key.partition("@")[0].partition(".")[0])
        return key in self._index.modules

    def module_key(self, name: str, root: Optional[str] = None, here: Optional[str] = None) -> Optional[str]:
        self._ask(Aspect.MODULES, name.partition(".")[0])
        return self._index.module_key(name, root, here)

    def locate(self, qual: Optional[str], root: Optional[str] = None,
               here: Optional[str] = None) -> Optional[str]:
        """``engine.train`` -> the key-qualified tree member it names (re-exports followed)."""
        if not qual:
            return None
        self._ask(Aspect.MODULES, qual.partition(".")[0])
        parts = qual.split(".")
        idx = self._index
        for i in range(len(parts) - 1, 0, -1):
            key = idx.module_key(".".join(parts[:i]), root, here)
            if key is not None:
                return self.resolve(".".join([key] + parts[i:]))
        return None

    # other modules' exports
    def resolve(self, qual: str) -> str:
        self._ask(Aspect.RESOLVE, qual)
        r = self._resolved.get(qual)
        if r is None:  # asked many times over (every call, every aspect): resolved once
            r = self._resolved[qual] = self._index.resolve(qual)
        return r

    def star_binding(self, qual: str) -> Optional[str]:
        """What a star import of the module binds to a name (:meth:`ProjectIndex.star_binding`)."""
        self._ask(Aspect.STAR, qual)
        return self._index.star_binding(qual)

    def summary(self, qual: str, aspect: Aspect = Aspect.EFFECTS) -> Optional[dict]:
        """The summary of the function ``qual`` leads to; the caller uses ``aspect`` of it."""
        self._ask(Aspect(aspect), qual)
        r = self._resolved.get(qual)
        if r is None:
            r = self._resolved[qual] = self._index.resolve(qual)
        return self._index.summaries.get(r)

    def class_facts(self, qual: str, aspect: Aspect = Aspect.CLASS) -> Optional[dict]:
        """The facts of class ``qual``; the caller uses ``aspect`` of them."""
        self._ask(Aspect(aspect), qual)
        return self._index.classes.get(qual)

    def method(self, cls_qual: str, name: str) -> Optional[str]:
        self._ask(Aspect.METHOD, f"{cls_qual}.{name}")
        return self._index.method(cls_qual, name)

    def overrides(self, cls_qual: str, name: str) -> list:
        """The methods ``name`` that subclasses of the class ``cls_qual`` define anywhere in
        the tree (key-qualified; see :meth:`ProjectIndex.overrides`)."""
        self._ask(Aspect.OVERRIDES, f"{cls_qual}.{name}")
        return self._index.overrides(cls_qual, name)

    def is_called(self, qual: str) -> bool:
        """Whether another module of the tree calls ``qual``."""
        self._ask(Aspect.CALLED, qual)
        return qual in self._index.called

    def only_called_under_no_grad(self, qual: str) -> bool:
        """Whether other modules call ``qual``, all of them under ``no_grad``."""
        self._ask(Aspect.NO_GRAD_CALLERS, qual)
        return qual in self._index.called_under_no_grad

    def param_sites(self, qual: str, idx: int, param: str, guess: Optional[str] = None):
        """What the call sites of ``qual`` in other modules pass for one of its parameters
        (see :meth:`ProjectIndex.param_sites`)."""
        name = param_question(qual, idx, param, guess)
        self._ask(Aspect.ARGS, name)
        return self._index.param_sites(name)


class Workspace:
    """The one owner of the project index of a set of files: its module table (keys, import
    roots), the exports of the files' results and the calls between modules. It is the only
    way to build or change an index: the CLI (``engine.run``), the fixer and the language
    server all go through it, so they see the same modules."""

    def __init__(self, files):
        self.files = list(files)
        self._index: Optional[ProjectIndex] = None

    @property
    def index(self) -> ProjectIndex:
        """The index (its module table computed on first use: it stats every folder up to
        its package root)."""
        if self._index is None:
            self._index = ProjectIndex.for_files(self.files)
        return self._index

    def blank(self) -> ProjectIndex:
        """An index with this module table and no exports (a worker's replica)."""
        return self.index.blank()

    def view(self) -> ProjectView:
        return ProjectView(self.index)

    def merge(self, results) -> None:
        """The exports of ``results`` (all the files' results); a cached result not read yet
        stays pending (read when a name of its module is looked up)."""
        merge_into(self.index, results)

    def replace(self, old, new, results) -> None:
        """Swap one file's exports (``old`` -> ``new``) and recount the calls between modules
        over ``results`` (all the files' results, ``new`` included), instead of merging the
        whole tree again."""
        p = self.index
        if old is not None:
            if old.module:
                p.pending.pop(old.module, None)
                dict.pop(p.stars, old.module, None)
            for mine, theirs in ((p.summaries, old.summaries), (p.classes, old.classes),
                                 (p.reexports, old.reexports)):
                for k in theirs:
                    dict.pop(mine, k, None)
        p.add_exports(new.module, new.summaries, new.classes, new.reexports, new.stars)
        count_calls(p, list(results))


def merge_into(project: ProjectIndex, results) -> None:
    """``project``'s exports from ``results`` (see :meth:`Workspace.merge`)."""
    project.clear_exports()
    count_calls(project, results)
    for r in results:
        if r.is_lazy() and (not r.module or project.defer(r)):
            continue  # read when a name of its module is looked up (a file not parsed has none)
        project.add_exports(r.module, r.summaries, r.classes, r.reexports, r.stars)


def count_calls(project: ProjectIndex, results) -> None:
    """The project's sets of functions other modules call (at all; only under ``no_grad``)."""
    base, extra, sets = called_parts(results)
    called, under = (set(sets[0]), set(sets[1])) if sets is not None else (set(), set())
    for q, (n, u) in extra.items():  # what differs from the snapshot's totals
        b = base.get(q)
        if b is not None:
            n, u = n + b[0], u + b[1]
        if n:
            called.add(q)
        else:
            called.discard(q)
        if n and u == n:
            under.add(q)
        else:
            under.discard(q)
    project.called, project.called_under_no_grad = called, under
    project.call_sites = {}
    for q in called:
        if q.endswith(")"):
            note_args_entry(project, q, True)


def called_counts(results) -> dict:
    """qualname -> [calls from other modules, how many of them under ``no_grad``]. Cached
    results not read yet count through their snapshot's totals."""
    base, extra, _ = called_parts(results)
    counts = {q: list(c) for q, c in base.items()}
    for q, (n, u) in extra.items():
        c = counts.get(q)
        if c is None:
            counts[q] = [n, u]
        else:
            c[0] += n
            c[1] += u
    return counts


def called_parts(results) -> tuple:
    """The calls-from-other-modules counts of ``results`` in two parts: ``base``, the totals of
    the results of the last run's snapshot (shared: not to be changed), and ``extra`` (those of
    the others, a few in a run where a few files changed), with ``base``'s sets of called
    qualnames and of those called only under ``no_grad`` (``None`` when ``base`` is empty).
    Copying a whole tree's counts (27,000 qualnames for torch) for each look cost more than
    the lint of the file that changed."""
    extra: dict = {}

    def add(q, n, under) -> None:
        c = extra.get(q)
        if c is None:
            c = extra[q] = [0, 0]
        c[0] += n
        c[1] += under

    lazy: dict = {}
    plain = []
    for r in results:
        src = r.__dict__.get("_lazy")
        if src is not None:  # read or not, its calls are the snapshot's
            lazy.setdefault(id(src.store), []).append(src)
        else:
            plain.append(r)
    base: dict = {}
    sets = None
    for group in lazy.values():
        keys = [src.key for src in group]
        if sets is None:  # the first snapshot (usually the only one)
            base = group[0].store.called_counts(keys)
            sets = group[0].store.called_sets(keys)
            continue
        for q, (n, under) in group[0].store.called_counts(keys).items():
            add(q, n, under)
    for r in plain:
        for q, off in r.called:
            add(q, 1, bool(off))
    return base, extra, sets

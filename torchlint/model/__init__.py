"""The semantic model of one module of training code: the single source of facts for rules.

``ModuleModel.build`` runs the binder (one pass over the tree), classifies training events,
and lazily computes dataflow facts, mode flow and function summaries.  Rules ask it
questions (``mm.loops``, ``mm.flow(fn)``, ``mm.summary_of(callee)``); they never walk the tree.
"""
from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from . import catalog
from .binder import Binder, ClassModel, FunctionModel, ImportTable, dotted
from .dataflow import Dataflow
from .flow import ENTRY, ModeFlow, summarize
from .ir import (
    BACKWARD, CALL, CLEAR, FORWARD, GRAD_OFF, LOSS, MODE, STEP, AssignOp, BranchOp, CallOp,
    LoopOp, ReturnOp, walk,
)
from .roles import RoleResolver, classify, is_eval_name

__all__ = ["ModuleModel", "FunctionModel", "ClassModel", "ProjectIndex", "ExternalRef"]


class ExternalRef:
    """A call target in another module of the linted tree (resolved through the project)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"ExternalRef({self.qualname})"


class ProjectIndex:
    """What the engine knows about the other modules of the linted tree.

    ``modules`` maps dotted module names to files; ``summaries`` maps ``module.function`` to
    summary dicts produced by other workers (empty on the first pass).  ``classes`` maps
    ``module.Class`` to small class facts (is it an ``nn.Module``, what its forward returns).
    """

    def __init__(self, modules: Optional[dict] = None, summaries: Optional[dict] = None,
                 classes: Optional[dict] = None, reexports: Optional[dict] = None):
        self.called: set = set()
        self.called_under_no_grad: set = set()
        self.modules = modules or {}
        self.summaries = summaries or {}
        self.classes = classes or {}
        self.reexports = reexports or {}

    def resolve(self, qual: str) -> Optional[str]:
        """Follow package ``__init__`` re-exports: ``pkg.train`` -> ``pkg.engine.train``."""
        seen = 0
        while qual in self.reexports and seen < 8:
            qual = self.reexports[qual]
            seen += 1
        return qual


_DEF_RE_CACHE: dict = {}


class ModuleModel:
    def __init__(self, path: str, display_path: str, text: str, module: cst.Module,
                 module_name: str = "", is_package: bool = False,
                 project: Optional[ProjectIndex] = None):
        self.path = path
        self.display_path = display_path
        self.text = text
        self.module = module
        self.module_name = module_name
        self.project = project or ProjectIndex()
        self.imports = ImportTable(module_name, is_package)
        self.binder = Binder(module, self.imports)
        self.binder.bind()
        self.classes = self.binder.classes
        self.functions = self.binder.functions
        self.all_functions = self.binder.all_functions
        self.module_function = self.binder.module_function
        self.resolver = RoleResolver(self)
        self._positions = None
        self._flows: dict = {}
        self._summaries: dict = {}
        self._summarizing: set = set()
        self._class_is_module: dict = {}
        self._forward_facts: dict = {}
        self._return_facts: dict = {}
        self.external_queries: set[str] = set()  # qualnames of other modules' functions asked for
        self._lines = None
        for fn in self.all_functions:
            classify(self, fn, self.resolver)
        for fn in self.all_functions:
            Dataflow(self, fn, self.resolver).run()

    # ------------------------------------------------------------------ names
    def qualify(self, d: Optional[str]) -> Optional[str]:
        return self.imports.qualify(d)

    def find_class(self, name: str) -> Optional[ClassModel]:
        c = self.classes.get(name)
        if c is not None:
            return c
        return None

    def external_class(self, name: str) -> Optional[dict]:
        q = self.qualify(name)
        if q is None:
            return None
        q = self.project.resolve(q)
        return self.project.classes.get(q)

    def class_is_module(self, cls: ClassModel) -> bool:
        r = self._class_is_module.get(cls.qualname)
        if r is not None:
            return r
        self._class_is_module[cls.qualname] = False
        result = False
        for b, raw in zip(cls.bases, cls.raw_bases):
            if b in catalog.MODULE_BASES or b.startswith("torch.nn.") and b.rsplit(".", 1)[-1][:1].isupper():
                result = True
            elif b in catalog.LIGHTNING_BASES:
                result = True
                cls.is_lightning = True
            else:
                base = self.find_class(raw)
                if base is not None and base is not cls and self.class_is_module(base):
                    result = True
                    cls.is_lightning = cls.is_lightning or base.is_lightning
                else:
                    ext = self.external_class(raw)
                    if ext and ext.get("is_module"):
                        result = True
            if result:
                break
        if not result and "forward" in cls.methods and any(
                r in ("Module", "nn.Module") for r in cls.raw_bases):
            result = True
        cls.is_module = result
        self._class_is_module[cls.qualname] = result
        return result

    def is_module_method(self, fn: FunctionModel) -> bool:
        """Methods of nn.Module subclasses (forward, Lightning steps): not training loops."""
        return fn.cls is not None and self.class_is_module(fn.cls)

    def is_lightning(self, fn: FunctionModel) -> bool:
        return fn.cls is not None and self.class_is_module(fn.cls) and fn.cls.is_lightning

    # ------------------------------------------------------------------ positions
    def _pos(self):
        if self._positions is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = wrapper.resolve(PositionProvider)
        return self._positions

    def span_of(self, node: cst.CSTNode):
        r = self._pos()[node]
        return r.start.line, r.start.column, r.end.line, r.end.column

    def code_for(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def line_of(self, node: cst.CSTNode) -> int:
        if isinstance(node, cst.FunctionDef):
            fn = next((f for f in self.all_functions if f.node is node), None)
            if fn is not None:
                return self.def_line(fn)
        try:
            return self._pos()[node].start.line
        except Exception:
            return 0

    def def_line(self, fn: FunctionModel) -> int:
        """Line of a ``def`` without computing positions for the whole module."""
        if fn.is_module_level:
            return 1
        if self._lines is None:
            self._lines = {}
            for m in re.finditer(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", self.text, re.M):
                self._lines.setdefault(m.group(1), []).append(self.text.count("\n", 0, m.start()) + 1)
        lines = self._lines.get(fn.name) or [0]
        same = [f for f in self.all_functions if f.name == fn.name]
        idx = same.index(fn) if fn in same else 0
        return lines[idx] if idx < len(lines) else lines[0]

    # ------------------------------------------------------------------ calls
    def resolve_call(self, fn: FunctionModel, op: CallOp):
        """The function a call runs: a FunctionModel here, an ExternalRef, or None."""
        d = op.func
        if d is None:
            return None
        if "." not in d:
            # nested function, then module-level function
            f = fn
            while f is not None:
                for n in f.nested:
                    if n.name == d:
                        return n
                f = f.parent
            target = self.functions.get(d)
            if target is not None:
                return target
            q = self.qualify(d)
            if q and self._is_tree_module_member(q):
                return ExternalRef(*q.rsplit(".", 1))
            return None
        base, _, name = d.rpartition(".")
        if base == "self" and fn.cls is not None:
            cls = fn.cls
            seen = 0
            while cls is not None and seen < 10:
                m = cls.methods.get(name)
                if m is not None:
                    return m
                nxt = None
                for raw in cls.raw_bases:
                    nxt = self.find_class(raw)
                    if nxt is not None:
                        break
                cls = nxt
                seen += 1
            return None
        q = self.qualify(d)
        if q and self._is_tree_module_member(q):
            mod, _, nm = q.rpartition(".")
            return ExternalRef(mod, nm)
        return None

    def _is_tree_module_member(self, q: str) -> bool:
        q = self.project.resolve(q)
        mod = q.rpartition(".")[0]
        return mod in self.project.modules and mod != self.module_name

    def summary_of(self, target) -> Optional[dict]:
        if target is None:
            return None
        if isinstance(target, ExternalRef):
            q = self.project.resolve(target.qualname)
            self.external_queries.add(q)
            return self.project.summaries.get(q)
        key = id(target)
        s = self._summaries.get(key)
        if s is not None:
            return s
        if key in self._summarizing:
            return None
        self._summarizing.add(key)
        try:
            s = summarize(self, target)
        finally:
            self._summarizing.discard(key)
        self._summaries[key] = s
        return s

    def argmap(self, fn: FunctionModel, op: CallOp, summ: dict) -> dict:
        """Callee parameter key -> the caller's path for the argument passed."""
        params = list(summ.get("params", ()))
        out = {}
        positional = [a for a in op.args if a.keyword is None and not a.star]
        is_method = (op.func or "").startswith("self.") or (params and params[0] == "self")
        pparams = params[1:] if params and params[0] == "self" else params
        for i, a in enumerate(positional):
            if i < len(pparams):
                d = dotted(a.value)
                if d:
                    out[pparams[i]] = d
        for a in op.args:
            if a.keyword is not None:
                d = dotted(a.value)
                if d:
                    out[a.keyword.value] = d
        if is_method and (op.func or "").startswith("self."):
            for key in list(summ.get("exit_modes", {})) + list(summ.get("trains_in_entry", ())) + \
                    list(summ.get("evals_in_entry", ())):
                if key.startswith("self."):
                    out[key] = key
        return out

    def flow(self, fn: FunctionModel) -> ModeFlow:
        f = self._flows.get(id(fn))
        if f is None:
            f = ModeFlow(self, fn)
            self._flows[id(fn)] = f
            f.run()
        return f

    def callers(self, fn: FunctionModel) -> Iterator[tuple]:
        """(caller FunctionModel, CALL op) for every call of ``fn`` in this module."""
        for f in self.all_functions:
            for op in walk(f.body):
                if isinstance(op, CallOp) and op.kind == CALL and op.info is fn:
                    yield f, op

    # ------------------------------------------------------------------ facts
    def forward_output_facts(self, fn: FunctionModel, op: CallOp) -> frozenset:
        """Facts of what a model's forward returns (probabilities, log-probabilities, ...)."""
        info = op.info
        cls = self.classes.get(info) if isinstance(info, str) else None
        if cls is None:
            role = self.resolver.of_path(fn, op.target or "")
            if isinstance(role[1], str):
                cls = self.classes.get(role[1])
        if cls is None:
            return frozenset()
        key = cls.qualname
        if key in self._forward_facts:
            return self._forward_facts[key]
        self._forward_facts[key] = frozenset()
        facts = frozenset()
        fwd = cls.methods.get("forward")
        if fwd is not None:
            facts = frozenset(f for f in self.return_facts(fwd) if f in ("probs", "sigmoid", "logprobs"))
        else:
            facts = self._sequential_output(cls)
        self._forward_facts[key] = facts
        return facts

    def _sequential_output(self, cls: ClassModel) -> frozenset:
        return frozenset()

    def return_facts(self, fn: FunctionModel) -> frozenset:
        r = self._return_facts.get(id(fn))
        if r is not None:
            return r
        out = frozenset()
        for op in walk(fn.body):
            if isinstance(op, ReturnOp):
                out = out | op.value_facts
        self._return_facts[id(fn)] = out
        return out

    def clears_by_assignment(self, fn: FunctionModel) -> bool:
        """``p.grad = None`` / ``p.grad.zero_()`` style clearing inside ``fn``."""
        for op in walk(fn.body):
            if isinstance(op, AssignOp):
                for t in op.targets:
                    if isinstance(t, cst.Attribute) and t.attr.value == "grad":
                        return True
            elif isinstance(op, CallOp) and op.attr in ("zero_", "detach_", "fill_") and op.recv \
                    and (op.recv.endswith(".grad") or op.recv.endswith(".grad.data")):
                return True
        return False

    # ------------------------------------------------------------------ loops
    def loops(self, fn: FunctionModel) -> list:
        return [op for op in walk(fn.body) if isinstance(op, LoopOp)]

    def export_summaries(self) -> dict:
        """Summaries of the module's top-level functions and methods, keyed by qualified name."""
        out = {}
        for fn in self.all_functions:
            if fn.is_module_level or fn.parent is not None:
                continue
            out[f"{self.module_name}.{fn.qualname}"] = self.summary_of(fn)
        return out

    def export_calls(self) -> list:
        """[qualname, under_no_grad] for each call of another module's function."""
        from .ir import CALL as _CALL

        out = []
        for fn in self.all_functions:
            for op in walk(fn.body):
                if isinstance(op, CallOp) and op.kind == _CALL and isinstance(op.info, ExternalRef):
                    out.append([self.project.resolve(op.info.qualname), op.grad == GRAD_OFF])
        return out

    def export_classes(self) -> dict:
        out = {}
        for cls in self.classes.values():
            out[f"{self.module_name}.{cls.qualname}"] = {"is_module": self.class_is_module(cls)}
        return out

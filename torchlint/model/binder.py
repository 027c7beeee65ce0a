"""The binder: one pass over a module's syntax tree.

It resolves imports to qualified names, records classes and functions, and turns every
function body (and the module's own code) into the ops of :mod:`torchlint.model.ir`.
It does not use libcst's metadata providers: names are resolved from the module's own
import table, and positions are computed later, only for the nodes that are reported.

The walk follows only the fields that can hold code (no whitespace, commas or
parentheses), which is what keeps it well under the cost of parsing.
"""
from __future__ import annotations

from dataclasses import fields as dc_fields
from typing import Optional

import libcst as cst

from . import catalog
from .ir import (
    GRAD_OFF, GRAD_ON, GRAD_UNKNOWN, AssignOp, BranchOp, CallOp, DefOp, JumpOp, LoopOp, ReturnOp,
)


def dotted(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` for Name/Attribute chains, ``None`` for anything else."""
    # exact type tests: libcst's node classes are ABCs, so isinstance() is slow, and Name
    # and Attribute have no subclasses
    t = type(node)
    if t is _Name:
        return node.value
    parts = []
    while t is _Attribute:
        parts.append(node.attr.value)
        node = node.value
        t = type(node)
    if t is _Name:
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


_Name, _Attribute = cst.Name, cst.Attribute


def _attr_chain(node: cst.BaseExpression) -> str:
    try:
        return dotted(node) or ""
    except Exception:
        return ""


class ImportTable:
    """Local name -> qualified name, from the module's import statements."""

    def __init__(self, module_name: str = "", is_package: bool = False):
        self.names: dict[str, str] = {}
        self.module_name = module_name
        self.is_package = is_package
        # qualified module names imported (for the dependency graph)
        self.imported_modules: set[str] = set()
        self.stars: list[str] = []  # modules star-imported (``from .x import *``)
        # what ``from <this module> import *`` would bind of the imported names: those the
        # module's top level imports (``__all__`` is applied by ``star_exports``)
        self.top_level: set = set()
        # ``local name -> qualified name or None`` for a name only a star import can have bound
        # (set by the model: it asks the star-imported modules of the tree)
        self.star_lookup = None
        self._star_cache: dict = {}

    def _resolve_relative(self, level: int, module: Optional[str]) -> str:
        base = self.module_name.split(".") if self.module_name else []
        if not self.is_package:
            base = base[:-1]
        if level > 1:
            base = base[: len(base) - (level - 1)] if level - 1 <= len(base) else []
        if module:
            base = base + module.split(".")
        return ".".join(base)

    def add_import(self, node: cst.Import, top: bool = False) -> None:
        for alias in node.names:
            name = _attr_chain(alias.name)
            if not name:
                continue
            self.imported_modules.add(name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
                self.names[local] = name
            else:
                local = name.split(".")[0]
                self.names[local] = local
            if top:
                self.top_level.add(local)

    def add_import_from(self, node: cst.ImportFrom, top: bool = False) -> None:
        module = _attr_chain(node.module) if node.module is not None else None
        level = len(node.relative)
        base = self._resolve_relative(level, module) if level else (module or "")
        if base:
            self.imported_modules.add(base)
        if isinstance(node.names, cst.ImportStar):
            if base:
                self.stars.append(base)
            return
        for alias in node.names:
            name = _attr_chain(alias.name)
            if not name:
                continue
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            q = f"{base}.{name}" if base else name
            self.names[local] = q
            self.imported_modules.add(q)
            if top:
                self.top_level.add(local)

    def qualify(self, name: Optional[str]) -> Optional[str]:
        if not name:
            return None
        first, _, rest = name.partition(".")
        q = self.names.get(first)
        if q is None:
            if not self.stars or self.star_lookup is None:
                return None
            # ``from utils import *`` where utils imports torch: ``torch`` is utils' torch
            if first not in self._star_cache:
                self._star_cache[first] = self.star_lookup(first)
            q = self._star_cache[first]
            if q is None:
                return None
        return f"{q}.{rest}" if rest else q

    def star_exports(self, dunder_all) -> list:
        """The imported names ``from <this module> import *`` binds: ``__all__``'s when the
        module has one, else every top-level import whose name has no leading underscore."""
        if dunder_all is not None:
            return sorted(n for n in dunder_all if n in self.names and n in self.top_level)
        return sorted(n for n in self.top_level if not n.startswith("_") and n in self.names)


class ClassModel:
    def __init__(self, name: str, qualname: str, node: cst.ClassDef, bases: list[str],
                 raw_bases: list[str]):
        self.name = name
        self.qualname = qualname
        self.node = node
        self.bases = bases  # qualified where the import table knows them, else as written
        self.raw_bases = raw_bases
        self.methods: dict[str, "FunctionModel"] = {}
        self.attr_values: dict[str, list[AssignOp]] = {}  # self.X -> assignments
        self.is_module: bool = False  # resolved after binding
        self.is_lightning: bool = False


class FunctionModel:
    def __init__(self, name: str, qualname: str, node: cst.CSTNode, cls: Optional[ClassModel],
                 params: list[str], defaults: dict, annotations: dict, decorators: list[str],
                 parent: Optional["FunctionModel"] = None):
        self.name = name
        self.qualname = qualname
        self.node = node
        self.cls = cls
        self.params = params
        self.defaults = defaults
        self.annotations = annotations
        self.decorators = decorators
        self.parent = parent
        self.body: list = []
        self.decorator_grad: Optional[str] = None
        self.nested: list["FunctionModel"] = []
        self.is_module_level = isinstance(node, cst.Module)
        # filled by later stages
        self.roles: dict[str, tuple] = {}
        self.summary = None

    def __repr__(self) -> str:
        return f"<FunctionModel {self.qualname}>"


_SKIP_FIELD = ("whitespace", "lpar", "rpar", "comma", "semicolon", "colon", "dot", "equal",
               "star", "lbracket", "rbracket", "lbrace", "rbrace", "header", "footer",
               "leading_lines", "lines_after_decorators", "newline", "default_indicator",
               "operator", "arrow", "asynchronous", "prefix", "quote")
_FIELD_CACHE: dict[type, tuple] = {}


def _child_fields(tp: type) -> tuple:
    f = _FIELD_CACHE.get(tp)
    if f is None:
        f = tuple(x.name for x in dc_fields(tp) if not any(s in x.name for s in _SKIP_FIELD))
        _FIELD_CACHE[tp] = f
    return f


_LEAVES = (cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis)


class Binder:
    def __init__(self, module: cst.Module, imports: ImportTable):
        self.module = module
        self.imports = imports
        self.classes: dict[str, ClassModel] = {}
        self.redefined: dict[str, list] = {}  # qualname -> every definition of a class defined twice
        self.redefined_functions: dict[str, list] = {}  # name -> every definition of a module-level function defined twice
        self.functions: dict[str, FunctionModel] = {}
        self.module_function = FunctionModel("<module>", "<module>", module, None, [], {}, {}, [])
        self.all_functions: list[FunctionModel] = [self.module_function]
        # state while binding
        self._fn: FunctionModel = self.module_function
        self._cls: Optional[ClassModel] = None
        self._grad: Optional[str] = None
        self._ctx: tuple = ()  # unknown context managers around (see ``Op.ctx``)
        self._mode_ctx: tuple = ()  # library mode contexts around (see ``Op.mode_ctx``)
        self._loop: Optional[LoopOp] = None
        self._guards: tuple = ()
        self._ctx_depth = 0  # guard depth of the innermost ``with`` (or function) around
        self._out: list = self.module_function.body
        # the grad mode the module's own code leaves set at import (``torch.set_grad_enabled``
        # at the top level), ``None`` when it sets none
        self.grad_at_import: Optional[str] = None
        self._grad_saved_by_with = 0
        self._ctx_vars: dict = {}  # names bound to grad contexts in the current function
        self.dunder_all: Optional[set] = None  # the module's ``__all__``, when it has one

    # ------------------------------------------------------------------ driving
    def bind(self) -> None:
        self._block(self.module.body)

    _cur_stmt = None

    def _emit(self, op) -> None:
        op.stmt = self._cur_stmt
        op.grad = self._grad
        if self._ctx:
            op.ctx = self._ctx
        if self._mode_ctx:
            op.mode_ctx = self._mode_ctx
        op.loop = self._loop
        op.guards = self._guards
        self._out.append(op)

    def _block(self, stmts) -> None:
        for s in stmts:
            self._stmt(s)

    def _suite(self, suite) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self._block(suite.body)
        elif isinstance(suite, cst.SimpleStatementSuite):
            for s in suite.body:
                self._small(s)
        else:  # pragma: no cover - defensive
            self._block(getattr(suite, "body", ()))

    def _collect(self, fn) -> list:
        """Run ``fn`` with a fresh output list and return what it emitted."""
        saved = self._out
        self._out = []
        try:
            fn()
            return self._out
        finally:
            self._out = saved

    # ---------------------------------------------------------------- statements
    def _stmt(self, s) -> None:
        tp = type(s)
        self._cur_stmt = s
        if tp is cst.SimpleStatementLine:
            for small in s.body:
                self._small(small)
        elif tp is cst.FunctionDef:
            self._function(s)
        elif tp is cst.ClassDef:
            self._class(s)
        elif tp is cst.If:
            self._if(s)
        elif tp is cst.For:
            self._for(s)
        elif tp is cst.While:
            self._while(s)
        elif tp is cst.With:
            self._with(s)
        elif tp is cst.Try or tp.__name__ == "TryStar":
            self._try(s)
        elif tp.__name__ == "Match":
            self._match(s)
        else:
            for name in _child_fields(tp):
                v = getattr(s, name, None)
                if isinstance(v, cst.BaseSuite):
                    self._suite(v)

    def _small(self, s) -> None:
        tp = type(s)
        if tp is cst.Expr:
            self._expr(s.value)
            v = s.value
            if type(v) is cst.Call and type(v.func) is cst.Attribute and v.func.attr.value == "enter_context" \
                    and v.args:
                # ``stack.enter_context(torch.no_grad())``: the rest of the ``with ExitStack()``
                # block (or of the function) runs in that grad mode; entered in a branch, maybe
                g = self._grad_of_context(v.args[0].value)
                if g is not None:
                    self._grad = g if len(self._guards) <= self._ctx_depth else GRAD_UNKNOWN
                    self._ctx = ()
            elif type(v) is cst.Call and self.imports.qualify(dotted(v.func)) in catalog.SET_GRAD_ENABLED:
                # ``torch.set_grad_enabled(False)`` as a statement: the rest of the block (up to
                # the end of an enclosing ``with``, which restores the mode) runs in that mode
                g = self._grad_of_context(v)
                if g is not None:
                    self._grad = g if len(self._guards) <= self._ctx_depth else GRAD_UNKNOWN
                    self._ctx = ()
                    if self._fn.is_module_level:
                        # at import, for the whole process: functions of this module run in it
                        # when they are called (unless they set a mode themselves)
                        top = not self._guards and self._loop is None and self._ctx_depth == 0 \
                            and self._grad_saved_by_with == 0
                        self.grad_at_import = g if top and g != GRAD_UNKNOWN else GRAD_UNKNOWN
        elif tp is cst.Assign:
            self._expr(s.value)
            targets = tuple(t.target for t in s.targets)
            for t in targets:
                self._target_subexprs(t)
            self._emit(AssignOp(s, None, targets=targets, value=s.value))
            self._rewrapped_grad(targets, s.value)
            self._dunder_all(targets, s.value, False)
            if len(targets) == 1 and isinstance(targets[0], cst.Name):
                self._bind_ctx_var(targets[0].value, s.value)
            if self._cls is not None and self._fn.cls is self._cls:
                for t in targets:
                    self._record_self_attr(t, s)
        elif tp is cst.AugAssign:
            self._expr(s.value)
            self._target_subexprs(s.target)
            op = type(s.operator).__name__
            self._emit(AssignOp(s, None, targets=(s.target,), value=s.value, aug=op))
            if op == "AddAssign":
                self._dunder_all((s.target,), s.value, True)
        elif tp is cst.AnnAssign:
            if s.value is not None:
                self._expr(s.value)
            self._emit(AssignOp(s, None, targets=(s.target,), value=s.value, annotation=s.annotation.annotation))
            if self._cls is not None and self._fn.cls is self._cls and s.value is not None:
                self._record_self_attr(s.target, s)
        elif tp is cst.Return:
            if s.value is not None:
                self._expr(s.value)
            self._emit(ReturnOp(s, None, value=s.value))
        elif tp is cst.Import:
            self.imports.add_import(s, self._fn.is_module_level and self._cls is None)
        elif tp is cst.ImportFrom:
            self.imports.add_import_from(s, self._fn.is_module_level and self._cls is None)
        elif tp is cst.Del:
            pass
        elif tp is cst.Break or tp is cst.Continue:
            self._emit(JumpOp(s, None, jump="break" if tp is cst.Break else "continue"))
        elif tp is cst.Raise:
            for name in _child_fields(tp):
                v = getattr(s, name, None)
                if isinstance(v, cst.BaseExpression):
                    self._expr(v)
            self._emit(JumpOp(s, None, jump="raise"))
        elif tp in (cst.Pass, cst.Global, cst.Nonlocal):
            pass
        else:
            for name in _child_fields(tp):
                v = getattr(s, name, None)
                if isinstance(v, cst.BaseExpression):
                    self._expr(v)

    def _record_self_attr(self, target, stmt) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):  # self.model, self.opt = model, opt
            for el in target.elements:
                self._record_self_attr(el.value, stmt)
            return
        d = dotted(target) if isinstance(target, cst.Attribute) else None
        if d and d.startswith("self.") and d.count(".") == 1:
            self._cls.attr_values.setdefault(d, []).append(self._out[-1])

    def _target_subexprs(self, t) -> None:
        # a[i] = ... evaluates a and i; attribute targets evaluate their base
        if isinstance(t, cst.Subscript):
            self._expr(t.value)
            for el in t.slice:
                self._expr(el.slice)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                self._target_subexprs(el.value)

    def _function(self, node: cst.FunctionDef) -> None:
        params, defaults, annotations = [], {}, {}
        p = node.params
        for prm in list(p.posonly_params) + list(p.params) + list(p.kwonly_params):
            params.append(prm.name.value)
            if prm.default is not None:
                defaults[prm.name.value] = prm.default
            if prm.annotation is not None:
                annotations[prm.name.value] = prm.annotation.annotation
        if isinstance(p.star_arg, cst.Param):
            params.append("*" + p.star_arg.name.value)
        if p.star_kwarg is not None:
            params.append("**" + p.star_kwarg.name.value)
        decorators = []
        for d in node.decorators:
            dec = d.decorator
            call = dec.func if isinstance(dec, cst.Call) else dec
            name = dotted(call) or ""
            decorators.append(self.imports.qualify(name) or name)
        outer = self._fn
        cls = self._cls if self._fn_is_class_body else None
        name = node.name.value
        if cls is not None:
            qual = f"{cls.qualname}.{name}"
        elif outer.is_module_level:
            qual = name
        else:
            qual = f"{outer.qualname}.<locals>.{name}"
        fn = FunctionModel(name, qual, node, cls, params, defaults, annotations, decorators,
                           parent=None if outer.is_module_level else outer)
        for dq in decorators:
            if dq in catalog.GRAD_OFF_CONTEXTS:
                fn.decorator_grad = GRAD_OFF
            elif dq in catalog.GRAD_ON_CONTEXTS:
                fn.decorator_grad = GRAD_ON
        self.all_functions.append(fn)
        if cls is not None:
            cls.methods[name] = fn
        elif outer.is_module_level:
            if name in self.functions:  # defined again (a later notebook cell): every definition, in order
                self.redefined_functions.setdefault(name, [self.functions[name]]).append(fn)
            self.functions[name] = fn
        else:
            outer.nested.append(fn)
            self._emit(DefOp(node, None, function=fn))
        # bind the body in a fresh context
        saved = (self._fn, self._grad, self._loop, self._guards, self._out, self._fn_is_class_body,
                 self._ctx_depth, self._ctx, self._ctx_vars, self._mode_ctx)
        self._fn, self._grad, self._loop, self._guards = fn, fn.decorator_grad, None, ()
        self._ctx_depth, self._ctx, self._ctx_vars, self._mode_ctx = 0, (), {}, ()
        self._out = fn.body
        self._fn_is_class_body = False
        try:
            self._suite(node.body)
        finally:
            (self._fn, self._grad, self._loop, self._guards, self._out, self._fn_is_class_body,
             self._ctx_depth, self._ctx, self._ctx_vars, self._mode_ctx) = saved

    _fn_is_class_body = False

    def _class(self, node: cst.ClassDef) -> None:
        bases, raw = [], []
        for a in node.bases:
            d = dotted(a.value)
            if d is None and isinstance(a.value, cst.Subscript):
                d = dotted(a.value.value)
            if d:
                raw.append(d)
                bases.append(self.imports.qualify(d) or d)
        outer_cls = self._cls
        qual = node.name.value if outer_cls is None else f"{outer_cls.qualname}.{node.name.value}"
        cls = ClassModel(node.name.value, qual, node, bases, raw)
        if qual in self.classes:  # defined again (a later notebook cell): every definition, in order
            self.redefined.setdefault(qual, [self.classes[qual]]).append(cls)
        self.classes[qual] = cls
        saved = (self._cls, self._fn_is_class_body)
        self._cls, self._fn_is_class_body = cls, True
        try:
            body = node.body
            if isinstance(body, cst.IndentedBlock):
                for s in body.body:
                    if isinstance(s, (cst.FunctionDef, cst.ClassDef)):
                        self._stmt(s)
                    # class-level assignments are not part of any function's flow
            self._fn_is_class_body = saved[1]
        finally:
            self._cls, self._fn_is_class_body = saved

    def _if(self, node: cst.If) -> None:
        self._cur_stmt = node
        self._expr(node.test)
        br = BranchOp(node, None, test=node.test)
        self._emit(br)
        saved = self._guards
        arms = []
        self._guards = saved + ((br, 0),)
        arms.append(self._collect(lambda: self._suite(node.body)))
        leaves = [_leaves(node.body)]
        orelse = node.orelse
        if isinstance(node.test, cst.Name) and node.test.value == "True":
            orelse = None  # ``if True: ... else: ...``: the other arms never run (code switched off)
            br.exhaustive = True
        if orelse is not None:
            self._guards = saved + ((br, 1),)
            if isinstance(orelse, cst.If):
                arms.append(self._collect(lambda: self._if(orelse)))
                leaves.append(False)
            else:
                arms.append(self._collect(lambda: self._suite(orelse.body)))
                leaves.append(_leaves(orelse.body))
            br.exhaustive = True
        self._guards = saved
        br.arms = arms
        br.leaves = tuple(leaves)

    def _loop_common(self, loop: LoopOp, body, orelse) -> None:
        self._emit(loop)
        stmts = getattr(body, "body", ())
        last = stmts[-1] if stmts else None
        if isinstance(last, cst.SimpleStatementLine) and last.body and \
                isinstance(last.body[-1], (cst.Break, cst.Return)):
            # ``for x, y in loader: ...; break``: one batch, not a loop over the data
            loop.runs_once = True
        loop.parent = self._loop
        saved = self._loop
        self._loop = loop
        try:
            loop.body = self._collect(lambda: self._suite(body))
        finally:
            self._loop = saved
        if orelse is not None:
            loop.orelse = self._collect(lambda: self._suite(orelse.body))

    def _for(self, node: cst.For) -> None:
        before = len(self._out)
        self._expr(node.iter)
        iter_call = None
        if isinstance(node.iter, cst.Call):
            for op in self._out[before:]:
                if isinstance(op, CallOp) and op.node is node.iter:
                    iter_call = op
        loop = LoopOp(node, None, is_while=False, target=node.target, iter=node.iter, iter_call=iter_call)
        self._loop_common(loop, node.body, node.orelse)

    def _while(self, node: cst.While) -> None:
        loop = LoopOp(node, None, is_while=True, iter=node.test)
        self._expr(node.test)
        self._loop_common(loop, node.body, node.orelse)

    def _with(self, node: cst.With) -> None:
        saved_depth, self._ctx_depth = self._ctx_depth, len(self._guards)
        try:
            self._with_items(node)
        finally:
            self._ctx_depth = saved_depth

    def _with_items(self, node: cst.With) -> None:
        new_grad, new_ctx, new_mode_ctx = self._grad, self._ctx, self._mode_ctx
        for item in node.items:
            self._expr(item.item)
            g = self._grad_of_context(item.item)
            if g is not None:
                new_grad, new_ctx = g, ()
                mode = catalog.MODE_CONTEXTS.get(self.imports.qualify(dotted(item.item.func)) or "") \
                    if type(item.item) is cst.Call else None
                if mode is not None:  # ``with eval_mode(model, ema):`` switches those models too
                    new_mode_ctx = new_mode_ctx + tuple(
                        (mode, d, item.item) for d in (dotted(a.value) for a in item.item.args
                                                       if a.keyword is None and not a.star) if d)
            elif type(item.item) is cst.Call and dotted(item.item.func):
                d = dotted(item.item.func)
                new_ctx = new_ctx + (self.imports.qualify(d) or d,)
            if item.asname is not None:
                self._emit(AssignOp(item, None, targets=(item.asname.name,), value=item.item))
        saved = self._grad, self._ctx, self._mode_ctx
        self._grad, self._ctx, self._mode_ctx = new_grad, new_ctx, new_mode_ctx
        self._grad_saved_by_with += 1
        try:
            self._suite(node.body)
        finally:
            self._grad, self._ctx, self._mode_ctx = saved
            self._grad_saved_by_with -= 1

    def _bind_ctx_var(self, name: str, value) -> None:
        """A name bound to a grad context (``ctx = torch.no_grad()``, ``ctx = nullcontext() if
        train else torch.no_grad()``), for a later ``with ctx:``; bound in a branch, maybe."""
        g = self._grad_of_context(value) if isinstance(value, (cst.Call, cst.IfExp, cst.Attribute)) else None
        if self._guards and (g is not None or name in self._ctx_vars):
            self._ctx_vars[name] = GRAD_UNKNOWN
        elif g is not None:
            self._ctx_vars[name] = g
        else:
            self._ctx_vars.pop(name, None)

    def _dunder_all(self, targets, value, extend: bool) -> None:
        """``__all__ = ["a", "b"]`` (or ``+=``) at the top level: what a star import of this
        module binds; a value that is not a literal list of strings binds no imported name."""
        if not (self._fn.is_module_level and self._cls is None and len(targets) == 1
                and isinstance(targets[0], cst.Name) and targets[0].value == "__all__"):
            return
        names = set()
        if isinstance(value, (cst.List, cst.Tuple)):
            for el in value.elements:
                v = el.value
                if isinstance(v, cst.SimpleString) and not isinstance(el, cst.StarredElement):
                    names.add(v.evaluated_value)
        if extend and self.dunder_all is not None:
            names |= self.dunder_all
        self.dunder_all = names

    def _rewrapped_grad(self, targets, value) -> None:
        """``evaluate = torch.no_grad()(evaluate)``: the decorator applied by hand to a function
        of this module (every later call runs in that mode)."""
        if not (self._fn.is_module_level and len(targets) == 1 and isinstance(targets[0], cst.Name)
                and type(value) is cst.Call and type(value.func) is cst.Call and len(value.args) == 1
                and isinstance(value.args[0].value, cst.Name)
                and value.args[0].value.value == targets[0].value):
            return
        fn = self.functions.get(targets[0].value)
        g = self._grad_of_context(value.func)
        if fn is not None and g in (GRAD_OFF, GRAD_ON):
            fn.decorator_grad = g

    def _grad_of_context(self, expr) -> Optional[str]:
        if isinstance(expr, cst.IfExp):
            # ``nullcontext() if need_grad else torch.no_grad()``: one mode or the other
            a, b = self._grad_of_context(expr.body), self._grad_of_context(expr.orelse)
            return a if a == b else GRAD_UNKNOWN
        call = expr.func if isinstance(expr, cst.Call) else expr
        if isinstance(call, cst.Name) and call.value in self._ctx_vars:
            return self._ctx_vars[call.value]  # ``ctx = torch.no_grad()`` ... ``with ctx:``
        q = self.imports.qualify(dotted(call))
        if q in catalog.GRAD_OFF_CONTEXTS:
            return GRAD_OFF
        if q in catalog.GRAD_ON_CONTEXTS:
            return GRAD_ON
        if q in catalog.SET_GRAD_ENABLED and isinstance(expr, cst.Call) and expr.args:
            v = expr.args[0].value
            if isinstance(v, cst.Name) and v.value in ("False", "True"):
                return GRAD_OFF if v.value == "False" else GRAD_ON
            return GRAD_UNKNOWN
        return None

    def _try(self, node) -> None:
        # the body runs; each handler is an alternative continuation; finally always runs
        self._suite(node.body)
        if node.handlers:
            br = BranchOp(node, None, test=None)
            self._emit(br)
            saved = self._guards
            arms = []
            for i, h in enumerate(node.handlers):
                self._guards = saved + ((br, i),)
                arms.append(self._collect(lambda h=h: self._suite(h.body)))
            self._guards = saved
            br.arms = arms
        if node.orelse is not None:
            self._suite(node.orelse.body)
        if node.finalbody is not None:
            self._suite(node.finalbody.body)

    def _match(self, node) -> None:
        self._expr(node.subject)
        br = BranchOp(node, None, test=node.subject)
        self._emit(br)
        saved = self._guards
        arms = []
        for i, case in enumerate(node.cases):
            self._guards = saved + ((br, i),)
            arms.append(self._collect(lambda c=case: self._suite(c.body)))
        self._guards = saved
        br.arms = arms

    # ---------------------------------------------------------------- expressions
    def _expr(self, e) -> None:
        tp = type(e)
        if tp in _LEAVES:
            return
        if tp is cst.Call:
            self._call(e)
        elif tp is cst.Attribute:
            self._expr(e.value)
        elif tp is cst.Lambda:
            return  # lambdas run later, if at all
        elif tp in (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp):
            self._comp(e)
        else:
            for name in _child_fields(tp):
                v = getattr(e, name, None)
                if v is None:
                    continue
                if isinstance(v, (tuple, list)):
                    for x in v:
                        self._expr_any(x)
                else:
                    self._expr_any(v)

    def _expr_any(self, v) -> None:
        if isinstance(v, cst.BaseExpression):
            self._expr(v)
        elif isinstance(v, cst.CSTNode):
            # Arg, Element, DictElement, Subscript elements, f-string parts, ...
            for name in _child_fields(type(v)):
                x = getattr(v, name, None)
                if x is None or isinstance(x, str):
                    continue
                if isinstance(x, (tuple, list)):
                    for y in x:
                        self._expr_any(y)
                else:
                    self._expr_any(x)

    def _comp(self, e) -> None:
        # evaluate the iterables and the element; a comprehension is a small loop
        f = e.for_in
        while f is not None:
            self._expr(f.iter)
            for cond in f.ifs:
                self._expr(cond.test)
            f = f.inner_for_in
        if isinstance(e, cst.DictComp):
            self._expr(e.key)
            self._expr(e.value)
        else:
            self._expr(e.elt)

    def _call(self, e: cst.Call) -> None:
        func = e.func
        recv_node = None
        attr = None
        if isinstance(func, cst.Attribute):
            recv_node = func.value
            attr = func.attr.value
            self._expr(recv_node)
        elif not isinstance(func, cst.Name):
            self._expr(func)
        for a in e.args:
            self._expr(a.value)
        d = dotted(func)
        q = self.imports.qualify(d) if d else None
        recv = dotted(recv_node) if recv_node is not None else None
        self._emit(CallOp(e, None, func=d, qual=q, recv=recv, recv_node=recv_node, attr=attr,
                          args=tuple(e.args)))


_EXITS = (cst.Continue, cst.Break, cst.Return, cst.Raise)


def _leaves(suite) -> bool:
    """The block's last statement leaves it: ``continue``, ``break``, ``return`` or ``raise``."""
    body = getattr(suite, "body", ())
    if not body:
        return False
    last = body[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return bool(last.body) and isinstance(last.body[-1], _EXITS)
    return isinstance(last, _EXITS)

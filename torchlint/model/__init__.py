"""The semantic model of one module of training code: the single source of facts for rules.

``ModuleModel.build`` runs the binder (one pass over the tree), classifies training events,
and lazily computes dataflow facts, mode flow and function summaries.  Rules ask it
questions (``mm.loops``, ``mm.flow(fn)``, ``mm.summary_of(callee)``); they never walk the tree.
"""
from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from ..parse import _STRING
from ..project import RETURN_KEEP, Aspect, ProjectIndex, ProjectView, project_answer, summary_has_effects  # noqa: F401
from . import catalog, resources as _resources
from .binder import Binder, ClassModel, FunctionModel, ImportTable, dotted
from .dataflow import Dataflow, returns_number
from .flow import ENTRY, ModeFlow, summarize
from .ir import (
    BACKWARD, CALL, CLEAR, FORWARD, GRAD_OFF, GRAD_ON, LOSS, MODE, STEP, AssignOp, BranchOp, CallOp,
    LoopOp, ReturnOp, all_ops, walk,
)
from .roles import RoleResolver, classify, is_eval_name

__all__ = ["ModuleModel", "FunctionModel", "ClassModel", "ProjectIndex", "ExternalRef"]

# a ``def`` at the start of a line, strings and comments skipped (matched, not captured)
_DEF_SCAN = re.compile(r"#[^\n]*|" + _STRING + r"|^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", re.M | re.S)


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


_DEF_RE_CACHE: dict = {}


def _compact(summary: dict) -> dict:
    """An exported summary without its empty fields (readers use ``.get`` with an empty
    default): most functions do nothing a caller cares about, and the project, the cache and
    the messages to the workers carry every exported summary."""
    out = {k: v for k, v in summary.items() if v or k in ("name", "qualname", "path", "line")}
    if summary.get("backward"):  # read with a default of True
        out["backward_inherits_grad"] = bool(summary.get("backward_inherits_grad"))
    return out


def _is_torch_code(imports) -> bool:
    """Whether a module may be PyTorch code: not when it imports another deep-learning
    framework (MXNet, TensorFlow, JAX ...) and nothing of PyTorch's ecosystem.  A module that
    imports neither (a helper handed models by its callers) may be."""
    tops = {m.split(".", 1)[0] for m in imports.imported_modules}
    tops |= {q.split(".", 1)[0] for q in imports.names.values()}
    if tops & catalog.TORCH_PACKAGES:
        return True
    return not (tops & catalog.OTHER_FRAMEWORKS)


def _decorator_grad(mm, name: str, depth: int = 0):
    """The grad mode a decorator of this module applies to the function it wraps:
    ``no_grad = torch.no_grad()`` used as ``@no_grad``; ``def deco(fn)`` whose wrapper calls
    ``fn`` inside ``with torch.no_grad():`` (or under its own ``@torch.no_grad()``); a
    ``return torch.inference_mode()(fn)``.  ``None`` when it applies none or is unknown."""
    if depth > 3:
        return None
    d = mm.functions.get(name)
    if d is None:
        for op in mm.module_function.body:
            if isinstance(op, AssignOp) and op.aug is None and isinstance(op.value, cst.Call) and \
                    any(dotted(t) == name for t in op.targets):
                q = mm.qualify(dotted(op.value.func) or "")
                if q in catalog.GRAD_OFF_CONTEXTS:
                    return GRAD_OFF
                if q in catalog.GRAD_ON_CONTEXTS:
                    return GRAD_ON
        return None
    return _wrapper_grad(mm, d, depth)


def _wrapper_grad(mm, d, depth: int):
    """The grad mode the decorator function ``d`` gives what it wraps (see ``_decorator_grad``);
    a decorator factory (``@smart_inference_mode()``) gives the mode of the decorator it returns."""
    from .ir import CallOp, ReturnOp

    params = [p for p in d.params if not p.startswith("*")]
    if not params:
        return None
    wrapped = params[0]
    for op in walk(d.body):
        if isinstance(op, ReturnOp) and isinstance(op.value, cst.Call) and isinstance(op.value.func, cst.Call):
            g = _context_callee_grad(mm, op.value.func.func)
            if g is not None:
                return g
    for inner in d.nested:
        for op in walk(inner.body):
            if isinstance(op, CallOp) and op.func == wrapped and op.grad in (GRAD_OFF, GRAD_ON):
                return op.grad
    if depth < 3:
        for op in d.body:
            if isinstance(op, ReturnOp) and isinstance(op.value, cst.Name):
                inner = next((n for n in d.nested if n.name == op.value.value), None)
                if inner is not None:
                    return _wrapper_grad(mm, inner, depth + 1)
    return None


def _context_callee_grad(mm, e):
    """``torch.no_grad`` / ``torch.enable_grad``, or ``(torch.inference_mode if new else
    torch.no_grad)`` whose arms agree: the grad mode of calling it, else ``None``."""
    if isinstance(e, cst.IfExp):
        a, b = _context_callee_grad(mm, e.body), _context_callee_grad(mm, e.orelse)
        return a if a == b else None
    q = mm.qualify(dotted(e) or "")
    if q in catalog.GRAD_OFF_CONTEXTS:
        return GRAD_OFF
    if q in catalog.GRAD_ON_CONTEXTS:
        return GRAD_ON
    return None


def _imported_decorator_grad(mm, name: str):
    """The grad mode a decorator imported from another module of the tree applies (its
    summary's ``applies_grad``, see ``export_summaries``)."""
    if name in mm.functions or "." not in name and not mm.imports.names.get(name):
        return None
    ref = mm._external(name)
    if ref is None:
        return None
    s = mm.summary_of(ref)
    return (s or {}).get("applies_grad")


def _contextmanager_grad(mm, fn):
    """The grad mode a ``@contextlib.contextmanager`` function ``fn`` of this module gives the
    body of a ``with`` over it: the mode of the context its ``yield`` runs in
    (``with torch.no_grad(): yield``)."""
    if not any(d in ("contextlib.contextmanager", "contextmanager") for d in fn.decorators):
        return None
    return _yield_grad(mm, fn.node.body, None)


def _yield_grad(mm, node, grad):
    """The grad mode of the first ``yield`` under ``node`` (a module-level function, not a
    recursive closure: a closure that calls itself is a reference cycle holding the model)."""
    if isinstance(node, cst.With):
        for it in node.items:
            e = it.item
            call = e.func if isinstance(e, cst.Call) else e
            q = mm.qualify(dotted(call) or "")
            if q in catalog.GRAD_OFF_CONTEXTS:
                grad = GRAD_OFF
            elif q in catalog.GRAD_ON_CONTEXTS:
                grad = GRAD_ON
    elif isinstance(node, cst.Yield):
        return grad
    for child in node.children:
        if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            r = _yield_grad(mm, child, grad)
            if r is not None:
                return r
    return None


def _context_grad(mm, names: tuple):
    """The grad mode the innermost of the context managers ``names`` that sets one gives its
    body (a user ``@contextmanager`` of this module or of another module of the tree)."""
    cache = mm.__dict__.setdefault("_ctx_grad", {})
    for name in reversed(names):
        if name not in cache:
            f = mm.functions.get(name)
            cache[name] = _contextmanager_grad(mm, f) if f is not None else _imported_decorator_grad(mm, name)
        if cache[name] is not None:
            return cache[name]
    return None


def _apply_decorator_grad(mm, fn) -> None:
    for dq in fn.decorators:
        g = _decorator_grad(mm, dq) or _imported_decorator_grad(mm, dq)
        if g is not None:
            fn.decorator_grad = g
            for op in walk(fn.body):
                if op.grad is None:
                    op.grad = g
            return


def _owners(top) -> dict:
    """{id(node): the innermost function around it (a def is its own)} for ``top`` and the
    nodes under it."""
    from .dataflow import _code_children

    owner = {}
    stack = [(top, None)]
    while stack:
        n, fn = stack.pop()
        if type(n) is cst.FunctionDef:
            fn = n
        owner[id(n)] = fn
        stack.extend((c, fn) for c in _code_children(n))
    return owner


class ModuleModel:
    def __init__(self, path: str, display_path: str, text: str, module: cst.Module,
                 module_name: str = "", is_package: bool = False,
                 project: Optional[ProjectIndex] = None):
        self.path = path
        self.display_path = display_path
        self.text = text
        self.module = module
        self.module_name = module_name
        # the other modules of the tree, seen only through a view that records every
        # question asked of it (``external_queries``): see ``project.ProjectView``
        self.project = ProjectView(project)
        self.external_queries = self.project.asked
        self.imports = ImportTable(module_name, is_package)
        # cross-module identity: the key other modules' summaries use for this one, its
        # import root and its folder (imports of a script resolve there first)
        self.dotted_name = module_name
        self.module_name = self.project.key_for(path, module_name)
        import os as _os

        self.here = _os.path.dirname(_os.path.abspath(path)) if path else None
        self.root = self.project.root_of(self.module_name, self.here)
        self._located: dict = {}
        self._dataflow_state: dict = {}
        self.imports.star_lookup = self._star_binding
        self.binder = Binder(module, self.imports)
        self.binder.bind()
        self.classes = self.binder.classes
        self.redefined = self.binder.redefined
        self.redefined_functions = self.binder.redefined_functions
        self.functions = self.binder.functions
        self.all_functions = self.binder.all_functions
        self.module_function = self.binder.module_function
        self.grad_at_import = self.binder.grad_at_import
        self.is_torch_code = _is_torch_code(self.imports)
        self.resolver = RoleResolver(self)
        self._positions = None
        self._owner = self._local = self._text_lines = None  # see _local_position
        self._top = self._stmt_lines = None  # see _top_level_position
        self.memo = None  # an engine.DocumentMemo: what the lint of an earlier text left
        self._flows: dict = {}
        self._summaries: dict = {}
        self._summarizing: set = set()
        self._class_is_module: dict = {}
        self._forward_facts: dict = {}
        self._return_facts: dict = {}
        self._return_flags: dict = {}  # id(fn) -> parameters that choose what it returns
        self._returns_assumed: dict = {}  # (id(fn), assumed truths) -> (facts, items) or None
        self._loss_params: dict = {}  # id(function) -> its parameters passed to a loss (loss_params)
        self._generator_batches: dict = {}  # id(generator function) -> (it, what its loops yield)
        self._lines = None
        self._def_index = None
        for fn in self.all_functions:
            if fn.decorator_grad is None and fn.decorators:
                _apply_decorator_grad(self, fn)
        for fn in self.all_functions:  # ``with user_context():`` whose grad mode the model knows
            for op in walk(fn.body):
                if op.ctx:
                    g = _context_grad(self, op.ctx)
                    if g is not None:
                        op.grad = g
        for fn in self.all_functions:
            classify(self, fn, self.resolver)
        self._callers_index = None  # built on first use, now that every call is classified
        self._classified = True
        for fn in self.all_functions:
            self.ensure_dataflow(fn)

    def ensure_dataflow(self, fn: FunctionModel) -> bool:
        """Run the dataflow pass of ``fn`` once (callees first, when a call needs their
        return facts); ``False`` while it is running (recursion)."""
        st = self._dataflow_state.get(id(fn))
        if st is not None:
            return st
        self._dataflow_state[id(fn)] = False
        Dataflow(self, fn, self.resolver).run()
        self._dataflow_state[id(fn)] = True
        return True

    # ------------------------------------------------------------------ names
    def qualify(self, d: Optional[str]) -> Optional[str]:
        return self.imports.qualify(d)

    def _star_binding(self, name: str) -> Optional[str]:
        """The qualified name a ``from <tree module> import *`` of this module binds to
        ``name`` (the last such import that binds it), ``None`` when none does: a function or
        class of that module (``utils.f``, resolved as ``from utils import f`` would be) or a
        library name it imports (``torch``).  ``torch`` that no tree module binds, under a star
        import of a library (``from torch_snippets import *``, which re-exports it), is the
        torch package."""
        library = False
        for base in reversed(self.imports.stars):
            key = self.project.module_key(base, self.root, self.here)
            if key is None:
                library = True
            if key is None or key == self.module_name:
                continue
            got = self.project.star_binding(f"{key}.{name}")
            if got is not None:
                return f"{base}.{name}" if got == f"{key}.{name}" else got
        return "torch" if name == "torch" and library else None

    def find_class(self, name: str) -> Optional[ClassModel]:
        c = self.classes.get(name)
        if c is not None:
            return c
        return None

    def locate(self, qual: Optional[str]) -> Optional[str]:
        """A qualified name (``engine.train``) -> the key-qualified name of a member of another
        module of the linted tree (re-exports followed), or ``None``."""
        if not qual:
            return None
        r = self._located.get(qual, 0)
        if r == 0:
            r = self.project.locate(qual, self.root, self.here)
            if r is not None and r.rpartition(".")[0] == self.module_name:
                r = None  # this module itself
            self._located[qual] = r
        return r

    def external_class_name(self, name: Optional[str]) -> Optional[str]:
        """The key-qualified name of a class of another tree module that ``name`` refers to."""
        return self.locate(self.qualify(name)) if name else None

    def external_class(self, name: str, aspect: str = "class") -> Optional[dict]:
        """The facts of a class of another tree module that ``name`` refers to. ``aspect`` is
        the one fact the caller uses (``class``: is it a module; ``mode``: is a module class
        mode-sensitive): only a change of that fact makes this file linted again."""
        q = self.external_class_name(name)
        if q is None:
            return None
        return self.project.class_facts(q, Aspect(aspect))

    def _plain_class(self, cls: ClassModel, depth: int = 0) -> bool:
        """A class of the tree whose bases are all plain classes of the tree (or none, or
        ``object``): an attribute holding one is not a submodule, so ``train()``/``eval()`` of
        the module holding it do not reach it."""
        if depth > 8:
            return False
        for raw in cls.raw_bases:
            if raw == "object":
                continue
            local = self.find_class(raw)
            if local is not None and local is not cls:
                if not self._plain_class(local, depth + 1):
                    return False
                continue
            ext = self.external_class(raw, "mode")
            if not (ext and ext.get("is_module") is False and ext.get("plain")):
                return False
        return True

    def class_is_module(self, cls: ClassModel) -> bool:
        r = self._class_is_module.get(cls.qualname)
        if r is not None:
            return r
        self._class_is_module[cls.qualname] = False
        result = False
        for b, raw in zip(cls.bases, cls.raw_bases):
            if b in catalog.LIGHTNING_BASES:
                result = True
                cls.is_lightning = True
            elif b in catalog.MODULE_BASES or b.startswith("torch.nn.") and b.rsplit(".", 1)[-1][:1].isupper():
                result = True
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

    def is_test_class(self, cls: ClassModel, depth: int = 0) -> bool:
        """A ``unittest.TestCase`` subclass (directly, through a local base, or a framework's
        ``TestCase``: torch's, absl's, Django's): test code wherever its file is."""
        for b, raw in zip(cls.bases, cls.raw_bases):
            if b.rsplit(".", 1)[-1] in ("TestCase", "IsolatedAsyncioTestCase"):
                return True
            base = self.find_class(raw)
            if base is not None and base is not cls and depth < 8 and self.is_test_class(base, depth + 1):
                return True
        return False

    def has_tests(self) -> bool:
        """The module is a test module, on evidence and not on its name alone: it imports
        pytest or unittest, or defines ``test_*`` functions, ``Test*`` / ``TestCase`` classes
        or pytest fixtures (``conftest.py``).  An evaluation script named ``test_model.py``
        with a ``test(model, loader)`` function and a ``__main__`` block is not."""
        mods = self.imports.imported_modules
        if any(m.split(".", 1)[0] in ("pytest", "unittest", "hypothesis") for m in mods):
            return True
        if any(q.split(".", 1)[0] in ("pytest", "unittest") for q in self.imports.names.values()):
            return True
        if any(name.startswith("test_") for name in self.functions):
            return True
        if any(c.name.startswith("Test") or self.is_test_class(c) for c in self.classes.values()):
            return True
        return self.runs_on_made_up_data()

    def runs_on_made_up_data(self) -> bool:
        """A smoke script: the module defines no function or class of its own, and its top-level
        code runs models only on tensors it makes up (random or literal tensors built in the
        file, ``torch.rand(B, T, D)``, ``torch.LongTensor([[1, 3, 2]])``), never on a batch of a
        loader, with no loader anywhere: it checks that a model runs, and what it trains is
        thrown away.  (The engine asks this only of a module whose path is test code.)"""
        if self.functions or self.classes or self.has_unseen_code:
            return False
        fn = self.module_function
        if any(role == catalog.LOADER for role, _ in self.resolver.module_roles().values()):
            return False
        self.ensure_dataflow(fn)
        forwards = [o for o in all_ops(fn) if isinstance(o, CallOp) and o.kind == FORWARD]
        if not forwards:
            return False
        for o in forwards:
            facts = getattr(o, "arg_facts", ()) or ()
            if not facts or any("batch" in f for f in facts) or not any("fresh" in f for f in facts):
                return False
        return True

    def test_class_lines(self) -> tuple:
        """``(first, last)`` lines of every ``unittest.TestCase`` class of the module."""
        out = []
        for cls in self.classes.values():
            if self.is_test_class(cls):
                sl, _, el, _ = self.span_of(cls.node)
                out.append((sl, el))
        return tuple(out)

    def is_module_method(self, fn: FunctionModel) -> bool:
        """Methods of nn.Module subclasses (forward, Lightning steps): not training loops."""
        return fn.cls is not None and self.class_is_module(fn.cls)

    def is_lightning(self, fn: FunctionModel) -> bool:
        return fn.cls is not None and self.class_is_module(fn.cls) and fn.cls.is_lightning

    # ------------------------------------------------------------------ positions
    # libcst's PositionProvider generates the code of everything it covers, with a callback
    # per node: 1.4 s for a 4,700-line module, where one function takes milliseconds. A node
    # inside a function is placed by the positions of that function alone, generated in a
    # module of its own at the same indentation and shifted to the line its ``def`` is on;
    # the generated lines must equal the file's lines there, else the whole module is used.
    def _pos(self):
        if self._positions is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = wrapper.resolve(PositionProvider)
        return self._positions

    def _position(self, node: cst.CSTNode):
        if self._positions is None:
            r = self._local_position(node)
            if r is not None:
                return r
        return self._pos()[node]

    def _local_position(self, node: cst.CSTNode):
        if self._owner is None:
            from .dataflow import _code_children

            self._owner, self._local = {id(self.module): None}, {}
            memo = self.memo
            owners = {}
            for stmt in _code_children(self.module):
                got = memo.owners.get(id(stmt)) if memo is not None else None
                if got is None or got[0] is not stmt:
                    got = (stmt, _owners(stmt))
                owners[id(stmt)] = got
                self._owner.update(got[1])
            if memo is not None:  # what this tree holds: the entries of nodes it no longer has go
                memo.owners = owners
                live = {id(f) for f in self._owner.values() if f is not None}
                memo.positions = {k: v for k, v in memo.positions.items() if k in live}
        fnode = self._owner.get(id(node))
        if fnode is None:
            return self._top_level_position(node) if id(node) in self._owner else None
        return self._placed(node, fnode, self._function_positions)

    def _placed(self, node: cst.CSTNode, owner: cst.CSTNode, place):
        """``node``'s range from the positions of ``owner`` alone (``place(owner)``: positions
        and the lines to add, or ``None`` when they cannot be checked), computed once per owner."""
        placed = self._local.get(id(owner))
        if placed is None:
            placed = self._local[id(owner)] = place(owner) or False
        if placed is False:
            return None
        positions, shift = placed
        r = positions.get(node)
        if r is None:
            return None
        return CodeRange(CodePosition(r.start.line + shift, r.start.column),
                         CodePosition(r.end.line + shift, r.end.column))

    def _top_level_position(self, node: cst.CSTNode):
        """A node of module-level code (a notebook's, a script's) placed by the positions of
        its top-level statement alone, generated as a module of its own and shifted to the
        statement's line (CPython's ``ast`` gives the lines of the top-level statements in
        milliseconds); the generated lines must equal the file's lines there, else the whole
        module is used."""
        if self._top is None:
            from .dataflow import _code_children

            self._top = {}
            for stmt in self.module.body:
                stack = [stmt]
                while stack:
                    n = stack.pop()
                    if self._owner.get(id(n)) is None:  # a def's nodes are placed by the def
                        self._top[id(n)] = stmt
                        stack.extend(_code_children(n))
        stmt = self._top.get(id(node))
        if stmt is None:
            return None
        return self._placed(node, stmt, self._statement_positions)

    def _statement_lines(self) -> dict:
        """{id(top-level statement): its first line (its first decorator's)}, from ``ast``;
        empty when this Python does not parse the text or its statements do not pair up."""
        if self._stmt_lines is None:
            import ast

            self._stmt_lines = {}
            try:
                body = ast.parse(self.text).body
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return self._stmt_lines
            k = 0
            for stmt in self.module.body:
                if k >= len(body):
                    self._stmt_lines = {}
                    break
                first = body[k]
                self._stmt_lines[id(stmt)] = min([first.lineno] + [d.lineno for d in
                                                                   getattr(first, "decorator_list", ())])
                k += len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
            else:
                if k != len(body):
                    self._stmt_lines = {}
        return self._stmt_lines

    def _statement_positions(self, stmt: cst.CSTNode):
        """(positions of the nodes of the top-level ``stmt``, lines to add), or ``None`` when
        they cannot be checked against the file's text."""
        line = self._statement_lines().get(id(stmt))
        if not line:
            return None
        lines = self._text_lines
        if lines is None:
            lines = self._text_lines = self.text.splitlines(keepends=True)
        mod = self.module.with_changes(body=[stmt], header=(), footer=(), has_trailing_newline=True)
        positions = MetadataWrapper(mod, unsafe_skip_copy=True).resolve(PositionProvider)
        gen = mod.code.splitlines(keepends=True)
        shift = line - positions[stmt].start.line
        if shift < 0 or lines[shift:shift + len(gen)] != gen:
            return None
        return positions, shift

    def _function_positions(self, fnode: cst.FunctionDef):
        """(positions of the nodes of ``fnode``, lines to add), or ``None`` when they cannot
        be checked against the file's text."""
        fn = next((f for f in self.all_functions if f.node is fnode), None)
        line = self.def_line(fn) if fn is not None else 0
        lines = self._text_lines
        if lines is None:
            lines = self._text_lines = self.text.splitlines(keepends=True)
        if not 0 < line <= len(lines):
            return None
        src = lines[line - 1]
        indent = src[:len(src) - len(src.lstrip(" \t"))]
        memo = self.memo
        got = memo.positions.get(id(fnode)) if memo is not None else None
        if got is not None and got[0] is fnode and got[1] == indent:
            positions, gen = got[2], got[3]  # the same function's nodes, placed by the same code
        else:
            body = [fnode] if not indent else [
                cst.ClassDef(name=cst.Name("_"), body=cst.IndentedBlock(body=[fnode], indent=indent))]
            mod = self.module.with_changes(body=body, header=(), footer=(), has_trailing_newline=True)
            positions = MetadataWrapper(mod, unsafe_skip_copy=True).resolve(PositionProvider)
            gen = mod.code.splitlines(keepends=True)
            if memo is not None:
                memo.positions[id(fnode)] = (fnode, indent, positions, gen)
        first = 1 if indent else 0  # the line of the stand-in class
        shift = line - positions[fnode.name].start.line
        start = first + shift  # where the function's first generated line is in the file
        if start < 0 or lines[start:start + len(gen) - first] != gen[first:]:
            return None
        return positions, shift

    def span_of(self, node: cst.CSTNode):
        r = self._position(node)
        return r.start.line, r.start.column, r.end.line, r.end.column

    def code_for(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def line_of(self, node: cst.CSTNode) -> int:
        if isinstance(node, cst.FunctionDef):
            fn = next((f for f in self.all_functions if f.node is node), None)
            if fn is not None:
                return self.def_line(fn)
        try:
            return self._position(node).start.line
        except Exception:
            return 0

    def def_line(self, fn: FunctionModel) -> int:
        """Line of a ``def`` without computing positions for the whole module."""
        if fn.is_module_level:
            return 1
        if self._lines is None:
            self._lines = {}
            line, pos = 1, 0
            for m in _DEF_SCAN.finditer(self.text):
                if m.group(1) is None:
                    continue  # a string or a comment (a docstring's example ``def``)
                line += self.text.count("\n", pos, m.start())  # counted once, not from the top each time
                pos = m.start()
                self._lines.setdefault(m.group(1), []).append(line)
        lines = self._lines.get(fn.name) or [0]
        if self._def_index is None:  # the n-th function of a name is the n-th ``def`` of it
            self._def_index = {}
            seen: dict = {}
            for f in self.all_functions:
                n = seen.get(f.name, 0)
                self._def_index[id(f)] = n
                seen[f.name] = n + 1
        idx = self._def_index.get(id(fn), 0)
        return lines[idx] if idx < len(lines) else lines[0]

    # ------------------------------------------------------------------ calls
    def resolve_call(self, fn: FunctionModel, op: CallOp):
        """The function a call runs: a FunctionModel here, an ExternalRef, or None.

        Resolves nested and module-level functions, names imported from other modules of the
        linted tree (absolute, relative, through package re-exports), ``self.method()``
        through the class and its bases (in this module or imported), and ``Class.method``.
        """
        target = self._resolve_name(fn, op.func)
        if fn.is_module_level and target is not None and op.func in self.redefined_functions \
                and target is self.functions.get(op.func):
            target = self.defined_above(op.func, op.node) or target
        return target

    def defined_above(self, name: str, node) -> Optional[FunctionModel]:
        """A notebook or script may define a function twice (a later cell adds a ``device``
        parameter): top-level code calls the definition above it."""
        defs = self.redefined_functions.get(name)
        if not defs:
            return None
        line = self.line_of(node)
        best = None
        for f in defs:
            if self.def_line(f) < line:
                best = f
        return best

    def _resolve_name(self, fn: FunctionModel, d: Optional[str], depth: int = 0):
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
            target = self._external(self.qualify(d))
            if target is None and depth < 3:
                # an alias of a function: ``loss_fn = my_loss`` (imported), then ``loss_fn(...)``
                try:
                    df = self.resolver.definition(fn, d)
                except RecursionError:
                    df = None
                if df is not None and isinstance(df[1], (cst.Name, cst.Attribute)) and dotted(df[1]) != d:
                    target = self._resolve_name(df[0], dotted(df[1]), depth + 1)
            return target
        base, _, name = d.rpartition(".")
        if base in ("self", "super()") and fn.cls is not None or \
                (base == "self" and fn.parent is not None and fn.parent.cls is not None):
            cls = fn.cls or fn.parent.cls
            return self._method_of(cls, name)
        return self._external(self.qualify(d))

    def _method_of(self, cls: ClassModel, name: str, depth: int = 0):
        """``name`` looked up on ``cls`` and its bases (local classes, then imported ones)."""
        if cls is None or depth > 10:
            return None
        m = cls.methods.get(name)
        if m is not None:
            return m
        for raw in cls.raw_bases:
            base = self.find_class(raw)
            if base is not None and base is not cls:
                r = self._method_of(base, name, depth + 1)
                if r is not None:
                    return r
                continue
            ext = self.external_class_name(raw)
            if ext is not None:
                q = self.project.method(ext, name)
                if q is not None:
                    mod, _, nm = self._split(q)
                    return ExternalRef(mod, nm)
        return None

    def class_method(self, cls_name: str, name: str):
        """Method ``name`` of the class ``cls_name`` (a class of this module by qualname, or the
        key-qualified name of a class of another tree module), inherited ones included: a
        ``FunctionModel``, an ``ExternalRef`` or ``None``."""
        cls = self.classes.get(cls_name)
        if cls is not None:
            return self._method_of(cls, name)
        q = self.project.method(cls_name, name)
        if q is None:
            return None
        mod, _, nm = self._split(q)
        return ExternalRef(mod, nm)

    def _split(self, q: str):
        """``key.Class.method`` -> (key, ".", "Class.method") using the module table."""
        parts = q.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = ".".join(parts[:i])
            if self.project.has_module(mod):
                return mod, ".", ".".join(parts[i:])
        return q.rpartition(".")

    def _external(self, q: Optional[str]):
        loc = self.locate(q)
        if loc is None:
            return None
        mod, _, nm = self._split(loc)
        if not self.project.has_module(mod):
            return None
        if "." in nm:
            # Class.method of an imported class (a static or class method), maybe inherited
            cls_q, _, meth = loc.rpartition(".")
            m = self.project.method(cls_q, meth)
            if m is not None:
                mod, _, nm = self._split(m)
        return ExternalRef(mod, nm)

    def _is_tree_module_member(self, q: str) -> bool:
        return self.locate(q) is not None

    def summary_of(self, target, aspect: str = "effects") -> Optional[dict]:
        """The summary of a called function; for one of another module, ``aspect`` says
        which part of it the caller uses (see ``project_answer``)."""
        if target is None:
            return None
        if isinstance(target, ExternalRef):
            return self.project.summary(target.qualname, Aspect(aspect))
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
        free = set(summ.get("free", ()))
        if free and summ.get("path", self.display_path) == self.display_path:
            # (another module's globals are not the caller's variables of the same name)
            # closures and globals: the callee sees the caller's variable of the same name
            for key in list(summ.get("exit_modes", {})) + list(summ.get("trains_in_entry", ())) + \
                    list(summ.get("evals_in_entry", ())) + list(summ.get("forwards", ())):
                if key.split(".", 1)[0] in free:
                    out.setdefault(key, key)
        if is_method and (op.func or "").startswith("self."):
            for key in list(summ.get("exit_modes", {})) + list(summ.get("trains_in_entry", ())) + \
                    list(summ.get("evals_in_entry", ())) + list(summ.get("forwards", ())):
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
        if getattr(self, "_classified", False):
            if self._callers_index is None:  # one walk for all functions, not one per question
                index: dict = {}
                for f in self.all_functions:
                    for op in all_ops(f):
                        if isinstance(op, CallOp) and op.kind == CALL and op.info is not None:
                            index.setdefault(id(op.info), []).append((f, op))
                self._callers_index = index
            yield from [(f, op) for f, op in self._callers_index.get(id(fn), ()) if op.info is fn]
            return
        for f in self.all_functions:
            for op in all_ops(f):
                if isinstance(op, CallOp) and op.kind == CALL and op.info is fn:
                    yield f, op

    # ------------------------------------------------------------------ facts
    def forward_output_facts(self, fn: FunctionModel, op: CallOp) -> frozenset:
        """Facts of what a model's forward returns (probabilities, log-probabilities, ...); a
        forward that returns what a module passed to it returns (``def forward(self, x, layer):
        return layer(...)``) returns, here, what the module of this call returns; one that
        applies a softmax only when a parameter is set (``if apply_softmax:``) returns
        probabilities only to a call that sets it (its default when the call passes nothing)."""
        from .dataflow import call_output_facts, model_output_facts, param_calls, resolve_flag_facts, \
            without_param_calls

        facts = resolve_flag_facts(self._forward_output_facts(fn, op), op)
        calls = param_calls(facts)
        if not calls:
            return facts
        out = without_param_calls(facts)
        positional = [a for a in op.args if a.keyword is None and not a.star]
        for i, name in calls:
            arg = next((a for a in op.args if a.keyword is not None and a.keyword.value == name), None)
            if arg is None and i < len(positional) and not any(a.star for a in op.args):
                arg = positional[i]
            v = arg.value if arg is not None else None
            if isinstance(v, cst.Call):
                out = out | call_output_facts(self, fn, v)
            elif isinstance(v, (cst.Name, cst.Attribute)):
                out = out | model_output_facts(self, fn, dotted(v))
        return out

    def _called_module_class(self, fn: FunctionModel, op: CallOp) -> tuple:
        """The class of the module ``op`` calls, as ``(cls, None)`` for a class of this module,
        ``(None, qualified name)`` for a class known only by name (another module of the tree,
        a library), or ``(None, None)`` when nothing says."""
        info = op.info
        cls = self.classes.get(info) if isinstance(info, str) else None
        if cls is not None:
            return cls, None
        role = self.resolver.of_path(fn, op.target or "")
        if isinstance(role[1], str):
            cls = self.classes.get(role[1])
            return (cls, None) if cls is not None else (None, role[1])
        return None, info if isinstance(info, str) else None

    def _forward_output_facts(self, fn: FunctionModel, op: CallOp) -> frozenset:
        cls, qual = self._called_module_class(fn, op)
        if qual is not None:
            return self.external_forward_facts(qual)
        if cls is None:
            # a model built here from layers (nn.Sequential(..., nn.Softmax())), by a factory
            # function, or passed in by the callers of ``fn``
            from .dataflow import model_output_facts

            return model_output_facts(self, fn, op.target)
        return self.class_forward_facts(cls)

    def forward_loss_kind(self, fn: FunctionModel, op: CallOp) -> Optional[str]:
        """The kind of loss (cross-entropy, BCE with logits ...) that the forward of the module
        ``op`` runs applies to its first input: a user loss module (``FocalLoss()(pred, y)``
        whose ``forward`` calls ``F.binary_cross_entropy_with_logits(inputs, targets)``), of
        this module or of another module of the tree; else ``None``."""
        cls, qual = self._called_module_class(fn, op)
        if cls is not None:
            return self.class_loss_input(cls)
        if not qual or "." not in qual:
            return None
        return (self.project.class_facts(qual, Aspect.FWD) or {}).get("loss_input")

    def class_loss_input(self, cls: ClassModel) -> Optional[str]:
        """The kind of the loss ``cls``'s own ``forward`` applies to its first parameter, as
        it is (not a transformed copy)."""
        from .dataflow import loss_kind

        fwd = cls.methods.get("forward")
        params = [p for p in fwd.params if p not in ("self", "cls")] if fwd is not None else []
        if not params or params[0].startswith("*"):
            return None
        for op in all_ops(fwd):
            if isinstance(op, CallOp) and op.kind == LOSS:
                a = op.arg(0, "input")
                if a is not None and isinstance(a.value, cst.Name) and a.value.value == params[0]:
                    k = loss_kind(self, fwd, op)
                    if k in (catalog.CE, catalog.NLL, catalog.BCE, catalog.BCE_LOGITS):
                        return k
        return None

    def loss_params(self, fn: FunctionModel) -> tuple:
        """``(param, index, kind, guards)`` for each loss call of ``fn`` (a helper of this
        module: ``def _loss_fn(self, y_pred, y_true): return F.cross_entropy(y_pred, y_true)``)
        whose input is one of ``fn``'s parameters as it was passed (never rebound in ``fn``):
        ``index`` is the parameter's position at a call (``self`` left out), ``kind`` the
        loss's (cross-entropy, NLL, BCE, BCE with logits) and ``guards`` the tests (their
        code and arm) the loss call runs under."""
        r = self._loss_params.get(id(fn))
        if r is not None:
            return r
        from .dataflow import loss_kind

        params = list(fn.params)
        if fn.cls is not None and params and params[0] in ("self", "cls"):
            params = params[1:]
        out = []
        rebound = set()
        for op in all_ops(fn):
            if isinstance(op, AssignOp):
                for t in op.targets:
                    for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else (t,)):
                        e = getattr(e, "value", e)
                        if isinstance(e, cst.Name):
                            rebound.add(e.value)
        for op in all_ops(fn):
            if not (isinstance(op, CallOp) and op.kind == LOSS):
                continue
            a = op.arg(0, "input")
            if a is None or not isinstance(a.value, cst.Name):
                continue
            name = a.value.value
            if name not in params or name.startswith("*") or name in rebound:
                continue
            k = loss_kind(self, fn, op)
            if k in (catalog.CE, catalog.NLL, catalog.BCE, catalog.BCE_LOGITS):
                out.append((name, params.index(name), k, self.guard_keys(op)))
        r = self._loss_params[id(fn)] = tuple(out)
        return r

    def guard_keys(self, op) -> frozenset:
        """The tests ``op`` runs under, as (code with one kind of quotes and no spaces, arm)
        pairs; ``if not x:`` is the other arm of ``if x:``."""
        keys = set()
        for br, arm in op.guards:
            if isinstance(br, BranchOp) and br.test is not None:
                test = br.test
                if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and arm in (0, 1):
                    test, arm = test.expression, 1 - arm
                keys.add((self.code_for(test).replace('"', "'").replace(" ", ""), arm))
        return frozenset(keys)

    def helper_losses(self, fn: FunctionModel, op: CallOp) -> Iterator[tuple]:
        """``(index, param, kind)`` for each argument that a call of a helper of this module
        passes on to a loss (see :meth:`loss_params`), when the value passed reaches that loss:
        the loss runs on every call of the helper, or under a test of the helper that is
        also the test under which the function which made the value returned it
        (``if self.method == 'multiclass': return F.softmax(x, 1)`` in one method,
        ``if self.method == 'multiclass': return F.cross_entropy(y_pred, y)`` in another)."""
        target = op.info
        if op.kind != CALL or not isinstance(target, FunctionModel) or target.is_module_level:
            return
        for name, index, kind, guards in self.loss_params(target):
            a = op.arg(index, name)
            if a is None:
                continue
            if guards and not (guards & self._producer_guards(fn, a.value)):
                continue
            yield index, name, kind

    def _producer_guards(self, fn: FunctionModel, expr) -> frozenset:
        """The tests under which the function of this module whose return value ``expr`` is
        (a call, or a name last assigned from one) returns a value with an activation fact."""
        call = expr
        if isinstance(expr, cst.Name):
            call = None
            use = self.line_of(expr)
            for o in all_ops(fn):
                if isinstance(o, AssignOp) and o.aug is None and isinstance(o.value, cst.Call) \
                        and any(isinstance(t, cst.Name) and t.value == expr.value for t in o.targets) \
                        and self.line_of(o.value) <= use:
                    call = o.value
        if not isinstance(call, cst.Call):
            return frozenset()
        cop = next((o for o in all_ops(fn) if isinstance(o, CallOp) and o.node is call), None)
        producer = cop.info if cop is not None and cop.kind == CALL else None
        if not isinstance(producer, FunctionModel):
            return frozenset()
        out = set()
        for r in all_ops(producer):
            if isinstance(r, ReturnOp) and r.value_facts & {"probs", "sigmoid", "logprobs"}:
                out |= self.guard_keys(r)
        return frozenset(out)

    _ACTIVATIONS = ("probs", "sigmoid", "logprobs", "logits")

    def forward_item_facts(self, fn: FunctionModel, op: CallOp) -> Optional[tuple]:
        """What each item of the tuple a model's ``forward`` returns is (``return
        torch.sigmoid(x), feature_map``: sigmoid outputs, then nothing known), for the model
        of ``op``, a class of this module or of another module of the tree; else ``None``."""
        cls, qual = self._called_module_class(fn, op)
        if cls is not None:
            return self.class_forward_item_facts(cls)
        if not qual or "." not in qual:
            return None
        items = (self.project.class_facts(qual, Aspect.FWD) or {}).get("forward_items")
        return tuple(frozenset(i) for i in items) if items else None

    def class_forward_item_facts(self, cls: ClassModel) -> Optional[tuple]:
        """Per item, the activation facts of the tuple ``cls``'s own ``forward`` returns on
        every path (``None`` when it returns no tuple, or none of its items is known)."""
        fwd = cls.methods.get("forward")
        if fwd is None:
            return None
        items = self.return_item_facts(fwd)
        if not items:
            return None
        out = tuple(frozenset(f for f in i if f in self._ACTIVATIONS) for i in items)
        return out if any(out) else None

    def external_forward_facts(self, qual: str) -> frozenset:
        """What the forward of a model class of another tree module returns (its export)."""
        if not qual or "." not in qual:
            return frozenset()
        facts = self.project.class_facts(qual, Aspect.FWD) or {}
        return frozenset(facts.get("forward", ()))

    def class_forward_facts(self, cls: ClassModel) -> frozenset:
        """What ``cls``'s forward returns, by its own forward, its bases, or its layers."""
        key = cls.qualname
        if key in self._forward_facts:
            return self._forward_facts[key]
        self._forward_facts[key] = frozenset()
        facts = frozenset()
        fwd = cls.methods.get("forward")
        if fwd is not None:
            from .dataflow import flag_conditioned

            facts = frozenset(f for f in self.return_facts(fwd) if f in ("probs", "sigmoid", "logprobs", "logits")
                              or f.startswith("calls_param:"))
            facts = flag_conditioned(self, fwd, facts)  # `if apply_softmax: ...`
        else:
            facts = self._sequential_output(cls)
            if not facts:  # forward inherited from a base class, here or imported
                for raw in cls.raw_bases:
                    base = self.find_class(raw)
                    if base is not None and base is not cls:
                        facts = self.class_forward_facts(base)
                    else:
                        facts = self.external_forward_facts(self.external_class_name(raw) or "")
                    if facts:
                        break
        self._forward_facts[key] = facts
        return facts

    def _sequential_output(self, cls: ClassModel) -> frozenset:
        from .dataflow import sequential_class_output

        return sequential_class_output(self, cls)

    def return_facts(self, fn: FunctionModel) -> frozenset:
        r = self._return_facts.get(id(fn))
        if r is not None:
            return r
        done = self.ensure_dataflow(fn)  # a callee's facts are needed before its caller's
        out = frozenset()
        for op in all_ops(fn):
            if isinstance(op, ReturnOp):
                out = out | op.value_facts
        if returns_number(self, fn):
            # a Python number (a warm-up schedule's value): never a tensor, nor the batch it was given
            out = frozenset({"scalar"})
        if done:
            self._return_facts[id(fn)] = out
        return out

    def return_item_facts(self, fn: FunctionModel) -> Optional[tuple]:
        """The facts of each item when every ``return`` of ``fn`` with a value returns a tuple
        of the same length (``return output, loss.item()``), else ``None``."""
        self.ensure_dataflow(fn)
        out = None
        for op in all_ops(fn):
            if isinstance(op, ReturnOp) and op.value is not None:
                if not op.item_facts or (out is not None and len(out) != len(op.item_facts)):
                    return None
                out = op.item_facts if out is None else tuple(a | b for a, b in zip(out, op.item_facts))
        return out

    _RETURN_KEEP = RETURN_KEEP

    def return_flags(self, fn: FunctionModel) -> tuple:
        """Parameters of ``fn`` that choose what it returns: tested by an ``if p:`` (or ``if not
        p:``) an arm of which returns (``if return_labels: return labels``)."""
        got = self._return_flags.get(id(fn))
        if got is not None:
            return got
        from .dataflow import flag_test

        params = [p for p in fn.params if not p.startswith("*") and p not in ("self", "cls")]
        out = []
        for op in all_ops(fn):
            if isinstance(op, BranchOp) and op.test is not None:
                t = flag_test(op.test)
                if t and t[0] in params and t[0] not in out and \
                        any(isinstance(o, ReturnOp) for arm in op.arms for o in walk(arm)):
                    out.append(t[0])
        got = self._return_flags[id(fn)] = tuple(out)
        return got

    def _returns_at_call(self, target: FunctionModel, op: CallOp) -> Optional[tuple]:
        """``(facts, items)`` that ``target`` returns at the call ``op`` when the call passes a
        literal (or leaves the literal default) for a parameter that chooses what it returns:
        only the returns that choice reaches (``labels = solve(..., return_labels=True)`` gets
        the labels, ``loss, acc = solve(...)`` the tuple).  ``None`` when no such parameter is
        known at the call."""
        flags = self.return_flags(target)
        if not flags or any(a.star for a in op.args) or returns_number(self, target):
            return None
        from .dataflow import _literal_truth, run_assuming
        from .resources import param_for

        params = [p for p in target.params if not p.startswith("*")]
        given = {}
        for a in op.args:
            p = param_for(params, op, a)
            if p is not None:
                given[p] = a.value
        assume = {}
        for p in flags:
            v = given.get(p, target.defaults.get(p))
            truth = _literal_truth(v) if v is not None else None
            if truth is not None:
                assume[p] = truth
        if not assume:
            return None
        key = (id(target), tuple(sorted(assume.items())))
        if key in self._returns_assumed:
            return self._returns_assumed[key]
        if not self.ensure_dataflow(target):
            return None  # (not while its own pass runs)
        returned, items, reached = run_assuming(self, target, assume)
        got = (returned, items) if reached else None  # no return reached under that choice: nothing known
        self._returns_assumed[key] = got
        return got

    def call_result_facts(self, fn: FunctionModel, op: CallOp, arg_facts=()) -> frozenset:
        """Facts of the value a call of a function of the linted tree returns: what its
        summary says it returns (a loss attached to the graph, probabilities, moved
        tensors); a batch passed in and returned (moved or not) is still a batch."""
        target = op.info
        if isinstance(target, FunctionModel):
            if target.is_module_level:
                return frozenset()
            chosen = self._returns_at_call(target, op)
            ret = chosen[0] if chosen is not None else self.return_facts(target)
        elif isinstance(target, ExternalRef):
            batch = any("batch" in a for a in arg_facts)
            s = self.summary_of(target, "retb" if batch else "ret")
            ret = frozenset(s.get("returns", ())) if s else frozenset()
        else:
            return frozenset()
        out = ret & self._RETURN_KEEP
        if ("param_in" in ret or "moved" in ret) and any("batch" in a for a in arg_facts):
            out = out | {"batch"}
            if "param_in" in ret and all("moved" in a for a in arg_facts if "batch" in a):
                out = out | {"moved"}  # what it received, moved by the caller (``x, y = unpack(batch)``)
        return frozenset(out)

    def call_result_item_facts(self, fn: FunctionModel, op: CallOp, arg_facts=()) -> Optional[tuple]:
        """The facts of each item of the tuple a call of a function of the linted tree returns
        (those :meth:`call_result_facts` keeps for the whole value), or ``None`` when the
        function does not always return a tuple of one length."""
        target = op.info
        if isinstance(target, FunctionModel):
            if target.is_module_level:
                return None
            chosen = self._returns_at_call(target, op)
            items = chosen[1] if chosen is not None else self.return_item_facts(target)
        elif isinstance(target, ExternalRef):
            batch = any("batch" in a for a in arg_facts)
            s = self.summary_of(target, "retb" if batch else "ret")
            items = tuple(frozenset(i) for i in s.get("returns_items", ())) if s else None
        else:
            return None
        if not items:
            return None
        return tuple(frozenset(ret & self._RETURN_KEEP) for ret in items)

    def describe_call(self, op) -> Optional[str]:
        """``"`evaluate()` (engine.py:41)"`` for a call of a function of the linted tree (for
        messages that must say which function made the difference), else ``None``."""
        if not isinstance(op, CallOp) or op.kind != CALL:
            return None
        s = self.summary_of(op.info, "exact")
        if not s:
            return None
        return f"`{s['name']}()` ({s['path']}:{s['line']})"

    def value_origin(self, fn: FunctionModel, expr) -> Optional[str]:
        """The tree function whose return value ``expr`` is (``probs = predict(model, x)`` ...
        ``criterion(probs, y)``), described as by :meth:`describe_call`; ``None`` otherwise."""
        from .binder import dotted as _dotted

        if isinstance(expr, cst.Call):
            op = next((o for o in all_ops(fn) if isinstance(o, CallOp) and o.node is expr), None)
            return self.describe_call(op)
        name = _dotted(expr) if expr is not None else None
        if not name:
            return None
        last = None
        use = self.line_of(expr)
        for o in all_ops(fn):
            if isinstance(o, AssignOp) and o.aug is None and isinstance(o.value, cst.Call):
                for t in o.targets:
                    names = [_dotted(e.value) for e in t.elements] if isinstance(t, (cst.Tuple, cst.List)) \
                        else [_dotted(t)]
                    if name in names and (not use or self.line_of(o.value) <= use):  # the last binding above the use
                        last = o.value
        return self.value_origin(fn, last) if last is not None else None

    def function_named(self, fn: FunctionModel, name: Optional[str]):
        """A function a name refers to from ``fn``: nested, module-level, or imported."""
        if not name:
            return None
        if "." not in name:
            f = fn
            while f is not None:
                for n in f.nested:
                    if n.name == name:
                        return n
                f = f.parent
            if name in self.functions:
                return self.functions[name]
        return self._external(self.qualify(name))

    def loader_moves(self, fn: FunctionModel, expr) -> bool:
        """The loader ``expr`` was built with a ``collate_fn`` that moves tensors to a device."""
        from .binder import dotted as _dotted

        path = _dotted(expr) if expr is not None else None
        if not path:
            return False
        values = []
        f = fn
        while f is not None:
            values += [op.value for op in all_ops(f) if isinstance(op, AssignOp) and op.value is not None
                       and any(_dotted(t) == path for t in op.targets)]
            f = f.parent
        cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
        if path.startswith("self.") and cls is not None:
            values += [op.value for op in cls.attr_values.get(path, ()) if op.value is not None]
        if not values:
            values = [op.value for op in walk(self.module_function.body) if isinstance(op, AssignOp)
                      and op.value is not None and any(_dotted(t) == path for t in op.targets)]
        for v in values:
            if not isinstance(v, cst.Call):
                continue
            for a in v.args:
                if a.keyword is None or a.keyword.value != "collate_fn":
                    continue
                c = a.value
                if isinstance(c, cst.Call) and (_dotted(c.func) or "").endswith("partial") and c.args:
                    c = c.args[0].value
                target = self.function_named(fn, _dotted(c))
                s = self.summary_of(target, "exact") if target is not None else None
                if s and (s.get("moves") or "moved" in s.get("returns", ())):
                    return True
        return False

    @property
    def has_unseen_code(self) -> bool:
        """Part of the module is not analysed: a notebook cell that does not parse was left
        out of the program (what it does with the module's names is unknown)."""
        from ..notebook import LEFT_OUT

        return LEFT_OUT in self.text

    def clears_by_assignment(self, fn: FunctionModel) -> bool:
        """``p.grad = None`` / ``p.grad.zero_()`` style clearing inside ``fn``."""
        from .queries import is_grad_clear, selective_grad_clear

        return any(is_grad_clear(op, self) and not selective_grad_clear(op, self) for op in all_ops(fn))

    # ------------------------------------------------------------------ loops
    def loops(self, fn: FunctionModel) -> list:
        return [op for op in all_ops(fn) if isinstance(op, LoopOp)]

    def export_summaries(self) -> dict:
        """Summaries of the module's top-level functions and methods, keyed by qualified name."""
        out = {}
        for fn in self.all_functions:
            if fn.is_module_level or fn.parent is not None:
                continue
            s = _compact(self.summary_of(fn))
            if fn.cls is None and (fn.nested or fn.decorators or any(isinstance(op, ReturnOp) for op in fn.body)):
                # a decorator that runs what it wraps under no_grad / enable_grad, or a
                # context manager whose body runs so
                g = _decorator_grad(self, fn.name) or _contextmanager_grad(self, fn)
                if g is not None:
                    s["applies_grad"] = g
            out[f"{self.module_name}.{fn.qualname}"] = s
        return out

    def export_calls(self) -> list:
        """[qualname, under_no_grad] for each call of another module's function."""
        from .ir import CALL as _CALL

        from .callsites import export_entries, export_method_calls

        out = []
        for fn in self.all_functions:
            for op in all_ops(fn):
                if isinstance(op, CallOp) and op.kind == _CALL and isinstance(op.info, ExternalRef):
                    out.append([self.project.resolve(op.info.qualname), op.grad == GRAD_OFF])
        # each call site of another module's function or class with what it passes (roles
        # known only at call sites: ``model.callsites``), counted with the calls
        out.extend([entry, off] for entry, off in export_entries(self))
        # ``model.generate(x)`` on an instance of another module's class: a call of that method
        out.extend([entry, off] for entry, off in export_method_calls(self))
        return out

    def export_classes(self) -> dict:
        """Class facts for other modules: is it an ``nn.Module``, its bases (key-qualified),
        its methods (their summaries are exported as ``key.Class.method``), what its forward
        returns (probabilities, log-probabilities, sigmoid outputs, raw logits), and whether
        it is an iterable-style dataset."""
        out = {}
        for cls in self.classes.values():
            bases = []
            for raw in cls.raw_bases:
                local = self.find_class(raw)
                if local is not None and local is not cls:
                    bases.append(f"{self.module_name}.{local.qualname}")
                else:
                    ext = self.external_class_name(raw)
                    if ext:
                        bases.append(ext)
            is_module = self.class_is_module(cls)
            facts = {"is_module": is_module, "bases": bases, "methods": sorted(cls.methods)}
            if not is_module and _resources.get(self).class_iterable(cls.qualname):
                facts["iterable_dataset"] = True  # DataLoader(shuffle=True) would raise on it
            if not is_module:
                on_device = _resources.get(self).class_places_on_device(cls)
                if on_device is not None:  # a dataset that puts its tensors on a device, or not
                    facts["on_device"] = on_device
                shuffles = _resources.get(self).class_shuffling_methods(cls.qualname)
                if shuffles:  # methods that permute its samples (a dataset reshuffled per epoch)
                    facts["shuffles"] = sorted(shuffles)
            if is_module:
                try:  # does it behave differently in train and eval mode (dropout, batch norm)?
                    facts["mode_sensitive"] = self.resolver.class_mode_sensitive(cls)
                    free_if = self.resolver.class_mode_free_if(cls) if facts["mode_sensitive"] else None
                    if free_if:  # unless its constructor's dropout rates are given as 0
                        facts["mode_free_if"] = free_if
                    layers = self.resolver.class_mode_layers(cls) if facts["mode_sensitive"] else False
                    if layers is not None:  # a mode-dependent layer is seen in it, or none (absent: unknown)
                        facts["mode_layers"] = layers
                except RecursionError:
                    facts["mode_sensitive"] = True
                    facts.pop("mode_free_if", None)
            elif self._plain_class(cls):
                facts["plain"] = True  # no nn.Module in its bases: holds no train/eval mode
            if is_module:
                try:
                    facts["forward"] = sorted(self.class_forward_facts(cls))
                except RecursionError:
                    facts["forward"] = []
                items = self.class_forward_item_facts(cls)
                if items:  # a forward that returns a tuple: what each item is
                    facts["forward_items"] = [sorted(i) for i in items]
                kind = self.class_loss_input(cls)
                if kind:  # a loss module: the loss its forward applies to its first input
                    facts["loss_input"] = kind
            out[f"{self.module_name}.{cls.qualname}"] = facts
        return out

    def export_reexports(self) -> tuple:
        """(``{key.name: key-qualified target}``, ``[key of each star-imported module]``): the
        names this module imports from other modules of the tree, which importers of this
        module (a package ``__init__`` above all) may import from it in turn."""
        out = {}
        for local, q in self.imports.names.items():
            loc = self.locate(q)
            if loc is None and q:
                key = self.project.module_key(q, self.root, self.here)
                loc = key if key is not None and key != self.module_name else None
            if loc and loc != f"{self.module_name}.{local}":
                out[f"{self.module_name}.{local}"] = loc
        # the PyTorch-ecosystem names a ``from <this module> import *`` binds (``torch``,
        # ``nn``, ``F``...): an importer qualifies them as this module does
        for local in self.imports.star_exports(self.binder.dunder_all):
            q = self.imports.names[local]
            k = f"{self.module_name}.{local}"
            if k not in out and q.partition(".")[0] in catalog.TORCH_PACKAGES:
                out[k] = q
        stars = []
        for base in getattr(self.imports, "stars", ()):
            key = self.project.module_key(base, self.root, self.here)
            if key is not None and key != self.module_name:
                stars.append(key)
        return out, stars

"""Roles (what a name is in PyTorch terms) and the classification of calls into training events."""
from __future__ import annotations

import builtins
import re
from typing import Optional

import libcst as cst

from . import catalog
from .binder import FunctionModel, dotted
from .ir import (
    AUTOGRAD_GRAD, BACKWARD, CALL, CLEAR, FORWARD, LOSS, MODE, MOVE, SCHED_STEP, STEP,
    AssignOp, CallOp, DefOp, LoopOp, ReturnOp, all_ops, walk,
)

# (role, info) where info is the loss kind for LOSS, the class name for MODEL
Role = tuple

_PASSTHROUGH_METHODS = catalog.MODULE_SELF_METHODS
_WRAPPERS = catalog.MODEL_WRAPPERS
_PREPARE = {"prepare", "setup", "prepare_model", "prepare_optimizer", "prepare_data_loader",
            "unwrap_model", "setup_dataloaders"}
_EVAL_NAME = re.compile(r"(^|_)(eval|evaluate|evaluation|valid|validate|validation|val|test|testing|"
                        r"infer|inference|predict|prediction|score|benchmark)($|_)", re.I)


def is_eval_name(name: str) -> bool:
    return bool(_EVAL_NAME.search(name))


def is_test_function(mm, fn) -> bool:
    """A unit test: a function of a test file (``torchlint.selection.is_test_path``) or a
    method of a ``unittest.TestCase`` class.  A ``test()`` function of a training script
    evaluates; it is not a unit test."""
    from ..selection import is_test_path

    f = fn
    while f.parent is not None:
        f = f.parent
    if f.cls is not None and mm.is_test_class(f.cls):
        return True
    return is_test_path(getattr(mm, "path", "") or "", getattr(mm, "root", "") or "") and mm.has_tests()


class RoleResolver:
    """Answers "what is this path?" for one module, caching per function."""

    def __init__(self, mm):
        self.mm = mm  # ModuleModel
        self._module_roles: Optional[dict] = None
        self._class_roles: dict = {}
        self._otherwise: dict = {}
        self._definitions: dict = {}  # (id(fn), path) -> definition(fn, path)

    # ----------------------------------------------------------- expressions
    def of_expr(self, fn, expr) -> Role:
        if isinstance(expr, (cst.Name, cst.Attribute)):
            d = dotted(expr)
            if d:
                q = self.mm.qualify(d)
                kind = catalog.functional_loss_kind(q) if q else None
                if kind is not None:  # ``self.loss_func = F.binary_cross_entropy_with_logits``
                    return (catalog.LOSS, kind)
                return self.of_path(fn, d)
            return (None, None)
        if isinstance(expr, cst.Call):
            func = expr.func
            d = dotted(func)
            q = self.mm.qualify(d) if d else None
            if q:
                role, info = catalog.role_of_constructor(q)
                if role:
                    return (role, info)
                if q in _WRAPPERS and expr.args:
                    return self.of_expr(fn, expr.args[0].value)
            if d:
                cls = self.mm.find_class(d)
                if cls is not None and self.mm.class_is_module(cls):
                    return (catalog.MODEL, cls.qualname)
                if cls is None:  # a model class of another module of the linted tree
                    ext = self.mm.external_class(d)
                    if ext and ext.get("is_module"):
                        return (catalog.MODEL, self.mm.external_class_name(d))
            if isinstance(func, cst.Attribute):
                attr = func.attr.value
                if attr in _PASSTHROUGH_METHODS:
                    return self.of_expr(fn, func.value)
                if attr in _PREPARE and len(expr.args) == 1:
                    return self.of_expr(fn, expr.args[0].value)
                if attr == "from_pretrained":
                    base = dotted(func.value) or ""
                    qb = self.mm.qualify(base) if base else None
                    if qb and (catalog.non_torch_object(qb) or (qb.startswith("transformers.")
                                                               and qb.rsplit(".", 1)[-1].startswith(("Flax", "TF")))):
                        # a diffusers pipeline (``AutoPipelineForText2Image``): its ``__call__``
                        # runs no_grad sampling, it is not a module
                        return (None, None)
                    if "Model" in base or "ForCausalLM" in base or "For" in base:
                        return (catalog.MODEL, None)
            return (None, None)
        if isinstance(expr, cst.Lambda):
            return self.callable_loss(fn, [p.name.value for p in expr.params.params], expr.body)
        return (None, None)

    def callable_loss(self, fn, params: list, body) -> Role:
        """A lambda (or a function whose body is one ``return``) that returns a loss call is a
        loss: ``lambda logits, y: F.cross_entropy(logits, y, reduction="none")``.  It has that
        loss's kind when it hands its first two parameters on as the input and the target;
        a loss of another kind otherwise (``targets.argmax(1)`` first: not class indices)."""
        if not isinstance(body, cst.Call):
            return (None, None)
        d = dotted(body.func)
        q = self.mm.qualify(d) if d else None
        kind = catalog.functional_loss_kind(q) if q else None
        if kind is None and q and q.startswith("torch.nn.functional.") and q.endswith("_loss"):
            kind = catalog.OTHER_LOSS
        if kind is None and isinstance(body.func, cst.Call):  # nn.CrossEntropyLoss()(x, y)
            role, info = self.of_expr(fn, body.func)
            if role == catalog.LOSS:
                kind = info or catalog.OTHER_LOSS
        if kind is None:
            return (None, None)
        given = [_first_arg(body, "input"), None]
        positional = [a for a in body.args if a.keyword is None and not a.star]
        given[1] = next((a for a in body.args if a.keyword is not None and a.keyword.value == "target"),
                        positional[1] if len(positional) > 1 else None)
        through = len(params) >= 2 and all(
            a is not None and isinstance(a.value, cst.Name) and a.value.value == p
            for a, p in zip(given, params[:2]))
        return (catalog.LOSS, kind if through else catalog.OTHER_LOSS)

    def _def_loss(self, nested) -> Role:
        """``def loss_func(logits, y): return F.cross_entropy(logits, y)``: see ``callable_loss``."""
        node = nested.node
        body = getattr(node.body, "body", ())
        stmts = [s for s in body if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                                          and isinstance(s.body[0], cst.Expr)
                                          and isinstance(s.body[0].value, cst.SimpleString))]
        if len(stmts) != 1 or not isinstance(stmts[0], cst.SimpleStatementLine) or len(stmts[0].body) != 1 \
                or not isinstance(stmts[0].body[0], cst.Return):
            return (None, None)
        params = [p for p in nested.params if p not in ("self", "cls")]
        return self.callable_loss(nested, params, stmts[0].body[0].value)

    # ----------------------------------------------------------- paths
    def of_path(self, fn, path: str) -> Role:
        f = fn
        while f is not None:
            r = self.local_roles(f).get(path)
            if r is not None:
                return r
            if path in f.params:
                return self._param_role(f, path)
            nested = next((n for n in getattr(f, "nested", ()) if n.name == path), None)
            if nested is not None:
                return self._def_loss(nested)
            f = f.parent
        if path.startswith("self.") and fn is not None:
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            if cls is not None:
                r = self.class_roles(cls).get(path)
                if r is not None:
                    return r
        if path.startswith("self.") and path.count(".") == 1 and fn is not None:
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            if cls is not None and path[5:] in cls.methods:
                return (None, None)  # ``self.restore_model(step)``: a method, not a module
        if path == "self" and fn is not None and fn.cls is not None and self.mm.class_is_module(fn.cls):
            return (catalog.MODEL, fn.cls.qualname)
        r = self.module_roles().get(path)
        if r is not None:
            return r
        q = self.mm.qualify(path)
        if q:
            role, info = catalog.role_of_constructor(q)
            if role is not None:
                return (None, None)  # a class or factory (``timm.create_model``), not an instance
        first = path.split(".", 1)[0]
        if first in self.mm.functions or first in self.mm.classes:
            return (None, None)  # a function or class of this module, not an instance
        return self._guess(fn, path, q)

    def _guess(self, fn, path: str, q: Optional[str] = None) -> Role:
        """The role a name suggests, when nothing says what the value is, and only where
        nothing says it is something else: not in a module of another framework, not for an
        imported name (a function, class or module: ``idist.auto_model``), not for a value
        defined by a lambda, a function or a call of another library (an OpenCV net, a
        diffusers noise scheduler, a gym environment)."""
        if not self.mm.is_torch_code:
            return (None, None)
        guess = catalog.role_from_name(path)
        if guess is None:
            return (None, None)
        if q:
            return (None, None)  # an imported name is a function, class or module
        if self.defined_otherwise(fn, path):
            return (None, None)
        return (guess, None)

    def defined_otherwise(self, fn, path: str) -> bool:
        """``path`` is bound to something known not to be a PyTorch training object: a
        lambda, a nested function, or what a call of another library returns."""
        key = (id(fn), path)
        got = self._otherwise.get(key)
        if got is None:
            got = self._otherwise[key] = self._defined_otherwise(fn, path)
        return got

    def _defined_otherwise(self, fn, path: str) -> bool:
        f = fn
        while f is not None:
            if any(n.name == path for n in getattr(f, "nested", ())):
                return True
            f = f.parent
        try:
            d = self.definition(fn, path)
        except RecursionError:
            return False
        if d is None:
            return False
        value = d_value = d[1]
        if isinstance(value, cst.Lambda):
            return True
        while isinstance(value, cst.Call):
            func = value.func
            d = dotted(func)
            if d and value is d_value:
                # an instance of a plain class of the tree (no ``nn.Module`` among its bases,
                # here or through the project): a NumPy network with its own ``forward``
                cls = self.mm.find_class(d)
                if cls is not None:
                    return self.mm._plain_class(cls)
                ext = self.mm.external_class(d, "mode")
                if ext is not None:
                    return ext.get("is_module") is False and bool(ext.get("plain"))
            dq = self.mm.qualify(d) if d else None
            if dq:
                return catalog.non_torch_object(dq)
            if isinstance(func, cst.Attribute):  # cv2.dnn.readNet(...).to(...) / a method chain
                value = func.value
                continue
            return False
        return False

    def _param_role(self, fn, name: str) -> Role:
        ann = fn.annotations.get(name)
        if ann is not None:
            d = dotted(ann)
            q = self.mm.qualify(d) if d else None
            if q == "torch.nn.Module" and self.mm.is_torch_code:
                # every loss is an ``nn.Module`` too: what the call sites pass decides
                # (``eval_model(model, loader, loss_fn: nn.Module)`` given ``nn.CrossEntropyLoss()``)
                from .callsites import param_role

                site = param_role(self.mm, fn, name)
                if site is not None and site[0] == catalog.LOSS:
                    return site
                if site is None and catalog.role_from_name(name) == catalog.LOSS:
                    return (catalog.LOSS, catalog.OTHER_LOSS)  # ``criterion: nn.Module``, no call site says
            if q in catalog.ANNOTATION_ROLES:
                return (catalog.ANNOTATION_ROLES[q], None)
            if d:
                cls = self.mm.find_class(d)
                if cls is not None and self.mm.class_is_module(cls):
                    return (catalog.MODEL, cls.qualname)
                if cls is None:
                    ext = self.mm.external_class(d)
                    if ext and ext.get("is_module"):
                        return (catalog.MODEL, self.mm.external_class_name(d))
        if not self.mm.is_torch_code:
            return (None, None)
        from .callsites import param_role

        site = param_role(self.mm, fn, name)  # what every call site passes, by evidence
        if site is not None:
            return site
        guess = catalog.role_from_name(name)
        if guess is not None and self._sites_pass_otherwise(fn, name):
            return (None, None)  # ``train(model, ...)`` given an instance of a NumPy network class
        if guess == catalog.MODEL and isinstance(fn.defaults.get(name), (
                cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.Integer, cst.Float)):
            return (None, None)  # ``model="net-lin"``: the name of a variant, not a module
        return (guess, None) if guess else (None, None)

    def _sites_pass_otherwise(self, fn, name: str, depth: int = 0) -> bool:
        """Every call site of ``fn`` (in this module; none in another) passes, for parameter
        ``name``, an instance of a plain class of the tree, maybe through a parameter of the
        caller whose own call sites do."""
        from .callsites import _bound, _local_sites

        params = [p for p in fn.params if not p.startswith("*")]
        if name not in params or fn.is_module_level:
            return False
        sites = _local_sites(self.mm).get(id(fn), ())
        if not sites:
            return False
        if fn.parent is None and self.mm.module_name \
                and self.mm.project.is_called(f"{self.mm.module_name}.{fn.qualname}"):
            return False
        idx = params.index(name) - (1 if _bound(fn) else 0)
        for caller, args in sites:
            if any(a.star for a in args):
                return False
            arg = next((a for a in args if a.keyword is not None and a.keyword.value == name), None)
            if arg is None:
                positional = [a for a in args if a.keyword is None]
                arg = positional[idx] if 0 <= idx < len(positional) else None
            d = dotted(arg.value) if arg is not None else None
            if not d or caller is fn:
                return False
            if d in caller.params:
                if depth >= 3 or not self._sites_pass_otherwise(caller, d, depth + 1):
                    return False
            elif not self._plain_instance(caller, d):
                return False
        return True

    def _plain_instance(self, fn, path: str) -> bool:
        """``path`` is bound to an instance of a plain class of the tree (no ``nn.Module`` in
        its bases: a NumPy network with its own ``forward``)."""
        try:
            d = self.definition(fn, path)
        except RecursionError:
            return False
        value = d[1] if d is not None else None
        if not isinstance(value, cst.Call) or not dotted(value.func):
            return False
        name = dotted(value.func)
        cls = self.mm.find_class(name)
        if cls is not None:
            return self.mm._plain_class(cls)
        ext = self.mm.external_class(name, "mode")
        return ext is not None and ext.get("is_module") is False and bool(ext.get("plain"))

    def local_roles(self, fn) -> dict:
        roles = fn.roles
        if roles.get("__done__"):
            return roles
        roles["__done__"] = (None, None)
        for op in all_ops(fn):
            if isinstance(op, AssignOp) and op.value is not None and op.aug is None:
                self._assign_roles(fn, op, roles)
            elif isinstance(op, DefOp):
                pass
        return roles

    def _assign_roles(self, fn, op: AssignOp, roles: dict) -> None:
        value = op.value
        for t in op.targets:
            if isinstance(t, (cst.Tuple, cst.List)):
                elts = [e.value for e in t.elements]
                if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elts):
                    for te, ve in zip(elts, value.elements):
                        self._bind(fn, te, self.of_expr(fn, ve.value), roles)
                elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                        and value.func.attr.value in _PREPARE:
                    args = [a.value for a in value.args if a.keyword is None]
                    for i, te in enumerate(elts):
                        if i < len(args):
                            self._bind(fn, te, self.of_expr(fn, args[i]), roles)
                continue
            self._bind(fn, t, self.of_expr(fn, value), roles)

    def _bind(self, fn, target, role: Role, roles: dict) -> None:
        d = dotted(target)
        if not d or role[0] is None:
            return
        if d not in roles:
            roles[d] = role

    def class_roles(self, cls) -> dict:
        r = self._class_roles.get(cls.qualname)
        if r is not None:
            return r
        r = {}
        self._class_roles[cls.qualname] = r
        for path, ops in cls.attr_values.items():
            for op in ops:
                fn = self._fn_of_class_op(cls, op)
                value = _value_bound_to(op, path) if op.value is not None else None
                role = self.of_expr(fn, value) if value is not None else (None, None)
                if role[0] is not None:
                    r[path] = role
                    break
        # inherited attributes from base classes in the module
        for b in cls.raw_bases:
            base = self.mm.find_class(b)
            if base is not None and base is not cls:
                for k, v in self.class_roles(base).items():
                    r.setdefault(k, v)
        return r

    def attr_role_at(self, fn, op: CallOp, role: Role) -> Role:
        """The role of the ``self`` attribute ``op`` calls, at that call.  A class that assigns
        the attribute several values of different roles or loss kinds, each under a test of
        attributes only ``__init__`` sets (``if self.task_type == "segment": self.loss_func =
        ...``), gives a call the value assigned under the same tests (the call sits in ``if
        self.task_type == "segment":`` too): a test of such attributes takes the same arm in
        ``__init__`` and later.  Values that still differ make a loss of unknown kind."""
        cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
        path = op.func
        assigns = cls.attr_values.get(path, ()) if cls is not None else ()
        if len(assigns) < 2:
            return role
        cands = []
        for a in assigns:
            m = self._fn_of_class_op(cls, a)
            v = _value_bound_to(a, path) if a.value is not None else None
            cands.append((a, m, self.of_expr(m, v) if v is not None else (None, None)))
        if len({r for _, _, r in cands}) == 1:
            return role
        agree = [r for a, m, r in cands if self._same_arms(cls, m, a, fn, op)]
        roles = {r for r in agree if r[0] is not None}
        if len(roles) == 1:
            return roles.pop()
        if not roles:
            return (None, None) if len(agree) < len(cands) else role
        if all(r[0] == catalog.LOSS for r in roles):
            return (catalog.LOSS, catalog.OTHER_LOSS)
        return role

    def _same_arms(self, cls, fa, a, fb, b) -> bool:
        """No test that encloses ``a`` (in ``fa``) and reads only attributes that ``__init__``
        alone assigns is taken the other way around ``b`` (in ``fb``): the same test in the other
        arm, or ``attr == "x"`` against ``attr == "y"``."""
        theirs = [(self._init_test(cls, g.test), arm) for g, arm in b.guards if g.test is not None]
        for g, arm in a.guards:
            if g.test is None:
                continue
            t = self._init_test(cls, g.test)
            if t is None:
                continue
            for u, arm_b in theirs:
                if u is None:
                    continue
                if u[0] == t[0] and arm != arm_b:
                    return False
                if arm == arm_b == 0 and t[1] is not None and u[1] is not None and t[1][0] == u[1][0] \
                        and t[1][1] != u[1][1]:
                    return False
        return True

    def _init_test(self, cls, test) -> Optional[tuple]:
        """``(code, (attr, literal) or None)`` of a test that reads only ``self`` attributes set
        in ``__init__`` and nowhere else of the class, and literals; ``None`` otherwise."""
        paths = []
        stack = [test]
        while stack:
            e = stack.pop()
            if isinstance(e, (cst.Name, cst.Attribute)):
                d = dotted(e)
                if d in ("True", "False", "None"):
                    continue
                if not d or not d.startswith("self.") or d.count(".") != 1:
                    return None
                paths.append(d)
            elif isinstance(e, (cst.SimpleString, cst.Integer, cst.Float)):
                continue
            elif isinstance(e, cst.Comparison):
                stack.append(e.left)
                stack.extend(c.comparator for c in e.comparisons)
            elif isinstance(e, cst.BooleanOperation):
                stack.extend((e.left, e.right))
            elif isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Not):
                stack.append(e.expression)
            elif isinstance(e, (cst.Tuple, cst.List, cst.Set)):
                stack.extend(el.value for el in e.elements)
            else:
                return None
        init = cls.methods.get("__init__")
        if not paths or init is None:
            return None
        for d in paths:
            ops = cls.attr_values.get(d, ())
            if not ops or any(self._fn_of_class_op(cls, o) is not init for o in ops):
                return None
        lit = None
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 \
                and isinstance(test.comparisons[0].operator, cst.Equal):
            left, right = test.left, test.comparisons[0].comparator
            if isinstance(right, cst.SimpleString) and dotted(left):
                lit = (dotted(left), right.evaluated_value)
        return self.mm.code_for(test).strip(), lit

    def _fn_of_class_op(self, cls, op):
        for m in cls.methods.values():
            for o in walk(m.body):
                if o is op:
                    return m
        return next(iter(cls.methods.values()), None)

    def module_roles(self) -> dict:
        if self._module_roles is None:
            self._module_roles = {}
            self._module_roles = self.local_roles(self.mm.module_function)
        return self._module_roles

    # ----------------------------------------------------------- definitions
    def definition(self, fn, path: str) -> Optional[tuple]:
        """``(function, value)``: the first plain assignment that binds ``path``, as seen from ``fn``.

        Follows enclosing functions, ``self`` attributes of the class and module globals; a
        parameter has no definition here (``None``).  Tuple unpacking of ``accelerator.prepare``
        and of tuple literals gives the matching element.
        """
        key = (id(fn), path)
        if key in self._definitions:  # asked for every call of a name (aliases of functions)
            return self._definitions[key]
        d = self._definitions[key] = self._definition(fn, path)
        return d

    def _bound(self, fn, ops) -> dict:
        """path -> the value of the first plain assignment of ``ops`` (of ``fn``) binding it."""
        key = ("bound", id(fn), ops is fn.body)
        out = self._definitions.get(key)
        if out is None:
            out = self._definitions[key] = {}
            for op in ops:
                if isinstance(op, AssignOp) and op.aug is None and op.value is not None:
                    for t in op.targets:
                        paths = [dotted(e.value) for e in t.elements] if isinstance(t, (cst.Tuple, cst.List)) \
                            else [dotted(t)]
                        for p in paths:
                            if p and p not in out:
                                v = _value_bound_to(op, p)
                                if v is not None:
                                    out[p] = v
        return out

    def _definition(self, fn, path: str) -> Optional[tuple]:
        f = fn
        while f is not None:
            v = self._bound(f, all_ops(f)).get(path)
            if v is not None:
                return f, v
            if path in f.params or path.split(".", 1)[0] in f.params and not path.startswith("self."):
                return None
            f = f.parent
        if path.startswith("self.") and fn is not None:
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            seen = 0
            while cls is not None and seen < 8:
                for op in cls.attr_values.get(path, ()):
                    if op.value is not None:
                        v = _value_bound_to(op, path)
                        if v is not None:
                            return self._fn_of_class_op(cls, op), v
                cls = next((self.mm.find_class(b) for b in cls.raw_bases if self.mm.find_class(b)), None)
                seen += 1
            return None
        mf = self.mm.module_function
        if fn is not mf:
            v = self._bound(mf, mf.body).get(path)
            if v is not None:
                return mf, v
        return None

    def optimizer_owners(self, fn, path: Optional[str]) -> Optional[frozenset]:
        """The models whose parameters the optimizer at ``path`` updates, or ``None`` if unknown.

        ``Adam(netG.parameters())`` -> ``{"netG"}``; ``SGD([{"params": m.fc.parameters()},
        {"params": m.body.parameters()}])`` -> ``{"m.fc", "m.body"}``; ``create_optimizer_v2(model)``
        -> ``{"model"}``.  Paths are in the namespace of the function that built the optimizer.
        """
        if not path:
            return None
        own = self._own_optimizer_owner(fn, path)
        if own is not None:
            return own
        d = self.definition(fn, path)
        if d is None:
            return None
        f, value = d
        for _ in range(4):
            if not isinstance(value, cst.Call):
                return None
            q = self.mm.qualify(dotted(value.func)) or ""
            role = catalog.role_of_constructor(q)[0] if q else None
            if role == catalog.OPTIMIZER:
                a = _first_arg(value, "params") or _first_arg(value, "model")
                return self._param_owners(f, a.value, 0) if a is not None else None
            # wrappers: accelerator.prepare(opt), Lookahead(opt), ZeroRedundancyOptimizer(...)
            a = _first_arg(value, None)
            if a is None or not isinstance(a.value, (cst.Name, cst.Attribute)):
                return None
            inner = dotted(a.value)
            if self.of_path(f, inner)[0] != catalog.OPTIMIZER:
                return None
            d = self.definition(f, inner)
            if d is None:
                return None
            f, value = d
        return None

    def _own_optimizer_owner(self, fn, path: str) -> Optional[frozenset]:
        """``netD.optimizer`` where ``netD`` is a model of a class of this module that builds
        its own optimizer on its own parameters (``self.optimizer = optim.Adam(self.parameters())``
        in ``__init__``): that optimizer updates ``netD``."""
        owner, _, attr = path.rpartition(".")
        if not owner or "." in attr:
            return None
        role, info = self.of_path(fn, owner)
        cls = self.mm.classes.get(info) if role == catalog.MODEL and isinstance(info, str) else None
        if cls is None:
            return None
        for op in cls.attr_values.get("self." + attr, ()):
            value = getattr(op, "value", None)
            if not isinstance(value, cst.Call):
                continue
            q = self.mm.qualify(dotted(value.func)) or ""
            a = _first_arg(value, "params")
            if q and catalog.role_of_constructor(q)[0] == catalog.OPTIMIZER and a is not None \
                    and isinstance(a.value, cst.Call) and dotted(a.value.func) == "self.parameters":
                return frozenset({_strip_module(owner)})
        return None

    def _param_owners(self, fn, e, depth: int) -> Optional[frozenset]:
        if isinstance(e, cst.Call):
            func = e.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters"):
                d = dotted(func.value)
                return frozenset({_strip_module(d)}) if d else None
            name = dotted(func) or ""
            last = name.rsplit(".", 1)[-1]
            args = [a.value for a in e.args if a.keyword is None]
            if last == "filter" and len(args) == 2:
                return self._param_owners(fn, args[1], depth)
            if last in ("list", "tuple", "set", "chain") and args:
                return _union(self._param_owners(fn, a, depth) for a in args)
            return None
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Add):
            return _union([self._param_owners(fn, e.left, depth), self._param_owners(fn, e.right, depth)])
        if isinstance(e, (cst.List, cst.Tuple)):
            if not e.elements:
                return None
            return _union(self._param_owners(fn, el.value, depth) for el in e.elements)
        if isinstance(e, cst.Dict):
            for el in e.elements:
                if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) \
                        and el.key.evaluated_value == "params":
                    return self._param_owners(fn, el.value, depth)
            return None
        if isinstance(e, (cst.ListComp, cst.GeneratorExp)) and e.for_in.inner_for_in is None:
            return self._param_owners(fn, e.for_in.iter, depth)
        if isinstance(e, (cst.Name, cst.Attribute)):
            d = dotted(e)
            if not d:
                return None
            if self.of_path(fn, d)[0] == catalog.MODEL:
                return frozenset({_strip_module(d)})
            if depth < 3:
                df = self.definition(fn, d)
                if df is not None:
                    return self._param_owners(df[0], df[1], depth + 1)
        return None

    def optimizers_in_scope(self, fn) -> dict:
        """path -> function that defines it, for every optimizer ``fn`` can see."""
        out = {}
        f = fn
        while f is not None:
            for path, (role, _) in self.local_roles(f).items():
                if role == catalog.OPTIMIZER:
                    out.setdefault(path, f)
            for p in f.params:
                if self.of_path(f, p)[0] == catalog.OPTIMIZER:
                    out.setdefault(p, f)
            f = f.parent
        cls = fn.cls if fn is not None else None
        if cls is not None:
            for path, (role, _) in self.class_roles(cls).items():
                if role == catalog.OPTIMIZER:
                    out.setdefault(path, fn)
        for path, (role, _) in self.module_roles().items():
            if role == catalog.OPTIMIZER:
                out.setdefault(path, self.mm.module_function)
        return out

    def mode_sensitive(self, fn, path: Optional[str], at=None) -> bool:
        """Whether the model at ``path`` may behave differently in train and eval mode (``at``:
        the node where it runs, for a class defined twice: the construction above it counts)."""
        if not path:
            return True
        ms = getattr(self, "_ms", None)
        if ms is None:
            ms = self._ms = ModeSensitivity(self)
        try:
            return ms.of_path(fn, _strip_module(path), at)
        except RecursionError:
            return True

    def mode_layers(self, fn, path: Optional[str], at=None) -> Optional[bool]:
        """Whether the model at ``path`` is known, by evidence, to behave differently in train
        and eval mode: it may (``mode_sensitive``) and a layer that depends on the mode is
        seen in what builds it (an ``nn.Dropout``/``nn.BatchNorm*`` ..., ``F.dropout``, a read
        of ``self.training``, in its class or a class or factory of the tree it uses, or a
        torchvision network).  A library model of unknown make, a model handed in with no call
        site saying what it is, a wrapper of unknown kind: ``None`` (unknown); a model whose
        make is known and shows no such layer (or none that acts): ``False``."""
        if not path:
            return None
        if not self.mode_sensitive(fn, path, at):
            return False
        ms = getattr(self, "_ms", None)
        if ms is None:
            ms = self._ms = ModeSensitivity(self)
        try:
            return ms.path_layers(fn, _strip_module(path), 0, at)
        except RecursionError:
            return None

    def returns_mode_layers(self, fn) -> bool:
        """``fn`` returns a model (alone or in a tuple) in which a mode-dependent layer is seen
        (summary ``returns_mode_layers``: ``get_model(args, train=False)`` of another module)."""
        ms = getattr(self, "_ms", None)
        if ms is None:
            ms = self._ms = ModeSensitivity(self)
        for op in walk(fn.body):
            if not isinstance(op, ReturnOp) or op.value is None:
                continue
            items = [el.value for el in op.value.elements] if isinstance(op.value, cst.Tuple) else [op.value]
            for v in items:
                if isinstance(v, (cst.Name, cst.Attribute, cst.Call)) and self.of_expr(fn, v)[0] == catalog.MODEL:
                    try:
                        if ms.expr_layers(fn, v, 1):
                            return True
                    except RecursionError:
                        return False
        return False

    def class_mode_layers(self, cls) -> Optional[bool]:
        ms = getattr(self, "_ms", None)
        if ms is None:
            ms = self._ms = ModeSensitivity(self)
        try:
            return ms.class_layers(cls, 0)
        except RecursionError:
            return None

    def class_mode_sensitive(self, cls) -> bool:
        ms = getattr(self, "_ms", None)
        if ms is None:
            ms = self._ms = ModeSensitivity(self)
        return ms.of_class(cls)

    def class_mode_free_if(self, cls) -> Optional[dict]:
        ms = getattr(self, "_ms", None)
        if ms is None:
            ms = self._ms = ModeSensitivity(self)
        return ms.free_if(cls)

    def frozen(self, fn, path: Optional[str]) -> Optional[str]:
        """Why the model at ``path`` is not trained here, or ``None`` if it may be.

        A model is frozen when ``requires_grad_(False)`` (or ``p.requires_grad = False`` over its
        parameters) is applied to it, or a parent of it, and never undone; or when every
        optimizer in scope has known parameters and none of them belongs to it.
        """
        path = _strip_module(path or "")
        if not path:
            return None
        why = self.grad_switched_off(fn, path)
        if why:
            return why
        if self.of_path(fn, path)[0] != catalog.MODEL:
            return None
        opts = self.optimizers_in_scope(fn)
        if not opts:
            return None
        owners = set()
        for opath, f in opts.items():
            o = self.optimizer_owners(fn, opath)
            if o is None:
                return None
            owners |= o
        if owners and not any(_under(path, o) or _under(o, path) for o in owners):
            return f"no optimizer updates `{path}` (they update {', '.join(sorted('`%s`' % o for o in owners))})"
        return None

    def grad_switched_off(self, fn, path: Optional[str], depth: int = 0) -> Optional[str]:
        """Why no parameter of the model at ``path`` requires grad (``requires_grad_(False)`` or
        ``p.requires_grad = False`` over its parameters, on it or a parent of it, here or by a
        freezing helper of this module, and never undone in its scope), else ``None``.  Such a
        model's forward records no graph (for inputs that do not require grad)."""
        path = _strip_module(path or "")
        if not path:
            return None
        marks = self._freeze_marks()
        key = self._scope_key(fn, path)
        on = [p for k, p, v in marks if v and k == key[0] and _under(path, p)]
        off = [p for k, p, v in marks if not v and k == key[0] and (_under(path, p) or _under(p, path))]
        if on and not off:
            return f"`{on[0]}` has `requires_grad` switched off"
        if off or fn is None or depth > 3:
            return None
        # a parameter of ``fn``: frozen when every call of ``fn`` in this module passes a
        # model frozen there (``freeze(encoder); extract_features(encoder, loader)``)
        root, _, rest = path.partition(".")
        if root not in fn.params or root in ("self", "cls"):
            return None
        callers = list(self.mm.callers(fn))
        if not callers:
            return None
        why = None
        summ = {"params": [p for p in fn.params if not p.startswith("*")]}
        for cf, op in callers:
            arg = self.mm.argmap(cf, op, summ).get(root)
            why = self.grad_switched_off(cf, f"{arg}.{rest}" if arg and rest else arg, depth + 1) if arg else None
            if not why:
                return None
        return why

    @staticmethod
    def _scope_key(fn, path: str) -> tuple:
        if path.startswith("self.") and fn is not None and fn.cls is not None:
            return (("cls", fn.cls.qualname),)
        f = fn
        while f is not None and f.parent is not None:
            f = f.parent
        return ((("fn", id(f)),))

    def _freeze_marks(self) -> list:
        """``[(scope key, path, frozen?)]`` for every ``requires_grad`` switch in the module."""
        if getattr(self, "_marks", None) is not None:
            return self._marks
        marks = []
        for fn in self.mm.all_functions:
            for op in all_ops(fn):
                if isinstance(op, CallOp) and op.attr == "requires_grad_" and op.recv:
                    v = _bool_arg(op, True)
                    if v is not None and not op.recv.endswith(".grad"):
                        marks.append((self._scope_key(fn, op.recv)[0], _strip_module(op.recv), not v))
                elif isinstance(op, CallOp) and op.attr == "requires_grad_" and op.recv is None:
                    pass
            for loop in (o for o in all_ops(fn) if isinstance(o, LoopOp)):
                it = loop.iter
                if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute)
                        and it.func.attr.value in ("parameters", "named_parameters")):
                    continue
                owner = dotted(it.func.value)
                var = loop.target
                if isinstance(var, cst.Tuple) and var.elements:
                    var = var.elements[-1].value
                vname = dotted(var) if isinstance(var, cst.Name) else None
                if not owner or not vname:
                    continue
                for o in walk(loop.body):
                    val = None
                    if isinstance(o, AssignOp) and o.aug is None and len(o.targets) == 1 \
                            and dotted(o.targets[0]) == f"{vname}.requires_grad":
                        val = o.value
                        v = val.value if isinstance(val, cst.Name) and val.value in ("True", "False") else None
                        if v is not None and not o.guards[len(loop.guards):]:
                            marks.append((self._scope_key(fn, owner)[0], _strip_module(owner), v == "False"))
                        elif v is not None:
                            marks.append((self._scope_key(fn, owner)[0], _strip_module(owner), False))
                    elif isinstance(o, CallOp) and o.attr == "requires_grad_" and o.recv == vname:
                        b = _bool_arg(o, True)
                        if b is not None:
                            marks.append((self._scope_key(fn, owner)[0], _strip_module(owner), not b))
        # ``freeze_params(unet.parameters())`` / ``freeze(encoder)``: a helper of this module that
        # switches off ``requires_grad`` for every element of a parameter it iterates (given
        # ``m.parameters()``), or for every parameter of a module it is given
        # (``for p in module.parameters(): p.requires_grad = False``, ``module.requires_grad_(False)``)
        freezers = {}
        for fn in self.mm.all_functions:
            plain = [p for p in fn.params if p not in ("self", "cls")]
            if not plain or any(_unfreezes(o) for o in all_ops(fn)):
                continue  # freezes all but a head (``for p in m.fc.parameters(): p.requires_grad = True``)
            for loop in (o for o in all_ops(fn) if isinstance(o, LoopOp)):
                if loop.parent is not None or not isinstance(loop.target, cst.Name) or loop.guards:
                    continue
                if isinstance(loop.iter, cst.Name) and loop.iter.value in plain:
                    arg, kind = loop.iter.value, "params"
                elif isinstance(loop.iter, cst.Call) and isinstance(loop.iter.func, cst.Attribute) \
                        and loop.iter.func.attr.value == "parameters" and not loop.iter.args \
                        and isinstance(loop.iter.func.value, cst.Name) and loop.iter.func.value.value in plain:
                    arg, kind = loop.iter.func.value.value, "module"
                else:
                    continue
                var = loop.target.value
                if any(not o.guards[len(loop.guards):] and (
                        isinstance(o, AssignOp) and o.aug is None and len(o.targets) == 1
                        and dotted(o.targets[0]) == f"{var}.requires_grad"
                        and isinstance(o.value, cst.Name) and o.value.value == "False"
                        or isinstance(o, CallOp) and o.attr == "requires_grad_" and o.recv == var
                        and _bool_arg(o, True) is False) for o in walk(loop.body)):
                    freezers[fn.name] = (plain.index(arg), kind)
            for op in fn.body:
                if isinstance(op, CallOp) and op.attr == "requires_grad_" and op.recv in plain \
                        and _bool_arg(op, True) is False and not op.guards:
                    freezers[fn.name] = (plain.index(op.recv), "module")
        if freezers:
            for fn in self.mm.all_functions:
                for op in all_ops(fn):
                    if not (isinstance(op, CallOp) and op.func in freezers):
                        continue
                    pos = [a for a in op.args if a.keyword is None and not a.star]
                    i, kind = freezers[op.func]
                    a = pos[i].value if i < len(pos) else None
                    owner = None
                    if kind == "params" and isinstance(a, cst.Call) and isinstance(a.func, cst.Attribute) \
                            and a.func.attr.value in ("parameters", "named_parameters"):
                        owner = dotted(a.func.value)
                    elif kind == "module" and isinstance(a, (cst.Name, cst.Attribute)):
                        owner = dotted(a)
                    if owner:
                        marks.append((self._scope_key(fn, owner)[0], _strip_module(owner), True))
        self._marks = marks
        return marks


# layers whose behaviour depends on train/eval mode
_MODE_LAYER = re.compile(r"Dropout|BatchNorm|InstanceNorm|Transformer|MultiheadAttention|RReLU|^LazyBatch")
_RNN_LAYERS = {"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN"}
_NEUTRAL_PREFIXES = ("collections.", "typing.", "math.", "itertools.", "functools.", "dataclasses.",
                     "pathlib.", "enum.", "numbers.", "warnings.", "numpy.", "logging.", "os.", "re.")
# torchvision families that all have batch norm, dropout or stochastic depth
_TORCHVISION_NETS = re.compile(r"^torchvision\.models\.(.+\.)?(resnet|resnext|wide_resnet|vgg|densenet|mobilenet|"
                               r"efficientnet|inception|googlenet|alexnet|squeezenet|shufflenet|mnasnet|regnet|"
                               r"convnext|fcn_|deeplab|lraspp|fasterrcnn|maskrcnn|keypointrcnn|retinanet|ssd|fcos)")
# layers whose train-mode output differs from the eval-mode output in a way that matters for an
# evaluation (instance norm is left out: in train mode it normalises each sample by its own
# statistics, as in training)
_NEUTRAL_TOPS = frozenset(("collections", "typing", "math", "itertools", "functools", "dataclasses", "pathlib",
                           "enum", "numbers", "warnings", "numpy", "logging", "os", "re", "copy", "random"))
_EVIDENT_LAYER = re.compile(r"Dropout|BatchNorm|TransformerEncoderLayer|TransformerDecoderLayer|^Transformer$|RReLU")


def _list_additions(fn, name: str) -> list:
    """The values that ``fn`` adds to its local list ``name``: ``name.append(x)``,
    ``name.insert(i, x)``, ``name.extend([...])``, ``name += [...]``."""
    out = []
    for op in all_ops(fn):
        if isinstance(op, CallOp) and op.recv == name and op.attr in ("append", "extend", "insert"):
            a = op.arg(1 if op.attr == "insert" else 0)
            if a is not None:
                out.append(a.value)
        elif isinstance(op, AssignOp) and op.aug == "+=" and op.value is not None \
                and any(isinstance(t, cst.Name) and t.value == name for t in op.targets):
            out.append(op.value)
    return out


def _any3(values) -> Optional[bool]:
    """``any`` over tri-state answers: True if one is True, else None if one is unknown."""
    out: Optional[bool] = False
    for v in values:
        if v:
            return True
        if v is None:
            out = None
    return out


_TRAINING_ATTR = re.compile(r"\.training\b|\btraining\s*=\s*self\b")


class ModeSensitivity:
    """Does a model behave differently in train and eval mode (dropout, batch norm, ...)?

    ``False`` only when every layer is known and none depends on the mode (a stack of
    Linear/Conv/LSTM-without-dropout layers): then a missing ``eval()``/``train()`` changes
    nothing.  Anything unknown (a model passed in, a library factory) counts as sensitive.

    A class's answer is what it *needs* (:meth:`needs`) to be free of the mode: ``None`` when
    nothing can make it so, else the constructor arguments that must be 0 (``"drop_rate"``, or
    ``"cfg[drop_rate]"`` for a key of a config dict handed in): a dropout rate that reaches
    ``nn.Dropout`` through parameters, nested constructors and config dicts, in this module or
    (through the class facts ``mode_free_if``) in another one.  A construction is then free of
    the mode when its arguments provably meet those conditions (literals, or a config dict whose
    every assignment and ``update()`` in its scope sets the key to 0).
    """

    def __init__(self, resolver: "RoleResolver"):
        self.r = resolver
        self.mm = resolver.mm
        self._needs: dict = {}

    def of_path(self, fn, path: str, at=None) -> bool:
        role, info = self.r.of_path(fn, path)
        d = self.r.definition(fn, path)
        if role == catalog.MODEL and isinstance(info, str):
            cls = self.mm.classes.get(info)
            if cls is not None:
                if at is not None and self.mm.redefined.get(cls.qualname):
                    d = self._last_binding_before(fn, path, at) or d
                call = d[1] if d is not None else None
                while isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) \
                        and call.func.attr.value in _PASSTHROUGH_METHODS:
                    call = call.func.value
                built = isinstance(call, cst.Call) and self.mm.find_class(dotted(call.func) or "") is cls
                cls = self._in_effect(cls, call if built else None)
                need = self.needs(cls)
                if need == _NOTHING:
                    return False
                if need is not None and built:
                    return self._bind(need, self._signature(cls), call,
                                      lambda e, k: self._site_cond(d[0], e, k)) is None  # built with dropout 0.0
                return True
        if d is None:
            return self._returned_by_helper(fn, path, at)
        return self.of_expr(d[0], d[1], 0)

    # ------------------------------------------------ evidence of mode-dependent layers
    # Tri-state answers: True (a mode-dependent layer is seen), False (the model's make is
    # known and none is seen), None (its make is unknown: a library model, a model handed in).
    def path_layers(self, fn, path: str, depth: int, at=None) -> Optional[bool]:
        """Whether a mode-dependent layer is seen in what the model at ``path`` is built from
        (``at``: the node where it is used, in top-level code that may rebind it per cell)."""
        if depth > 6:
            return None
        role, info = self.r.of_path(fn, path)
        if role == catalog.MODEL and isinstance(info, str):
            cls = self.mm.classes.get(info)
            if cls is not None:
                if self.mm.redefined.get(cls.qualname):
                    # a class defined twice (a notebook redefines ``get_model`` and the class in
                    # it): the definition above the construction (in top-level code, the one that
                    # binds ``path`` last above ``at``)
                    d = (self._last_binding_before(fn, path, at) if at is not None else None) \
                        or self.r.definition(fn, path)
                    call = d[1] if d is not None else None
                    while isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) \
                            and call.func.attr.value in _PASSTHROUGH_METHODS:
                        call = call.func.value
                    if isinstance(call, cst.Call) and (dotted(call.func) or "").rpartition(".")[2] == cls.name:
                        cls = self._in_effect(cls, call)
                return self.class_layers(cls, depth + 1)
            if "." in info:
                facts = self.mm.project.class_facts(self.mm.project.resolve(info), "mode")
                if facts is not None and facts.get("is_module"):
                    return bool(facts.get("mode_layers"))
        # top-level code that rebinds ``path`` (a notebook builds one ``model`` per cell): the
        # binding above ``at``
        d = (self._last_binding_before(fn, path, at) if at is not None and fn.is_module_level else None) \
            or self.r.definition(fn, path)
        if d is None:
            got = self._returned_layers(fn, path, depth, at)
            if got is None and path in fn.params and self._sites_pass_mode_free(fn, path, depth):
                return False
            return got
        got = self.expr_layers(d[0], d[1], depth + 1)
        if not got and "." not in path and isinstance(d[1], (cst.List, cst.Tuple)):
            # ``layers = []`` then ``layers.append(nn.Dropout(p))`` in a loop, and
            # ``nn.Sequential(*layers)``: the layers the list receives count too
            added = _list_additions(d[0], path)
            if added:
                got = _any3([got] + [self.expr_layers(d[0], e, depth + 1) for e in added])
        return got

    def _sites_pass_mode_free(self, fn, name: str, depth: int) -> bool:
        """Every call site of ``fn`` (all in this module) passes for its parameter ``name`` a
        model whose make is known and whose mode changes no number it computes (no dropout or
        batch norm; a torchvision detection model, whose mode picks losses or detections).
        Only this negative answer is taken from call sites: a model handed in otherwise stays
        of unknown make."""
        from .callsites import _bound, _local_sites

        if not fn.is_module_level and fn.parent is None and self.mm.module_name \
                and self.mm.project.is_called(f"{self.mm.module_name}.{fn.qualname}"):
            return False  # called from other modules too
        params = [p for p in fn.params if not p.startswith("*")]
        idx = params.index(name) - (1 if _bound(fn) else 0)
        sites = _local_sites(self.mm).get(id(fn), ())
        if not sites:
            return False
        for caller, args in sites:
            if any(a.star for a in args):
                return False
            kw = next((a for a in args if a.keyword is not None and a.keyword.value == name), None)
            positional = [a for a in args if a.keyword is None]
            arg = kw if kw is not None else positional[idx] if 0 <= idx < len(positional) else None
            if arg is None or self.expr_layers(caller, arg.value, depth) is not False:
                return False
        return True

    def _returned_layers(self, fn, path: str, depth: int, at=None) -> Optional[bool]:
        """``model, result = train_model(...)``: the model a helper of this module returns at
        that position (see ``_returned_by_helper``); in top-level code, the assignment and the
        helper live at ``at`` (a notebook that redefines ``get_model`` in a later cell)."""
        found = _tuple_item_returned(self.mm, fn, path, at)
        if not found:
            return None
        helper, items = found
        return _any3(self.expr_layers(helper, e, depth + 1) for e in items)

    def expr_layers(self, fn, e, depth: int) -> Optional[bool]:
        if depth > 6 or e is None:
            return None
        if isinstance(e, cst.Call):
            func = e.func
            if isinstance(func, cst.Attribute) and func.attr.value in _PASSTHROUGH_METHODS:
                return self.expr_layers(fn, func.value, depth + 1)
            d = dotted(func)
            q = (self.mm.qualify(d) if d else None) or ""
            if q.startswith("torch.nn.") and not q.startswith("torch.nn.functional."):
                last = q.rsplit(".", 1)[-1]
                if _EVIDENT_LAYER.search(last):
                    return True
                if last in ("Sequential", "ModuleList", "ModuleDict"):
                    return _any3(self.expr_layers(fn, a.value, depth + 1) for a in e.args)
                return False
            if catalog.TORCHVISION_DETECTION.match(q):
                return False  # the mode picks losses or detections: a wrong one fails loudly
            if _TORCHVISION_NETS.match(q):
                return True  # batch norm or dropout in every one of these families
            if q in _WRAPPERS and e.args:
                return self.expr_layers(fn, e.args[0].value, depth + 1)
            if isinstance(func, cst.Attribute) and func.attr.value == "load_from_checkpoint":
                local = self.mm.find_class(dotted(func.value) or "")
                return self.class_layers(local, depth + 1) if local is not None else None
            if isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained" \
                    and q.startswith("transformers.") and not q.rsplit(".", 2)[-2].startswith(("Flax", "TF")):
                return True  # a transformers model: dropout in its config (hidden/attention dropout)
            if d:
                local = self.mm.find_class(d)
                if local is not None:
                    return self.class_layers(local, depth + 1)
                target = self.mm.functions.get(d)
                if target is not None:
                    return _any3(self.expr_layers(target, op.value, depth + 1) for op in walk(target.body)
                                 if isinstance(op, ReturnOp) and op.value is not None)
                facts = self.mm.external_class(d, "mode")
                if facts is not None and facts.get("is_module"):
                    return bool(facts.get("mode_layers"))
                if q:  # a model factory of another module of the tree
                    summ = self.mm.summary_of(self.mm._external(q))
                    if summ and summ.get("returns_mode_layers"):
                        return True
            return None
        if isinstance(e, (cst.List, cst.Tuple)):
            return _any3(self.expr_layers(fn, el.value, depth + 1) for el in e.elements)
        if isinstance(e, (cst.Name, cst.Attribute)):
            d = dotted(e)
            return self.path_layers(fn, d, depth + 1) if d else None
        return None

    def class_layers(self, cls, depth: int) -> Optional[bool]:
        """``cls`` (a class of this module) builds or runs a mode-dependent layer, in its own
        methods, its bases of the tree, or the classes and layer factories of the tree it
        builds."""
        memo = self.__dict__.setdefault("_layers", {})
        key = id(cls)
        if key in memo:
            return memo[key]
        memo[key] = False  # recursion guard
        memo[key] = got = self._class_layers(cls, depth)
        return got

    def _class_layers(self, cls, depth: int) -> Optional[bool]:
        if depth > 8:
            return None
        unknown = False
        for b, raw in zip(cls.bases, cls.raw_bases):
            if b in catalog.MODULE_BASES or b in ("torch.nn.Module", "Module", "object"):
                continue
            local = self.mm.find_class(raw)
            if local is not None and local is not cls:
                got = self.class_layers(local, depth + 1)
                if got:
                    return True
                unknown |= got is None
                continue
            facts = self.mm.external_class(raw, "mode")
            if facts is not None and facts.get("mode_layers"):
                return True
            unknown |= facts is None or facts.get("mode_layers") is None
        init = cls.methods.get("__init__")
        if init is not None and self._runs_handed_in(cls, init):
            unknown = True  # a module of the caller's choosing
        for m in cls.methods.values():
            for op in walk(m.body):
                if not isinstance(op, CallOp):
                    continue
                q = op.qual or ""
                last = q.rsplit(".", 1)[-1]
                if q.startswith("torch.nn.") and (_EVIDENT_LAYER.search(last) or "dropout" in last
                                                  or last == "batch_norm"):
                    return True
                if catalog.TORCHVISION_DETECTION.match(q):
                    continue  # its mode picks losses or detections (see catalog)
                if _TORCHVISION_NETS.match(q):
                    return True
                if not op.func or op.func.startswith("self.") or op.func == cls.name:
                    continue
                got = False
                if "." not in op.func:
                    local = self.mm.find_class(op.func)
                    target = self.mm.functions.get(op.func) if local is None else None
                    if local is not None and local is not cls:
                        got = self.class_layers(local, depth + 1)
                    elif target is not None:
                        got = _any3(self.expr_layers(target, r.value, depth + 1) for r in walk(target.body)
                                    if isinstance(r, ReturnOp) and r.value is not None)
                    elif local is None:
                        got = self._external_layers(op, q, last)
                else:
                    got = self._external_layers(op, q, last)
                if got:
                    return True
                unknown |= got is None
        text = getattr(self.mm, "text", None)
        if isinstance(text, str) and self._text_mentions_training(text):
            try:
                if _TRAINING_ATTR.search(self.mm.code_for(cls.node)):
                    return True  # ``if self.training:`` / ``F.dropout(x, training=self.training)``
            except Exception:
                return None
        return None if unknown else False

    def _external_layers(self, op, q: str, last: str) -> Optional[bool]:
        """A class built in a method: of another tree module (its facts), of a library other
        than PyTorch (unknown when it is a class: a module of unknown make), or anything else
        (a function of a library: no module)."""
        if not q or q.startswith(("torch.", "builtins.")) or q.partition(".")[0] in _NEUTRAL_TOPS:
            return False
        facts = self.mm.external_class(op.func, "mode")
        if facts is not None:
            return facts.get("mode_layers") if facts.get("is_module") else False
        if last[:1].isupper() and self.mm.locate(q) is None:
            return None  # ``UNet2DModel(...)``, ``monai.networks.nets.UNet(...)``
        return False

    def of_class(self, cls, zeros: frozenset = frozenset()) -> bool:
        """``zeros``: the conditions of :meth:`needs` that a construction meets."""
        need = self.needs(cls)
        return need is None or not need <= zeros

    def needs(self, cls) -> Optional[frozenset]:
        """What makes ``cls`` free of the mode: ``None`` (nothing), or the constructor
        parameters (``"p"``) and config-dict keys (``"p[key]"``) that must be 0."""
        key = id(cls)
        if key in self._needs:
            return self._needs[key]
        self._needs[key] = None  # recursion guard: assume sensitive
        self._needs[key] = res = self._class_needs(cls)
        return res

    def free_if(self, cls) -> Optional[dict]:
        """The class fact ``mode_free_if`` for other modules: the conditions of :meth:`needs`
        with the constructor's signature, when some are needed."""
        need = self.needs(cls)
        if not need:
            return None
        params, zero_defaults = self._signature(cls)
        return {"params": list(params), "zero_defaults": sorted(zero_defaults), "zero": sorted(need)}

    def _in_effect(self, cls, call):
        """A notebook or script may define a class twice (a later cell adds dropout): a
        construction uses the definition above it."""
        defs = self.mm.redefined.get(cls.qualname) if hasattr(self.mm, "redefined") else None
        if not defs or call is None:
            return cls
        try:
            line = self.mm.line_of(call)
            best = None
            for c in defs:
                if self.mm.line_of(c.node) < line:
                    best = c
            return best or cls
        except Exception:
            return cls

    def _last_binding_before(self, fn, path: str, at) -> Optional[tuple]:
        """``(function, value)`` of the last plain assignment of ``path`` in ``fn`` above the
        node ``at`` (a notebook rebinds ``model`` once per cell that builds one)."""
        try:
            line = self.mm.line_of(at)
            best = None
            for op in all_ops(fn):
                if isinstance(op, AssignOp) and op.aug is None and op.value is not None \
                        and any(dotted(t) == path for t in op.targets):
                    ln = self.mm.line_of(op.node)
                    if ln < line and (best is None or ln > best[0]):
                        best = (ln, op.value)
            return (fn, best[1]) if best else None
        except Exception:
            return None

    def _signature(self, cls) -> tuple:
        init = cls.methods.get("__init__")
        if init is None:
            return (), frozenset()
        params = tuple(p for p in init.params[1:] if not p.startswith("*"))
        zd = frozenset(p for p in params if p in init.defaults and _is_zero(init.defaults[p]))
        return params, zd

    def _class_needs(self, cls) -> Optional[frozenset]:
        for b, raw in zip(cls.bases, cls.raw_bases):
            if b in catalog.MODULE_BASES or b in ("torch.nn.Module", "Module"):
                continue
            local = self.mm.find_class(raw)
            if local is not None and local is not cls:
                if self.needs(local) != _NOTHING:
                    return None
                continue
            if self._external_needs(raw) != _NOTHING:
                return None
        # the class's code is a piece of the module's text: generated (a walk with a callback
        # per node) only when the text mentions ``.training`` at all
        text = getattr(self.mm, "text", None)
        if not isinstance(text, str) or self._text_mentions_training(text):
            try:
                if _TRAINING_ATTR.search(self.mm.code_for(cls.node)):
                    return None
            except Exception:
                return None
        out = set()
        for m in cls.methods.values():
            params = frozenset()
            if m.name == "__init__":
                for p in m.params[1:]:
                    # a submodule handed in from outside: unknown
                    if self.r._param_role(m, p.lstrip("*"))[0] == catalog.MODEL:
                        return None
                if self._runs_handed_in(cls, m):
                    return None
                # parameters the constructor does not rebind: their value is the caller's
                rebound = {dotted(t) for op in walk(m.body) if isinstance(op, AssignOp) for t in op.targets}
                params = frozenset(p for p in m.params[1:] if not p.startswith("*") and p not in rebound)
            for op in walk(m.body):
                if isinstance(op, CallOp):
                    r = self._call_needs(m, op.node, params)
                    if r is None:
                        return None
                    out |= r
        return frozenset(out)

    def _runs_handed_in(self, cls, init) -> bool:
        """A constructor argument kept as a submodule (``self.head = head``,
        ``self.encoders = nn.ModuleList(encoders)``) and run by a method (``self.head(x)``,
        ``for enc in self.encoders``): a module of the caller's choosing, maybe with dropout."""
        params = {p.lstrip("*") for p in init.params[1:]} - {"self"}
        kept = set()
        for op in walk(init.body):
            if not isinstance(op, AssignOp) or op.value is None:
                continue
            v = op.value
            if isinstance(v, cst.Call) and (self.mm.qualify(dotted(v.func) or "") or "").rsplit(".", 1)[-1] \
                    in ("ModuleList", "ModuleDict", "Sequential") and v.args:
                v = v.args[0].value
            if isinstance(v, cst.Name) and v.value in params:
                kept.update(d for d in (dotted(t) for t in op.targets) if d and d.startswith("self."))
        if not kept:
            return False
        for m in cls.methods.values():
            if m.name == "__init__":
                continue
            for op in walk(m.body):
                if isinstance(op, CallOp) and op.func in kept:
                    return True
                if isinstance(op, LoopOp) and dotted(op.iter) in kept:
                    return True
        return False

    def _text_mentions_training(self, text: str) -> bool:
        got = self.__dict__.get("_mentions")
        if got is None:
            got = self._mentions = _TRAINING_ATTR.search(text) is not None
        return got

    def _external_needs(self, name: str):
        """What a class of another module needs (see :meth:`needs`); a plain class of the
        tree (no ``nn.Module`` anywhere in its bases) is not a submodule: nothing."""
        getter = getattr(self.mm, "external_class", None)
        facts = getter(name, "mode") if getter is not None else None
        if not facts:
            return None
        if facts.get("is_module") is False and facts.get("plain"):
            return _NOTHING
        if facts.get("is_module") is None or "mode_sensitive" not in facts:
            return None
        if not facts["mode_sensitive"]:
            return _NOTHING
        mfi = facts.get("mode_free_if")
        if isinstance(mfi, dict):
            try:
                return (frozenset(mfi["zero"]), (tuple(mfi["params"]), frozenset(mfi["zero_defaults"])))
            except (KeyError, TypeError):
                return None
        return None

    def _external(self, name: str) -> bool:
        return self._external_needs(name) != _NOTHING

    def _call_needs(self, fn, call: cst.Call, params: frozenset = frozenset()) -> Optional[frozenset]:
        """What constructing/calling this needs for the model to be free of the mode (``None``:
        it is mode-sensitive whatever the arguments); ``params``: the constructor's own
        parameters a condition may name."""
        d = dotted(call.func)
        if d is None or d.startswith("self."):
            return _NOTHING  # a submodule or method of the class: judged where it is constructed
        q = self.mm.qualify(d) or ""
        last = d.rsplit(".", 1)[-1]
        if q.startswith("torch.nn.functional."):
            return None if "dropout" in q else _NOTHING
        if q.startswith("torch.nn."):
            name = q.rsplit(".", 1)[-1]
            if name.startswith(("Dropout", "AlphaDropout", "FeatureAlphaDropout")):
                a = call.args[0] if call.args and call.args[0].keyword is None else next(
                    (x for x in call.args if x.keyword is not None and x.keyword.value == "p"), None)
                return None if a is None else self._cond(a.value, params)
            if _MODE_LAYER.search(name):
                return None
            if q in _RNN_LAYERS:
                for a in call.args:
                    if a.keyword is not None and a.keyword.value == "dropout":
                        return self._cond(a.value, params)
                return None if len([a for a in call.args if a.keyword is None]) >= 6 else _NOTHING
            return _NOTHING
        if q.startswith("torch.") or q.startswith(_NEUTRAL_PREFIXES):
            return _NOTHING
        if "." not in d and hasattr(builtins, d):
            return _NOTHING  # ValueError(...), Exception(...)
        local = self.mm.find_class(d)
        if local is not None:  # (whatever its name's case: ``class double_conv(nn.Module)``)
            if not self.mm.class_is_module(local):
                return _NOTHING
            need = self.needs(local)
            if need is None:
                return None
            return self._bind(need, self._signature(local), call, lambda e, k: self._cond(e, params, k))
        if not last[:1].isupper() or last.isupper():
            # functions and CONSTANTS, not layers; unless the name is a module class of
            # another module of the tree (``from .unet_parts import *`` of ``class inconv``)
            getter = getattr(self.mm, "external_class", None)
            facts = getter(d, "class") if q and getter is not None else None
            if not facts or not facts.get("is_module"):
                return _NOTHING
        target = self.mm.functions.get(d)
        if target is not None:  # a layer factory of this file: def WNConv1d(*a, **k): return weight_norm(nn.Conv1d(*a, **k))
            rets = [op.value for op in walk(target.body) if isinstance(op, ReturnOp) and op.value is not None]
            return None if not rets or any(self.of_expr(target, v, 1) for v in rets) else _NOTHING
        ext = self._external_needs(d)
        if isinstance(ext, tuple):
            return self._bind(ext[0], ext[1], call, lambda e, k: self._cond(e, params, k))
        return ext

    @staticmethod
    def _bind(need: frozenset, sig: tuple, call: cst.Call, cond) -> Optional[frozenset]:
        """Map the conditions ``need`` (on the callee's parameters ``sig``) through the
        arguments of ``call``: ``cond(expr, key)`` says what an argument needs to be 0 (for a
        config-dict key ``key``: to hold 0 there)."""
        if not need:
            return _NOTHING
        params, zero_defaults = sig
        if any(a.star for a in call.args):
            return None  # *args / **kwargs: which parameter gets what is unknown
        pos = [a for a in call.args if a.keyword is None]
        out = set()
        for c in need:
            p, _, key = c.partition("[")
            key = key[:-1] if key else None
            arg = None
            if p in params and params.index(p) < len(pos):
                arg = pos[params.index(p)].value
            kw = next((a for a in call.args if a.keyword is not None and a.keyword.value == p), None)
            if kw is not None:
                arg = kw.value
            if arg is None:
                if key is None and p in zero_defaults:
                    continue
                return None
            r = cond(arg, key)
            if r is None:
                return None
            out |= r
        return frozenset(out)

    def _cond(self, e, params: frozenset, key: Optional[str] = None) -> Optional[frozenset]:
        """Inside a constructor: what makes ``e`` (or its ``key`` when it is a config dict)
        0: nothing (a literal 0), a condition on a parameter, or ``None`` (not 0)."""
        if key is None:
            if isinstance(e, (cst.Integer, cst.Float)):
                return _NOTHING if _is_zero(e) else None
            if isinstance(e, cst.Name) and e.value in params:
                return frozenset({e.value})
            k = _literal_index(e)
            if k is not None and isinstance(e.value, cst.Name) and e.value.value in params:
                return frozenset({f"{e.value.value}[{k}]"})
            return None
        if isinstance(e, cst.Name) and e.value in params:
            return frozenset({f"{e.value}[{key}]"})
        if isinstance(e, cst.Dict):
            v = _dict_get(e, key)
            return None if v is None else self._cond(v, params)
        return None

    def _site_cond(self, fn, e, key: Optional[str] = None, depth: int = 0) -> Optional[frozenset]:
        """At a construction in ``fn``: ``_NOTHING`` when ``e`` (or its ``key``) is provably 0,
        else ``None``."""
        if depth > 4:
            return None
        if key is None:
            if isinstance(e, (cst.Integer, cst.Float)):
                return _NOTHING if _is_zero(e) else None
            k = _literal_index(e)
            if k is not None:
                return self._site_cond(fn, e.value, k, depth + 1)
            return None
        if isinstance(e, cst.Dict):
            v = _dict_get(e, key)
            return None if v is None else self._site_cond(fn, v, None, depth + 1)
        if isinstance(e, cst.Name):
            return self._dict_key_zero(fn, e.value, key, depth)
        return None

    def _dict_key_zero(self, fn, name: str, key: str, depth: int) -> Optional[frozenset]:
        """The config dict ``name`` holds 0 at ``key`` wherever it is used: every assignment
        of it in its scope is a dict literal with 0 there, every ``name.update(...)`` and
        ``name[...] = ...`` leaves the key 0."""
        scope = self._scope_of(fn, name)
        if scope is None:
            return None
        seen = False
        for op in all_ops(scope):
            if isinstance(op, AssignOp):
                for t in op.targets:
                    if isinstance(t, cst.Name) and t.value == name:
                        if op.aug is not None or op.value is None \
                                or self._site_cond(scope, op.value, key, depth + 1) is None:
                            return None
                        seen = True
                    elif isinstance(t, (cst.Tuple, cst.List)) and any(
                            isinstance(el.value, cst.Name) and el.value.value == name for el in t.elements):
                        return None
                    elif isinstance(t, cst.Subscript) and isinstance(t.value, cst.Name) and t.value.value == name:
                        k = _literal_index(t)
                        if k is None or k == key and (op.aug is not None or op.value is None or
                                                      self._site_cond(scope, op.value, None, depth + 1) is None):
                            return None
            elif isinstance(op, CallOp) and op.recv == name and op.attr in ("update", "setdefault", "__setitem__"):
                if op.attr != "update" or len(op.args) != 1 or op.args[0].keyword is not None \
                        or not self._keeps_key(scope, op.args[0].value, key, depth):
                    return None
        return _NOTHING if seen else None

    def _keeps_key(self, fn, e, key: str, depth: int) -> bool:
        """``d.update(e)`` leaves ``d[key]`` as it was, or sets it to 0: ``e`` is a dict
        literal (or a name bound only to dict literals, or an item of a table of them:
        ``model_configs[CHOOSE_MODEL]``) without the key, or with 0 there."""
        def ok(v) -> bool:
            if not isinstance(v, cst.Dict) or any(not isinstance(el, cst.DictElement) or not isinstance(
                    el.key, (cst.SimpleString, cst.Integer)) for el in v.elements):
                return False
            got = _dict_get(v, key)
            return got is None or self._site_cond(fn, got, None, depth + 1) is not None

        def values_of(name: str):
            scope = self._scope_of(fn, name)
            if scope is None:
                return None
            vals = []
            for op in all_ops(scope):
                if isinstance(op, AssignOp) and any(
                        isinstance(t, cst.Name) and t.value == name for t in op.targets):
                    if op.aug is not None or op.value is None:
                        return None
                    vals.append(op.value)
                elif isinstance(op, AssignOp) and any(
                        isinstance(t, cst.Subscript) and isinstance(t.value, cst.Name) and t.value.value == name
                        for t in op.targets):
                    return None
                elif isinstance(op, CallOp) and op.recv == name and op.attr in ("update", "setdefault"):
                    return None
            return vals or None

        if isinstance(e, cst.Dict):
            return ok(e)
        if isinstance(e, cst.Name):
            vals = values_of(e.value)
            return vals is not None and all(ok(v) for v in vals)
        if isinstance(e, cst.Subscript) and isinstance(e.value, cst.Name) and len(e.slice) == 1:
            vals = values_of(e.value.value)  # a table of configurations, indexed by a choice
            return vals is not None and all(
                isinstance(v, cst.Dict) and v.elements and all(
                    isinstance(el, cst.DictElement) and ok(el.value) for el in v.elements) for v in vals)
        return False

    def _scope_of(self, fn, name: str):
        """The function whose code binds ``name`` as seen from ``fn`` (its own, an enclosing
        one, the module); ``None`` for a parameter."""
        f = fn
        while f is not None:
            if name in f.params:
                return None
            for op in all_ops(f):
                if isinstance(op, AssignOp) and any(isinstance(t, cst.Name) and t.value == name for t in op.targets):
                    return f
            f = f.parent
        mf = getattr(self.mm, "module_function", None)
        return mf if mf is not None and mf is not fn else None

    def _returned_by_helper(self, fn, path: str, at=None) -> bool:
        """``model, result = train_model(...)``: the model a helper of this module returns at
        that position, on every ``return`` (in top-level code, the assignment above ``at``)."""
        found = _tuple_item_returned(self.mm, fn, path, at)
        if not found:
            return True
        helper, items = found
        return any(self.of_expr(helper, e, 1) for e in items)

    def _built_sensitive(self, fn, cls, call: cst.Call) -> bool:
        cls = self._in_effect(cls, call)
        need = self.needs(cls)
        if need is None:
            return True
        return self._bind(need, self._signature(cls), call, lambda e, k: self._site_cond(fn, e, k)) is None

    def of_expr(self, fn, e, depth: int) -> bool:
        if depth > 6:
            return True
        if isinstance(e, cst.Call):
            func = e.func
            if isinstance(func, cst.Attribute) and func.attr.value in _PASSTHROUGH_METHODS:
                return self.of_expr(fn, func.value, depth + 1)
            d = dotted(func)
            q = self.mm.qualify(d) if d else None
            if q and q.startswith("torch.nn.") and not q.startswith("torch.nn.functional."):
                if self._call_needs(fn, e) != _NOTHING:
                    return True
                if q.rsplit(".", 1)[-1] not in ("Sequential", "ModuleList", "ModuleDict"):
                    return False  # a layer: its arguments are sizes, not modules
                return any(self.of_expr(fn, a.value, depth + 1) for a in e.args
                           if isinstance(a.value, (cst.Call, cst.Name, cst.Attribute, cst.List,
                                                   cst.Tuple, cst.Dict, cst.ListComp)))
            if isinstance(func, cst.Name) and func.value in ("list", "tuple") and e.args:
                return self.of_expr(fn, e.args[0].value, depth + 1)
            if q in _WRAPPERS and e.args:
                return self.of_expr(fn, e.args[0].value, depth + 1)
            if isinstance(func, cst.Attribute) and func.attr.value == "load_from_checkpoint":
                # Lightning's ``Net.load_from_checkpoint(path)``: an instance of that class
                local = self.mm.find_class(dotted(func.value) or "")
                if local is not None and self.mm.class_is_module(local):
                    return self.of_class(local)
            if d:
                local = self.mm.find_class(d)
                if local is not None and self.mm.class_is_module(local):
                    return self._built_sensitive(fn, local, e)
                if local is not None and all(b == "object" for b in local.raw_bases):
                    # a plain class of this file (a from-scratch network with its own forward
                    # and backward) has no train/eval mode
                    return False
                target = self.mm.functions.get(d)
                if target is not None:  # def build_model(): return nn.Sequential(...)
                    rets = [op.value for op in walk(target.body) if isinstance(op, ReturnOp) and op.value is not None]
                    return not rets or any(self.of_expr(target, v, depth + 1) for v in rets)
                if q:
                    ext = self._external_needs(d)
                    if isinstance(ext, tuple):
                        return self._bind(ext[0], ext[1], e, lambda a, k: self._site_cond(fn, a, k)) is None
                    return ext != _NOTHING
            return True
        if isinstance(e, (cst.List, cst.Tuple)):
            return any(self.of_expr(fn, el.value, depth + 1) for el in e.elements)
        if isinstance(e, cst.Dict):
            return any(self.of_expr(fn, el.value, depth + 1) for el in e.elements
                       if isinstance(el, cst.DictElement))
        if isinstance(e, cst.ListComp):
            return self.of_expr(fn, e.elt, depth + 1)
        if isinstance(e, cst.StarredElement):
            return True
        if isinstance(e, (cst.Name, cst.Attribute)):
            d = dotted(e)
            if d:
                role = self.r.of_path(fn, d)
                if role[0] == catalog.MODEL and isinstance(role[1], str) and role[1] in self.mm.classes \
                        and not self.mm.redefined.get(self.mm.classes[role[1]].qualname):
                    return self.of_class(self.mm.classes[role[1]])
                # (a class defined twice: the construction that binds it says which definition)
                df = self.r.definition(fn, d)
                if df is not None and df[1] is not e:
                    if "." not in d and isinstance(df[1], (cst.List, cst.Tuple)) \
                            and any(self.of_expr(df[0], v, depth + 1) for v in _list_additions(df[0], d)):
                        return True  # ``layers.append(nn.Dropout(p))``, then ``nn.Sequential(*layers)``
                    return self.of_expr(df[0], df[1], depth + 1)
            return True
        return True


_NOTHING = frozenset()


def _literal_index(e) -> Optional[str]:
    """``x["name"]``: the string key, else ``None``."""
    if isinstance(e, cst.Subscript) and _literal_key(e):
        v = e.slice[0].slice.value.evaluated_value
        return v if isinstance(v, str) else None
    return None


def _dict_get(d: cst.Dict, key: str):
    """The value a dict literal gives ``key`` (``None``: absent, or unknown: ``**other`` or a
    computed key may set it)."""
    got = None
    for el in d.elements:
        if not isinstance(el, cst.DictElement) or not isinstance(el.key, (cst.SimpleString, cst.Integer)):
            return None
        if isinstance(el.key, cst.SimpleString) and el.key.evaluated_value == key:
            got = el.value
    return got


def _literal_key(sub: cst.Subscript) -> bool:
    """``x["name"]``: one index, a string literal."""
    return len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index) \
        and isinstance(sub.slice[0].slice.value, cst.SimpleString)


def _is_zero(e, zeros: frozenset = frozenset()) -> bool:
    """``0``, ``0.0``, or a name in ``zeros`` (a constructor parameter known to be 0)."""
    if isinstance(e, (cst.Integer, cst.Float)):
        try:
            return float(e.value) == 0
        except ValueError:
            return False
    return isinstance(e, cst.Name) and e.value in zeros


def _strip_module(p: str) -> str:
    while p.endswith(".module"):
        p = p[: -len(".module")]
    return p


def _under(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or one of its submodules."""
    return path == parent or path.startswith(parent + ".")


def _union(parts) -> Optional[frozenset]:
    out = set()
    for p in parts:
        if p is None:
            return None
        out |= p
    return frozenset(out)


def _first_arg(call: cst.Call, keyword: Optional[str]) -> Optional[cst.Arg]:
    if keyword is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == keyword:
                return a
    for a in call.args:
        if a.keyword is None and not a.star:
            return a
    return None


def _unfreezes(op) -> bool:
    """``x.requires_grad = True`` (or a value not known to be False), ``x.requires_grad_()``."""
    if isinstance(op, AssignOp) and op.aug is None:
        return any(isinstance(t, cst.Attribute) and t.attr.value == "requires_grad" for t in op.targets) \
            and not (isinstance(op.value, cst.Name) and op.value.value == "False")
    return isinstance(op, CallOp) and op.attr == "requires_grad_" and _bool_arg(op, True) is not False


def _bool_arg(op: CallOp, default: Optional[bool]) -> Optional[bool]:
    if not op.args:
        return default
    v = op.args[0].value
    if isinstance(v, cst.Name) and v.value in ("True", "False"):
        return v.value == "True"
    return None


def _value_bound_to(op: AssignOp, path: str):
    value = op.value
    for t in op.targets:
        if dotted(t) == path:
            return value
        if isinstance(t, (cst.Tuple, cst.List)):
            elts = [e.value for e in t.elements]
            for i, te in enumerate(elts):
                if dotted(te) != path:
                    continue
                if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elts):
                    return value.elements[i].value
                if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                        and value.func.attr.value in _PREPARE:
                    args = [a.value for a in value.args if a.keyword is None]
                    if i < len(args):
                        return args[i]
    return None


# -------------------------------------------------------------------- classification
_MODEL_LIKE = (catalog.MODEL,)


def _mode_of_train_call(op: CallOp) -> Optional[str]:
    if op.attr == "eval":
        return "eval" if not op.args else None
    # train(), train(True), train(False), train(mode=False)
    if not op.args:
        return "train"
    a = op.args[0]
    v = a.value
    if isinstance(v, cst.Name) and v.value in ("True", "False"):
        return "train" if v.value == "True" else "eval"
    return "?"


def _own_method(mm, fn, op: CallOp) -> bool:
    """``self.backward(...)`` resolves to a method the class defines itself (a hand-written
    gradient computation of a from-scratch model), not to ``Tensor.backward``; the call is then
    classified as a call of that method, whose summary says whether it runs autograd."""
    return mm.resolve_call(fn, op) is not None


def _plain_local_class(mm, value):
    """The plain class of this module (no ``nn.Module``, no base outside this module's plain
    classes) that ``value`` (a constructor call) builds, else ``None``."""
    if not isinstance(value, cst.Call):
        return None
    cls = mm.find_class(dotted(value.func) or "")
    if cls is None or mm.class_is_module(cls) or not mm._plain_class(cls):
        return None
    return cls


def _binding(mm, fn, resolver: RoleResolver, path: str, at):
    """The value bound to ``path`` where ``at`` runs: in top-level code (a notebook's cells, a
    script) the last assignment above it; in a function its assignments if they all agree;
    else its definition outside (``self`` attributes, module globals)."""
    binds = [op for op in all_ops(fn) if isinstance(op, AssignOp) and op.aug is None and op.value is not None
             and any(dotted(t) == path for t in op.targets)]
    if binds and fn.is_module_level:
        line = mm.line_of(at)
        above = [op for op in binds if mm.line_of(op.node) < line]
        return above[-1].value if above else None
    if binds:
        vals = {mm.code_for(op.value.func) if isinstance(op.value, cst.Call) else id(op) for op in binds}
        return binds[0].value if len(vals) == 1 else None
    d = resolver.definition(fn, path)
    return d[1] if d is not None else None


def _element_values(mm, fn, resolver: RoleResolver, path: str, depth: int = 0) -> Optional[list]:
    """The items of the list at ``path`` (``self.layers``): a list literal it is bound to, or
    the list literal every call of the class passes for the ``__init__`` parameter it holds
    (``Sequential([MyLinear(2, h), MyReLU()])``)."""
    from .callsites import _local_sites

    d = resolver.definition(fn, path)
    if d is None or depth > 2:
        return None
    f, v = d
    if isinstance(v, (cst.List, cst.Tuple)):
        return [e.value for e in v.elements]
    if not (isinstance(v, cst.Name) and v.value in f.params and f.name == "__init__"):
        return None
    idx = f.params.index(v.value) - 1
    out = []
    sites = _local_sites(mm).get(id(f), ())
    for caller, args in sites:
        arg = next((a for a in args if a.keyword is not None and a.keyword.value == v.value), None)
        pos = [a for a in args if a.keyword is None and not a.star]
        if arg is None and 0 <= idx < len(pos):
            arg = pos[idx]
        if arg is None:
            return None
        val = arg.value
        if isinstance(val, cst.Name):
            dd = resolver.definition(caller, val.value)
            val = dd[1] if dd is not None else None
        if not isinstance(val, (cst.List, cst.Tuple)):
            return None
        out.extend(e.value for e in val.elements)
    return out if sites else None


def plain_instance_classes(mm, fn, resolver: RoleResolver, op: CallOp) -> list:
    """The plain classes of this module the receiver of ``op`` is an instance of, by evidence:
    its binding (``net = Sequential([MyLinear(2, 50), MyReLU()])``; in a notebook the binding
    above the call, so a later ``net = nn.Sequential(...)`` cell does not count), or, for the
    variable of a loop over a list attribute (``for layer in reversed(self.layers)``), the
    items of that list. Empty when any of them is not such an instance. Such an object is not
    a model, and its ``forward``/``backward``/``step`` are its own methods: a hand-written
    NumPy network."""
    path = op.recv
    if not path or "(" in path or "[" in path:
        return []
    loop = op.loop
    while loop is not None:
        if not loop.is_while and isinstance(loop.target, cst.Name) and loop.target.value == path:
            it = loop.iter
            if isinstance(it, cst.Call) and dotted(it.func) == "reversed" and it.args:
                it = it.args[0].value
            src = dotted(it) if it is not None else None
            items = _element_values(mm, fn, resolver, src) if src and src.startswith("self.") else None
            classes = [_plain_local_class(mm, e) for e in items or ()]
            return classes if items and all(classes) else []
        loop = loop.parent
    cls = _plain_local_class(mm, _binding(mm, fn, resolver, path, op.node))
    return [cls] if cls is not None else []


def _plain_object_method(mm, fn, resolver: RoleResolver, op: CallOp):
    """For ``obj.name(...)`` on instances of plain classes of this module that all define (or
    inherit from a plain class) ``name``: that method (``None`` when they are several classes),
    or ``False`` when ``obj`` is not known to be such an instance."""
    classes = plain_instance_classes(mm, fn, resolver, op)
    if not classes:
        return False
    methods = [mm._method_of(c, op.attr) for c in classes]
    if not all(isinstance(m, FunctionModel) for m in methods):
        return False
    return methods[0] if all(m is methods[0] for m in methods) else None


_MODULE_CLASSES = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})


def not_a_module_here(mm, op, path: str) -> bool:
    """``op`` runs only where ``path`` is not an ``nn.Module``: in the arm of an
    ``isinstance(path, nn.Module)`` test that the test fails (d2l's ``evaluate_accuracy``
    switches Module nets with ``eval()`` and calls a net written as a plain function in its
    ``else`` arm, ``net(X, is_training=False)``).  A call there is no forward of a model."""
    for br, arm in op.guards:
        test = br.test
        if not isinstance(br.node, cst.If) or test is None:
            continue
        negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
        if negated:
            test = test.expression
        if arm == (0 if negated else 1) and _isinstance_module_test(mm, test, path):
            return True
    return False


def _isinstance_module_test(mm, test, path: str) -> bool:
    """``test`` is ``isinstance(path, nn.Module)`` (or a tuple of classes, all ``nn.Module``)."""
    if not (isinstance(test, cst.Call) and dotted(test.func) == "isinstance" and len(test.args) == 2):
        return False
    if dotted(test.args[0].value) != path:
        return False
    classes = test.args[1].value
    items = [e.value for e in classes.elements] if isinstance(classes, cst.Tuple) else [classes]
    return bool(items) and all(mm.qualify(dotted(c) or "") in _MODULE_CLASSES for c in items)


def classify(mm, fn, resolver: RoleResolver) -> None:
    """Label the calls of ``fn`` that are training events (none in a module of another
    framework: MXNet's ``loss.backward()`` and ``trainer.step()`` are not PyTorch's)."""
    if not mm.is_torch_code:
        return
    for op in all_ops(fn):
        if not isinstance(op, CallOp):
            continue
        attr = op.attr
        q = op.qual or ""
        if attr == "zero_grad":
            op.kind, op.target = CLEAR, op.recv or "?"
        elif q in ("torch.autograd.backward",):
            op.kind, op.target = BACKWARD, None
        elif q == "torch.distributed.autograd.backward":
            # gradients go to the distributed autograd context (a fresh one per iteration)
            op.kind, op.target, op.info = BACKWARD, None, catalog.DIST_AUTOGRAD
        elif q == "torch.autograd.grad":
            op.kind = AUTOGRAD_GRAD
        elif attr in ("backward", "forward") and op.recv not in (None, "self") \
                and _plain_object_method(mm, fn, resolver, op) is not False:
            # ``net.backward()`` on an instance of a plain class of this module that defines its
            # own ``backward`` (a from-scratch NumPy network): a call of that method
            m = _plain_object_method(mm, fn, resolver, op)
            if m is not None:
                op.kind, op.info = CALL, m
        elif attr in ("backward", "manual_backward") and not (
                op.recv == "self" and attr == "backward" and _own_method(mm, fn, op)):
            op.kind, op.target = BACKWARD, op.recv
        elif attr == "step" and op.recv_node is not None:
            recv, target = op.recv_node, op.recv
            if isinstance(recv, cst.Subscript) and _literal_key(recv) and dotted(recv.value):
                # ``self.optimizer["generator"].step()``: an optimizer of a dict of optimizers
                recv = recv.value
                target = dotted(recv)
            role = resolver.of_expr(fn, recv)[0]
            if role == catalog.SCHEDULER:
                op.kind, op.target = SCHED_STEP, target
            elif role == catalog.OPTIMIZER:
                op.kind, op.target = STEP, target
                a = op.arg(0, "closure")
                if a is not None:
                    op.closure = a.value
            elif role == catalog.SCALER:
                a = op.arg(0)
                op.kind, op.target = STEP, (dotted(a.value) if a is not None else None)
        elif (q in catalog.OPTIMIZER_STEP_FUNCS or (op.func or "").rsplit(".", 1)[-1] == "optimizer_step") \
                and op.arg(0) is not None and resolver.of_expr(fn, op.arg(0).value)[0] == catalog.OPTIMIZER:
            # xm.optimizer_step(optimizer) (torch_xla) steps the optimizer it is given
            op.kind, op.target = STEP, dotted(op.arg(0).value)
        elif attr in ("train", "eval") and op.recv_node is not None:
            role = resolver.of_expr(fn, op.recv_node)[0]
            if role == catalog.MODEL:
                op.kind, op.target, op.info = MODE, op.recv or "?", _mode_of_train_call(op)
        elif attr in ("to", "cuda") and op.recv is not None:
            op.kind, op.target = MOVE, op.recv
        if op.kind is not None:
            continue
        fkind = catalog.functional_loss_kind(q)
        if fkind is not None or (q.startswith("torch.nn.functional.") and q.endswith("_loss")):
            op.kind, op.info = LOSS, fkind or catalog.OTHER_LOSS
            continue
        if op.func is None and isinstance(op.node.func, cst.Call):
            # ``nn.CrossEntropyLoss()(logits, y)``: a loss module built and called at once
            role, info = resolver.of_expr(fn, op.node.func)
            if role == catalog.LOSS:
                op.kind, op.info = LOSS, info
                continue
        if op.func is None and isinstance(op.node.func, cst.Subscript) and _literal_key(op.node.func):
            # ``self.model["generator"](z, c)``: a model of a dict of models, called
            base = dotted(op.node.func.value)
            if base and resolver.of_path(fn, base)[0] == catalog.MODEL:
                op.kind, op.target, op.info = FORWARD, base, None
                continue
        if attr == "forward" and op.recv_node is not None and op.recv not in (None, "self", "cls") \
                and not (op.recv or "").startswith("super("):
            # ``model.forward(x)`` / ``criterion.forward(out, y)``: a forward or a loss all the same
            role, info = resolver.of_expr(fn, op.recv_node)
            if role == catalog.MODEL:
                op.kind, op.target, op.info = FORWARD, op.recv, info
                continue
            if role == catalog.LOSS:
                op.kind, op.target, op.info = LOSS, op.recv, info
                continue
        if op.func is not None:
            role, info = resolver.of_path(fn, op.func)
            if role == catalog.MODEL and not_a_module_here(mm, op, op.func):
                continue  # d2l's ``else: net(X, is_training=False)``: a net written as a function
            if role == catalog.MODEL:
                op.kind, op.target, op.info = FORWARD, op.func, info
                continue
            if role == catalog.LOSS and op.func.startswith("self."):
                role, info = resolver.attr_role_at(fn, op, (role, info))
            if role == catalog.LOSS:
                op.kind, op.target, op.info = LOSS, op.func, info
                continue
            callee = mm.resolve_call(fn, op)
            if callee is not None:
                op.kind, op.info = CALL, callee


def _tuple_item_returned(mm, fn, path: str, at=None):
    """``model, result = train_model(...)`` in ``fn``: the helper of this module and, for each of
    its ``return`` statements, the item at ``path``'s position; None when ``path`` is not bound so
    or the helper or one of its returns is unknown (not a tuple long enough).  In top-level code
    with ``at`` (where the model is used): the last such assignment above ``at``, calling the
    definition of the helper above that assignment (a notebook redefines ``get_model``)."""
    ops = all_ops(fn)
    if at is not None and fn.is_module_level:
        try:
            line = mm.line_of(at)
            ops = [o for o in ops if isinstance(o, AssignOp) and mm.line_of(o.node) < line][::-1]
        except Exception:
            ops = all_ops(fn)
    for op in ops:
        if not (isinstance(op, AssignOp) and op.aug is None and isinstance(op.value, cst.Call)):
            continue
        for t in op.targets:
            if not isinstance(t, (cst.Tuple, cst.List)):
                continue
            idx = next((i for i, el in enumerate(t.elements) if dotted(el.value) == path), None)
            if idx is None:
                continue
            name = dotted(op.value.func) or ""
            helper = (mm.defined_above(name, op.node) if fn.is_module_level else None) or mm.functions.get(name)
            if helper is None:
                return None
            rets = [r.value for r in walk(helper.body) if isinstance(r, ReturnOp)]
            if not rets or any(not isinstance(v, cst.Tuple) or len(v.elements) <= idx for v in rets):
                return None
            return helper, [v.elements[idx].value for v in rets]
    return None

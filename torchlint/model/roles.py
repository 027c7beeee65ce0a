"""Roles (what a name is in PyTorch terms) and the classification of calls into training events."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from . import catalog
from .binder import dotted
from .ir import (
    AUTOGRAD_GRAD, BACKWARD, CALL, CLEAR, FORWARD, LOSS, MODE, MOVE, SCHED_STEP, STEP,
    AssignOp, CallOp, DefOp, walk,
)

# (role, info) where info is the loss kind for LOSS, the class name for MODEL
Role = tuple

_PASSTHROUGH_METHODS = {"to", "cuda", "cpu", "train", "eval", "half", "float", "double", "bfloat16",
                        "to_empty", "requires_grad_", "share_memory"}
_WRAPPERS = {"torch.nn.DataParallel", "torch.nn.parallel.DistributedDataParallel",
             "torch.nn.parallel.DataParallel", "torch.compile", "torch.jit.script",
             "torch.nn.SyncBatchNorm.convert_sync_batchnorm", "torch.nn.DistributedDataParallel"}
_PREPARE = {"prepare", "setup", "prepare_model", "prepare_optimizer", "prepare_data_loader",
            "unwrap_model", "setup_dataloaders"}
_EVAL_NAME = re.compile(r"(^|_)(eval|evaluate|evaluation|valid|validate|validation|val|test|testing|"
                        r"infer|inference|predict|prediction|score|benchmark)($|_)", re.I)


def is_eval_name(name: str) -> bool:
    return bool(_EVAL_NAME.search(name))


class RoleResolver:
    """Answers "what is this path?" for one module, caching per function."""

    def __init__(self, mm):
        self.mm = mm  # ModuleModel
        self._module_roles: Optional[dict] = None
        self._class_roles: dict = {}

    # ----------------------------------------------------------- expressions
    def of_expr(self, fn, expr) -> Role:
        if isinstance(expr, (cst.Name, cst.Attribute)):
            d = dotted(expr)
            if d:
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
            if isinstance(func, cst.Attribute):
                attr = func.attr.value
                if attr in _PASSTHROUGH_METHODS:
                    return self.of_expr(fn, func.value)
                if attr in _PREPARE and len(expr.args) == 1:
                    return self.of_expr(fn, expr.args[0].value)
                if attr == "from_pretrained":
                    base = dotted(func.value) or ""
                    if "Model" in base or "ForCausalLM" in base or "For" in base:
                        return (catalog.MODEL, None)
            return (None, None)
        return (None, None)

    # ----------------------------------------------------------- paths
    def of_path(self, fn, path: str) -> Role:
        f = fn
        while f is not None:
            r = self.local_roles(f).get(path)
            if r is not None:
                return r
            if path in f.params:
                return self._param_role(f, path)
            f = f.parent
        if path.startswith("self.") and fn is not None:
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            if cls is not None:
                r = self.class_roles(cls).get(path)
                if r is not None:
                    return r
        if path == "self" and fn is not None and fn.cls is not None and self.mm.class_is_module(fn.cls):
            return (catalog.MODEL, fn.cls.qualname)
        r = self.module_roles().get(path)
        if r is not None:
            return r
        q = self.mm.qualify(path)
        if q:
            role, info = catalog.role_of_constructor(q)
            if role in (catalog.LOSS,):
                return (None, None)  # a class, not an instance
        guess = catalog.role_from_name(path)
        return (guess, None) if guess else (None, None)

    def _param_role(self, fn, name: str) -> Role:
        ann = fn.annotations.get(name)
        if ann is not None:
            d = dotted(ann)
            q = self.mm.qualify(d) if d else None
            if q in catalog.ANNOTATION_ROLES:
                return (catalog.ANNOTATION_ROLES[q], None)
            if d:
                cls = self.mm.find_class(d)
                if cls is not None and self.mm.class_is_module(cls):
                    return (catalog.MODEL, cls.qualname)
        guess = catalog.role_from_name(name)
        return (guess, None) if guess else (None, None)

    def local_roles(self, fn) -> dict:
        roles = fn.roles
        if roles.get("__done__"):
            return roles
        roles["__done__"] = (None, None)
        for op in walk(fn.body):
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
                role = self.of_expr(fn, op.value) if op.value is not None else (None, None)
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


def classify(mm, fn, resolver: RoleResolver) -> None:
    """Label the calls of ``fn`` that are training events."""
    for op in walk(fn.body):
        if not isinstance(op, CallOp):
            continue
        attr = op.attr
        q = op.qual or ""
        if attr == "zero_grad":
            op.kind, op.target = CLEAR, op.recv or "?"
        elif q in ("torch.autograd.backward",):
            op.kind, op.target = BACKWARD, None
        elif q == "torch.autograd.grad":
            op.kind = AUTOGRAD_GRAD
        elif attr in ("backward", "manual_backward"):
            op.kind, op.target = BACKWARD, op.recv
        elif attr == "step" and op.recv_node is not None:
            role = resolver.of_expr(fn, op.recv_node)[0]
            if role == catalog.SCHEDULER:
                op.kind, op.target = SCHED_STEP, op.recv
            elif role == catalog.OPTIMIZER:
                op.kind, op.target = STEP, op.recv
                a = op.arg(0, "closure")
                if a is not None:
                    op.closure = a.value
            elif role == catalog.SCALER:
                a = op.arg(0)
                op.kind, op.target = STEP, (dotted(a.value) if a is not None else None)
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
        if op.func is not None:
            role, info = resolver.of_path(fn, op.func)
            if role == catalog.MODEL:
                op.kind, op.target, op.info = FORWARD, op.func, info
                continue
            if role == catalog.LOSS:
                op.kind, op.target, op.info = LOSS, op.func, info
                continue
            callee = mm.resolve_call(fn, op)
            if callee is not None:
                op.kind, op.info = CALL, callee

"""Roles known only at call sites: a parameter takes the role (and the class) of the argument
every call site passes for it, in this module and in the other modules of the linted tree.

``def train(model, optimizer, loader)`` in ``train.py`` and ``model = net.Network().cuda();
train.train(model, ...)`` in ``main.py``: ``model`` is a ``net.Network`` (whose forward may
end in a softmax) because the only call says so.  A call site counts only with evidence: the
argument was built by a constructor (a tree ``nn.Module`` class, ``torch.optim.*``, a loss
class, a loader ...), passed through ``.to()``/``.cuda()``/``DataParallel``, or is itself a
parameter whose call sites agree.  A name alone (``model``) is not evidence.

Calls are: ``f(...)``, ``self.method(...)``, ``Class(...)`` (the class's ``__init__``: what it
stores on ``self`` follows), and ``functools.partial(f, ...)``.  Each other module exports
its call sites of tree functions (``ModuleModel.export_calls``) as entries of its calls list
named ``qualname(<facts>)`` (see ``project.args_entry``), so the pool, the cache snapshot and
the language server count them with the calls; the callee asks ``Aspect.ARGS`` through the
project view, and its results depend on the answer like on any other question.
"""
from __future__ import annotations

import json
from typing import Optional

import libcst as cst

from . import catalog
from .binder import dotted
from .ir import CallOp, all_ops

_PASSTHROUGH = catalog.MODULE_SELF_METHODS
_WRAPPERS = catalog.MODEL_WRAPPERS
_PARTIAL = {"functools.partial"}
_FWD = ("probs", "logprobs", "sigmoid", "logits")
_MISSING = "-"  # a site that passes nothing (or nothing known) for a parameter
_STAR = "*"  # a site with ``*args``/``**kwargs``: its arguments cannot be matched


def evidence_role(mm, fn, expr, depth: int = 0) -> Optional[tuple]:
    """``(role, info)`` of ``expr`` in ``fn`` by evidence only (a constructor, a wrapper, a
    parameter whose call sites agree), or ``None``.  ``info`` is a model's class
    (key-qualified for classes of this module too) or a loss kind."""
    if depth > 6 or expr is None:
        return None
    if isinstance(expr, cst.Call):
        func = expr.func
        d = dotted(func)
        q = mm.qualify(d) if d else None
        if q:
            role, info = catalog.role_of_constructor(q)
            if role:
                return (role, info)
            if q in _WRAPPERS and expr.args:
                return evidence_role(mm, fn, expr.args[0].value, depth + 1)
        if d:
            cls = mm.find_class(d)
            if cls is not None:
                if mm.class_is_module(cls):
                    return (catalog.MODEL, f"{mm.module_name}.{cls.qualname}" if mm.module_name else cls.qualname)
                return None
            ext = mm.external_class(d)
            if ext and ext.get("is_module"):
                return (catalog.MODEL, mm.external_class_name(d))
        if isinstance(func, cst.Attribute) and func.attr.value in _PASSTHROUGH:
            return evidence_role(mm, fn, func.value, depth + 1)
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    path = dotted(expr)
    if not path or path == "self":
        return None
    memo = mm.__dict__.setdefault("_evidence_roles", {})
    key = (id(fn), path)
    if key in memo:
        return memo[key]
    memo[key] = None  # in progress (``model = model.to(device)``)
    got = memo[key] = _path_evidence(mm, fn, path, depth)
    return got


def _path_evidence(mm, fn, path: str, depth: int) -> Optional[tuple]:
    if path.startswith("self."):
        owner = fn if fn.cls is not None else fn.parent
        if owner is None or owner.cls is None:
            return None
    try:
        d = mm.resolver.definition(fn, path)
    except RecursionError:
        return None
    if d is not None:
        return evidence_role(mm, d[0], d[1], depth + 1)
    f = fn
    while f is not None:
        if path in f.params:
            return param_role(mm, f, path)
        f = f.parent
    return None


def _model_fwd(mm, fn, expr) -> list:
    """What the model passed as ``expr`` returns (a ``Sequential`` ending in a softmax ...)."""
    from .dataflow import call_output_facts, model_output_facts

    try:
        if isinstance(expr, cst.Call):
            facts = call_output_facts(mm, fn, expr)
        else:
            facts = model_output_facts(mm, fn, dotted(expr))
    except RecursionError:
        return []
    return sorted(f for f in facts if f in _FWD)


def arg_fact(mm, fn, expr) -> Optional[list]:
    """What a call site tells its callee about one argument: ``[role, info]`` (and, for a
    model of no known class, ``[role, None, forward facts]``), or ``None``."""
    r = evidence_role(mm, fn, expr)
    if r is None or r[0] is None:
        return None
    if r[0] == catalog.MODEL and r[1] is None:
        fwd = _model_fwd(mm, fn, expr)
        if fwd:
            return [r[0], None, fwd]
    return [r[0], r[1]]


def site_facts(mm, fn, args) -> dict:
    """``{position or keyword: fact}`` for the arguments of one call site (``{"*": 1}`` when a
    starred argument hides which parameter gets what)."""
    out: dict = {}
    i = 0
    for a in args:
        if a.star:
            return {_STAR: 1}
        key = a.keyword.value if a.keyword is not None else str(i)
        if a.keyword is None:
            i += 1
        out[key] = arg_fact(mm, fn, a.value)  # null: passed, nothing known
    return out


def _bound(fn) -> bool:
    """A method whose first parameter is bound by the call (``self``/``cls``)."""
    return fn.cls is not None and bool(fn.params) and fn.params[0] in ("self", "cls") \
        and "staticmethod" not in " ".join(fn.decorators)


def _local_sites(mm) -> dict:
    """id(callee FunctionModel) -> [(caller, args, offset)] for the calls of this module:
    ``f(...)``, ``self.m(...)``, ``Class(...)`` (its ``__init__``), ``partial(f, ...)``."""
    got = mm.__dict__.get("_local_call_sites")
    if got is not None:
        return got
    got = mm.__dict__["_local_call_sites"] = {}
    for f in mm.all_functions:
        for op in all_ops(f):
            if not isinstance(op, CallOp) or op.func is None:
                continue
            args = op.args
            q = op.qual or ""
            if q in _PARTIAL and args and args[0].keyword is None and not args[0].star:
                name = dotted(args[0].value)
                target = _local_target(mm, f, name)
                if target is not None:
                    got.setdefault(id(target), []).append((f, args[1:]))
                continue
            target = _local_target(mm, f, op.func, op.node)
            if target is not None:
                got.setdefault(id(target), []).append((f, args))
    return got


def _local_target(mm, fn, name: Optional[str], at=None):
    """The function of this module a call of ``name`` from ``fn`` runs (a class: its
    ``__init__``), or ``None``; a call at ``at`` in top-level code runs the definition above it."""
    if not name:
        return None
    cls = mm.classes.get(name) if "." not in name else None
    if cls is not None:
        init = mm._method_of(cls, "__init__")  # its own or a local base class's
        return init if not hasattr(init, "module") else None
    base, _, meth = name.rpartition(".")
    if base == "self":
        owner = fn if fn.cls is not None else fn.parent
        if owner is None or owner.cls is None:
            return None
        m = owner.cls.methods.get(meth)
        return m
    if "." in name:
        return None
    f = fn
    while f is not None:
        for n in f.nested:
            if n.name == name:
                return n
        f = f.parent
    if at is not None and fn.is_module_level and name in mm.redefined_functions:
        return mm.defined_above(name, at) or mm.functions.get(name)
    return mm.functions.get(name)


def _local_facts(mm, fn) -> list:
    """The facts dict of every call site of ``fn`` in this module."""
    memo = mm.__dict__.setdefault("_call_site_facts", {})
    got = memo.get(id(fn))
    if got is None:
        memo[id(fn)] = []  # a recursive call (f passes its own parameter to itself) adds nothing
        got = memo[id(fn)] = [site_facts(mm, caller, args) for caller, args in _local_sites(mm).get(id(fn), ())]
    return got


def _agree(values) -> Optional[list]:
    agreed = None
    for v in values:
        if v is None:
            return None
        if agreed is None:
            agreed = v
        elif v != agreed:
            if v[:1] == agreed[:1] and v[0] == catalog.MODEL:
                agreed = [catalog.MODEL, None]  # models of different classes
            else:
                return None
    return agreed


def param_site(mm, fn, name: str) -> Optional[list]:
    """The fact every call site of ``fn`` (here and in the other modules) agrees on for its
    parameter ``name`` (see :func:`arg_fact`), or ``None`` (no call site, a site without
    evidence, or sites that disagree)."""
    memo = mm.__dict__.setdefault("_param_site", {})
    k = (id(fn), name)
    if k in memo:
        return memo[k]
    memo[k] = None  # in progress: a cycle of calls agrees on nothing
    params = [p for p in fn.params if not p.startswith("*")]
    if name not in params:
        return None
    idx = params.index(name) - (1 if _bound(fn) else 0)
    values = []
    default = _default_fact(mm, fn, name)
    for s in _local_facts(mm, fn):
        if _STAR in s:
            return None
        v = s.get(name)
        if v is None and idx >= 0:
            v = s.get(str(idx))
        if v is None and name in fn.defaults and not _passes(s, name, idx):
            v = default  # the call leaves the parameter at its default
        values.append(v)
    if values and _agree(values) is None:
        return None  # this module's own sites already agree on nothing: no other module can change that
    exported = not fn.is_module_level and fn.parent is None and bool(mm.module_name)
    if exported:
        qual = f"{mm.module_name}.{fn.qualname}"
        guess = catalog.role_from_name(name) if mm.is_torch_code else None
        ext = mm.project.param_sites(qual, idx, name, guess)
        if ext is not None:
            values.append(ext)
        elif values and mm.project.is_called(qual):
            # other modules call it and agree on nothing, or on nothing but what its name says
            return None
    if not values and default is not None and not (exported and mm.project.is_called(qual)):
        values = [default]  # never called with it in the linted code: its default
    agreed = _agree(values) if values else None
    memo[k] = agreed
    return agreed


def _passes(site: dict, name: str, idx: int) -> bool:
    """The call site passes something (known or not) for the parameter."""
    return name in site or (idx >= 0 and str(idx) in site)


def _default_fact(mm, fn, name: str) -> Optional[list]:
    """What the default of parameter ``name`` is (``loss=nn.CrossEntropyLoss()``), evaluated
    where the ``def`` is."""
    d = fn.defaults.get(name)
    if d is None:
        return None
    scope = fn.parent or mm.module_function
    return arg_fact(mm, scope, d)


def param_role(mm, fn, name: str) -> Optional[tuple]:
    """``(role, info)`` of parameter ``name`` of ``fn`` from its call sites, or ``None``.
    ``info`` of a model is its class: a local qualname for a class of this module, else
    key-qualified."""
    v = param_site(mm, fn, name)
    if v is None:
        return None
    info = v[1] if len(v) > 1 else None
    if v[0] == catalog.MODEL and isinstance(info, str) and mm.module_name \
            and info.startswith(mm.module_name + ".") and info[len(mm.module_name) + 1:] in mm.classes:
        info = info[len(mm.module_name) + 1:]
    return (v[0], info)


def param_forward(mm, fn, name: str) -> frozenset:
    """What the model every call site passes as ``name`` returns, when they say (a model of
    no class: a ``Sequential`` ending in a softmax ...)."""
    v = param_site(mm, fn, name)
    if v is None or v[0] != catalog.MODEL or len(v) < 3:
        return frozenset()
    return frozenset(v[2])


def export_entries(mm):
    """``(entry, under_no_grad)`` for each call site of a function or class of another tree
    module (see :func:`project.args_entry`): ``f(...)``, ``self.m(...)`` of an inherited
    method, ``Class(...)`` (its ``__init__``), ``partial(f, ...)``.  A call that binds no
    parameter knowably (``Class.method(obj, ...)``) is left out."""
    from ..project import args_entry
    from .ir import CALL, GRAD_OFF

    for f in mm.all_functions:
        for op in all_ops(f):
            if not isinstance(op, CallOp) or op.func is None:
                continue
            args, name = op.args, op.func
            if (op.qual or "") in _PARTIAL:
                if not args or args[0].keyword is not None or args[0].star:
                    continue
                name, args = dotted(args[0].value), args[1:]
                if not name or _local_target(mm, f, name) is not None:
                    continue
                ref = mm._external(mm.qualify(name))
            elif op.kind == CALL:
                ref = op.info
            else:
                continue
            if ref is None or not hasattr(ref, "qualname"):
                continue
            qual = mm.project.resolve(ref.qualname)
            if mm.project.class_facts(qual) is not None:
                init = mm.project.method(qual, "__init__")  # its own or a base class's
                if init is None:
                    continue
                qual = mm.project.resolve(init)
            elif "." in ref.name and not name.startswith(("self.", "super().")) \
                    and (op.qual or "") not in _PARTIAL:
                continue  # Class.method(obj, ...): which parameter gets what is unknown
            if op.kind != CALL or qual.endswith(".__init__"):
                yield qual, op.grad == GRAD_OFF  # called, like a plain call
            yield args_entry(qual, site_facts(mm, f, args)), op.grad == GRAD_OFF


# ---------------------------------------------------------------- call-site contexts
def _owner_class(fn):
    """The class whose method ``fn`` is (or whose method encloses it)."""
    f = fn
    while f is not None and f.cls is None:
        f = f.parent
    return f.cls if f is not None else None


def _local_ancestors(mm, cls, depth: int = 0) -> list:
    out = []
    for raw in cls.raw_bases:
        base = mm.find_class(raw)
        if base is not None and base is not cls and depth < 8:
            out.append(base)
            out.extend(_local_ancestors(mm, base, depth + 1))
    return out


def method_sites(mm, fn) -> list:
    """``[(caller, op)]``: the calls of this module that may run the method ``fn`` besides the
    ones bound to it directly: ``self.name(...)`` in a method of a class where ``self`` may be
    an instance of ``fn``'s class (that class, a class it inherits ``fn`` from, or a base class
    whose method calls a name only a subclass defines, as an evaluator's ``run_all_evals``
    calls ``self.evaluate_mt``), ``super().name(...)`` in a subclass, and ``obj.name(...)``
    where ``obj`` is, by evidence, an instance of a class that runs ``fn`` for ``name``."""
    cls = _owner_class(fn)
    if cls is None or fn.cls is None:
        return []
    name = fn.name
    memo = mm.__dict__.setdefault("_method_sites", {})
    if id(fn) in memo:
        return memo[id(fn)]
    related = {id(cls)} | {id(a) for a in _local_ancestors(mm, cls)}
    out = []
    for f in mm.all_functions:
        for op in all_ops(f):
            if not isinstance(op, CallOp) or op.attr != name or op.recv is None:
                continue
            if op.recv == "self":
                owner = _owner_class(f)
                if owner is None:
                    continue
                if mm._method_of(owner, name) is fn or id(owner) in related and owner is not cls:
                    out.append((f, op))
            elif op.recv == "super()":
                owner = _owner_class(f)
                if owner is not None and any(a is cls for a in _local_ancestors(mm, owner)):
                    out.append((f, op))
            elif "(" not in op.recv:
                ev = evidence_role(mm, f, op.recv_node)
                if ev is None or ev[0] != catalog.MODEL or not isinstance(ev[1], str) or not mm.module_name \
                        or not ev[1].startswith(mm.module_name + "."):
                    continue
                inst = mm.find_class(ev[1][len(mm.module_name) + 1:])
                if inst is not None and mm._method_of(inst, name) is fn:
                    out.append((f, op))
    memo[id(fn)] = out
    return out


def only_called_without_grad(mm, fn, depth: int = 0) -> bool:
    """Every call of ``fn`` the linted tree shows runs with gradients off, and there is one:
    a call under ``no_grad``/``inference_mode`` (a ``with`` block or a decorator), or from a
    function that is itself only called so. Calls are the ones bound to ``fn`` in this module,
    the method calls that may run it (:func:`method_sites`) and the calls of other modules
    (``Aspect.NO_GRAD_CALLERS``). A call-site context, as a call-site role: ``generate()``
    called only from a ``@torch.no_grad()`` ``test()`` runs without a graph."""
    from .ir import GRAD_OFF

    if fn.is_module_level or depth > 4:
        return False
    memo = mm.__dict__.setdefault("_only_nograd", {})
    if id(fn) in memo:
        return memo[id(fn)]
    memo[id(fn)] = False  # a recursive call is not evidence
    sites, seen = [], set()
    for caller, op in list(mm.callers(fn)) + method_sites(mm, fn):
        if id(op) not in seen:
            seen.add(id(op))
            sites.append((caller, op))
    q = f"{mm.module_name}.{fn.qualname}" if mm.module_name else None
    external = bool(q) and fn.parent is None and mm.project.is_called(q)
    res = bool(sites) or external
    if res and external:
        res = mm.project.only_called_under_no_grad(q)
    for caller, op in sites:
        if not res:
            break
        res = op.grad == GRAD_OFF or _grad_off_function(caller) or only_called_without_grad(mm, caller, depth + 1)
    if not sites and not external and fn.cls is not None and fn.parent is None:
        # an override of a method of a base class in another module, called by nothing here: the
        # base class's own calls of that method (``self.evaluate()`` in its ``validate()``) run it
        res = _base_calls_without_grad(mm, fn)
    memo[id(fn)] = res
    return res


def _base_calls_without_grad(mm, fn) -> bool:
    """The method of ``fn``'s name that ``fn``'s class inherits from a base class of another
    module is, by that module's summary, called only with gradients off (``called_without_grad``)."""
    cls = fn.cls
    for raw in getattr(cls, "raw_bases", ()):
        if mm.find_class(raw) is not None:
            continue  # a base of this module: its calls are among this module's sites
        ext = mm.external_class_name(raw)
        m = mm.project.method(ext, fn.name) if ext else None
        if m is not None:
            return bool((mm.project.summary(m) or {}).get("called_without_grad"))
    return False


def evaluated_by_callers(mm, fn, paths) -> Optional[object]:
    """The ``eval()`` that leaves the ``self`` models at ``paths`` in eval mode at every call
    of the method ``fn``: a batch loop of its own (``_inner_loop(dl, ...)``) that the
    validation and test methods of its class call right after ``self.model.eval()``.  There
    must be a call in this module, every such call must see only eval mode, and no other
    module may call ``fn``; else ``None``."""
    if fn.is_module_level or fn.cls is None or not paths or not all(p.startswith("self.") for p in paths):
        return None
    sites = list(mm.callers(fn)) + method_sites(mm, fn)
    q = f"{mm.module_name}.{fn.qualname}" if mm.module_name else None
    if not sites or (q and mm.project.is_called(q)):
        return None
    origin = None
    for caller, op in sites:
        if caller.cls is not fn.cls:
            return None
        for p in paths:
            modes = mm.flow(caller).modes_at(op, p)
            if not modes or any(m != "eval" for m, _ in modes):
                return None
            origin = origin or next(iter(modes))[1]
    return origin


def _grad_off_function(fn) -> bool:
    from .ir import GRAD_OFF

    f = fn
    while f is not None:
        if f.decorator_grad == GRAD_OFF:
            return True
        f = f.parent
    return False


def export_method_calls(mm):
    """``(method, under_no_grad)`` for each ``obj.name(...)`` whose ``obj`` is, by evidence, an
    instance of a class of another tree module (``model = Model(...); model.generate(x)``):
    counted as calls of that class's method (its own or a base class's), so the method's module
    knows the context it is called in."""
    from .ir import CALL, GRAD_OFF

    for f in mm.all_functions:
        for op in all_ops(f):
            if not isinstance(op, CallOp) or op.kind == CALL or not op.attr or op.recv is None \
                    or op.recv == "self" or "(" in op.recv or op.attr.startswith("__"):
                continue
            if op.qual and op.qual != op.func:
                continue  # ``np.array(...)``, ``torch.load(...)``: a call through an import
            ev = evidence_role(mm, f, op.recv_node)
            if ev is None or ev[0] != catalog.MODEL or not isinstance(ev[1], str) \
                    or (mm.module_name and ev[1].startswith(mm.module_name + ".")):
                continue
            m = mm.project.method(ev[1], op.attr)
            if m is not None:
                yield mm.project.resolve(m), op.grad == GRAD_OFF


def subclass_eval_loops(mm, fn, op) -> Optional[tuple]:
    """A method's ``self.name(...)`` call that runs, in every subclass of the tree that overrides
    ``name`` in another module, an evaluation loop inheriting the caller's grad mode (summary
    ``eval_loop``), while this class's own ``name`` evaluates nothing (a stub the subclasses
    fill in, as a trainer's ``test()`` calls ``self.evaluate(loaders)`` right after
    ``self.model.eval()``): ``(overrides, origin)``, the key-qualified overriding methods
    and the ``eval()`` that leaves the ``self`` models in eval mode at the call (every model
    the method switches is in eval mode there, none in train mode); else ``None``."""
    from .flow import norm_path
    from .ir import CALL, MODE

    if fn.is_module_level or fn.cls is None or not isinstance(op, CallOp) or op.kind != CALL \
            or op.recv != "self" or not op.attr or op.grad is not None:
        return None
    own = op.info
    if getattr(own, "cls", None) is None or not mm.module_name:
        return None
    s = mm.summary_of(own) or {}
    if s.get("forward") or s.get("backward") or s.get("step"):
        return None  # the class's own method does the work (or trains): not a stub
    paths = {norm_path(o.target) for o in all_ops(fn) if isinstance(o, CallOp) and o.kind == MODE
             and o.target and o.target.startswith("self.")}
    if not paths:
        return None
    flow, origin = mm.flow(fn), None
    for p in sorted(paths):
        modes = flow.modes_at(op, p)
        if not modes or any(m != "eval" for m, _ in modes):
            return None
        origin = origin or next(iter(modes))[1]
    cls_key = f"{mm.module_name}.{own.cls.qualname}"
    found = mm.project.overrides(cls_key, op.attr)
    own_methods = {f"{mm.module_name}.{c.qualname}.{op.attr}" for c in mm.classes.values()}
    if not found or any(q in own_methods for q in found):
        return None  # subclasses of this module: their own loops are checked here
    for q in found:
        t = mm.project.summary(q) or {}
        if not t.get("eval_loop"):
            return None
    return found, origin

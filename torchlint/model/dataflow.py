"""Value facts: where a value came from and what it holds, inside one function.

Facts are small strings collected in frozensets:

``graph``     attached to the autograd graph (model outputs, losses, ops on them)
``loss``      a loss value
``model_out`` returned by a model call
``probs``     softmax probabilities      ``logprobs``  log_softmax output
``sigmoid``   sigmoid output              ``logits``    raw scores of a model whose forward ends in a layer
``detached``  ``.detach()``ed             ``scalar``    a Python number (``.item()``, ``float()``)
``batch``     from iterating a loader     ``moved``     moved with ``.to``/``.cuda``
``float``     cast to floating point      ``fresh``     a new tensor (zeros, empty, clone)
``param``     a parameter

The pass walks the ops in program order (loops twice, branches joined) and stores, on
each op, the facts of its arguments, so rules read them without re-evaluating anything.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from . import catalog
from .binder import dotted
from .ir import (
    FORWARD, GRAD_OFF, LOSS, AssignOp, BranchOp, CallOp, DefOp, LoopOp, ReturnOp,
)

EMPTY: frozenset = frozenset()
_KEEP_METHODS = {"view", "reshape", "squeeze", "unsqueeze", "flatten", "permute", "transpose",
                 "contiguous", "mean", "sum", "clone", "t", "expand", "expand_as", "view_as",
                 "chunk", "split", "narrow", "select", "gather", "index_select", "masked_fill",
                 "type_as", "repeat", "squeeze_", "unsqueeze_", "__getitem__"}
_DEVICE_METHODS = {"to", "cuda"}
_SCALAR_METHODS = {"item", "tolist", "numpy"}
_PROB_KINDS = ("probs", "sigmoid", "logprobs", "logits")


def _strip(f: frozenset, *names: str) -> frozenset:
    return f.difference(names)


class Dataflow:
    def __init__(self, mm, fn, resolver):
        self.mm = mm
        self.fn = fn
        self.resolver = resolver
        self.call_ops: dict[int, CallOp] = {}
        for op in _all_calls(fn.body):
            self.call_ops[id(op.node)] = op

    # ---------------------------------------------------------------- driver
    def run(self) -> None:
        env: dict[str, frozenset] = {}
        for p in self.fn.params:
            role = self.resolver.of_path(self.fn, p)[0]
            if role is None and p not in ("self", "cls"):
                env[p] = frozenset({"param_in"})
        self._block(self.fn.body, env)

    def _block(self, block, env) -> dict:
        for op in block:
            env = self._op(op, env)
        return env

    def _op(self, op, env) -> dict:
        if isinstance(op, CallOp):
            op.recv_facts = self.facts(op.recv_node, env) if op.recv_node is not None else EMPTY
            op.arg_facts = tuple(self.facts(a.value, env) for a in op.args)
            return env
        if isinstance(op, AssignOp):
            if op.value is None:
                return env
            vf = self.facts(op.value, env)
            if op.grad == GRAD_OFF:
                vf = _strip(vf, "graph")
            op.value_facts = vf
            if op.aug is not None:
                t = op.targets[0]
                d = dotted(t)
                op.target_facts = env.get(d, EMPTY) if d else EMPTY
                if d:
                    env = dict(env)
                    env[d] = op.target_facts | (vf & {"graph", "loss"})
                return env
            env = dict(env)
            for t in op.targets:
                self._bind(t, op.value, vf, env)
            return env
        if isinstance(op, ReturnOp):
            if op.value is not None:
                op.value_facts = self.facts(op.value, env)
            return env
        if isinstance(op, LoopOp):
            env = dict(env)
            if not op.is_while and op.target is not None:
                itf = self._iter_facts(op, env)
                self._bind(op.target, None, itf, env)
            first = self._block(op.body, env)
            merged = _join(env, first)
            if not op.is_while and op.target is not None:
                self._bind(op.target, None, self._iter_facts(op, merged), merged)
            second = self._block(op.body, merged)
            out = _join(merged, second)
            if op.orelse:
                out = self._block(op.orelse, out)
            return out
        if isinstance(op, BranchOp):
            outs = [self._block(arm, dict(env)) for arm in op.arms]
            if not op.exhaustive:
                outs.append(env)
            res = outs[0]
            for o in outs[1:]:
                res = _join(res, o)
            return res
        return env

    def _iter_facts(self, loop: LoopOp, env) -> frozenset:
        it = loop.iter
        # enumerate(loader) / tqdm(loader) / zip(...)
        while isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "tqdm", "tqdm.tqdm", "iter") and it.args:
            it = it.args[0].value
        role = self.resolver.of_expr(self.fn, it)[0]
        if role == catalog.LOADER:
            return frozenset({"batch"})
        base = self.facts(it, env)
        if "batch" in base:
            return frozenset({"batch"})
        return EMPTY

    def _bind(self, target, value, vf: frozenset, env: dict) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            elts = [e.value for e in target.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elts):
                for te, ve in zip(elts, value.elements):
                    self._bind(te, ve.value, self.facts(ve.value, env), env)
            else:
                elem = vf - {"loss"} if "batch" not in vf else frozenset({"batch"} | (vf & {"moved"}))
                for te in elts:
                    self._bind(te, None, elem, env)
            return
        if isinstance(target, cst.StarredElement):
            self._bind(target.value, None, vf, env)
            return
        d = dotted(target)
        if d:
            env[d] = vf

    # ---------------------------------------------------------------- expressions
    def facts(self, e, env) -> frozenset:
        if e is None:
            return EMPTY
        tp = type(e)
        if tp is cst.Name or tp is cst.Attribute:
            d = dotted(e)
            if d is not None:
                if d in env:
                    return env[d]
                if tp is cst.Attribute:
                    if e.attr.value in ("data",):
                        return _strip(self.facts(e.value, env), "graph") | {"data"}
                    if e.attr.value == "grad":
                        return frozenset({"grad"})
                    base = self.facts(e.value, env)
                    return base & {"batch", "moved"}
            return EMPTY
        if tp is cst.Call:
            return self._call_facts(e, env)
        if tp is cst.Subscript:
            return self.facts(e.value, env) - {"loss"} if False else self.facts(e.value, env)
        if tp is cst.BinaryOperation:
            lf, rf = self.facts(e.left, env), self.facts(e.right, env)
            both = lf | rf
            keep = both & {"graph", "loss", "batch", "moved"}
            return keep
        if tp is cst.UnaryOperation:
            return self.facts(e.expression, env) & {"graph", "loss"}
        if tp in (cst.Tuple, cst.List):
            out = EMPTY
            for el in e.elements:
                out = out | self.facts(el.value, env)
            return out & {"graph", "loss", "batch", "moved"}
        if tp is cst.DictComp:
            return self._dictcomp_facts(e, env)
        if tp is cst.IfExp:
            return self.facts(e.body, env) | self.facts(e.orelse, env)
        return EMPTY

    def _dictcomp_facts(self, e, env) -> frozenset:
        v = e.value
        if isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value in _DEVICE_METHODS:
            return frozenset({"batch", "moved"})
        if isinstance(v, cst.IfExp):
            b = v.body
            if isinstance(b, cst.Call) and isinstance(b.func, cst.Attribute) and b.func.attr.value in _DEVICE_METHODS:
                return frozenset({"batch", "moved"})
        return EMPTY

    def _call_facts(self, e: cst.Call, env) -> frozenset:
        op = self.call_ops.get(id(e))
        func = e.func
        q = op.qual if op is not None else None
        grad_off = op is not None and op.grad == GRAD_OFF
        out: frozenset
        if op is not None and op.kind == FORWARD:
            out = frozenset({"graph", "model_out"}) | self.mm.forward_output_facts(self.fn, op)
        elif op is not None and op.kind == LOSS:
            out = frozenset({"graph", "loss"})
        elif q in catalog.SOFTMAX_FUNCS:
            out = self._arg0(e, env) & {"graph", "detached", "batch", "moved"} | {"probs"}
        elif q in catalog.LOG_SOFTMAX_FUNCS:
            out = self._arg0(e, env) & {"graph", "detached", "moved"} | {"logprobs"}
        elif q in catalog.SIGMOID_FUNCS:
            out = self._arg0(e, env) & {"graph", "detached", "moved"} | {"sigmoid"}
        elif q in catalog.FRESH_FACTORIES:
            out = frozenset({"fresh"})
        elif q in ("torch.log",) and e.args:
            a = self._arg0(e, env)
            out = (a - {"probs"}) | ({"logprobs"} if "probs" in a else EMPTY)
        elif isinstance(func, cst.Attribute):
            m = func.attr.value
            base = self.facts(func.value, env)
            if m == "detach":
                out = _strip(base, "graph") | {"detached"}
            elif m in _SCALAR_METHODS:
                out = frozenset({"scalar"})
            elif m in _DEVICE_METHODS:
                out = base | {"moved"}
            elif m in ("float", "double", "half"):
                out = base | {"float"}
            elif m in ("long", "int"):
                out = base - {"float"}
            elif m == "softmax":
                out = (base & {"graph", "detached"}) | {"probs"}
            elif m == "log_softmax":
                out = (base & {"graph", "detached"}) | {"logprobs"}
            elif m == "sigmoid":
                out = (base & {"graph", "detached"}) | {"sigmoid"}
            elif m == "log" and "probs" in base:
                out = (base - {"probs"}) | {"logprobs"}
            elif m == "clone":
                out = base | {"fresh"}
            elif m in _KEEP_METHODS:
                out = base
            elif m in ("argmax", "max", "eq", "topk", "sort"):
                out = base - {"loss", "probs", "sigmoid", "logprobs"}
            else:
                out = base & {"graph", "batch", "moved"}
        else:
            d = dotted(func)
            if d in ("float", "int"):
                out = frozenset({"scalar"})
            else:
                out = EMPTY
        if grad_off:
            out = _strip(out, "graph")
        return out

    def _arg0(self, e: cst.Call, env) -> frozenset:
        if not e.args:
            return EMPTY
        return self.facts(e.args[0].value, env)


def _join(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, EMPTY) | v
    return out


def _all_calls(block):
    for op in block:
        if isinstance(op, CallOp):
            yield op
        elif isinstance(op, LoopOp):
            yield from _all_calls(op.body)
            yield from _all_calls(op.orelse)
        elif isinstance(op, BranchOp):
            for arm in op.arms:
                yield from _all_calls(arm)

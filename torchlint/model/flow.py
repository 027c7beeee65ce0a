"""Mode flow and function summaries.

*Mode flow* follows, through one function, which mode (``train``/``eval``) each model can be
in at every forward pass and call.  A model's state is a set of ``(mode, origin)`` pairs; the
mode ``entry`` means "whatever the caller left".  Loops are iterated to a fixpoint, so a
switch to eval at the end of an epoch reaches the next epoch's training step (the back edge).

A *summary* condenses a function for its callers: the mode it leaves each parameter and
``self`` attribute in, whether it trains or evaluates a model in the mode it was given,
whether it clears gradients, steps, runs backward.  Summaries are plain dicts, so they can
be cached and shipped between processes; the project table resolves calls across modules.
The mode a function leaves a model in says where it was set: ``[mode, function, path, line]``
(a :class:`ModeOrigin` when read).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import libcst as cst

from . import catalog
from .binder import dotted
from .ir import (
    AUTOGRAD_GRAD, BACKWARD, CALL, CLEAR, FORWARD, GRAD_OFF, GRAD_ON, MODE, SCHED_STEP, STEP,
    AssignOp, BranchOp, CallOp, JumpOp, LoopOp, ReturnOp, all_ops, walk,
)

ENTRY = "entry"
LOADED = "loaded"  # a ``return_modes`` entry: the helper returns a ``from_pretrained()`` model
CHOSEN = "chosen"  # marks a mode picked by a condition (if training: train() else: eval())
State = dict  # path -> frozenset[(mode, ModeOrigin)]


@dataclass(frozen=True)
class ModeOrigin:
    """Where a model's mode was set: a call or an assignment of this module (``node``; the
    position is rendered in the message, ``text`` may hold ``{}`` for its line), or a function
    whose summary says so (``text`` names it, at ``path``:``line``, a path token)."""

    text: str
    node: Any = None  # a libcst node (compared by identity)
    chosen: bool = False  # picked by a condition on purpose (if training: train() else: eval())
    # ``X.from_pretrained(...)`` (transformers, diffusers, peft) returns the model in eval mode:
    # such a state is ``ENTRY`` for every other question (no caller's mode is known), and an
    # evaluation of it is in eval mode
    loaded: bool = False
    # the mode a helper returns a model in (``return_modes``): a freshly built model is in
    # train mode without anybody switching it
    returned: bool = False
    path: str = ""
    line: int = 0

    @classmethod
    def of_exit(cls, entry) -> "ModeOrigin":
        """The origin of a summary's ``exit_modes`` entry ``[mode, function, path, line]``."""
        _, name, path, line = entry
        return cls(f"`{name}()`", path=path, line=line)


def norm_path(p: Optional[str]) -> Optional[str]:
    if p is None:
        return None
    for suffix in (".module", ".model"):
        # model.module (DataParallel) is the same model for modes
        if p.endswith(".module"):
            p = p[: -len(".module")]
    return p


class ModeFlow:
    def __init__(self, mm, fn):
        self.mm = mm
        self.fn = fn
        self.at: dict[int, frozenset] = {}  # id(op) -> modes of the op's model/argument
        self.at_args: dict[int, dict] = {}  # id(CALL op) -> {param key: modes}
        self.before_call: dict[int, dict] = {}  # id(CALL op) -> the state it runs in (``modes_at``)
        self.final: State = {}
        self.returns: dict = {}  # id(ReturnOp) -> (op, state where it returns)
        self._calls: Optional[dict] = None

    def modes(self, state: State, path: str) -> frozenset:
        path = norm_path(path)
        v = state.get(path)
        if v is None:
            if self._constructed_here(path):
                return frozenset({("train", None)})
            return frozenset({(ENTRY, None)})
        return v

    def modes_at(self, op, path: str) -> Optional[frozenset]:
        """The modes of the model at ``path`` when the call ``op`` of a function of the tree
        runs (``None`` for an op that is not such a call)."""
        st = self.before_call.get(id(op))
        return None if st is None else self.modes(st, path)

    def _constructed_here(self, path) -> bool:
        # module-level models start in train mode (nn.Module's default)
        return self.fn.is_module_level and "." not in path

    def run(self) -> "ModeFlow":
        self.final = self._block(self.fn.body, {})
        return self

    def exit_state(self) -> State:
        """The modes the function may leave its models in: at its end or at any ``return``."""
        out = self.final
        for _, st in self.returns.values():
            out = _join_entry(out, st, self)
        return out

    def _block(self, block, st: State) -> State:
        for op in block:
            st = self._op(op, st)
        return st

    def _op(self, op, st: State) -> State:
        if isinstance(op, CallOp) and op.mode_ctx:
            # inside ``with eval_mode(model):`` the model is in that mode, and at the exit back
            # in the mode it had before the ``with``
            view = dict(st)
            for mode, path, node in op.mode_ctx:
                name = dotted(node.func) or "eval_mode"
                view[norm_path(path)] = frozenset({(mode, ModeOrigin(f"`{name}({path})`", node))})
            out = self._call(op, view)
            if out is view:
                return st
            out = dict(out)
            for _, path, _ in op.mode_ctx:
                p = norm_path(path)
                if p in st:
                    out[p] = st[p]
                else:
                    out.pop(p, None)
            return out
        if isinstance(op, CallOp):
            return self._call(op, st)
        return self._other(op, st)

    def _call(self, op, st: State) -> State:
        k = op.kind
        if k == MODE and op.target:
            t = norm_path(op.target)
            origin = ModeOrigin(f"`{op.target}.{op.attr}()`", op.node,
                                chosen=self._by_argument(op) or self._mode_argument(op))
            st = dict(st)
            if op.info in ("train", "eval"):
                st[t] = frozenset({(op.info, origin)})
            else:
                st[t] = frozenset({("train", origin), ("eval", origin)})
        elif k == FORWARD and op.target:
            self.at[id(op)] = self.modes(st, op.target)
        elif k is None and op.recv_node is not None or k is None and op.func and "infer" in op.func.lower():
            from .queries import model_call_target  # a forward through a library helper or a model's method

            path = model_call_target(self.mm, self.fn, op)
            if path:
                self.at[id(op)] = self.modes(st, path)
        elif k == CALL:
            self.before_call[id(op)] = st
            summ = self.mm.summary_of(op.info)
            if summ is not None:
                argmap = self.mm.argmap(self.fn, op, summ)
                self.at_args[id(op)] = {key: self.modes(st, path) for key, path in argmap.items()}
                each = summ.get("each_modes") or {}
                if each:
                    st = self._each_modes(op, summ, each, st)
                exits = summ.get("exit_modes") or {}
                if exits:
                    st = dict(st)
                    for key, entry in exits.items():
                        path = argmap.get(key)
                        if path is not None:
                            st[norm_path(path)] = frozenset({(entry[0], ModeOrigin.of_exit(entry))})
        return st

    def _other(self, op, st: State) -> State:
        if isinstance(op, ReturnOp):
            self.returns[id(op)] = (op, st)
            return st
        if isinstance(op, AssignOp):
            if op.value is not None and op.aug is None and isinstance(op.value, cst.Call):
                returned = self._returned_modes(op.value)
                if returned:
                    # ours, hf = build_pair(cfg): the modes the helper returns its models in
                    st = dict(st)
                    elems = _unpacked(op.targets)
                    for key, entry in returned.items():
                        d = elems.get(key)
                        if d and entry[0] == LOADED:
                            # the helper returns ``X.from_pretrained(...)``: in eval mode
                            _, name, path, line = entry
                            st[norm_path(d)] = frozenset({(ENTRY, ModeOrigin(
                                f"`{name}()` (it returns a `from_pretrained()` model, in eval mode)",
                                path=path, line=line, loaded=True))})
                        elif d:
                            _, name, path, line = entry
                            st[norm_path(d)] = frozenset({(entry[0], ModeOrigin(
                                f"`{name}()`", path=path, line=line, returned=True))})
                    return st
                chained = _chained_mode(op.value)
                if chained is not None:
                    # model = build_model().eval(): the mode set last in the chain
                    st = dict(st)
                    node = op.value
                    for t in op.targets:
                        d = dotted(t)
                        if d:
                            st[norm_path(d)] = frozenset({(chained, ModeOrigin(
                                f"`.{'eval' if chained == 'eval' else 'train'}()` in the assignment of `{d}`", node))})
                    return st
                wrapped = _wrapped_model(self.mm, self.fn, op.value)
                if wrapped is not None:
                    # model = DDP(model) / torch.compile(model) / torch.jit.script(model): the
                    # wrapper runs the same modules, in the mode they are in
                    st = dict(st)
                    for t in op.targets:
                        d = dotted(t)
                        if d and norm_path(d) != norm_path(wrapped):
                            st[norm_path(d)] = self.modes(st, wrapped)
                    return st
                if _from_pretrained(op.value):
                    st = dict(st)
                    origin = ModeOrigin("`from_pretrained()` in the assignment at line {} (it returns "
                                        "the model in eval mode)", op.value, loaded=True)
                    for t in op.targets:
                        d = dotted(t)
                        if d:
                            st[norm_path(d)] = frozenset({(ENTRY, origin)})
                    return st
                role = self.mm.resolver.of_expr(self.fn, op.value)[0]
                if role == catalog.MODEL:
                    # model = Net().to(device) is freshly built (train mode); model = model.to(device),
                    # accelerator.prepare(model) and copy.deepcopy(model) keep the state
                    fresh = _freshly_built(self.mm, op.value)
                    if fresh:
                        st = dict(st)
                        for t in op.targets:
                            d = dotted(t)
                            if d:
                                st[norm_path(d)] = frozenset({("train", None)})
            return st
        if isinstance(op, LoopOp):
            cur = st
            for _ in range(4):
                out = self._block(op.body, cur)
                nxt = _join_entry(cur, out, self)
                if nxt == cur:
                    break
                cur = nxt
            # record the states with the fixpoint input
            out = self._block(op.body, cur)
            # training and evaluation loops run at least once: the mode after the loop is the
            # mode its body leaves (an epoch loop ending in eval() leaves the model in eval)
            res = out
            if op.orelse:
                res = self._block(op.orelse, res)
            return res
        if isinstance(op, BranchOp):
            outs = [self._block(arm, st) for arm in op.arms]
            if not op.exhaustive:
                outs.append(st)
            # an arm that ends in ``return``/``raise`` reaches nothing after the branch (the
            # mode restored before ``return`` runs no later forward here; the callers see it
            # through ``exit_state``)
            going_on = [o for i, o in enumerate(outs) if not _returns_or_raises(op, i)]
            if going_on and len(going_on) < len(outs):
                outs = going_on
            res = outs[0]
            for o in outs[1:]:
                res = _join_entry(res, o, self)
            if op.exhaustive and len(op.arms) > 1:
                res = self._chosen_modes(op, outs, st, res)
            return res
        return st

    def _each_modes(self, op, summ, each, st: State) -> State:
        """``set_mode('eval', [pg, ee, baseline])``: a helper that switches every model of a
        list it is given, to the mode a string argument names (summary ``each_modes``)."""
        params = list(summ.get("params", ()))
        pparams = params[1:] if params and params[0] == "self" else params
        positional = [a for a in op.args if a.keyword is None and not a.star]

        def arg(name):
            for a in op.args:
                if a.keyword is not None and a.keyword.value == name:
                    return a.value
            i = pparams.index(name) if name in pparams else -1
            return positional[i].value if 0 <= i < len(positional) else None

        for key, entry in each.items():
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str or type(entry[1]) is not dict:
                continue
            by, modes = entry
            models = arg(key)
            if not isinstance(models, (cst.List, cst.Tuple)):
                continue
            lit = ""
            if by:
                v = arg(by)
                if not isinstance(v, cst.SimpleString):
                    continue
                lit = v.evaluated_value
            mode = modes.get(lit)
            if mode not in ("train", "eval"):
                continue
            origin = ModeOrigin.of_exit([mode, summ.get("name", "?"), summ.get("path", ""), summ.get("line", 0)])
            st = dict(st)
            for el in models.elements:
                d = dotted(el.value)
                if d:
                    st[norm_path(d)] = frozenset({(mode, origin)})
        return st

    def _by_argument(self, op) -> bool:
        """The switch runs under a test of one of the function's parameters (``if train:
        model.train()`` / ``if not train: model.eval()``): the caller picks the mode on purpose."""
        params = {p.lstrip("*") for p in self.fn.params if _MODE_PARAM.search(p)}
        for br, _ in op.guards:
            test = getattr(br, "test", None)
            if test is not None and params & _names(test):
                return True
        return False

    def _mode_argument(self, op) -> bool:
        """``self.model.train(train)``: the mode is one of the function's parameters, so each
        caller picks it on purpose (``one_epoch(True)`` / ``one_epoch(False)``)."""
        if op.attr != "train" or len(op.args) != 1:
            return False
        v = op.args[0].value
        return isinstance(v, cst.Name) and v.value in {p.lstrip("*") for p in self.fn.params}

    def _returned_modes(self, value) -> dict:
        """The ``return_modes`` of the function of this tree that ``value`` (a call) runs."""
        if self._calls is None:
            self._calls = {id(o.node): o for o in all_ops(self.fn) if isinstance(o, CallOp) and o.kind == CALL}
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                and value.func.attr.value in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16"):
            value = value.func.value  # build_net().to(device)
        call = self._calls.get(id(value))
        if call is None:
            return {}
        summ = self.mm.summary_of(call.info)
        return return_modes_at(summ, call.args) if summ else {}

    def _chosen_modes(self, br, outs, before, res):
        """``if training: model.train() else: model.eval()``: the mode is chosen on purpose by
        a condition.  Such modes are marked ``CHOSEN`` in their origin, and rules do not treat
        them as a forgotten switch."""
        res = dict(res)
        for path in res:
            per_arm = [o.get(path) for o in outs]
            if any(v is None or len(v) != 1 or v == before.get(path) for v in per_arm):
                continue
            modes = {next(iter(v))[0] for v in per_arm}
            if not {"train", "eval"} <= modes:
                continue
            origin = ModeOrigin("the mode chosen by the condition at line {}", br.node, chosen=True)
            res[path] = frozenset({(m, origin) for m in modes})
        return res


def _chained_mode(value) -> Optional[str]:
    """``x.eval()`` / ``x.to(d).train(False)`` / ``x.eval().to(d)``: the mode the chain sets last."""
    base = value
    while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute):
        attr = base.func.attr.value
        if attr == "eval" and not base.args:
            return "eval"
        if attr == "train":
            if not base.args:
                return "train"
            v = base.args[0].value
            if isinstance(v, cst.Name) and v.value in ("True", "False"):
                return "train" if v.value == "True" else "eval"
            return None
        if attr not in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16", "requires_grad_"):
            return None
        base = base.func.value
    return None


def _wrapped_model(mm, fn, value) -> Optional[str]:
    """``DistributedDataParallel(model, ...)``, ``torch.compile(model)``, ``accelerator.prepare(model)``:
    the path of the model a wrapper call is given, or None."""
    base = value
    while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) \
            and base.func.attr.value in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16"):
        base = base.func.value
    if not isinstance(base, cst.Call) or not base.args:
        return None
    first = base.args[0]
    if first.keyword is not None and first.keyword.value not in ("module", "model"):
        return None
    inner = dotted(first.value)
    if not inner or mm.resolver.of_path(fn, inner)[0] != catalog.MODEL:
        return None
    d = dotted(base.func) or ""
    last = d.rsplit(".", 1)[-1]
    if last[:1].isupper() or last in ("compile", "script", "trace", "prepare", "prepare_model",
                                       "memory_efficient_fusion", "convert_sync_batchnorm",
                                       "setup", "wrap", "fully_shard", "unwrap_model", "deepcopy"):
        return inner
    return None


# parameters that are a mode flag or a phase name (train, is_training, eval_mode, phase, mode),
# not a loader or a schedule that merely names one (val_loader, eval_every, test_interval)
_MODE_PARAM = re.compile(r"^(is_|do_|in_)?(train|training|eval|evaluate|evaluation|test|testing|val|valid|validation"
                         r"|infer|inference)(_mode)?$|^(mode|phase|split|stage)$", re.I)


def _names(expr) -> set:
    """The plain names an expression reads."""
    out, stack = set(), [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, cst.Name):
            out.add(e.value)
        elif isinstance(e, cst.Attribute):
            stack.append(e.value)
        else:
            stack.extend(e.children)
    return out


def _unpacked(targets) -> dict:
    """Assignment targets by the ``return_modes`` key of the value they take: ``""`` for
    ``x = f()``, ``"0"``, ``"1"`` ... for ``a, b = f()``."""
    out = {}
    for t in targets:
        if isinstance(t, (cst.Tuple, cst.List)):
            for i, e in enumerate(t.elements):
                d = dotted(e.value) if isinstance(e, cst.Element) else None
                if d:
                    out[str(i)] = d
        else:
            d = dotted(t)
            if d:
                out[""] = d
    return out


def _return_modes(mm, fn, flow, where, returns=None) -> dict:
    """The mode of each model ``fn`` returns, the same on every ``return``: ``{"": entry}`` for
    ``return model``, ``{"0": entry, "1": entry}`` for ``return ours, hf`` (entries as in
    ``exit_modes``); a model built here is in train mode, one switched by ``eval()`` in eval.
    ``returns`` restricts it to some of the returns (``(op, state)`` pairs)."""
    per = None
    for op, st in (flow.returns.values() if returns is None else returns):
        v = op.value
        if v is None:
            return {}
        if isinstance(v, cst.Tuple):
            items = [(str(i), e.value) for i, e in enumerate(v.elements) if isinstance(e, cst.Element)]
        else:
            items = [("", v)]
        got = {}
        for key, e in items:
            m = None
            d = dotted(e)
            if d:
                got_modes = flow.modes(st, d)
                ms = {mo for mo, _ in got_modes}
                if len(ms) == 1 and ENTRY not in ms:
                    m = ms.pop()
                elif got_modes and all(o is not None and o.loaded for _, o in got_modes):
                    m = LOADED
            elif isinstance(e, cst.Call):
                m = _chained_mode(e) or ("train" if _freshly_built(mm, e) else None) or (
                    LOADED if _from_pretrained(e) else None)
            if m:
                got[key] = m
        per = got if per is None else {k: m for k, m in per.items() if got.get(k) == m}
        if not per:
            return {}
    return {k: [m, *where] for k, m in (per or {}).items()}


def _flag_test(test, params) -> Optional[tuple]:
    """``(parameter, truth)`` when ``test`` is a plain truth test of a parameter: ``train``,
    ``not train``, ``train == False``, ``train is True``; else None."""
    truth = True
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, truth = test.expression, not truth
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 \
            and isinstance(test.comparisons[0].operator, (cst.Equal, cst.Is, cst.NotEqual, cst.IsNot)) \
            and isinstance(test.comparisons[0].comparator, cst.Name) \
            and test.comparisons[0].comparator.value in ("True", "False"):
        lit = test.comparisons[0].comparator.value == "True"
        neg = isinstance(test.comparisons[0].operator, (cst.NotEqual, cst.IsNot))
        test, truth = test.left, truth == (lit != neg)
    if isinstance(test, cst.Name) and test.value in params:
        return test.value, truth
    return None


def _truth_of(e) -> Optional[bool]:
    """The truth of a literal argument or default (``True``, ``False``, ``None``, ``0``, ``1``)."""
    if isinstance(e, cst.Name) and e.value in ("True", "False", "None"):
        return e.value == "True"
    if isinstance(e, cst.Integer):
        return e.evaluated_value != 0
    return None


def _return_modes_if(mm, fn, flow, where) -> list:
    """``def get_model(args, train=False): ... if train: model.train(); return model, optim``
    then ``model.eval(); return model``: the mode of the returned models as a function of a
    flag parameter, ``[parameter, default truth ("true"/"false"/""), {"true": return_modes,
    "false": return_modes}]``, resolved per call site (``get_model(args, train=False)``); empty
    when no flag parameter separates the returns or both truths return the same modes.  A
    return counts for one truth when a test of the flag guards it, or when it follows, in the
    function's own block, an ``if flag:`` whose arm ends by returning."""
    params = [p for p in fn.params if not p.startswith("*") and p not in ("self", "cls")]
    returns = list(flow.returns.values())
    if len(returns) < 2 or not params:
        return []
    top = {id(o): i for i, o in enumerate(fn.body)}
    for p in params:
        split = {True: [], False: []}
        leaving = []  # (index in the body, truth whose arm returns)
        for i, o in enumerate(fn.body):
            if isinstance(o, BranchOp) and o.test is not None and o.leaves and o.leaves[0] \
                    and not o.exhaustive:
                ft = _flag_test(o.test, (p,))
                if ft is not None:
                    leaving.append((i, ft[1]))
        used = False
        for op, st in returns:
            truth = None
            for br, arm in op.guards:
                ft = _flag_test(getattr(br, "test", None), (p,)) if getattr(br, "test", None) is not None else None
                if ft is not None and (arm == 0 or (arm == 1 and br.exhaustive and len(br.arms) == 2)):
                    truth = ft[1] if arm == 0 else not ft[1]
            if truth is None and op.loop is None:
                first = op.guards[0][0] if op.guards else op
                at = top.get(id(first))
                if at is not None:
                    for i, t in leaving:
                        if i < at:
                            truth = not t
            if truth is None:
                split[True].append((op, st))
                split[False].append((op, st))
            else:
                used = True
                split[truth].append((op, st))
        if not used or not split[True] or not split[False]:
            continue
        by = {k: _return_modes(mm, fn, flow, where, split[t]) for k, t in (("true", True), ("false", False))}
        if by["true"] == by["false"] or not (by["true"] or by["false"]):
            continue
        d = _truth_of(fn.defaults.get(p)) if fn.defaults.get(p) is not None else None
        return [p, "" if d is None else "true" if d else "false", by]
    return []


def return_modes_at(summ, args) -> dict:
    """The ``return_modes`` of a summary for a call with these arguments (libcst ``Arg`` nodes):
    the modes its flag parameter's literal argument (or its default) picks when the summary has
    ``return_modes_if``, else its ``return_modes``."""
    cond = summ.get("return_modes_if")
    if type(cond) is list and len(cond) == 3 and type(cond[0]) is str and type(cond[2]) is dict:
        p, default, by = cond
        params = list(summ.get("params", ()))
        pparams = params[1:] if params and params[0] == "self" else params
        positional = [a for a in args if a.keyword is None and not a.star]
        got = next((a.value for a in args if a.keyword is not None and a.keyword.value == p), None)
        if got is None and p in pparams and pparams.index(p) < len(positional):
            got = positional[pparams.index(p)].value
        starred = any(a.star for a in args)
        truth = _truth_of(got) if got is not None else (None if starred or default == "" else default == "true")
        if truth is not None:
            modes = by.get("true" if truth else "false")
            return modes if type(modes) is dict else {}
    return summ.get("return_modes") or {}


def _from_pretrained(value) -> bool:
    """``X.from_pretrained(...)`` (maybe followed by ``.to(device)``/``.cuda()``)."""
    base = value
    while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) \
            and base.func.attr.value in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16", "requires_grad_"):
        base = base.func.value
    return isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) \
        and base.func.attr.value == "from_pretrained"


def _freshly_built(mm, value) -> bool:
    base = value
    while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) \
            and base.func.attr.value in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train"):
        base = base.func.value
    if not isinstance(base, cst.Call):
        return False
    d = dotted(base.func)
    if not d:
        return False
    q = mm.qualify(d) or ""
    if q.endswith(".from_pretrained") or d.endswith(".from_pretrained"):
        return False  # transformers returns pretrained models in eval mode: not a fresh train-mode model
    if catalog.role_of_constructor(q)[0] == catalog.MODEL:
        return True  # nn.Linear(...), torchvision.models.resnet18(), timm.create_model(...)
    if any(_chained_mode(a.value) == "eval" for a in base.args):
        return False  # ``WrapInception(net.eval())``: the network that runs was switched to eval
    cls = mm.find_class(d)
    if cls is not None and mm.class_is_module(cls):
        return True
    ext = mm.external_class(d) if q and hasattr(mm, "external_class") else None
    return bool(ext and ext.get("is_module"))


def _returns_or_raises(br: BranchOp, i: int) -> bool:
    """Arm ``i`` of ``br`` ends the function: its last statement is ``return`` or ``raise``."""
    if i >= len(br.arms) or i >= len(br.leaves) or not br.leaves[i] or not br.arms[i]:
        return False
    last = br.arms[i][-1]
    return isinstance(last, ReturnOp) or isinstance(last, JumpOp) and last.jump == "raise"


def _join(a: State, b: State) -> State:
    if a is b:
        return a
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] | v if k in out else v
    for k in a:
        if k not in b:
            pass
    return out


def _join_entry(a: State, b: State, flow: ModeFlow) -> State:
    keys = set(a) | set(b)
    return {k: flow.modes(a, k) | flow.modes(b, k) for k in keys}


# ------------------------------------------------------------------------- summaries
def loop_trains(loop: LoopOp) -> bool:
    for op in walk(loop.body):
        if isinstance(op, CallOp) and op.kind in (BACKWARD,):
            return True
    return False


def _each_modes(fn, keys) -> dict:
    """``for m in models: m.eval()`` on the items of a parameter, perhaps under a test of a
    string parameter (``if mode == 'eval': m.eval()``): ``{param: [by, {literal: mode}]}``
    (``by`` empty and the literal ``""`` when no test chooses).  Any other guard, or two
    switches that disagree, leave the parameter out."""
    out: dict = {}
    bad = set()
    for op in all_ops(fn):
        if not isinstance(op, CallOp):
            continue
        # (the items of a list are not known as models here: ``m.eval()`` on the loop variable)
        mode = op.info if op.kind == MODE else op.attr if op.kind is None and not op.args else None
        lp = op.loop
        if mode not in ("train", "eval") or lp is None or not op.recv:
            continue
        if lp.is_while or not isinstance(lp.target, cst.Name) or op.recv != lp.target.value \
                or not isinstance(lp.iter, cst.Name) or lp.iter.value not in keys:
            continue
        key = lp.iter.value
        by, lit = "", ""
        for br, arm in op.guards:
            t = getattr(br, "test", None)
            if arm == 0 and isinstance(t, cst.Comparison) and len(t.comparisons) == 1 \
                    and type(t.comparisons[0].operator).__name__ == "Equal" \
                    and isinstance(t.left, cst.Name) and t.left.value in keys \
                    and isinstance(t.comparisons[0].comparator, cst.SimpleString) and not by:
                by, lit = t.left.value, t.comparisons[0].comparator.evaluated_value
            elif not (isinstance(t, cst.Comparison) and isinstance(t.left, cst.Name) and t.left.value == lp.target.value):
                bad.add(key)  # (``if m is None: continue`` is no choice of mode)
        prev = out.get(key)
        if prev is None:
            out[key] = [by, {lit: mode}]
        elif prev[0] != by or prev[1].get(lit, mode) != mode:
            bad.add(key)
        else:
            prev[1][lit] = mode
    return {k: v for k, v in out.items() if k not in bad}


def function_events(fn, kinds) -> list:
    return [op for op in all_ops(fn) if isinstance(op, CallOp) and op.kind in kinds]


def summarize(mm, fn) -> dict:
    """The summary of ``fn`` for its callers (a JSON-serialisable dict)."""
    flow = mm.flow(fn)
    keys = [p for p in fn.params if not p.startswith("*") and p not in ("cls",)]
    free = free_names(mm, fn)
    where = [fn.name, mm.display_path, mm.def_line(fn)]
    exit_modes = {}
    for path, modes in flow.exit_state().items():
        key = _key_for(fn, path, keys, free)
        if key is None:
            continue
        ms = {m for m, _ in modes}
        if len(ms) == 1 and ENTRY not in ms:
            exit_modes[key] = [ms.pop(), *where]
    trains = any(True for _ in function_events(fn, (BACKWARD,)))
    # the models it runs forward once per call (not in a loop of its own), with gradients on,
    # in the mode its caller left them
    forwards = set()
    for op in function_events(fn, (FORWARD,)):
        key = _key_for(fn, norm_path(op.target), keys, free)
        if key is not None and op.loop is None and op.grad != GRAD_OFF \
                and any(m == ENTRY for m, _ in flow.at.get(id(op), ())):
            forwards.add(key)
    # does it train / evaluate a model in the mode its caller gave it?
    trains_in_entry, evals_in_entry = set(), set()
    for op in function_events(fn, (FORWARD,)):
        modes = flow.at.get(id(op), frozenset())
        key = _key_for(fn, norm_path(op.target), keys, free)
        if key is None or not any(m == ENTRY for m, _ in modes):
            continue
        if trains:
            # a forward under no_grad, or of a frozen model, is not the one being trained
            if op.grad != GRAD_OFF and (op.loop is None or _loop_or_outer_trains(op.loop)) \
                    and not mm.resolver.frozen(fn, norm_path(op.target)):
                trains_in_entry.add(key)
        elif op.grad == GRAD_OFF or fn.decorator_grad == GRAD_OFF:
            evals_in_entry.add(key)
    # transitive through calls
    for op in function_events(fn, (CALL,)):
        s = mm.summary_of(op.info)
        if not s:
            continue
        argmap = mm.argmap(fn, op, s)
        modes_at = flow.at_args.get(id(op), {})
        for ckey in s.get("trains_in_entry", ()):
            path = argmap.get(ckey)
            if path and any(m == ENTRY for m, _ in modes_at.get(ckey, frozenset())):
                k = _key_for(fn, norm_path(path), keys, free)
                if k:
                    trains_in_entry.add(k)
        for ckey in s.get("evals_in_entry", ()):
            path = argmap.get(ckey)
            if path and any(m == ENTRY for m, _ in modes_at.get(ckey, frozenset())):
                k = _key_for(fn, norm_path(path), keys, free)
                if k:
                    evals_in_entry.add(k)
    calls = function_events(fn, (CALL,))
    sub = [mm.summary_of(op.info) or {} for op in calls]
    return {
        "name": fn.name,
        "qualname": fn.qualname,
        "path": mm.display_path,
        "line": mm.def_line(fn),
        "params": keys,
        "free": sorted({k.split(".", 1)[0] for k in list(exit_modes) + sorted(trains_in_entry)
                        + sorted(evals_in_entry) if k.split(".", 1)[0] in free}),
        "exit_modes": exit_modes,
        "each_modes": _each_modes(fn, keys),
        "return_modes": _return_modes(mm, fn, flow, where) if not fn.is_module_level else {},
        # [flag parameter, its default's truth, {"true"/"false": return_modes}]: the returned
        # models' modes chosen by a flag (``get_model(args, train=False)``)
        "return_modes_if": _return_modes_if(mm, fn, flow, where) if not fn.is_module_level else [],
        # it returns a model in which a mode-dependent layer is seen (evidence for TL201)
        "returns_mode_layers": mm.resolver.returns_mode_layers(fn) if not fn.is_module_level else False,
        "trains_in_entry": sorted(trains_in_entry),
        "evals_in_entry": sorted(evals_in_entry),
        "backward": trains or any(s.get("backward") for s in sub),
        # [parameter, truth]: every backward runs only when that parameter has that truth value
        "backward_if": _backward_condition(fn, calls, sub),
        # it computes gradients with ``torch.autograd.grad`` (attacks, meta-learning inner loops)
        "autograd": bool(function_events(fn, (AUTOGRAD_GRAD,))) or any(s.get("autograd") for s in sub),
        # a backward that runs in whatever grad mode the caller set (not under enable_grad)
        "backward_inherits_grad": any(op.grad is None and not _graph_built_under_enable_grad(fn, op)
                                      and not runs_only_with_grad(mm, op)
                                      for op in function_events(fn, (BACKWARD,)))
        or any(op.grad is None and (mm.summary_of(op.info) or {}).get("backward_inherits_grad")
               and not runs_only_with_grad(mm, op) for op in calls),
        "step": bool(function_events(fn, (STEP,))) or any(s.get("step") for s in sub),
        "clear": bool(function_events(fn, (CLEAR,))) or mm.clears_by_assignment(fn)
        or any(s.get("clear") for s in sub),
        "sched_step": bool(function_events(fn, (SCHED_STEP,))) or any(s.get("sched_step") for s in sub),
        "grad": fn.decorator_grad,
        "returns": sorted(mm.return_facts(fn) | _cpu_tensor_fact(mm, fn)),
        # each item's facts when every return is a tuple of one length (``return out, loss.item()``)
        "returns_items": _items(mm.return_item_facts(fn)),
        "forward": bool(function_events(fn, (FORWARD,))) or any(s.get("forward") for s in sub),
        "forwards": sorted(forwards),
        # it runs a model forward in a loop of its own in whatever grad mode the caller set, and
        # computes no gradient (an evaluation pass: its caller decides whether graphs are built)
        "eval_loop": _eval_loop_inherits_grad(mm, fn, sub),
        # a method that every call of this module runs with gradients off (there is one): what a
        # subclass's override of it in another module inherits as its callers' grad mode
        "called_without_grad": fn.cls is not None and _called_without_grad(mm, fn),
        "moves": any(op.kind == "move" for op in all_ops(fn) if isinstance(op, CallOp))
        or any(s.get("moves") for s in sub),
        # loader parameters it iterates in a training loop / only in evaluation loops (TL701)
        **dict(zip(("trains_on", "evaluates_on"), _loader_params(mm, fn))),
        # [parameter, method, in a loop]: methods it calls on the dataset of a loader parameter
        # (``train_dl.dataset.shuffleSamples()``; TL701)
        "reshuffles": _reshuffled_params(mm, fn),
    }


def _called_without_grad(mm, fn) -> bool:
    from .callsites import only_called_without_grad

    called = mm.__dict__.get("_self_called")
    if called is None:  # the method names called on ``self`` anywhere in the module (one walk)
        called = mm.__dict__["_self_called"] = {
            op.attr for f in mm.all_functions for op in all_ops(f)
            if isinstance(op, CallOp) and op.recv == "self" and op.attr}
    return fn.name in called and only_called_without_grad(mm, fn)


def _eval_loop_inherits_grad(mm, fn, sub) -> bool:
    """A loop of ``fn`` (one that may run more than once) runs a model forward with no grad
    context of its own (``op.grad is None``), and ``fn`` runs no backward, ``autograd.grad``
    or optimizer step, directly or through its helpers."""
    if fn.decorator_grad is not None or function_events(fn, (BACKWARD, AUTOGRAD_GRAD, STEP)) or any(
            s.get("backward") or s.get("autograd") or s.get("step") for s in sub):
        return False
    for op in function_events(fn, (FORWARD,)):
        loop = op.loop
        if op.grad is None and loop is not None and not loop.runs_once and loop.grad is None:
            return True
    return False


def _cpu_tensor_fact(mm, fn) -> frozenset:
    from . import resources

    return frozenset({resources.CPU_TENSOR}) if resources.get(mm).returns_cpu_tensor(fn) else frozenset()


def _items(items: Optional[tuple]) -> list:
    """A summary's ``returns_items``: empty unless some item carries a fact."""
    return [sorted(i) for i in items] if items and any(items) else []


def _backward_condition(fn, calls, sub) -> Optional[list]:
    """``[parameter, truth, test, literal, default]`` when every backward the function runs
    (its own and its callees') is guarded by one test of the same parameter: ``if not
    cross_valid:`` (test ``"bool"``), ``if opt is not None:`` (``"none"``: the test is "not
    None"), ``if type_ == 'train':`` (``"eq"`` with the literal); ``truth`` is the value of
    the test on which the backward runs, ``default`` the test's value for the parameter's
    literal default (``None`` when unknown).  A call that passes, or leaves at its default,
    a value of the other truth (``run_epoch(loader, cross_valid=True)``, ``loss_epoch(model,
    loss_func, val_dl)`` with ``opt=None``, ``all_batches('valid')``) runs no backward.  A
    callee's condition on a parameter the function passes it its own parameter for
    (``loss_batch(loss_func, out, y, opt)`` in ``loss_epoch(..., opt=None)``) is the
    function's condition; a call that passes the callee a value of the other truth is no
    backward site."""
    params = {p.lstrip("*") for p in fn.params}
    if fn.cls is not None and fn.params and fn.params[0] == "self":
        params |= {"self." + a for a in _self_attrs_tested(fn)}  # ``if self.stage == "train":``
    own = list(function_events(fn, (BACKWARD,)))
    sites = [(op, None) for op in own] + [(op, s) for op, s in zip(calls, sub) if s.get("backward")]
    found = set()
    for op, s in sites:
        cond = None
        for br, arm in op.guards:
            t = _param_truth(br.test, params) if isinstance(br.node, cst.If) else None
            if t is None and arm == 0 and isinstance(br.node, cst.If):
                # ``if self.optimizer is not None and self.stage == "train":`` runs only when
                # each operand holds: one of them (a comparison with a literal first) is a condition
                t = _conjunct_truth(br.test, params)
            if t is not None:
                cond = (t[0], t[1] if arm == 0 else not t[1], t[2], t[3])
                break
        if cond is None and s is not None and s.get("backward_if"):
            arg = _cond_arg(op, s)
            c = s["backward_if"]
            if arg is _NOT_PASSED:
                if len(c) > 4 and c[4] is not None and c[4] != c[1]:
                    continue  # the callee's default skips its backward
            elif arg is not None:
                v = test_value(c[2] if len(c) > 2 else "bool", c[3] if len(c) > 3 else None, arg)
                if v is not None and v != c[1]:
                    continue  # this call passes the value that skips the callee's backward
                if isinstance(arg, cst.Name) and arg.value in params:
                    cond = (arg.value, c[1], c[2] if len(c) > 2 else "bool", c[3] if len(c) > 3 else None)
        if cond is None:
            return None
        found.add(cond)
    if not sites or len(found) != 1:
        return None
    name, truth, kind, lit = found.pop()
    d = fn.defaults.get(name)
    return [name, truth, kind, lit, test_value(kind, lit, d) if d is not None else None]


_NOT_PASSED = object()


def _cond_arg(op, summ):
    """The expression ``op`` passes for the parameter its callee's ``backward_if`` tests,
    ``_NOT_PASSED`` when it passes none (the default applies), or ``None`` when unknown
    (``*args``/``**kwargs``)."""
    name = summ["backward_if"][0]
    params = list(summ.get("params", ()))
    if params and params[0] in ("self", "cls") and (op.func or "").startswith(("self.", "cls.")):
        params = params[1:]
    for a in op.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    if any(a.star == "**" for a in op.args):
        return None
    positional = [a for a in op.args if a.keyword is None]
    if name not in params:
        return None
    i = params.index(name)
    if any(a.star for a in positional[:i + 1]):
        return None
    return positional[i].value if i < len(positional) else _NOT_PASSED


def test_value(kind: str, lit, expr) -> Optional[bool]:
    """The value of a guard test (see :func:`_backward_condition`) for a literal argument
    ``expr``, or ``None`` when ``expr`` is no literal."""
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        if kind == "none":
            return expr.value != "None"
        if kind == "eq":
            return None
        return expr.value == "True"
    if isinstance(expr, (cst.Integer, cst.SimpleString)):
        v = expr.evaluated_value
        if kind == "none":
            return True
        if kind == "eq":
            return v == lit
        return bool(v)
    return None


def _conjunct_truth(test, params):
    """For ``a and b and ...``: the condition of one operand, a comparison with a literal
    preferred (see :func:`_param_truth`), or ``None``."""
    ops, stack = [], [test]
    while stack:
        t = stack.pop()
        if isinstance(t, cst.BooleanOperation) and isinstance(t.operator, cst.And):
            stack += [t.right, t.left]
        else:
            ops.append(t)
    if len(ops) < 2:
        return None
    found = [c for c in (_param_truth(t, params) for t in ops) if c is not None]
    return next((c for c in found if c[2] == "eq"), found[0] if found else None)


def _self_attrs_tested(fn) -> set:
    """The ``self.<attr>`` names the guards of ``fn``'s ops compare or test."""
    out = set()
    for op in all_ops(fn):
        for br, _ in op.guards:
            stack = [br.test] if br.test is not None else []
            while stack:
                t = stack.pop()
                if isinstance(t, cst.BooleanOperation):
                    stack += [t.left, t.right]
                elif isinstance(t, cst.UnaryOperation):
                    stack.append(t.expression)
                elif isinstance(t, cst.Comparison):
                    stack.append(t.left)
                elif isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self":
                    out.add(t.attr.value)
    return out


def _param_truth(test, params):
    """``p`` -> (p, True, "bool", None), ``not p`` -> (p, False, "bool", None), ``p is not
    None`` -> (p, True, "none", None), ``p is None`` -> (p, False, "none", None), ``p ==
    'train'`` -> (p, True, "eq", "train"), ``p != 'train'`` -> (p, False, "eq", "train") for a
    parameter ``p``; else None."""
    if isinstance(test, cst.Name) and test.value in params:
        return test.value, True, "bool", None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) \
            and isinstance(test.expression, cst.Name) and test.expression.value in params:
        return test.expression.value, False, "bool", None
    if isinstance(test, cst.Attribute) and dotted(test) in params:
        return dotted(test), True, "bool", None
    left = dotted(test.left) if isinstance(test, cst.Comparison) else None
    if left in params and len(test.comparisons) == 1:
        op, right = test.comparisons[0].operator, test.comparisons[0].comparator
        if isinstance(right, cst.Name) and right.value == "None":
            if isinstance(op, cst.IsNot):
                return left, True, "none", None
            if isinstance(op, cst.Is):
                return left, False, "none", None
        if isinstance(right, (cst.SimpleString, cst.Integer)) and isinstance(op, (cst.Equal, cst.NotEqual)):
            v = right.evaluated_value
            if isinstance(v, (str, int)):
                return left, isinstance(op, cst.Equal), "eq", v
    return None


def runs_only_with_grad(mm, op) -> bool:
    """``op`` runs only in the arm of a test that is false under ``no_grad`` or in eval mode:
    ``if loss.requires_grad:`` (a loss computed under no_grad requires none), ``if
    torch.is_grad_enabled():``, ``if self.model.training:`` (a step shared by the training and
    the validation epoch, which the caller runs in eval mode under no_grad)."""
    for br, arm in op.guards:
        if arm != 0 or not isinstance(br.node, cst.If) or br.test is None:
            continue
        tests = [br.test]
        while tests:
            t = tests.pop()
            if isinstance(t, cst.BooleanOperation) and isinstance(t.operator, cst.And):
                tests += [t.left, t.right]
            elif isinstance(t, cst.Attribute) and t.attr.value in ("requires_grad", "training"):
                return True
            elif isinstance(t, cst.Call) and mm.qualify(dotted(t.func) or "") == "torch.is_grad_enabled":
                return True
    return False


def _graph_built_under_enable_grad(fn, op) -> bool:
    """``y.backward()`` where every assignment of ``y`` in ``fn`` runs under ``enable_grad``:
    the graph was recorded there, and a backward needs no grad mode, so the caller's
    ``no_grad`` does not stop it (``with torch.enable_grad(): y = model(x)`` then ``y.backward()``)."""
    root = (op.recv or "").split(".", 1)[0]
    if not root or root == "self":
        return False
    grads = []
    for a in all_ops(fn):
        if isinstance(a, AssignOp):
            names = []
            for t in a.targets:
                els = [e.value for e in t.elements] if isinstance(t, (cst.Tuple, cst.List)) else [t]
                names.extend(dotted(e) for e in els)
            if root in names:
                grads.append(a.grad)
    return bool(grads) and all(g == GRAD_ON for g in grads)


def _loader_params(mm, fn) -> tuple:
    from . import resources

    return resources.get(mm).trains_on_params(fn)


def _reshuffled_params(mm, fn) -> list:
    from . import resources

    return resources.get(mm).reshuffled_params(fn)


def _loop_or_outer_trains(loop) -> bool:
    while loop is not None:
        if loop_trains(loop):
            return True
        loop = loop.parent
    return False


def _key_for(fn, path: Optional[str], keys, free=()) -> Optional[str]:
    if not path:
        return None
    if path in keys:
        return path
    if path.startswith("self.") and fn.cls is not None:
        return path
    if path.split(".", 1)[0] in free:
        return path  # a variable of the enclosing function or module (closures, globals)
    return None


def _assigned(fn) -> set:
    out = set()
    for op in all_ops(fn):
        if isinstance(op, AssignOp):
            for t in op.targets:
                for d in _target_names(t):
                    out.add(d)
    return out


def _target_names(t):
    if isinstance(t, cst.Name):
        yield t.value
    elif isinstance(t, (cst.Tuple, cst.List)):
        for e in t.elements:
            yield from _target_names(e.value)


def free_names(mm, fn) -> set:
    """Names ``fn`` uses from an enclosing function or the module (closures and globals)."""
    if fn.is_module_level:
        return set()
    own = set(fn.params) | _assigned(fn)
    outer = set()
    f = fn.parent
    while f is not None:
        outer |= set(f.params) | _assigned(f)
        f = f.parent
    outer |= _assigned(mm.module_function)
    return outer - own - {"self", "cls"}

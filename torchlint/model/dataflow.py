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
``param``     a parameter (iterating ``.parameters()``, ``nn.Parameter(...)``)
``grad_in``   an input of an ``nn.Module`` method (may require grad, like ``graph``)
``saves_out`` the output of an op autograd saves for backward (sigmoid, tanh, exp, softmax,
              relu, ``nn.ReLU`` ...); views of it keep the fact
``saved``     a name used as an operand of ``*``/``@``/``/``/``**`` with a grad-requiring partner,
              or as the input of a layer whose backward reads it (``layer_saved`` too then:
              ``nn.Linear``, convolutions, normalization layers; ``h = self.conv(x.transpose(1, 2))``)
``indices``   integer class indices (``randint``, ``argmax``, ``.long()``)
``host_data`` a tensor made from a variable's data on the CPU (``torch.from_numpy(x)``,
              ``torch.Tensor(seqs)``): full-batch data, moved only by ``.to``
``soft``      soft / one-hot / mixed targets (``one_hot``, mixup, label smoothing)
``holds_loss`` a container whose item (one literal key) was backwarded: it holds a loss and
              its graph (``out = module.training_step(batch); out["loss"].backward()``)

In-place operations (``x.mul_()``, ``x += y``, ``x[i] = v``, ``out=``, in-place activations)
are recorded per function in ``fn.inplace_ops`` as :class:`Inplace` records with the facts of
the tensor they modify, and every ``.data`` access in ``fn.data_accesses`` as
:class:`DataAccess` records (read or write, the facts of the tensor it is taken from).

The pass walks the ops in program order (loops twice, branches joined) and stores, on
each op, the facts of its arguments, so rules read them without re-evaluating anything.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from . import catalog
from .binder import FunctionModel, dotted
from .ir import (
    BACKWARD, CALL, FORWARD, GRAD_OFF, LOSS, MOVE, AssignOp, BranchOp, CallOp, JumpOp, LoopOp,
    ReturnOp, all_ops, walk,
)

EMPTY: frozenset = frozenset()
_KEEP_METHODS = {"view", "reshape", "squeeze", "unsqueeze", "flatten", "permute", "transpose",
                 "contiguous", "mean", "sum", "clone", "t", "expand", "expand_as", "view_as",
                 "chunk", "split", "narrow", "select", "gather", "index_select", "masked_fill",
                 "type_as", "repeat", "squeeze_", "unsqueeze_", "__getitem__", "resize", "resize_as",
                 "reshape_as", "unflatten", "movedim", "swapaxes", "swapdims", "flip", "roll"}
# torch functions that only change the shape of their first argument (its facts stay)
_KEEP_FUNCS = {"torch.reshape", "torch.squeeze", "torch.unsqueeze", "torch.flatten", "torch.transpose",
               "torch.permute", "torch.movedim", "torch.swapaxes", "torch.swapdims", "torch.t",
               "torch.narrow", "torch.select", "torch.flip", "torch.roll", "torch.unflatten"}
_DEVICE_METHODS = {"to", "cuda"}
# functions that join tensors into a new one, and the facts of the data it keeps
_JOIN_FUNCS = {"torch.stack", "torch.cat", "torch.concat", "torch.concatenate"}
_DATA_FACTS = frozenset({"batch", "moved", "param_in"})
# the pre-0.4 typed constructors: ``torch.FloatTensor(2, 3)`` is a shape, ``torch.FloatTensor(x)`` data
_LEGACY_TYPED = {"torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.IntTensor", "torch.DoubleTensor",
                 "torch.ByteTensor", "torch.HalfTensor", "torch.BoolTensor"}
_HOST_DATA_FUNCS = {"torch.Tensor", "torch.tensor", "torch.from_numpy", "torch.as_tensor", "torch.FloatTensor",
                    "torch.LongTensor"}
# autograd-saved outputs (derivatives.yaml uses ``result``) and the views that alias them
_SAVES_OUT_FUNCS = {"torch.sigmoid", "torch.tanh", "torch.exp", "torch.softmax", "torch.relu",
                    "torch.sqrt", "torch.rsqrt", "torch.log_softmax", "torch.special.expit",
                    "torch.nn.functional.softmax", "torch.nn.functional.relu",
                    "torch.nn.functional.sigmoid", "torch.nn.functional.tanh",
                    "torch.nn.functional.log_softmax", "torch.special.softmax",
                    "torch.special.log_softmax", "torch.nn.functional.softmin"}
_SAVES_OUT_METHODS = {"sigmoid", "tanh", "exp", "softmax", "log_softmax", "relu", "sqrt", "rsqrt",
                      "sigmoid_", "tanh_", "exp_", "relu_", "sqrt_", "rsqrt_"}
_SAVES_OUT_MODULES = {"torch.nn.ReLU", "torch.nn.Sigmoid", "torch.nn.Tanh", "torch.nn.Softmax",
                      "torch.nn.LogSoftmax", "torch.nn.Softmax2d"}
_VIEW_METHODS = {"view", "view_as", "reshape", "reshape_as", "squeeze", "unsqueeze", "flatten",
                 "unflatten", "permute", "transpose", "t", "expand", "expand_as", "narrow",
                 "select", "chunk", "split", "unbind", "contiguous", "movedim", "swapaxes",
                 "swapdims", "diagonal", "as_strided", "__getitem__"}
# in-place methods that do not change a tensor's values
_NOT_INPLACE = {"requires_grad_", "share_memory_", "retain_grad", "register_hook", "record_stream",
                "set_", "resize_", "rename_", "refine_names", "align_to", "zero_grad", "detach_",
                "pin_memory_", "untyped_storage_"}
# in-place view methods: they change the shape and strides of the tensor object they are
# called on, no value of its storage (on a `.data` alias: nothing the original sees)
_SHAPE_ONLY_INPLACE = {"unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_"}
_INPLACE_FUNCS = {"torch.relu_", "torch.sigmoid_", "torch.tanh_", "torch.exp_", "torch.clamp_",
                  "torch.clamp_min_", "torch.clamp_max_", "torch.nn.functional.relu_",
                  "torch.nn.functional.elu_", "torch.nn.functional.leaky_relu_",
                  "torch.nn.functional.hardtanh_", "torch.nn.functional.threshold_",
                  "torch.nn.functional.rrelu_", "torch.nn.functional.celu_",
                  "torch.nn.functional.selu_"}
# functions with an ``inplace=`` switch that modify their first argument
_INPLACE_KW_FUNCS = {"torch.nn.functional.relu", "torch.nn.functional.relu6",
                     "torch.nn.functional.leaky_relu", "torch.nn.functional.elu",
                     "torch.nn.functional.selu", "torch.nn.functional.celu",
                     "torch.nn.functional.hardtanh", "torch.nn.functional.silu",
                     "torch.nn.functional.hardswish", "torch.nn.functional.hardsigmoid",
                     "torch.nn.functional.mish", "torch.nn.functional.dropout",
                     "torch.nn.functional.dropout2d", "torch.nn.functional.alpha_dropout",
                     "torch.nn.functional.threshold", "torch.nn.functional.rrelu"}
_INPLACE_MODULES = {"torch.nn.ReLU", "torch.nn.ReLU6", "torch.nn.LeakyReLU", "torch.nn.ELU",
                    "torch.nn.SELU", "torch.nn.CELU", "torch.nn.Hardtanh", "torch.nn.SiLU",
                    "torch.nn.Hardswish", "torch.nn.Hardsigmoid", "torch.nn.Mish",
                    "torch.nn.Dropout", "torch.nn.Dropout2d", "torch.nn.Dropout1d",
                    "torch.nn.Dropout3d", "torch.nn.AlphaDropout", "torch.nn.Threshold",
                    "torch.nn.RReLU"}
_SEQUENTIAL = frozenset({"torch.nn.Sequential", "torch.nn.modules.container.Sequential"})
_SAVING_BINOPS = ("Multiply", "MatrixMultiply", "Divide", "Power")
_SAVING_FUNCS = {"torch.mul", "torch.matmul", "torch.mm", "torch.bmm", "torch.div", "torch.pow",
                 "torch.einsum", "torch.multiply", "torch.true_divide"}
_SAVING_METHODS = {"mul", "matmul", "mm", "bmm", "div", "pow", "multiply"}
_GRAPHY = frozenset({"graph", "grad_in", "param"})
# facts that describe one particular tensor object (views alias it; other ops make new ones)
_ALIAS_FACTS = ("saves_out", "saved", "layer_saved", "param")
# facts of a tensor autograd holds for a backward: an in-place change of it makes that backward fail
_SAVED_FACTS = ("saves_out", "saved", "layer_saved")
# layers whose backward reads their input: a weight's gradient needs it (linear, convolutions:
# saved while the weight requires grad), and normalization layers save it whatever requires grad
_SAVES_INPUT_MODULES = frozenset({
    "torch.nn.Linear", "torch.nn.Bilinear", "torch.nn.LazyLinear",
    "torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d", "torch.nn.ConvTranspose1d",
    "torch.nn.ConvTranspose2d", "torch.nn.ConvTranspose3d", "torch.nn.LazyConv1d", "torch.nn.LazyConv2d",
    "torch.nn.LazyConv3d", "torch.nn.LayerNorm", "torch.nn.GroupNorm", "torch.nn.RMSNorm",
    "torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d", "torch.nn.InstanceNorm1d",
    "torch.nn.InstanceNorm2d", "torch.nn.InstanceNorm3d"})
# wrappers that return the layer they are given (its forward reads the input as the layer's does)
_LAYER_WRAPPERS = frozenset({"torch.nn.utils.weight_norm", "torch.nn.utils.spectral_norm",
                             "torch.nn.utils.parametrizations.weight_norm",
                             "torch.nn.utils.parametrizations.spectral_norm"})
_SOFT_NAMES = ("one_hot", "onehot", "mixup", "cutmix", "mix", "smooth", "soft")


class Inplace:
    """An in-place modification of a tensor (``how``: method, aug, setitem, out, activation)."""

    __slots__ = ("op", "node", "facts", "how", "target")

    def __init__(self, op, node, facts, how, target):
        self.op, self.node, self.facts, self.how, self.target = op, node, facts, how, target

    def __repr__(self) -> str:
        return f"Inplace({self.how}, {sorted(self.facts)})"


def _loss_item_holder(node) -> Optional[str]:
    """``out["loss"]`` (one literal key) -> ``out``: the container of the item."""
    if type(node) is not cst.Subscript or len(node.slice) != 1:
        return None
    sl = node.slice[0].slice
    if not isinstance(sl, cst.Index) or not isinstance(sl.value, (cst.SimpleString, cst.Integer)):
        return None
    return dotted(node.value)


def _is_index0(sub) -> bool:
    """``x[0]``: one subscript element, the integer 0."""
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
        return False
    v = sub.slice[0].slice.value
    return isinstance(v, cst.Integer) and v.value == "0"


def _is_key(sub) -> bool:
    """``x["name"]``: one subscript element, a string: an item of a mapping (DGL's
    ``edges.data["h"]``, a batch's ``.data["input_ids"]``), never of a tensor."""
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
        return False
    return isinstance(sub.slice[0].slice.value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


class DataAccess:
    """``x.data`` taken from a tensor with facts ``facts``; ``write`` when it is modified;
    ``index0`` the ``x.data[0]`` subscript around it, when there is one (the pre-0.4 idiom for
    a loss's value: an ``IndexError`` on a 0-dim tensor today)."""

    __slots__ = ("op", "node", "facts", "write", "base", "assign", "index0", "host", "meta_only")

    def __init__(self, op, node, facts, write, base, assign=False):
        self.op, self.node, self.facts, self.write = op, node, facts, write
        self.base, self.assign = base, assign
        self.index0 = None
        # read only to become a host value (``x.cpu().data.numpy()``, ``x.data.tolist()``):
        # nothing differentiable follows, and without `.data` it would need `.detach()` anyway
        self.host = False
        # read only for what describes it, not its values: ``x.data.new(*shape).zero_()`` (a fresh
        # tensor of its type and device), ``x.data.size()``: nothing is detached that matters
        self.meta_only = False

    def __repr__(self) -> str:
        return f"DataAccess({self.base}, write={self.write}, {sorted(self.facts)})"

_SCALAR_METHODS = {"item", "tolist", "numpy"}
_HOST_METHODS = {"numpy", "tolist", "item"}
# methods that read a tensor's type, device or shape and none of its values
_META_METHODS = {"new", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "size", "dim",
                 "numel", "type", "get_device", "element_size", "is_contiguous"}
_HOST_HOPS = {"cpu", "float", "double", "long", "int", "squeeze", "contiguous", "clone", "flatten", "view",
              "reshape"}
_PROB_KINDS = ("probs", "sigmoid", "logprobs", "logits")


_CHILD_FIELDS: dict = {}
_TOKEN_TYPES: dict = {}
# libcst's visiting order where it differs from the dataclass field order
_VISIT_FIRST = {"IfExp": ("body", "test", "orelse")}


_ISSUB: dict = {}


def _is(x, base) -> bool:
    """``isinstance(x, base)`` cached per type: libcst's node classes are ABCs, whose
    isinstance checks dominate the dataflow pass's walks over expressions."""
    k = (type(x), base)
    r = _ISSUB.get(k)
    if r is None:
        r = _ISSUB[k] = isinstance(x, base)
    return r


def _code_children(e) -> list:
    """``e.children`` in the same order, without whitespace and punctuation nodes, cheaply:
    libcst's ``.children`` rebuilds the node through a visitor (the dataflow pass's hot spot)."""
    tp = type(e)
    names = _CHILD_FIELDS.get(tp)
    if names is None:
        import dataclasses

        names = tuple(f.name for f in dataclasses.fields(tp))
        first = _VISIT_FIRST.get(tp.__name__)
        if first:
            names = first + tuple(n for n in names if n not in first)
        _CHILD_FIELDS[tp] = names
    out = []
    for name in names:
        v = getattr(e, name)
        tv = type(v)
        if tv is tuple or tv is list:
            vals = v
        elif _is(v, cst.CSTNode):
            vals = (v,)
        else:
            continue
        for x in vals:
            t = type(x)
            tok = _TOKEN_TYPES.get(t)
            if tok is None:
                tok = _TOKEN_TYPES[t] = not issubclass(t, cst.CSTNode) or t.__module__ in (
                    "libcst._nodes.whitespace", "libcst._nodes.op") or t.__name__ in (
                    "LeftParen", "RightParen", "LeftSquareBracket", "RightSquareBracket",
                    "LeftCurlyBrace", "RightCurlyBrace", "Asynchronous")
            if not tok:
                out.append(x)
    return out


# the model's walks over expressions use it (``.children`` builds every child again)
code_children = _code_children

_SCAN_LEAVES = frozenset((cst.Name, cst.Integer, cst.Float, cst.SimpleString, cst.Lambda))
_COMPS = frozenset((cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp))


# the output of calling the forward's parameter at index i (``self`` left out) named n:
# ``calls_param:i:n``, resolved at each forward call by the module its caller passes
PARAM_CALL = "calls_param:"


def param_calls(facts: frozenset) -> list:
    """``[(index, name)]`` of the forward parameters whose call's output ``facts`` include."""
    out = []
    for f in facts:
        if f.startswith(PARAM_CALL):
            i, _, n = f[len(PARAM_CALL):].partition(":")
            out.append((int(i), n))
    return sorted(out)


def without_param_calls(facts: frozenset) -> frozenset:
    return frozenset(f for f in facts if not f.startswith(PARAM_CALL))


def _strip(f: frozenset, *names: str) -> frozenset:
    return f.difference(names)


# an output fact of a forward that holds only when one of its parameters tests true (or false):
# ``flag_param:<positional index, -1 if keyword-only>:<name>:<1|0 the truth it needs>:<1|0|?
# the default's truth>:<fact>`` (``if apply_softmax: y = F.softmax(y, dim=1)``), resolved at
# each forward call by the argument it passes (:func:`resolve_flag_facts`)
FLAG_PARAM = "flag_param:"
_FALSY = {"False": False, "None": False, "True": True}


def _literal_truth(e) -> Optional[bool]:
    """The truth value of a literal argument (``True``, ``False``, ``None``, ``0``, ``1``)."""
    if isinstance(e, cst.Name):
        return _FALSY.get(e.value)
    if isinstance(e, cst.Integer):
        try:
            return int(e.value, 0) != 0
        except ValueError:
            return None
    return None


# builtins whose value is always a Python number, and those that give one of numbers
_NUMBER_FUNCS = {"int", "float", "len", "bool"}
_NUMBER_OF_NUMBERS = {"abs", "round", "min", "max", "pow"}
_NUMBER_ANNOTATIONS = {"int", "float", "bool"}
_NUMPY_MATH = {f"numpy.{f}" for f in ("cos", "sin", "exp", "log", "sqrt", "floor", "ceil", "clip",
                                       "minimum", "maximum", "power", "abs", "round")}
_NUMBER_CONSTANTS = {"math.pi", "math.e", "math.tau", "math.inf", "numpy.pi", "numpy.e", "numpy.inf"}


def returns_number(mm, fn) -> bool:
    """Every ``return`` of ``fn`` gives a Python number: arithmetic on literals, on
    parameters annotated ``int``/``float``, on local names bound only to such values (or a
    ``range`` loop's counter) and on ``math.*``/``int()``/``len()``/``min()`` ... of them
    (a warm-up or cosine schedule: ``return start + step / warmup * (end - start)``).  A
    call of it is a number whatever its arguments are, never a tensor."""
    if fn.is_module_level:
        return False
    rets = [op for op in all_ops(fn) if isinstance(op, ReturnOp)]
    return bool(rets) and all(op.value is not None and _number_expr(mm, fn, op.value, ())
                              for op in rets)


def _number_expr(mm, fn, e, seen: tuple) -> bool:
    tp = type(e)
    if tp is cst.Integer or tp is cst.Float:
        return True
    if tp is cst.UnaryOperation:
        return _number_expr(mm, fn, e.expression, seen)
    if tp is cst.BinaryOperation:
        return _number_expr(mm, fn, e.left, seen) and _number_expr(mm, fn, e.right, seen)
    if tp is cst.IfExp:
        return _number_expr(mm, fn, e.body, seen) and _number_expr(mm, fn, e.orelse, seen)
    if tp is cst.Attribute:
        return mm.qualify(dotted(e)) in _NUMBER_CONSTANTS
    if tp is cst.Name:
        return _number_name(mm, fn, e.value, seen)
    if tp is cst.Call:
        d = dotted(e.func)
        if d is None or any(a.star for a in e.args):
            return False
        q = mm.qualify(d) or d
        if q.startswith("math."):
            return True
        if q in _NUMPY_MATH:
            return bool(e.args) and all(_number_expr(mm, fn, a.value, seen) for a in e.args)
        if "." in d or d in mm.functions or d in mm.imports.names:
            return False  # (a function of the module or an import shadows the builtin)
        if d in _NUMBER_FUNCS:
            return True
        if d in _NUMBER_OF_NUMBERS:
            return bool(e.args) and all(_number_expr(mm, fn, a.value, seen) for a in e.args)
    return False


def _number_name(mm, fn, name: str, seen: tuple) -> bool:
    if name in ("True", "False"):
        return True
    if name in seen or len(seen) > 6:
        return name in seen  # ``x = x * 2``: its other definitions decide
    if name in fn.params:
        ann = fn.annotations.get(name)
        return ann is not None and dotted(ann) in _NUMBER_ANNOTATIONS
    values = []
    for op in all_ops(fn):
        if isinstance(op, AssignOp) and any(dotted(t) == name for t in op.targets):
            if len(op.targets) != 1 or op.value is None:
                return False
            values.append(op.value)
        elif isinstance(op, AssignOp) and any(name in _target_names(t) for t in op.targets):
            return False  # unpacked from a tuple: what it holds is not known
        elif isinstance(op, LoopOp) and not op.is_while and op.target is not None \
                and name in _target_names(op.target):
            if not (type(op.target) is cst.Name and isinstance(op.iter, cst.Call)
                    and dotted(op.iter.func) == "range"):
                return False
            values.append(cst.Integer("0"))
    if not values:
        if fn.parent is not None or fn.is_module_level:
            return False
        mf = mm.module_function  # a module constant: ``WARMUP_EPOCHS = 5``
        values = [op.value for op in all_ops(mf) if isinstance(op, AssignOp) and op.aug is None
                  and len(op.targets) == 1 and dotted(op.targets[0]) == name]
        if not values or any(v is None for v in values):
            return False
        fn = mf
    return all(_number_expr(mm, fn, v, seen + (name,)) for v in values)


def _target_names(t) -> set:
    if isinstance(t, (cst.Tuple, cst.List)):
        out = set()
        for el in t.elements:
            out |= _target_names(el.value)
        return out
    if isinstance(t, cst.StarredElement):
        return _target_names(t.value)
    d = dotted(t)
    return {d} if d else set()


def flag_test(test) -> Optional[tuple]:
    """``(name, negated)`` of an ``if`` test that is a plain name or ``not`` a name."""
    neg = False
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, neg = test.expression, not neg
    return (test.value, neg) if isinstance(test, cst.Name) else None


def returns_assuming(mm, fn, assume: dict) -> frozenset:
    """What ``fn`` returns when each parameter named in ``assume`` tests as the given truth
    value: ``if p:`` runs only the arm it chooses, and a ``return`` on that arm ends the path.
    The facts the normal pass stored on the ops of ``fn`` are left as they were."""
    return run_assuming(mm, fn, assume)[0]


def run_assuming(mm, fn, assume: dict) -> tuple:
    """``(facts returned, items, returns reached)`` of ``fn`` under ``assume`` (see
    :func:`returns_assuming`): ``items`` the facts of each item when every ``return`` reached
    returns a tuple of one length (``if return_labels: return labels`` not taken: ``return
    loss, acc``), else None; the number of ``return`` statements with a value reached."""
    keep = [(op, [op.__dict__[k] for k in _OP_FACT_FIELDS if k in op.__dict__]) for op in all_ops(fn)]
    saved = (fn.__dict__.get("inplace_ops"), fn.__dict__.get("data_accesses"))
    try:
        df = Dataflow(mm, fn, mm.resolver)
        df.assume = assume
        df.run()
        items = None
        got = df.returned_items
        if got and all(i is not None for i in got) and len({len(i) for i in got}) == 1:
            items = tuple(frozenset().union(*col) for col in zip(*got))
        return df.returned, items, len(got)
    finally:
        for op, vals in keep:
            for k, v in zip((k for k in _OP_FACT_FIELDS if k in op.__dict__), vals):
                op.__dict__[k] = v
        fn.inplace_ops, fn.data_accesses = saved


_OP_FACT_FIELDS = ("recv_facts", "arg_facts", "value_facts", "target_facts", "item_facts")


def flag_conditioned(mm, fn, facts: frozenset) -> frozenset:
    """``facts`` (what ``fn``, a forward, returns) with each probability/logit fact that holds
    only when a parameter tests true (or only when it tests false) turned into a ``flag_param``
    fact: ``def forward(self, x, apply_softmax=False): ...; if apply_softmax: y = F.softmax(y,
    dim=1); return y`` returns probabilities only to the calls that pass ``apply_softmax=True``."""
    kinds = facts.intersection(_PROB_KINDS)
    if not kinds or mm._dataflow_state.get(id(fn)) is not True:  # (not while its own pass runs)
        return facts
    params = [p for p in fn.params if not p.startswith("*")]
    node = fn.node
    positional = len(node.params.posonly_params) + len(node.params.params) if isinstance(node, cst.FunctionDef) \
        else len(params)
    flags = []
    for op in all_ops(fn):
        tests = [op.test] if isinstance(op, BranchOp) and op.test is not None else []
        value = getattr(op, "value", None) if isinstance(op, (AssignOp, ReturnOp)) else None
        stack = [value] if value is not None else []
        while stack:  # ``x = F.softmax(x, dim=1) if softmax else x``
            e = stack.pop()
            if isinstance(e, cst.IfExp):
                tests.append(e.test)
            stack.extend(code_children(e))
        for test in tests:
            t = flag_test(test)
            if t and t[0] in params and t[0] not in ("self", "cls") and t[0] not in flags:
                flags.append(t[0])
    out = facts
    for p in flags:
        on = returns_assuming(mm, fn, {p: True}) & kinds
        off = returns_assuming(mm, fn, {p: False}) & kinds
        i = params.index(p)
        if i >= positional:
            i = -1  # keyword-only
        elif params and params[0] in ("self", "cls"):
            i -= 1
        d = fn.defaults.get(p)
        dt = _literal_truth(d) if d is not None else None
        default = "?" if dt is None else ("1" if dt else "0")
        for k in kinds:
            if k not in out:
                continue
            if k in on and k not in off:
                out = (out - {k}) | {f"{FLAG_PARAM}{i}:{p}:1:{default}:{k}"}
            elif k in off and k not in on:
                out = (out - {k}) | {f"{FLAG_PARAM}{i}:{p}:0:{default}:{k}"}
    return out


def resolve_flag_facts(facts: frozenset, op) -> frozenset:
    """``facts`` of a forward at the call ``op``: each ``flag_param`` fact becomes its fact when
    the argument the call passes (its default when the call passes none) has the truth value it
    needs. An argument whose value is not a literal drops the fact: the caller chooses the
    output at run time, and nothing here says which (a finding needs the probabilities on the
    path the code takes)."""
    flagged = [f for f in facts if f.startswith(FLAG_PARAM)]
    if not flagged:
        return facts
    out = facts.difference(flagged)
    positional = [a for a in op.args if a.keyword is None and not a.star]
    starred = any(a.star for a in op.args)
    for f in flagged:
        i, name, on, default, fact = f[len(FLAG_PARAM):].split(":", 4)
        arg = next((a for a in op.args if a.keyword is not None and a.keyword.value == name), None)
        idx = int(i)
        if arg is None and 0 <= idx < len(positional):
            arg = positional[idx]
        if arg is not None:
            truth = _literal_truth(arg.value)
        elif starred:
            truth = None
        else:
            truth = {"1": True, "0": False}.get(default)
        if truth is not None and truth == (on == "1"):
            out = out | {fact}
    return out


class Dataflow:
    def __init__(self, mm, fn, resolver):
        self.mm = mm
        self.fn = fn
        self.resolver = resolver
        self.call_ops: dict[int, CallOp] = {}
        for op in _all_calls(fn.body):
            self.call_ops[id(op.node)] = op
        self._inplace: dict = {}
        self._data: dict = {}
        self._index0: dict = {}
        self._host: set = set()  # ids of `.data` attributes read only to become host values
        self._meta: set = set()  # ids of `.data` attributes read only for their type, device or shape
        self._keyed: set = set()  # ids of `.data` nodes subscripted by a string: a mapping
        self._cur = None
        self._loop_iters: dict = {}
        # ``returns_assuming``: the truth value of some parameters; the union of the facts returned
        self.assume: Optional[dict] = None
        self.returned: frozenset = EMPTY
        self.returned_items: list = []  # (with ``assume``) each reached return's item facts, None if not a tuple
        self._dead = False  # (with ``assume``) the path ended in a return, raise, break or continue

    # ---------------------------------------------------------------- driver
    def run(self) -> None:
        env: dict[str, frozenset] = {}
        in_module = _in_module_method(self.mm, self.fn)
        for p in self.fn.params:
            role = self.resolver.of_path(self.fn, p)[0]
            if role is None and p not in ("self", "cls"):
                env[p] = frozenset({"param_in", "grad_in"}) if in_module else frozenset({"param_in"})
        self._block(self.fn.body, env)
        self.fn.inplace_ops = list(self._inplace.values())
        self.fn.data_accesses = list(self._data.values())

    def _block(self, block, env) -> dict:
        for op in block:
            env = self._op(op, env)
            if self._dead:
                break
        return env

    def _op(self, op, env) -> dict:
        self._cur = op
        if isinstance(op, CallOp):
            op.recv_facts = self.facts(op.recv_node, env) if op.recv_node is not None else EMPTY
            op.arg_facts = tuple(self.facts(a.value, env) for a in op.args)
            self._scan_data(op.node, env, op)
            self._call_inplace(op, env)
            env = self._mark_saved_call(op, env)
            if op.attr and op.attr.endswith("_") and op.recv and op.recv in env \
                    and env[op.recv] & set(_SAVED_FACTS):
                env = dict(env)
                env[op.recv] = env[op.recv].difference(_SAVED_FACTS)
            if op.kind == BACKWARD:
                # the graph is freed: what it saved may be modified again
                env = {k: v.difference(_SAVED_FACTS) for k, v in env.items()}
                holder = _loss_item_holder(op.recv_node)
                if holder:
                    # ``out["loss"].backward()``: ``out`` (a step's output dict) holds a loss
                    # with its graph, whatever the function that returned it
                    env[holder] = env.get(holder, EMPTY) | {"holds_loss"}
                name = self._backwarded_name(op)
                if name and not env.get(name, EMPTY) & {"scalar", "detached"}:
                    # what is backwarded is a loss with a graph, whatever made it (a MONAI
                    # loss, a function of the tree): evidence until the name is rebound
                    env[name] = env.get(name, EMPTY) | {"graph", "loss"}
            if op.kind == MOVE and op.recv and _is_statement_call(op):
                # `batch.to(device)` on its own line: in place for modules and BatchEncoding,
                # a discarded copy for tensors (``moved_inplace``; its items count as moved)
                env = dict(env)
                env[op.recv] = env.get(op.recv, EMPTY) | {"moved_inplace"}
            return env
        if isinstance(op, AssignOp):
            if op.value is None:
                return env
            vf = self.facts(op.value, env)
            if op.grad == GRAD_OFF:
                vf = _strip(vf, "graph")
            op.value_facts = vf
            self._scan_data(op.value, env, op)
            self._assign_inplace(op, env)
            env = self._mark_saved(op.value, env)
            if op.aug is not None:
                t = op.targets[0]
                d = dotted(t)
                op.target_facts = env.get(d, EMPTY) if d else EMPTY
                if d:
                    env = dict(env)
                    # one report per saved tensor: after the first in-place change it is no
                    # longer what autograd saved
                    env[d] = op.target_facts.difference(_SAVED_FACTS) | (vf & {"graph", "loss"})
                return env
            env = dict(env)
            for t in op.targets:
                if isinstance(t, cst.Subscript) and "graph" not in vf:
                    # ``out["loss"] = out["loss"].detach()``: the loss item is replaced
                    h = _loss_item_holder(t)
                    if h and "holds_loss" in env.get(h, EMPTY):
                        env[h] = env[h] - {"holds_loss"}
                self._bind(t, op.value, vf, env)
                if isinstance(t, cst.Subscript) and "moved" in vf and dotted(t.value):
                    # batch[k] = batch[k].to(device): the container's items are moved
                    env[dotted(t.value)] = env.get(dotted(t.value), EMPTY) | {"moved_inplace"}
            return env
        if isinstance(op, ReturnOp):
            if op.value is not None:
                op.value_facts = self.facts(op.value, env)
                items = None
                if isinstance(op.value, cst.Tuple) and op.value.elements and \
                        not any(isinstance(el, cst.StarredElement) for el in op.value.elements):
                    op.item_facts = items = tuple(self.facts(el.value, env) for el in op.value.elements)
                if self.assume is not None:
                    self.returned_items.append(items)
                if "moved_inplace" in op.value_facts:
                    # ``for k in batch: batch[k] = batch[k].to(device)``; ``return batch``
                    op.value_facts = op.value_facts | {"moved"}
                self._scan_data(op.value, env, op)
                self.returned = self.returned | op.value_facts
            if self.assume is not None:
                self._dead = True
            return env
        if isinstance(op, LoopOp):
            env = dict(env)
            self._loop_iters[id(op.target)] = op.iter
            if op.iter is not None:
                self._scan_data(op.iter, env, op)
            if not op.is_while and op.target is not None:
                itf = self._iter_facts(op, env)
                self._bind(op.target, None, itf, env)
            first = self._block(op.body, env)
            self._dead = False
            merged = _join(env, first)
            if not op.is_while and op.target is not None:
                self._bind(op.target, None, self._iter_facts(op, merged), merged)
            second = self._block(op.body, merged)
            out = _join(merged, second)
            self._dead = False  # the body may not run, and a jump in it ends one iteration
            if op.orelse:
                out = self._block(op.orelse, out)
            return out
        if isinstance(op, BranchOp):
            if self.assume is not None:
                return self._assumed_branch(op, env)
            outs = [self._block(arm, dict(env)) for arm in op.arms]
            if not op.exhaustive:
                outs.append(env)
            res = outs[0]
            for o in outs[1:]:
                res = _join(res, o)
            return res
        if self.assume is not None and isinstance(op, JumpOp):
            self._dead = True
        return env

    def _assumed_branch(self, op: BranchOp, env) -> dict:
        """A branch under ``assume``: a test of an assumed parameter runs the arm it chooses;
        otherwise every arm, joining those whose path goes on."""
        t = flag_test(op.test) if op.test is not None else None
        if t is not None and t[0] in self.assume:
            arm = 0 if self.assume[t[0]] != t[1] else 1
            return self._block(op.arms[arm], dict(env)) if arm < len(op.arms) else env
        outs = []
        for arm in op.arms:
            o = self._block(arm, dict(env))
            if not self._dead:
                outs.append(o)
            self._dead = False
        if not op.exhaustive:
            outs.append(env)
        if not outs:
            self._dead = True
            return env
        res = outs[0]
        for o in outs[1:]:
            res = _join(res, o)
        return res

    def _backwarded_name(self, op: CallOp) -> Optional[str]:
        """The plain name a backward call differentiates: ``loss.backward()``,
        ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
        ``self.manual_backward(loss)``; None for anything else (``loss.backward(grad)``: the
        tensor may not be a scalar loss)."""
        node = None
        if op.attr == "backward" and not op.args and op.recv_node is not None:
            node = op.recv_node
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and node.func.attr.value == "scale" and len(node.args) == 1:
                node = node.args[0].value  # scaler.scale(loss).backward()
        elif op.attr in ("backward", "manual_backward") and op.args and op.recv_node is not None and (
                op.attr == "manual_backward"
                or self.resolver.of_expr(self.fn, op.recv_node)[0] == catalog.ACCELERATOR):
            a = op.arg(0)
            node = a.value if a is not None else None
        return node.value if isinstance(node, cst.Name) else None

    def _next_batch(self, e: cst.Call) -> Optional[frozenset]:
        """``next(iter(loader))``, ``next(it)`` / ``it.next()`` of ``it = iter(loader)``: one batch
        of the loader (moved when its ``collate_fn`` moves it), else ``None``."""
        f = e.func
        if isinstance(f, cst.Name) and f.value == "next" and e.args and e.args[0].keyword is None:
            it = e.args[0].value
        elif isinstance(f, cst.Attribute) and f.attr.value == "next" and not e.args:
            it = f.value
        else:
            return None
        if isinstance(it, cst.Name):
            it = constructor_call(self.mm, self.fn, it.value)
        if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "iter"
                and len(it.args) == 1):
            return None
        loader = it.args[0].value
        if self.resolver.of_expr(self.fn, loader)[0] != catalog.LOADER:
            return None
        return frozenset({"batch", "moved"}) if self.mm.loader_moves(self.fn, loader) else frozenset({"batch"})

    def _generator_batches(self, it) -> Optional[frozenset]:
        """``for batch_dict in generate_batches(dataset, device=...)`` (or a name bound to that
        call), a generator function of this module that yields inside a loop over a data
        loader: its batches (moved when that loop moves tensors or the loader's ``collate_fn``
        does), else ``None``."""
        call = constructor_call(self.mm, self.fn, it.value) if isinstance(it, cst.Name) else it
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
            return None
        gen = self.mm.function_named(self.fn, call.func.value)
        if not isinstance(gen, FunctionModel) or gen is self.fn or gen.is_module_level:
            return None
        # what a generator yields depends on it alone: walk its loop bodies once per module
        cache = self.mm._generator_batches
        if id(gen) not in cache:
            cache[id(gen)] = (gen, self._scan_generator(gen))
        return cache[id(gen)][1]

    def _scan_generator(self, gen) -> Optional[frozenset]:
        for op in all_ops(gen):
            if not (isinstance(op, LoopOp) and isinstance(op.node, cst.For) and _yields(op.node.body)):
                continue
            loader = _strip_iter(op.iter)
            if self.resolver.of_expr(gen, loader)[0] != catalog.LOADER:
                continue
            if self.mm.loader_moves(gen, loader) or _moves_tensors(op.node.body):
                return frozenset({"batch", "moved"})
            return frozenset({"batch"})
        return None

    def _iter_facts(self, loop: LoopOp, env) -> frozenset:
        it = loop.iter
        # enumerate(loader) / tqdm(loader) / zip(...)
        while isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "tqdm", "tqdm.tqdm", "iter") and it.args:
            it = it.args[0].value
        if isinstance(it, cst.Name) and loop.iter is it:
            # ``pbar = tqdm(enumerate(loader), total=n)`` then ``for i, (x, y) in pbar:``
            from .resources import loop_iterable

            it = loop_iterable(self.mm, self.fn, it)
        if _is_param_iter(it):
            return frozenset({"param"})
        role = self.resolver.of_expr(self.fn, it)[0]
        if role == catalog.LOADER:
            if self.mm.loader_moves(self.fn, it):  # collate_fn moves the batches
                return frozenset({"batch", "moved"})
            return frozenset({"batch"})
        gen = self._generator_batches(it)
        if gen is not None:
            return gen
        base = self.facts(it, env)
        if "batch" in base:
            return frozenset({"batch"})
        if "params" in base:
            return frozenset({"param"})
        if base & {"probs", "logprobs", "sigmoid"}:
            # the rows of a tensor of probabilities: ``for out in torch.softmax(scores, -1)``
            return base & {"probs", "logprobs", "sigmoid", "graph", "grad_in", "moved"}
        return EMPTY

    def _bind(self, target, value, vf: frozenset, env: dict) -> None:
        if isinstance(target, (cst.Tuple, cst.List)) and value is None and "param" in vf:
            # for name, p in m.named_parameters() / for a, b in zip(m1.parameters(), ...)
            elts = [e.value for e in target.elements]
            kinds = _param_tuple_kinds(self._loop_iter_of(target), len(elts))
            for te, k in zip(elts, kinds):
                self._bind(te, None, frozenset({"param"}) if k else EMPTY, env)
            return
        if isinstance(target, (cst.Tuple, cst.List)):
            elts = [e.value for e in target.elements]
            items = self._call_items(value, len(elts), env) if isinstance(value, cst.Call) else None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elts):
                for te, ve in zip(elts, value.elements):
                    self._bind(te, ve.value, self.facts(ve.value, env), env)
            elif items is not None:
                # ``output, loss = train(x, y)`` where ``train`` returns ``output, loss.item()``:
                # an item loses what the whole value carries only through another item
                elem = vf - {"loss"} if "batch" not in vf else frozenset({"batch"} | (vf & {"moved"}))
                cop = self.call_ops.get(id(value))
                fwd = cop is not None and cop.kind == FORWARD  # a model's items: what its forward says
                for te, f in zip(elts, items):
                    # ``X, Y = build_dataset(words)``: only ``Y`` holds the class indices; a model's
                    # ``pred, depth = model(x)``: each item what its forward says
                    # (the item the function returns a loss in, ``return log, out`` with a loss in
                    # ``log``, is that loss's holder)
                    self._bind(te, None, (elem - (_ITEM_ONLY - f)) | (f & {"indices", "loss", "holds_loss"}) | (f if fwd else EMPTY), env)
            else:
                elem = vf - {"loss"} if "batch" not in vf else frozenset({"batch"} | (vf & {"moved"}))
                for i, te in enumerate(elts):
                    if i == 1 and len(elts) == 2 and _values_indices_call(value):
                        # _, pred = out.max(1): the indices carry no graph
                        self._bind(te, None, (elem - {"graph", "grad_in"}) | {"indices"}, env)
                        continue
                    self._bind(te, None, elem, env)
            return
        if isinstance(target, cst.StarredElement):
            self._bind(target.value, None, vf, env)
            return
        d = dotted(target)
        if d:
            env[d] = vf

    def _call_items(self, value: cst.Call, n: int, env) -> Optional[tuple]:
        """The facts of each item of the tuple a call of a tree function returns, when every
        ``return`` of it is a tuple of ``n`` items."""
        op = self.call_ops.get(id(value))
        if op is not None and op.kind == FORWARD:
            # ``pred, feature_map = model(x)``: what each item of the tuple its forward returns is
            items = self.mm.forward_item_facts(self.fn, op)
            if items is None or len(items) != n:
                return None
            return tuple(frozenset({"graph", "model_out"}) | i for i in items)
        if op is None or op.kind != CALL:
            return None
        items = self.mm.call_result_item_facts(self.fn, op, [self.facts(a.value, env) for a in value.args])
        return items if items is not None and len(items) == n else None

    # ---------------------------------------------------------------- expressions
    def facts(self, e, env) -> frozenset:
        if e is None:
            return EMPTY
        tp = type(e)
        if tp is cst.Name or tp is cst.Attribute:
            d = dotted(e)
            if d is not None and d in env:
                return env[d]
            if True:
                if tp is cst.Attribute:
                    if e.attr.value in ("data",):
                        return _strip(self.facts(e.value, env), "graph", "grad_in",
                                      *_SAVED_FACTS) | {"data"}
                    if e.attr.value == "grad":
                        return frozenset({"grad"})
                    if e.attr.value in _SHAPE_LIKE_ATTRS:
                        return EMPTY  # ``x.shape``, ``x.dtype``: not the tensor's data
                    base = self.facts(e.value, env)
                    if e.attr.value in ("mT", "T", "H", "mH", "real", "imag"):
                        return base
                    if e.attr.value in ("values", "indices"):  # torch.max(...) results
                        out = base & {"graph", "grad_in", "batch", "moved"}
                        return out | {"indices"} if e.attr.value == "indices" else out
                    if "model_out" in base and e.attr.value == "loss":  # outputs.loss (transformers)
                        return (base & {"graph", "grad_in"}) | {"loss"}
                    if "model_out" in base and e.attr.value in ("logits", "last_hidden_state", "pooler_output"):
                        return base & {"graph", "grad_in", "model_out"}
                    return base & {"batch", "moved", "param_in"}
            return EMPTY
        if tp is cst.Call:
            return self._call_facts(e, env)
        if tp is cst.Subscript:
            base = self.facts(e.value, env)
            if "moved_inplace" in base:
                return base | {"moved"}  # batch["input_ids"] after batch.to(device) / batch[k] = ...
            return base - {"holds_loss"}  # the holder's other items are not the loss
        if tp is cst.BinaryOperation:
            lf, rf = self.facts(e.left, env), self.facts(e.right, env)
            both = lf | rf
            keep = both & {"graph", "loss", "batch", "moved", "grad_in"}
            if "batch" in both and type(e.operator).__name__ in ("Multiply", "Add", "Subtract"):
                # lam * y_a + (1 - lam) * y_b: mixed (soft) targets
                if not _is_constant(e.left) and not _is_constant(e.right):
                    keep = keep | {"soft"}
            if "soft" in both:
                keep = keep | {"soft"}
            return keep
        if tp is cst.UnaryOperation:
            return self.facts(e.expression, env) & {"graph", "loss", "grad_in"}
        if tp in (cst.Tuple, cst.List):
            out = EMPTY
            for el in e.elements:
                out = out | self.facts(el.value, env)
            return out & {"graph", "loss", "batch", "moved", "grad_in", "param_in"}
        if tp is cst.Dict:
            # ``{"loss": loss, "n_samples": n}`` (a step's log): it holds a loss with its graph
            for el in e.elements:
                if isinstance(el, cst.DictElement):
                    f = self.facts(el.value, env)
                    if "loss" in f and "graph" in f or "holds_loss" in f:
                        return frozenset({"holds_loss"})
            return EMPTY
        if tp is cst.DictComp:
            return self._dictcomp_facts(e, env)
        if (tp is cst.ListComp or tp is cst.GeneratorExp) and e.for_in.inner_for_in is None \
                and not e.for_in.ifs and type(e.elt) is cst.Name and type(e.for_in.target) is cst.Name \
                and e.elt.value == e.for_in.target.value:
            # ``[t for t in targets]``: the items of the iterable, as they are
            return self.facts(e.for_in.iter, env) & _DATA_FACTS
        if tp is cst.IfExp:
            t = flag_test(e.test) if self.assume is not None else None
            if t is not None and t[0] in self.assume:  # ``F.softmax(x) if softmax else x``, assumed
                return self.facts(e.body if self.assume[t[0]] != t[1] else e.orelse, env)
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
        if _is_param_iter(e):
            out = frozenset({"params"})
        elif (nxt := self._next_batch(e)) is not None:
            out = nxt
        elif op is not None and op.kind == FORWARD:
            out = frozenset({"graph", "model_out"}) | self.mm.forward_output_facts(self.fn, op)
            ctor = constructor_qual(self.mm, self.fn, op.target)
            if ctor in _SAVES_OUT_MODULES or _forward_saves_output(self.mm, self.fn, op):
                out = out | {"saves_out"}
        elif op is not None and op.kind == LOSS:
            out = frozenset({"graph", "loss"})
        elif op is not None and op.kind == CALL:
            # a function of the linted tree: what its summary says it returns
            out = self.mm.call_result_facts(self.fn, op, [self.facts(a.value, env) for a in e.args])
        elif q in catalog.SOFTMAX_FUNCS:
            out = self._arg0(e, env) & {"graph", "detached", "batch", "moved", "grad_in"} | {"probs", "saves_out"}
        elif q in catalog.LOG_SOFTMAX_FUNCS:
            out = self._arg0(e, env) & {"graph", "detached", "moved", "grad_in"} | {"logprobs", "saves_out"}
        elif q in catalog.SIGMOID_FUNCS:
            out = self._arg0(e, env) & {"graph", "detached", "moved", "grad_in"} | {"sigmoid", "saves_out"}
        elif q in _SAVES_OUT_FUNCS:
            a = self._arg0(e, env)
            out = a & {"graph", "detached", "moved", "grad_in"} | {"saves_out"}
            if q == "torch.exp" and "logprobs" in a:
                out = out | {"probs"}  # exp(log_softmax(x)) is softmax(x)
        elif q in _KEEP_FUNCS and e.args:
            out = self._arg0(e, env)
        elif q in ("torch.nn.functional.one_hot",):
            out = (self._arg0(e, env) & {"batch", "moved"}) | {"soft"}
        elif q in ("torch.randint", "torch.argmax", "torch.randperm", "torch.multinomial"):
            out = frozenset({"fresh", "indices"})
        elif q in _VARIABLE and e.args:
            # ``Variable(t)`` is ``t`` since PyTorch 0.4: its data facts stay
            out = self._arg0(e, env) & _VARIABLE_KEEPS
        elif q in _LEGACY_TYPED and sum(1 for a in e.args if a.keyword is None and not a.star) >= 2:
            # ``torch.FloatTensor(B, T, D)``: a new tensor of that shape (the legacy ``torch.empty``),
            # not data made a tensor
            out = frozenset({"fresh"})
        elif q in _HOST_DATA_FUNCS and e.args and type(e.args[0].value) in (cst.Name, cst.Attribute, cst.Subscript, cst.Call) \
                and not any(a.keyword is not None and a.keyword.value == "device" for a in e.args):
            # ``torch.from_numpy(features)``, ``torch.Tensor(target_seq)``: a data set's arrays
            # made a tensor, on the CPU (full-batch training without a loader)
            out = frozenset({"host_data"})
        elif q in _JOIN_FUNCS and e.args:
            # ``torch.stack([t for t in targets])``: a new tensor of the same data
            out = frozenset({"fresh"}) | (self._arg0(e, env) & _DATA_FACTS)
        elif q in catalog.FRESH_FACTORIES:
            out = frozenset({"fresh"})
            if q == "torch.tensor" and _dtype_is_float(e):
                out = out | {"float"}
        elif q in ("torch.log",) and e.args:
            a = self._arg0(e, env)
            out = (a - {"probs", "param", "fresh", *_SAVED_FACTS}) | ({"logprobs"} if "probs" in a else EMPTY)
        elif isinstance(func, cst.Attribute):
            m = func.attr.value
            base = self.facts(func.value, env)
            if m == "detach":
                out = _strip(base, "graph", "grad_in") | {"detached"}
            elif m in _SCALAR_METHODS:
                out = frozenset({"scalar"})
            elif m in _DEVICE_METHODS:
                out = base | {"moved"}
                if _dtype_is_float(e):
                    out = out | {"float"}
                elif _dtype_is_int(e):
                    out = (out - {"float"}) | {"indices"}
            elif m in ("float", "double", "half", "bfloat16"):
                out = base | {"float"}
            elif m == "type" and e.args and _tensor_type_alias(self.mm, e.args[0].value, "torch.cuda."):
                # ``imgs.type(Tensor)``, ``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``
                out = base | {"moved"}
                if _tensor_type_alias(self.mm, e.args[0].value, "", _INT_TENSOR_TYPES):
                    out = (out - {"float"}) | {"indices"}
                elif _dtype_is_float(e) or _tensor_type_alias(self.mm, e.args[0].value, "", _FLOAT_TENSOR_TYPES):
                    out = out | {"float"}
            elif m == "type" and _dtype_is_float(e):
                out = base | {"float"}
            elif m == "type" and _dtype_is_int(e):
                out = (base - {"float"}) | {"indices"}
            elif m in ("long", "int"):
                out = (base - {"float"}) | {"indices"}
            elif m == "softmax":
                out = (base & {"graph", "detached", "grad_in"}) | {"probs", "saves_out"}
            elif m == "log_softmax":
                out = (base & {"graph", "detached", "grad_in"}) | {"logprobs", "saves_out"}
            elif m == "sigmoid":
                out = (base & {"graph", "detached", "grad_in"}) | {"sigmoid", "saves_out"}
            elif m == "log" and "probs" in base:
                out = (base - {"probs"}) | {"logprobs"}
            elif m == "clone":
                out = base | {"fresh"}
            elif m in ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"):
                out = frozenset({"fresh"})
            elif m in _SAVES_OUT_METHODS:
                out = (base & {"graph", "detached", "moved", "grad_in"}) | {"saves_out"}
                if m in ("exp", "exp_") and "logprobs" in base:
                    out = out | {"probs"}  # log_softmax(x).exp() is softmax(x)
            elif m in _KEEP_METHODS:
                out = base
            elif m in ("argmax", "argmin"):
                out = (base - {"loss", "probs", "sigmoid", "logprobs", "float", "soft", "graph",
                               "grad_in"}) | {"indices"}
            elif m in ("eq", "ne"):
                out = base - {"loss", "probs", "sigmoid", "logprobs", "graph", "grad_in"}
            elif m in ("max", "topk", "sort"):
                out = base - {"loss", "probs", "sigmoid", "logprobs"}
            elif m == "cpu":
                out = base & {"graph", "loss", "batch", "grad_in", "detached", "model_out", "scalar"}
            else:
                out = base & {"graph", "batch", "moved", "grad_in"}
            if m not in _VIEW_METHODS and m not in _SAVES_OUT_METHODS:
                out = out.difference(_ALIAS_FACTS)
            if m == "clone" or m in ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"):
                out = out - {"data"}
        else:
            d = dotted(func)
            if d in ("float", "int"):
                out = frozenset({"scalar"})
            elif d == "nn.Parameter" or q in catalog.PARAMETER_CLASSES:
                out = EMPTY if frozen_parameter(e) else frozenset({"param"})
            else:
                out = EMPTY
                if d and any(n in d.lower() for n in _SOFT_NAMES):
                    out = frozenset({"soft"})
        if q in ("torch.tensor", "torch.as_tensor", "torch.LongTensor") and e.args and isinstance(e.args[0].value, cst.Name) \
                and not _dtype_is_float(e) and _IntLists(self.mm, self.fn).int_list(e.args[0].value.value, e):
            out = (out - {"float"}) | {"indices"}  # ``Y.append(stoi[ch])`` ... ``Y = torch.tensor(Y)``
        if _makes_int_tensor(self.mm, e, q):
            out = (out - {"float"}) | {"indices"}  # class indices: ``torch.LongTensor(...)``, ``torch.tensor([0, 2])``
        if q is None and e.args and _tensor_type_alias(self.mm, func, "torch.cuda."):
            out = out | {"moved"}  # ``Tensor(x)`` of ``Tensor = torch.cuda.FloatTensor if cuda else ...``
        if type(func) is cst.Name and self.fn.name == "forward" and self.fn.cls is not None:
            # ``layer(x)`` in ``def forward(self, x, layer)``: what it returns depends on the
            # module each caller passes (a concrete-dropout wrapper around ``Sequential(fc, softmax)``)
            params = [p for p in self.fn.params if not p.startswith("*")]
            if func.value in params[1:]:
                out = out | {f"{PARAM_CALL}{params.index(func.value) - 1}:{func.value}"}
        if grad_off:
            out = _strip(out, "graph", "grad_in")
        return out

    # ---------------------------------------------------------------- in-place ops
    def _loop_iter_of(self, target):
        return self._loop_iters.get(id(target))

    def _add_inplace(self, op, node, facts, how, target) -> None:
        if "data" in facts:
            return  # through ``.data``: the data-attribute rule's business
        key = (id(op), how, id(target))
        old = self._inplace.get(key)
        if old is not None:
            old.facts = old.facts | facts
            return
        self._inplace[key] = Inplace(op, node, frozenset(facts), how, target)

    def _add_data(self, node, env, op, write=False, assign=False) -> None:
        key = id(node)
        if key in self._keyed:
            return  # `edges.data["h"]`: a mapping's `.data`, not a tensor's
        base = node.value
        old = self._data.get(key)
        f = self.facts(base, env)
        path = dotted(base)
        if path and _is_param_path(self.mm, path):
            f = f | {"param"}
        if old is not None:
            old.facts = old.facts | f
            old.write = old.write or write
            old.assign = old.assign or assign
            return
        self._data[key] = DataAccess(op, node, f, write, path, assign)
        self._data[key].index0 = self._index0.get(key)
        self._data[key].host = key in self._host
        self._data[key].meta_only = key in self._meta

    def _scan_data(self, expr, env, op) -> None:
        """Record every ``x.data`` read inside ``expr`` (writes are marked by the callers)."""
        has = getattr(self.mm, "_has_data_attr", None)
        if has is None:  # `torch.utils.data` is not a `.data` access
            has = self.mm._has_data_attr = bool(re.search(r"(?<!utils)\.\s*data\b", self.mm.text))
        if not has:
            return  # nothing to record; this walk is otherwise the dataflow pass's costliest part
        stack = [(expr, env)]
        while stack:
            e, en = stack.pop()
            if e is None or type(e) in _SCAN_LEAVES:
                continue
            if type(e) is cst.Call and type(e.func) is cst.Attribute and e.func.attr.value in _HOST_METHODS:
                r = e.func.value  # ``x.data.cpu().numpy()``: through moves and casts to the `.data`
                while type(r) is cst.Call and type(r.func) is cst.Attribute and r.func.attr.value in _HOST_HOPS:
                    r = r.func.value
                if type(r) is cst.Attribute and r.attr.value == "data":
                    self._host.add(id(r))
            if type(e) is cst.Call and type(e.func) is cst.Attribute and e.func.attr.value in _META_METHODS \
                    and type(e.func.value) is cst.Attribute and e.func.value.attr.value == "data":
                self._meta.add(id(e.func.value))  # ``x.data.new(...)``: recorded below, as a child
            if type(e) is cst.Attribute and e.attr.value == "data":
                self._add_data(e, en, op)
            elif type(e) is cst.Subscript and type(e.value) is cst.Attribute and e.value.attr.value == "data":
                if _is_index0(e):
                    self._index0[id(e.value)] = e  # the attribute, a child, is recorded next
                elif _is_key(e):
                    self._keyed.add(id(e.value))
            if type(e) in _COMPS:
                en = dict(en)
                f = e.for_in
                while f is not None:
                    if _is_param_iter(f.iter) or "params" in self.facts(f.iter, en):
                        t = f.target
                        if isinstance(t, (cst.Name, cst.Attribute)):
                            en[dotted(t)] = frozenset({"param"})
                        elif isinstance(t, cst.Tuple):
                            kinds = _param_tuple_kinds(f.iter, len(t.elements))
                            for el, k in zip(t.elements, kinds):
                                d = dotted(el.value)
                                if d and k:
                                    en[d] = frozenset({"param"})
                    f = f.inner_for_in
            for child in _code_children(e):
                if not _is(child, cst.BaseSuite):
                    stack.append((child, en))

    def _call_inplace(self, op: CallOp, env) -> None:
        attr = op.attr
        q = op.qual or ""
        if attr and attr.endswith("_") and not attr.startswith("_") and attr not in _NOT_INPLACE \
                and op.recv_node is not None and not op.qual:
            r = op.recv_node
            if isinstance(r, cst.Attribute) and r.attr.value == "data":
                # ``out.data.unsqueeze_(1)``: a view op in place changes only the alias's shape
                # and strides, never the values autograd saved (checked on CPU with torch)
                self._add_data(r, env, op, write=attr not in _SHAPE_ONLY_INPLACE)
            elif isinstance(r, cst.Subscript) and isinstance(r.value, cst.Attribute) and r.value.attr.value == "data" \
                    and not _is_key(r):
                self._add_data(r.value, env, op, write=True)
            else:
                f = op.recv_facts
                path = dotted(r)
                if path and "param" not in f and _is_self_param(self.mm, self.fn, path):
                    f = f | {"param"}
                self._add_inplace(op, op.node, f, "method", r)
        if op.args and (q in _INPLACE_FUNCS or (q in _INPLACE_KW_FUNCS and _kw_true(op, "inplace"))):
            self._add_inplace(op, op.node, op.arg_facts[0], "func", op.args[0].value)
        for i, a in enumerate(op.args):
            if a.keyword is not None and a.keyword.value == "out" and i < len(op.arg_facts):
                self._add_inplace(op, op.node, op.arg_facts[i], "out", a.value)
        if op.kind == FORWARD and op.args and op.args[0].keyword is None:
            call = constructor_call(self.mm, self.fn, op.target)
            if call is not None and _ctor_qual(self.mm, call) in _SEQUENTIAL and call.args \
                    and isinstance(call.args[0].value, cst.Call) and call.args[0].keyword is None \
                    and not call.args[0].star:
                call = call.args[0].value  # ``nn.Sequential(nn.LeakyReLU(0.2, inplace=True), ...)``
            if call is not None and _ctor_qual(self.mm, call) in _INPLACE_MODULES and _ctor_inplace(call):
                self._add_inplace(op, op.node, op.arg_facts[0], "activation", op.args[0].value)

    def _assign_inplace(self, op: AssignOp, env) -> None:
        for t in op.targets:
            self._target_inplace(op, t, env)

    def _target_inplace(self, op, t, env) -> None:
        if isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                self._target_inplace(op, el.value, env)
            return
        if isinstance(t, cst.Attribute) and t.attr.value == "data":
            self._add_data(t, env, op, write=True, assign=op.aug is None)
            return
        if isinstance(t, cst.Subscript):
            base = t.value
            if isinstance(base, cst.Attribute) and base.attr.value == "data" and not _is_key(t):
                self._add_data(base, env, op, write=True)
                return
            for el in t.slice:
                self._scan_data(el.slice, env, op)
            self._add_inplace(op, op.node, self.facts(base, env), "setitem", base)
            return
        if op.aug is not None and isinstance(t, (cst.Name, cst.Attribute)):
            f = self.facts(t, env)
            path = dotted(t)
            if path and "param" not in f and _is_self_param(self.mm, self.fn, path):
                f = f | {"param"}
            self._add_inplace(op, op.node, f, "aug", t)

    # ---------------------------------------------------------------- saved operands
    def _mark_saved_call(self, op: CallOp, env) -> dict:
        names = []
        node = op.node
        if op.qual in _SAVING_FUNCS:
            vals = [a.value for a in op.args if a.keyword is None]
            facts = [self.facts(v, env) for v in vals]
            for i, v in enumerate(vals):
                if any(f & _GRAPHY for j, f in enumerate(facts) if j != i):
                    names.append((v, facts[i]))
        elif op.attr in _SAVING_METHODS and op.recv_node is not None and op.args:
            other = op.args[0].value
            of = self.facts(other, env)
            if of & _GRAPHY:
                names.append((op.recv_node, op.recv_facts))
            if op.recv_facts & _GRAPHY:
                names.append((other, of))
        env = self._mark(names, env, node)
        if op.grad != GRAD_OFF and op.args and op.args[0].keyword is None and not op.args[0].star \
                and isinstance(op.node.func, (cst.Name, cst.Attribute)) \
                and _forward_saves_input(self.mm, self.fn, dotted(op.node.func)):
            # ``h = self.pos_conv(x.transpose(1, 2))``: the layer's backward reads ``x``
            base = _view_base(op.args[0].value)
            bf = self.facts(base, env)
            env = self._mark([(base, bf)], env, node, extra="layer_saved")
        for a in op.args:
            env = self._mark_saved(a.value, env)
        return env

    def _mark_saved(self, expr, env) -> dict:
        stack = [expr]
        while stack:
            e = stack.pop()
            if e is None or type(e) is cst.Lambda or type(e) is cst.Call:
                continue
            if type(e) is cst.BinaryOperation and type(e.operator).__name__ in _SAVING_BINOPS:
                names = []
                lf, rf = self.facts(e.left, env), self.facts(e.right, env)
                if rf & _GRAPHY:
                    names.append((e.left, lf))
                if lf & _GRAPHY:
                    names.append((e.right, rf))
                env = self._mark(names, env, e)
            for child in _code_children(e):
                if _is(child, cst.BaseExpression):
                    stack.append(child)
        return env

    def _mark(self, names, env, saver, extra: Optional[str] = None) -> dict:
        """``names`` (operands of ``saver``, an op that saves its inputs) are now saved for
        backward, unless no backward can reach ``saver``'s result (:meth:`_result_unreached`);
        ``extra``: a fact saying which kind of op saved them."""
        out = env
        for node, f in names:
            d = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if not d or d not in env or not (f & (_GRAPHY | {"fresh", "batch"})) or "saved" in f:
                continue
            if self._result_unreached(saver):
                return env
            if out is env:
                out = dict(env)
            out[d] = out[d] | ({"saved", extra} if extra else {"saved"})
        return out

    def _result_unreached(self, saver) -> bool:
        """No backward can reach the result of ``saver`` (an expression of the current op's
        statement), so what it saved is never read: the result is ``.detach()``ed (or made an
        index, a number) in its expression (``torch.sqrt((x * x).mean(1)).detach()``), or the
        statement binds it to a name that the next statement of the same block reading that
        name rebinds to such a result (``std = torch.sqrt(torch.sum(x * x, 1) / n)``,
        ``std = std.unsqueeze(1).detach()``)."""
        op = self._cur
        stmt = op.stmt if op is not None else None
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return False
        path = _path_to(stmt.body[0], saver)
        if path is None:
            return False
        if _under_no_grad_method(path):
            return True
        small = stmt.body[0]
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and path[1] is small.value
                and isinstance(small.targets[0].target, cst.Name)):
            return False
        name = small.targets[0].target.value
        ops = all_ops(self.fn)
        at = next((i for i, o in enumerate(ops) if o is op), None)
        if at is None:
            return False
        seen = {id(stmt)}
        for o in ops[at + 1:]:
            later = o.stmt
            if id(later) in seen:
                continue
            seen.add(id(later))
            if not any(isinstance(n, cst.Name) and n.value == name for n in _subtree(later)):
                continue
            if not isinstance(later, cst.SimpleStatementLine) or o.guards != op.guards or o.loop is not op.loop:
                return False  # read in another block: perhaps on a path that keeps the graph
            nxt = later.body[0] if len(later.body) == 1 else None
            if not (isinstance(nxt, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                                        for t in nxt.targets)):
                return False
            uses = [n for n in _subtree(nxt.value) if isinstance(n, cst.Name) and n.value == name]
            return bool(uses) and all(_under_no_grad_method(_path_to(nxt.value, n) or ()) for n in uses)
        return False

    def _arg0(self, e: cst.Call, env) -> frozenset:
        if not e.args:
            return EMPTY
        return self.facts(e.args[0].value, env)


# methods whose result carries no gradient: what autograd saved for the ops under them is never read
_NO_GRAD_METHODS = frozenset({"detach", "item", "tolist", "numpy", "argmax", "argmin", "argsort"})


def _subtree(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(_code_children(n))


def _path_to(root, node) -> Optional[list]:
    """The nodes from ``root`` down to ``node`` (both included), or None."""
    stack = [(root, None)]
    parent: dict = {}
    while stack:
        n, up = stack.pop()
        parent[id(n)] = up
        if n is node:
            path = [n]
            while up is not None:
                path.append(up)
                up = parent[id(up)]
            return path[::-1]
        stack.extend((c, n) for c in _code_children(n))
    return None


def _under_no_grad_method(path) -> bool:
    """The last node of ``path`` is inside the receiver of ``.detach()`` (``.item()``,
    ``.argmax()`` ...) on the way up to the first."""
    for k in range(len(path) - 2):
        a = path[k]
        if type(a) is cst.Call and type(a.func) is cst.Attribute and path[k + 1] is a.func \
                and a.func.attr.value in _NO_GRAD_METHODS:
            return True
    return False


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


# -------------------------------------------------------------------- helpers
def _in_module_method(mm, fn) -> bool:
    f = fn
    while f is not None:
        if f.cls is not None:
            return mm.class_is_module(f.cls)
        f = f.parent
    return False


_PARAM_ITER_METHODS = ("parameters", "named_parameters")


# facts of a returned tuple that belong to the items that carry them (the others are detached,
# numbers or batches): ``return output, loss.item()``
_ITEM_ONLY = frozenset({"graph", "model_out", "probs", "logprobs", "sigmoid", "logits", "saves_out"})


def _is_param_iter(it) -> bool:
    """``m.parameters()``, ``m.named_parameters()``, ``zip``/``chain``/``list`` of them."""
    if not isinstance(it, cst.Call):
        return False
    f = it.func
    if isinstance(f, cst.Attribute) and f.attr.value in _PARAM_ITER_METHODS:
        return True
    d = dotted(f) or ""
    if d.rsplit(".", 1)[-1] in ("zip", "chain", "list", "tuple", "enumerate", "filter", "reversed"):
        return any(_is_param_iter(a.value) for a in it.args)
    return False


def _param_tuple_kinds(it, n: int) -> list:
    """For a tuple loop target over ``it``: which elements are parameters."""
    if isinstance(it, cst.Call):
        f = it.func
        d = dotted(f) or ""
        if isinstance(f, cst.Attribute) and f.attr.value == "named_parameters":
            return [False] * (n - 1) + [True]
        last = d.rsplit(".", 1)[-1]
        if last == "zip":
            return [_is_param_iter(a.value) for a in it.args][:n] + [False] * max(0, n - len(it.args))
        if last == "enumerate" and it.args:
            return [False] + [_is_param_iter(it.args[0].value)] * (n - 1)
    return [False] * n


def _is_constant(e) -> bool:
    if isinstance(e, (cst.Integer, cst.Float)):
        return True
    if isinstance(e, cst.UnaryOperation):
        return _is_constant(e.expression)
    if isinstance(e, cst.BinaryOperation):
        return _is_constant(e.left) and _is_constant(e.right)
    return False


_FLOAT_DTYPES = {"torch.float", "torch.float32", "torch.float64", "torch.double", "torch.half",
                 "torch.float16", "torch.bfloat16", "torch.FloatTensor", "torch.cuda.FloatTensor",
                 "torch.DoubleTensor", "torch.cuda.DoubleTensor", "float"}
_INT_DTYPES = {"torch.long", "torch.int64", "torch.int", "torch.int32", "torch.LongTensor",
               "torch.cuda.LongTensor"}


_VARIABLE = {"torch.autograd.Variable", "torch.autograd.variable.Variable"}
_VARIABLE_KEEPS = frozenset({"batch", "moved", "param_in", "indices", "float", "soft", "host_data", "fresh"})
_INT_TENSOR_TYPES = {"torch.LongTensor", "torch.cuda.LongTensor", "torch.IntTensor", "torch.cuda.IntTensor"}


def _int_literal(e, depth: int = 0) -> bool:
    """A list or tuple literal of integers (nested, non-empty)."""
    if isinstance(e, cst.Integer):
        return True
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
        return isinstance(e.expression, cst.Integer)
    if isinstance(e, (cst.List, cst.Tuple)) and e.elements and depth < 4:
        return all(not isinstance(el, cst.StarredElement) and _int_literal(el.value, depth + 1) for el in e.elements)
    return False


_FLOAT_TENSOR_TYPES = {"torch.FloatTensor", "torch.cuda.FloatTensor", "torch.DoubleTensor", "torch.cuda.DoubleTensor",
                       "torch.HalfTensor", "torch.cuda.HalfTensor"}
_SHAPE_LIKE_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout"}


def _alias_values(mm, d: str) -> list:
    """The qualified names a module-level name is bound to (``LongTensor = torch.cuda.LongTensor
    if cuda else torch.LongTensor``: both), ``[]`` when one of its values is not a dotted name."""
    cache = mm.__dict__.setdefault("_tensor_type_aliases", {})
    if d not in cache:
        vals = [o.value for o in mm.module_function.body if isinstance(o, AssignOp) and o.aug is None
                and any(isinstance(t, cst.Name) and t.value == d for t in o.targets)]
        out = []
        for v in vals:
            for a in ([v.body, v.orelse] if isinstance(v, cst.IfExp) else [v]):
                q = mm.qualify(dotted(a)) if dotted(a) else None
                if q is None:
                    out = []
                    break
                out.append(q)
            else:
                continue
            break
        cache[d] = out
    return cache[d]


def _tensor_type_alias(mm, expr, prefix: str, among=None) -> bool:
    """``expr`` names a tensor type (``torch.cuda.FloatTensor``) or a module alias of tensor
    types: ``among`` (every value one of them), or any value starting with ``prefix``."""
    d = dotted(expr)
    if not d:
        return False
    q = mm.qualify(d)
    vals = [q] if q and q.startswith("torch.") else (_alias_values(mm, d) if "." not in d else [])
    if not vals:
        return False
    if among is not None:
        return all(v in among for v in vals)
    return any(v.startswith(prefix) and v.endswith("Tensor") for v in vals)


def _int_tensor_type(mm, func) -> bool:
    """``torch.LongTensor``, or a module-level name only ever bound to integer tensor types
    (``LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor``)."""
    return _tensor_type_alias(mm, func, "", _INT_TENSOR_TYPES)


def _makes_int_tensor(mm, e: cst.Call, q) -> bool:
    if q in ("torch.tensor", "torch.as_tensor") and e.args:
        if _dtype_is_int(e):
            return True
        a0 = e.args[0]
        return a0.keyword is None and not a0.star and _int_literal(a0.value) and not _dtype_is_float(e)
    if q in _INDEX_FACTORIES and _dtype_is_int(e):
        # ``torch.zeros(N * C, dtype=torch.long)``: a vector of class indices, filled in later
        # (a 2-D integer tensor may be a one-hot matrix made float on purpose)
        pos = [a for a in e.args if a.keyword is None and not a.star]
        n = 1 if q != "torch.full" else 2
        if len(pos) != n:
            return False
        size = pos[0].value
        return not isinstance(size, (cst.Tuple, cst.List)) or len(size.elements) == 1
    if q == "torch.arange" and e.args and not _dtype_is_float(e):
        # ``labels = torch.arange(n)``: the contrastive (CLIP, MoCo) targets, integers
        return all(a.keyword is not None or not _has_float_literal(a.value) for a in e.args)
    if q is None or q in _INT_TENSOR_TYPES:
        return bool(e.args) and _int_tensor_type(mm, e.func)
    return False


class _IntLists:
    """Python lists of integers built by appends (makemore's ``Y.append(ix)`` with ``ix =
    stoi[ch]`` and ``stoi = {s: i + 1 for i, s in enumerate(chars)}``): ``torch.tensor`` of one
    is a vector of class indices."""
    _INT_FUNCS = {"len", "int", "ord"}

    def __init__(self, mm, fn):
        self.mm, self.fn = mm, fn

    def _ops(self, fn):
        return [o for o in all_ops(fn)] if fn is not None else []

    def _bindings(self, fn, name):
        """(values, loop iters) that bind ``name`` in ``fn``; a value ``None`` is one not seen
        (an unpacking from a call, a ``with ... as``)."""
        values, loops = [], []
        for o in self._ops(fn):
            if isinstance(o, AssignOp) and o.aug is None:
                for t in o.targets:
                    if isinstance(t, cst.Name) and t.value == name:
                        values.append(o.value)
                    elif isinstance(t, (cst.Tuple, cst.List)):
                        for i, el in enumerate(t.elements):
                            if isinstance(el.value, cst.Name) and el.value.value == name:
                                v = o.value
                                values.append(v.elements[i].value if isinstance(v, (cst.Tuple, cst.List))
                                              and len(v.elements) == len(t.elements) else None)
            elif isinstance(o, AssignOp) and o.aug is not None and any(
                    isinstance(t, cst.Name) and t.value == name for t in o.targets):
                values.append(None)
            elif isinstance(o, LoopOp) and isinstance(o.node, cst.For) and o.target is not None:
                if isinstance(o.target, cst.Name) and o.target.value == name:
                    loops.append(o.iter)
                elif isinstance(o.target, cst.Tuple) and o.target.elements \
                        and isinstance(o.target.elements[0].value, cst.Name) \
                        and o.target.elements[0].value.value == name:
                    loops.append(("enumerate", o.iter))
                elif name in _target_names(o.target):
                    loops.append(None)
        return values, loops

    def _scope_of(self, name):
        """The function (this one or the module) whose bindings of ``name`` the code sees."""
        v, lp = self._bindings(self.fn, name)
        if v or lp:
            return self.fn
        mod = self.mm.module_function
        return mod if mod is not self.fn else None

    def int_list(self, name, at) -> bool:
        fn = self.fn
        values, loops = self._bindings(fn, name)
        if loops or not values:
            return False
        empty = 0
        for v in values:
            if isinstance(v, cst.List) and not v.elements:
                empty += 1
            elif not (isinstance(v, cst.Call) and v is at):
                return False  # ``Y = torch.tensor(Y)`` rebinds it: the call asked about
        if not empty:
            return False
        appended = 0
        for o in self._ops(fn):
            if isinstance(o, CallOp) and o.recv_node is not None and isinstance(o.recv_node, cst.Name) \
                    and o.recv_node.value == name:
                if o.attr != "append" or len(o.args) != 1 or not self.int_valued(o.args[0].value, fn, 0):
                    return False
                appended += 1
        return appended > 0

    def int_valued(self, e, fn, depth) -> bool:
        if depth > 4 or e is None:
            return False
        if isinstance(e, cst.Integer):
            return True
        if isinstance(e, cst.Call):
            return isinstance(e.func, cst.Name) and e.func.value in self._INT_FUNCS
        if isinstance(e, cst.BinaryOperation) and type(e.operator).__name__ in (
                "Add", "Subtract", "Multiply", "FloorDivide", "Modulo"):
            return self.int_valued(e.left, fn, depth + 1) and self.int_valued(e.right, fn, depth + 1)
        if isinstance(e, cst.Name):
            values, loops = self._bindings(fn, e.value)
            if not values and not loops:
                return False
            for it in loops:
                if not (isinstance(it, tuple) and isinstance(it[1], cst.Call) and dotted(it[1].func) == "enumerate") \
                        and not (isinstance(it, cst.Call) and dotted(it.func) == "range"):
                    return False
            return all(self.int_valued(v, fn, depth + 1) for v in values)
        if isinstance(e, cst.Subscript) and isinstance(e.value, cst.Name):
            # ``stoi[ch]`` of ``stoi = {s: i + 1 for i, s in enumerate(chars)}``
            scope = fn if self._bindings(fn, e.value.value)[0] else self.mm.module_function
            values, loops = self._bindings(scope, e.value.value)
            return bool(values) and not loops and all(self._int_dict(v, depth) for v in values)
        return False

    def _int_dict(self, v, depth) -> bool:
        if not isinstance(v, cst.DictComp) or v.for_in.inner_for_in is not None:
            return False
        target, it = v.for_in.target, v.for_in.iter
        if not (isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and isinstance(target, cst.Tuple)
                and target.elements and isinstance(target.elements[0].value, cst.Name)):
            return False
        index = target.elements[0].value.value
        return _int_of(v.value, index)


def _int_of(e, index) -> bool:
    """``i`` / ``i + 1`` of the enumerate index ``i``."""
    if isinstance(e, cst.Name):
        return e.value == index
    if isinstance(e, cst.Integer):
        return True
    if isinstance(e, cst.BinaryOperation) and type(e.operator).__name__ in ("Add", "Subtract", "Multiply"):
        return _int_of(e.left, index) and _int_of(e.right, index)
    return False


def _target_names(t) -> set:
    if isinstance(t, cst.Name):
        return {t.value}
    if isinstance(t, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in t.elements)) if t.elements else set()
    return set()


class _Finder(cst.CSTVisitor):
    def __init__(self, pred):
        self.pred, self.found = pred, False

    def on_visit(self, node) -> bool:
        if self.found or isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False  # a nested function's yield or move is not this loop's
        if self.pred(node):
            self.found = True
            return False
        return True


def _contains(node, pred) -> bool:
    v = _Finder(pred)
    node.visit(v)
    return v.found


def _yields(node) -> bool:
    return _contains(node, lambda n: isinstance(n, cst.Yield))


def _moves_tensors(node) -> bool:
    return _contains(node, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                     and n.func.attr.value in _DEVICE_METHODS)


def _strip_iter(it):
    while isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "tqdm", "tqdm.tqdm", "iter") and it.args:
        it = it.args[0].value
    return it


_INDEX_FACTORIES = {"torch.zeros", "torch.ones", "torch.empty", "torch.full"}


def _has_float_literal(e) -> bool:
    """``0.5`` or ``n * 0.5``: an argument that makes ``torch.arange`` float."""
    if isinstance(e, cst.Float):
        return True
    if isinstance(e, cst.BinaryOperation):
        return isinstance(e.operator, cst.Divide) or _has_float_literal(e.left) or _has_float_literal(e.right)
    if isinstance(e, cst.UnaryOperation):
        return _has_float_literal(e.expression)
    return False


def _dtype_arg(call: cst.Call):
    for a in call.args:
        v = a.value
        if a.keyword is not None and a.keyword.value != "dtype":
            continue
        d = dotted(v)
        if d:
            yield d
        elif isinstance(v, cst.SimpleString):
            yield v.value.strip("'\"")


def _dtype_is_float(call: cst.Call) -> bool:
    return any(d in _FLOAT_DTYPES for d in _dtype_arg(call))


def _dtype_is_int(call: cst.Call) -> bool:
    return any(d in _INT_DTYPES for d in _dtype_arg(call))


def _kw_true(op, name: str) -> bool:
    a = op.keyword(name)
    return a is not None and isinstance(a.value, cst.Name) and a.value.value == "True"


def _ctor_inplace(call: cst.Call) -> bool:
    for a in call.args:
        v = a.value
        if isinstance(v, cst.Name) and v.value == "True" and (a.keyword is None or a.keyword.value == "inplace"):
            return True
    return False


def _ctor_qual(mm, call: cst.Call) -> Optional[str]:
    d = dotted(call.func)
    return (mm.qualify(d) or d) if d else None


def constructor_call(mm, fn, path: Optional[str]) -> Optional[cst.Call]:
    """The call that built the object at ``path`` (``self.relu = nn.ReLU(inplace=True)``,
    ``model = nn.Sequential(...)``), looked up in the function, its parents, the class
    (and its bases in this module) and the module; ``None`` when unknown or ambiguous."""
    if not path:
        return None
    cache = mm.__dict__.setdefault("_ctor_cache", {})
    key = (id(fn), path)
    if key in cache:
        return cache[key]
    cache[key] = None
    found = None
    if path.startswith("self.") and path.count(".") == 1:
        cls = None
        f = fn
        while f is not None and cls is None:
            cls, f = f.cls, f.parent
        seen = 0
        while cls is not None and found is None and seen < 8:
            for op in cls.attr_values.get(path, ()):
                if isinstance(op.value, cst.Call):
                    found = op.value
                    break
            nxt = None
            for raw in cls.raw_bases:
                nxt = mm.find_class(raw)
                if nxt is not None:
                    break
            cls, seen = nxt, seen + 1
    elif "." not in path:
        f = fn
        while f is not None and found is None:
            found = _assigned_call(f, path)
            f = f.parent
        if found is None and not fn.is_module_level:
            found = _assigned_call(mm.module_function, path)
    cache[key] = found
    return found


def constructor_qual(mm, fn, path: Optional[str]) -> Optional[str]:
    call = constructor_call(mm, fn, path)
    return _ctor_qual(mm, call) if call is not None else None


def _assigned_call(fn, name: str) -> Optional[cst.Call]:
    hits = []
    for op in all_ops(fn):
        if isinstance(op, AssignOp) and op.aug is None and isinstance(op.value, cst.Call):
            for t in op.targets:
                if isinstance(t, cst.Name) and t.value == name:
                    hits.append(op.value)
    if not hits:
        return None
    # one constructor (or several of the same class) decides
    quals = {dotted(h.func) for h in hits}
    return hits[0] if len(quals) == 1 else None


def frozen_parameter(call: cst.Call) -> bool:
    """``nn.Parameter(t, requires_grad=False)`` (or ``Parameter(t, False)``): a parameter autograd
    never differentiates (a step counter, a fixed table), so nothing saves it for backward and an
    in-place change of it is fine."""
    arg = call.args[1] if len(call.args) > 1 and call.args[1].keyword is None else None
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "requires_grad":
            arg = a
    return arg is not None and _literal_truth(arg.value) is False


def _param_attrs(mm) -> set:
    """Attribute names assigned a trainable ``nn.Parameter(...)`` in any class of the module
    (not one built with ``requires_grad=False``)."""
    r = mm.__dict__.get("_param_attr_names")
    if r is None:
        r = set()
        for cls in mm.classes.values():
            for path, ops in cls.attr_values.items():
                for op in ops:
                    v = op.value
                    if isinstance(v, cst.Call) and (dotted(v.func) or "").rsplit(".", 1)[-1] == "Parameter" \
                            and not frozen_parameter(v):
                        r.add(path.split(".", 1)[1])
        mm.__dict__["_param_attr_names"] = r
    return r


def _is_param_path(mm, path: str) -> bool:
    """A dotted path that names a parameter: ``m.weight``, ``self.fc.bias``, ``self.pos_embed``
    (assigned ``nn.Parameter`` in a class of the module)."""
    if "." not in path:
        return False
    last = path.rsplit(".", 1)[-1]
    if last in ("weight", "bias"):
        return True
    return last in _param_attrs(mm)


def _is_self_param(mm, fn, path: str) -> bool:
    """``self.X`` names a parameter: its class (or a base class of this module) assigns ``X``
    a trainable ``nn.Parameter``; when the class assigns ``X`` only other values (a NumPy
    array of a hand-written layer, next to an ``nn.Module`` of the same notebook that calls
    its parameter ``b`` too) it is not one. A class that never assigns ``X`` falls back to the
    module's classes."""
    if not (path.startswith("self.") and path.count(".") == 1 and path[5:] in _param_attrs(mm)):
        return False
    f = fn
    while f is not None and f.cls is None:
        f = f.parent
    cls, seen = (f.cls if f is not None else None), 0
    while cls is not None and seen < 8:
        ops = cls.attr_values.get(path)
        if ops:
            return any(isinstance(op.value, cst.Call) and (dotted(op.value.func) or "").rsplit(".", 1)[-1] == "Parameter"
                       and not frozen_parameter(op.value) for op in ops)
        cls = next((mm.find_class(b) for b in cls.raw_bases if mm.find_class(b) is not None), None)
        seen += 1
    return True


def _is_statement_call(op) -> bool:
    """The call is a whole expression statement (its value is discarded)."""
    stmt = op.stmt
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Expr) and s.value is op.node for s in stmt.body)


def _values_indices_call(value) -> bool:
    """``x.max(dim)`` / ``torch.max(x, dim)`` / ``topk`` / ``sort``: a (values, indices) pair."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    name = func.attr.value if isinstance(func, cst.Attribute) else None
    if name not in ("max", "min", "topk", "sort", "kthvalue", "median", "mode", "cummax", "cummin"):
        return False
    recv = dotted(func.value) if isinstance(func, cst.Attribute) else None
    need = 2 if recv == "torch" else 1
    return len(value.args) >= need or name in ("topk", "sort")


# -------------------------------------------------------------------- what a model returns
_PASSTHROUGH = catalog.MODULE_SELF_METHODS
_MODEL_WRAPPERS = catalog.MODEL_WRAPPERS | {"copy.deepcopy"}  # a copy of a model returns what it returns
_LAYER_OUTPUT = {
    "torch.nn.Softmax": "probs", "torch.nn.Softmax2d": "probs", "torch.nn.LogSoftmax": "logprobs",
    "torch.nn.Sigmoid": "sigmoid", "torch.nn.Linear": "logits", "torch.nn.LazyLinear": "logits",
    "torch.nn.Bilinear": "logits", "torch.nn.Conv1d": "logits", "torch.nn.Conv2d": "logits",
    "torch.nn.Conv3d": "logits",
}


def value_constructors(mm, fn, path, depth: int = 0) -> list:
    """``[(function, call)]``: the calls that built the object at ``path`` in ``fn`` - its own
    assignment, or, for a parameter of ``fn``, what the callers in this module pass."""
    if not path or depth > 4:
        return []
    call = constructor_call(mm, fn, path)
    if call is not None:
        return [(fn, call)]
    if "." in path or path not in fn.params:
        return []
    out = []
    params = [p for p in fn.params if not p.startswith("*")]
    idx = params.index(path)
    if params and params[0] == "self":
        idx -= 1
    for caller, op in mm.callers(fn):
        arg = None
        for a in op.args:
            if a.keyword is not None and a.keyword.value == path:
                arg = a
        if arg is None:
            positional = [a for a in op.args if a.keyword is None and not a.star]
            if 0 <= idx < len(positional):
                arg = positional[idx]
        if arg is None:
            continue
        v = arg.value
        if isinstance(v, cst.Call):
            out.append((caller, v))
        elif isinstance(v, (cst.Name, cst.Attribute)):
            out.extend(value_constructors(mm, caller, dotted(v), depth + 1))
    return out


def model_output_facts(mm, fn, path) -> frozenset:
    """What calling the model at ``path`` returns: ``probs``/``logprobs``/``sigmoid`` when it
    ends in a softmax/log-softmax/sigmoid layer, ``logits`` when it ends in a linear layer."""
    active = mm.__dict__.setdefault("_model_output_active", set())
    key = (id(fn), path)
    if key in active:  # model = DDP(model)
        return EMPTY
    active.add(key)
    try:
        out = _added_modules_output(mm, fn, path)
        for f, call in ([] if out else value_constructors(mm, fn, path)):
            out = out | call_output_facts(mm, f, call)
        if not out and path and path in fn.params:
            from .callsites import param_forward

            out = param_forward(mm, fn, path)  # every call site passes such a model
        return out
    finally:
        active.discard(key)


def _added_modules_output(mm, fn, path) -> frozenset:
    """``model = nn.Sequential(); model.add_module("fc", nn.Linear(...)); model.add_module(
    "softmax", nn.Softmax())``: what the last module added in ``fn`` returns."""
    if not path:
        return EMPTY
    last = None
    for op in walk(fn.body):
        if isinstance(op, CallOp) and op.attr == "add_module" and op.recv == path and len(op.args) >= 2:
            last = op.args[1].value
    if isinstance(last, cst.Call):
        return call_output_facts(mm, fn, last, 1)
    return EMPTY


def call_output_facts(mm, fn, call, depth: int = 0) -> frozenset:
    """Output facts of the module that ``call`` constructs (or a factory call returns)."""
    if depth > 6 or not isinstance(call, cst.Call):
        return EMPTY
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _PASSTHROUGH:
        v = func.value
        if isinstance(v, cst.Call):
            return call_output_facts(mm, fn, v, depth + 1)
        return model_output_facts(mm, fn, dotted(v)) if isinstance(v, (cst.Name, cst.Attribute)) else EMPTY
    d = dotted(func)
    if not d:
        return EMPTY
    q = mm.qualify(d) or d
    if q in _MODEL_WRAPPERS and call.args:
        v = call.args[0].value
        if isinstance(v, cst.Call):
            return call_output_facts(mm, fn, v, depth + 1)
        return model_output_facts(mm, fn, dotted(v)) if isinstance(v, (cst.Name, cst.Attribute)) else EMPTY
    if q in _LAYER_OUTPUT:
        return frozenset({_LAYER_OUTPUT[q]})
    if q in ("torch.nn.Sequential",):
        return _last_layer_facts(mm, fn, call.args, depth)
    cls = mm.find_class(d)
    if cls is not None:
        return without_param_calls(mm.class_forward_facts(cls)) if mm.class_is_module(cls) else EMPTY
    target = mm.functions.get(d)
    if target is not None:
        out = EMPTY
        for op in walk(target.body):
            if isinstance(op, ReturnOp) and op.value is not None:
                v = op.value
                if isinstance(v, cst.Call):
                    out = out | call_output_facts(mm, target, v, depth + 1)
                elif isinstance(v, cst.Name):
                    out = out | model_output_facts(mm, target, v.value)
        return out
    ext = mm.external_class_name(d) if hasattr(mm, "external_class_name") else None
    if ext:
        return without_param_calls(mm.external_forward_facts(ext))
    return EMPTY


def _forward_saves_output(mm, fn, op) -> bool:
    """The module ``op`` runs returns a tensor autograd saved for backward: a class of this
    module whose ``forward`` returns such a tensor on every path (``return self.relu(out)``), or
    an ``nn.Sequential`` whose last layer is such a class or an activation that saves its output
    (``nn.Sequential(conv, bn, IncResBlock(64, 64))``)."""
    cls, _ = mm._called_module_class(fn, op)
    if cls is not None and not any(b == "torch.nn.Sequential" for b in cls.bases):
        return class_returns_saved_output(mm, cls)
    call = constructor_call(mm, fn, op.target)
    if call is None or _ctor_qual(mm, call) not in _SEQUENTIAL:
        return False
    layers = [a for a in call.args if a.keyword is None]
    if not layers or any(a.star for a in layers) or not isinstance(layers[-1].value, cst.Call):
        return False
    last = layers[-1].value
    if _ctor_qual(mm, last) in _SAVES_OUT_MODULES:
        return True
    c = mm.find_class(dotted(last.func) or "")
    return c is not None and mm.class_is_module(c) and class_returns_saved_output(mm, c)


def _view_base(e):
    """``x.transpose(1, 2).contiguous()`` -> ``x``: the tensor a chain of view methods reads."""
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in _VIEW_METHODS \
            and e.func.attr.value != "__getitem__":
        e = e.func.value
    return e


def _forward_saves_input(mm, fn, path: Optional[str]) -> bool:
    """The module at ``path`` (the object a call runs) reads its input again in backward: it was
    built as a linear, convolution or normalization layer (perhaps under
    ``weight_norm``/``spectral_norm``), or as an ``nn.Sequential`` whose first layer is one
    (``nn.Sequential(weight_norm(conv), pad, gelu)``)."""
    if not path:
        return False
    if path.startswith("self.") and path.count(".") == 1:
        # every assignment of the attribute in its class builds such a layer (a branch that
        # makes it an ``nn.Identity()`` or takes it from a parameter reads nothing)
        cls, f = None, fn
        while f is not None and cls is None:
            cls, f = f.cls, f.parent
        assigns = cls.attr_values.get(path, ()) if cls is not None else ()
        if assigns:
            return all(_layer_saves_input(mm, fn, a.value, 0) for a in assigns)
    return _layer_saves_input(mm, fn, constructor_call(mm, fn, path), 0)


def _layer_saves_input(mm, fn, call, depth: int) -> bool:
    if not isinstance(call, cst.Call) or depth > 4:
        return False
    q = _ctor_qual(mm, call)
    if q in _SAVES_INPUT_MODULES:
        return True
    if q in _LAYER_WRAPPERS or q in _SEQUENTIAL:
        first = call.args[0] if call.args else None
        if first is None or first.star or (first.keyword is not None and first.keyword.value != "module"):
            return False
        v = first.value
        if isinstance(v, (cst.Name, cst.Attribute)):
            v = constructor_call(mm, fn, dotted(v))
        return _layer_saves_input(mm, fn, v, depth + 1)
    return False


def class_returns_saved_output(mm, cls) -> bool:
    """Every ``return`` of ``cls``'s own ``forward`` returns the output of an op that autograd
    saves for backward (a ReLU, a sigmoid ...)."""
    cache = mm.__dict__.setdefault("_saved_output_classes", {})
    got = cache.get(cls.qualname)
    if got is None:
        cache[cls.qualname] = False  # (a forward that runs its own class)
        fwd = cls.methods.get("forward")
        got = False
        if fwd is not None:
            mm.return_facts(fwd)
            rets = [r for r in all_ops(fwd) if isinstance(r, ReturnOp) and r.value is not None]
            got = bool(rets) and all("saves_out" in r.value_facts for r in rets)
        cache[cls.qualname] = got
    return got


def _last_layer_facts(mm, fn, args, depth: int) -> frozenset:
    layers = [a.value for a in args if a.keyword is None]
    if not layers or any(a.star for a in args):
        return EMPTY
    last = layers[-1]
    if isinstance(last, cst.Call):
        return call_output_facts(mm, fn, last, depth + 1)
    if isinstance(last, (cst.Name, cst.Attribute)):
        return model_output_facts(mm, fn, dotted(last))
    return EMPTY


def sequential_class_output(mm, cls) -> frozenset:
    """``class Net(nn.Sequential)`` without a forward: its last layer, from
    ``super().__init__(...)`` in ``__init__``."""
    if not any(b == "torch.nn.Sequential" for b in cls.bases):
        return EMPTY
    init = cls.methods.get("__init__")
    if init is None:
        return EMPTY
    for op in walk(init.body):
        if isinstance(op, CallOp) and op.attr == "__init__" and isinstance(op.recv_node, cst.Call) \
                and dotted(op.recv_node.func) == "super":
            return _last_layer_facts(mm, init, op.args, 0)
    return EMPTY


def loss_kind(mm, fn, op) -> Optional[str]:
    """The kind of a loss call (cross-entropy, NLL, BCE ...), following a criterion passed in."""
    if op.info in (catalog.CE, catalog.NLL, catalog.BCE, catalog.BCE_LOGITS):
        return op.info
    kinds = set()
    for _, call in value_constructors(mm, fn, op.target or op.func):
        d = dotted(call.func)
        q = (mm.qualify(d) or d) if d else None
        if q:
            kinds.add(catalog.role_of_constructor(q)[1])
    if len(kinds) == 1:
        return kinds.pop()
    return op.info

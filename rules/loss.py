"""Loss functions: each expects a particular kind of input (logits, log-probabilities,
probabilities) and target (class indices or probabilities)."""
from __future__ import annotations

import re

import libcst as cst

from torchlint.model import catalog
from torchlint.model.binder import dotted
from torchlint.model.dataflow import loss_kind
from torchlint.model.ir import CALL, FORWARD, GRAD_OFF, LOSS, AssignOp, CallOp, LoopOp, all_ops
from torchlint.rule import Report, Rule

from . import register


def _from(mm, fn, arg) -> str:
    """" (returned by `helper()` (file.py:12))" when the value comes from a function of the tree."""
    origin = mm.value_origin(fn, arg.value) if arg is not None else None
    return f" (returned by {origin})" if origin else ""


def _arg_facts(op: CallOp, pos: int, keyword: str) -> tuple:
    """(arg node, facts) of a positional-or-keyword argument of a call."""
    positional = 0
    for a, f in zip(op.args, op.arg_facts):
        if a.keyword is not None:
            if a.keyword.value == keyword:
                return a, f
            continue
        if a.star:
            return None, frozenset()
        if positional == pos:
            return a, f
        positional += 1
    return None, frozenset()


def _losses(mm, kinds, loss_modules: bool = False):
    """(function, call, kind) of the loss calls of ``kinds``; with ``loss_modules``, also the
    calls of a user loss module whose ``forward`` applies such a loss to its first input."""
    for fn in mm.all_functions:
        for op in all_ops(fn):
            if isinstance(op, CallOp) and op.kind == LOSS:
                k = loss_kind(mm, fn, op)
                if k in kinds:
                    yield fn, op, k
            elif loss_modules and isinstance(op, CallOp) and op.kind == FORWARD:
                k = mm.forward_loss_kind(fn, op)
                if k in kinds:
                    yield fn, op, k


def _loss_inputs(mm, kinds):
    """(function, call, kind, input argument, its facts, helper) of the loss calls of ``kinds``,
    of the calls of a user loss module whose ``forward`` applies such a loss to its first input,
    and of the calls of a helper function of the module that passes one of its parameters to
    such a loss (``helper`` is then that parameter's name)."""
    for fn, op, k in _losses(mm, kinds, loss_modules=True):
        arg, f = _arg_facts(op, 0, "input")
        if arg is not None:
            yield fn, op, k, arg, f, None
    for fn in mm.all_functions:
        for op in all_ops(fn):
            if isinstance(op, CallOp) and op.kind == CALL:
                for index, name, k in mm.helper_losses(fn, op):
                    if k in kinds:
                        arg, f = _arg_facts(op, index, name)
                        if arg is not None:
                            yield fn, op, k, arg, f, name


def _loss_name(op, kind, helper=None) -> str:
    if helper is not None:
        inner = {catalog.CE: "`cross_entropy`", catalog.BCE_LOGITS: "`binary_cross_entropy_with_logits`"
                 }.get(kind, "a loss")
        return f"`{op.func}()` (its `{helper}` goes to {inner})"
    if op.kind == FORWARD:  # a user loss module
        inner = {catalog.CE: "cross-entropy", catalog.NLL: "NLL",
                 catalog.BCE_LOGITS: "BCE-with-logits"}.get(kind, "a")
        return f"`{op.func}()` (its `forward` applies {inner} loss to this input)"
    if op.qual and op.qual.startswith("torch.nn.functional."):
        return f"`{op.qual.rsplit('.', 1)[-1]}`"
    return {catalog.CE: "`CrossEntropyLoss`", catalog.NLL: "`NLLLoss`",
            catalog.BCE_LOGITS: "`BCEWithLogitsLoss`"}.get(kind, "the loss")


# ------------------------------------------------------------------ fix: drop the activation
def _activation_input(mm, call, funcs, method):
    """``F.softmax(x, dim=1)`` / ``x.softmax(1)`` -> ``x`` (the node), else ``None``."""
    if not isinstance(call, cst.Call):
        return None
    f = call.func
    d = dotted(f)
    q = mm.qualify(d) if d else None
    if q in funcs and call.args and call.args[0].keyword is None:
        return call.args[0].value
    if isinstance(f, cst.Attribute) and f.attr.value == method and not (q and q in funcs):
        if q is None:  # a method on a tensor, not torch.softmax
            return f.value
    return None


def _drop_activation_fix(fn, op, arg, funcs, method, what):
    """A fix that removes the softmax/sigmoid feeding the loss: inline, or in the assignment of
    the name passed to the loss (safe only when that name has no other use)."""
    value = arg.value

    def make(mm):
        from torchlint.fixes import replace_node

        src = _activation_input(mm, value, funcs, method)
        if src is not None:
            return replace_node(mm, value, mm.code_for(src), f"Remove the {what} in front of the loss", "safe")
        if not isinstance(value, cst.Name):
            return None
        name = value.value
        assigns = [o for o in all_ops(fn) if isinstance(o, AssignOp) and o.aug is None
                   and any(isinstance(t, cst.Name) and t.value == name for t in o.targets)]
        if len(assigns) != 1 or len(assigns[0].targets) != 1:
            return None
        a = assigns[0]
        src = _activation_input(mm, a.value, funcs, method)
        if src is None:
            return None
        uses = len(re.findall(rf"(?<![\w.]){re.escape(name)}\b", mm.code_for(fn.node)))
        safety = "safe" if uses == 2 else "unsafe"
        return replace_node(mm, a.value, mm.code_for(src),
                            f"Remove the {what} that produces `{name}` (it feeds the loss)", safety)
    return make


@register
class SoftmaxBeforeCrossEntropy(Rule):
    code = "TL401"
    exempt_in_tests = False  # a wrong loss is wrong in a test too
    name = "softmax-before-cross-entropy"
    summary = "Probabilities (softmax outputs) are passed to `CrossEntropyLoss`, which expects logits."
    why = (
        "`nn.CrossEntropyLoss` and `F.cross_entropy` apply `log_softmax` themselves. Given "
        "probabilities, they compute `log_softmax(softmax(z))`: the loss is squashed into a "
        "narrow range, its gradients vanish as the model becomes confident, and training "
        "converges slowly to a worse model, with no error or warning. This often hides inside the "
        "model: an `nn.Softmax` as the last layer of an `nn.Sequential`, or a `forward` that "
        "returns `F.softmax(...)`."
    )
    example = """\
probs = F.softmax(model(x), dim=1)
loss = F.cross_entropy(probs, y)
"""
    use_instead = """\
logits = model(x)
loss = F.cross_entropy(logits, y)
probs = F.softmax(logits.detach(), dim=1)  # for metrics, if needed
"""
    known_problems = ("A softmax inside the model is followed through `nn.Sequential`, the "
                      "model's `forward` and factory functions of the linted tree; models from "
                      "other libraries are not inspected. A `forward` that applies the softmax "
                      "only under a test of one of its parameters (`if apply_softmax:`, or "
                      "`F.softmax(x) if softmax else x`) returns probabilities only to the calls "
                      "that pass a true literal (or rely on a true default); a call passing a "
                      "variable is not reported. A loss module of the linted tree whose `forward` "
                      "passes its first input to `cross_entropy` is such a loss too, and so is a call of "
                      "a helper function or method of the module that passes one of its "
                      "parameters to `cross_entropy` (`self._loss_fn(y_pred, y)`); when the helper "
                      "does so only under a test (`if self.method == 'multiclass':`), the "
                      "probabilities must come from a helper returning them under the same test.")
    fix_safety = "safe"
    fix_doc = ("Removes the softmax call that feeds the loss (`F.cross_entropy(F.softmax(z, 1), y)` "
               "-> `F.cross_entropy(z, y)`, or the `F.softmax(...)` that produces the name passed "
               "to the loss). Safe when the probabilities have no other use; unsafe when the "
               "name is also used elsewhere (it now holds logits). A softmax inside the model is "
               "not removed automatically.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html",)
    triggers = (b"oftmax",)

    def check(self, mm):
        for fn, op, kind, arg, f, helper in _loss_inputs(mm, (catalog.CE,)):
            if "probs" not in f or "detached" in f or "logprobs" in f:
                continue
            yield Report(op.node, f"{_loss_name(op, kind, helper)} applies log-softmax itself but receives "
                         f"probabilities (a softmax output){_from(mm, fn, arg)}; pass the logits",
                         fix=_drop_activation_fix(fn, op, arg, catalog.SOFTMAX_FUNCS, "softmax", "softmax"),
                         scope=fn.qualname)


@register
class SigmoidBeforeBCEWithLogits(Rule):
    code = "TL402"
    exempt_in_tests = False  # a wrong loss is wrong in a test too
    name = "sigmoid-before-bce-with-logits"
    summary = "Sigmoid outputs are passed to `BCEWithLogitsLoss`, which applies the sigmoid itself."
    why = (
        "`nn.BCEWithLogitsLoss` / `F.binary_cross_entropy_with_logits` compute "
        "`BCE(sigmoid(x), y)` in a numerically stable way. Given probabilities, the sigmoid is "
        "applied twice: every prediction is squeezed into (0.5, 0.73), the loss can never get "
        "close to zero, gradients are tiny, and thresholds and `pos_weight` stop meaning what "
        "they should. Nothing fails; the model just trains badly."
    )
    example = """\
probs = torch.sigmoid(model(x))
loss = nn.BCEWithLogitsLoss()(probs, y)
"""
    use_instead = """\
logits = model(x)
loss = nn.BCEWithLogitsLoss()(logits, y)
"""
    known_problems = ("A sigmoid inside the model (last layer of an `nn.Sequential`, or returned "
                      "by `forward`) is followed within the linted tree only. A `forward` that "
                      "applies it only under a test of one of its parameters (`if apply_sigmoid:`) "
                      "returns sigmoid outputs only to the calls that pass a true literal (or rely "
                      "on a true default). A loss module of the linted tree whose `forward` passes its "
                      "first input to `binary_cross_entropy_with_logits` (a focal loss) is such a loss too, "
                      "and so is a helper method of the module that passes one of its parameters to "
                      "it (`def loss(self, logits, labels): return self.loss_func(logits, labels)` "
                      "with `self.loss_func = F.binary_cross_entropy_with_logits`).")
    fix_safety = "safe"
    fix_doc = ("Removes the sigmoid call that feeds the loss, inline or in the assignment of the "
               "name passed to the loss. Safe when the sigmoid outputs have no other use; unsafe "
               "otherwise (the name now holds logits). A sigmoid inside the model is not "
               "removed automatically.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html",)
    triggers = (b"igmoid", b"expit")

    def check(self, mm):
        for fn, op, kind, arg, f, helper in _loss_inputs(mm, (catalog.BCE_LOGITS,)):
            if "sigmoid" not in f or "detached" in f:
                continue
            yield Report(op.node, f"{_loss_name(op, kind, helper)} applies the sigmoid itself but receives "
                         f"sigmoid outputs{_from(mm, fn, arg)}; pass the logits (or use `BCELoss` on "
                         "probabilities)",
                         fix=_drop_activation_fix(fn, op, arg, catalog.SIGMOID_FUNCS, "sigmoid", "sigmoid"),
                         scope=fn.qualname)


@register
class NllLossWithoutLogSoftmax(Rule):
    code = "TL403"
    exempt_in_tests = False  # a wrong loss is wrong in a test too
    name = "nll-loss-without-log-softmax"
    summary = "`NLLLoss` receives probabilities or raw logits instead of log-probabilities."
    why = (
        "`nn.NLLLoss` / `F.nll_loss` only pick `-input[target]`: they expect log-probabilities "
        "(`log_softmax` outputs). Given raw logits, the loss is unbounded below - the model "
        "lowers it by inflating one score, not by getting the class right; given softmax "
        "probabilities, it maximises a probability linearly instead of its logarithm, and "
        "gradients vanish. Both train without any error."
    )
    example = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(784, 128)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(F.relu(self.hidden(x)))


model = Net()
loss = F.nll_loss(model(x), y)
"""
    use_instead = """\
loss = F.nll_loss(F.log_softmax(model(x), dim=1), y)
# or simply
loss = F.cross_entropy(model(x), y)
"""
    known_problems = ("Raw logits are recognised when the model's `forward` (or `nn.Sequential`) "
                      "ends in a linear or convolution layer defined in the linted tree.")
    fix_safety = "unsafe"
    fix_doc = ("Probabilities: the softmax that produces them becomes a `log_softmax` with the same "
               "arguments (written in the loss call, or in the assignment of the name passed to it). "
               "Raw logits: `F.nll_loss` becomes `F.cross_entropy` (same arguments), and an "
               "`nn.NLLLoss(...)` built in the module becomes `nn.CrossEntropyLoss(...)` when every "
               "use of it receives logits. Unsafe, except for a softmax written in the loss call: "
               "a name that held probabilities now holds log-probabilities wherever else it is "
               "used, and a criterion changed in the module changes for every use.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.NLLLoss.html",)
    triggers = (b"nll_loss", b"NLLLoss")

    def check(self, mm):
        for fn, op, kind in _losses(mm, (catalog.NLL,)):
            arg, f = _arg_facts(op, 0, "input")
            if arg is None or "logprobs" in f:
                continue
            if "probs" in f:
                what = "probabilities (a softmax output)"
            elif "logits" in f:
                what = "raw logits (the model ends in a linear layer, without log_softmax)"
            else:
                continue
            fix = _log_softmax_fix(fn, arg) if "probs" in f else _cross_entropy_fix(fn, op)
            yield Report(op.node, f"{_loss_name(op, kind)} expects log-probabilities but receives "
                         f"{what}{_from(mm, fn, arg)}; apply `log_softmax` or use `cross_entropy` on "
                         "the logits",
                         fix=fix, scope=fn.qualname)


def _log_softmax_fix(fn, arg):
    """Fix (TL403 on probabilities): the softmax feeding the loss becomes a log_softmax."""
    def make(mm):
        from torchlint.fixes import replace_node

        value, safety = arg.value, "safe"
        if isinstance(value, cst.Name):
            safety = "unsafe"
            assigns = [o for o in all_ops(fn) if isinstance(o, AssignOp) and o.aug is None
                       and any(isinstance(t, cst.Name) and t.value == value.value for t in o.targets)]
            if len(assigns) != 1 or len(assigns[0].targets) != 1:
                return None
            value = assigns[0].value
        new = _stable_spelling(mm, value)
        if new is None or "log_softmax" not in new:
            return None
        return replace_node(mm, value, new, "Pass log-probabilities: `softmax` -> `log_softmax`", safety)
    return make


def _cross_entropy_fix(fn, op):
    """Fix (TL403 on raw logits): ``F.nll_loss`` -> ``F.cross_entropy``; ``nn.NLLLoss(...)`` ->
    ``nn.CrossEntropyLoss(...)`` when every loss call of that module receives logits."""
    def make(mm):
        from torchlint.fixes import replace_node
        from torchlint.model.dataflow import value_constructors

        if op.qual == "torch.nn.functional.nll_loss":
            if isinstance(op.node.func, cst.Attribute) and op.node.func.attr.value == "nll_loss":
                return replace_node(mm, op.node.func.attr, "cross_entropy",
                                    "Use `cross_entropy` on the logits", "unsafe")
            return None
        built = value_constructors(mm, fn, op.target or op.func)
        if len(built) != 1:
            return None
        call = built[0][1]
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "NLLLoss"):
            return None
        for f2, o2, _ in _losses(mm, (catalog.NLL,)):
            if any(c is call for _, c in value_constructors(mm, f2, o2.target or o2.func)):
                _, facts = _arg_facts(o2, 0, "input")
                if "logits" not in facts or facts & {"logprobs", "probs"}:
                    return None  # another use of this criterion is given log-probabilities
        return replace_node(mm, call.func.attr, "CrossEntropyLoss", "Use `CrossEntropyLoss` on the logits", "unsafe")
    return make


@register
class CrossEntropyFloatTargets(Rule):
    code = "TL404"
    exempt_in_tests = False  # a wrong loss is wrong in a test too
    name = "cross-entropy-float-targets"
    summary = "Class-index targets are cast to float before `CrossEntropyLoss`/`NLLLoss`."
    why = (
        "With class-index targets, `cross_entropy` and `nll_loss` need integer (`long`) targets "
        "of shape `(N,)`. Float targets mean *class probabilities* of shape `(N, C)` to "
        "`cross_entropy`: a float `(N,)` label vector is either rejected with a confusing dtype "
        "or shape error, or - when the shapes happen to line up (`N == C`, a flattened "
        "segmentation map) - silently read as soft labels and trained on the wrong objective. "
        "The usual cause is a `.float()` copied from a regression or BCE script."
    )
    example = """\
for x, y in loader:
    loss = F.cross_entropy(model(x), y.float())
"""
    use_instead = """\
for x, y in loader:
    loss = F.cross_entropy(model(x), y.long())
"""
    known_problems = ("Soft targets (one-hot, mixup, label smoothing) are float on purpose and not "
                      "reported; a float cast is reported when it is applied to labels taken from a "
                      "data loader, to integer class indices, or to targets the function receives from "
                      "its caller (a model's `forward(x, targets)`, a loss helper), including a list "
                      "of them stacked (`torch.stack([t for t in targets]).float()`). A loss chosen "
                      "in `__init__` by a test of attributes only `__init__` sets (`if self.task == "
                      "'segment': self.loss_func = lambda logits, y: F.cross_entropy(logits, y)`) is "
                      "known at a call under the same test; chosen otherwise, its kind is unknown and "
                      "nothing is reported.")
    fix_safety = "unsafe"
    fix_doc = ("Replaces a `.float()` (`.double()`, `.half()`) cast written on the target argument by "
               "`.long()`, and so the cast in the assignment of the name passed as the target, in the "
               "same block (`y = y.float()`, `y = y.to(device, dtype=torch.float32)` -> `dtype=torch.long`). "
               "Unsafe: if the targets really were probabilities, they are truncated.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html",)
    triggers = (b"float", b"double", b"half", b"dtype")

    def check(self, mm):
        for fn, op, kind in _losses(mm, (catalog.CE, catalog.NLL)):
            arg, f = _arg_facts(op, 1, "target")
            if arg is None or "float" not in f or "soft" in f or not f & {"batch", "indices", "param_in"}:
                continue
            if op.keyword("label_smoothing") is not None:
                continue
            yield Report(op.node, f"{_loss_name(op, kind)} receives class-index targets cast to float; "
                         "class indices must be `long` (float targets mean class probabilities)",
                         fix=_long_targets(arg.value, fn, op), scope=fn.qualname)


_FLOAT_CASTS = ("float", "double", "half", "bfloat16")


def _long_targets(value, fn=None, op=None):
    """Fix (TL404): ``y.float()`` written as the target becomes ``y.long()``; for a name, the
    float cast of its last assignment before the loss (``y = y.to(device, dtype=torch.float32)``)."""
    def make(mm):
        from torchlint.fixes import replace_node

        if isinstance(value, cst.Name) and fn is not None:
            a = _last_assignment(fn, op, value.value)
            dtype = _float_dtype_keyword(a.value) if a is not None else None
            if dtype is not None:
                return replace_node(mm, dtype.attr, "long",
                                    f"Move the class indices as `long`: `{mm.code_for(dtype)}` -> `torch.long`",
                                    "unsafe")
            cast = a.value if a is not None else None
        else:
            cast = value
        if not (isinstance(cast, cst.Call) and not cast.args and isinstance(cast.func, cst.Attribute)
                and cast.func.attr.value in _FLOAT_CASTS):
            return None
        return replace_node(mm, cast.func.attr, "long",
                            f"Pass the class indices as `long`: `.{cast.func.attr.value}()` -> `.long()`", "unsafe")
    return make


_FLOAT_DTYPES = {"torch.float", "torch.float32", "torch.float64", "torch.double", "torch.half", "torch.float16",
                 "torch.bfloat16"}


def _last_assignment(fn, op, name):
    """The assignment of ``name`` that the call ``op`` reads: the last one before it in its own
    block (not under a condition ``op`` is outside of), none when a loop could bind it again."""
    ops = all_ops(fn)
    i = ops.index(op)
    for o in reversed(ops[:i]):
        if isinstance(o, LoopOp) and isinstance(o.node, cst.For) and name in names_of_target(o.target):
            return None
        if isinstance(o, AssignOp) and any(name in names_of_target(t) for t in o.targets):
            if o.aug is not None or len(o.targets) != 1 or o.loop is not op.loop or o.guards != op.guards[:len(o.guards)] \
                    or len(o.guards) != len(op.guards):
                return None
            if not isinstance(o.targets[0], cst.Name):
                return None
            return o
    return None


def names_of_target(t) -> set:
    if isinstance(t, cst.Name):
        return {t.value}
    if isinstance(t, (cst.Tuple, cst.List)):
        return set().union(*(names_of_target(e.value) for e in t.elements)) if t.elements else set()
    return set()


def _float_dtype_keyword(value):
    """``dtype=torch.float32`` of ``y.to(device, dtype=torch.float32)``: its ``torch.float32`` node."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to"):
        return None
    for a in value.args:
        if a.keyword is not None and a.keyword.value == "dtype" and isinstance(a.value, cst.Attribute) \
                and dotted(a.value) in _FLOAT_DTYPES:
            return a.value
    return None


# ------------------------------------------------------------------ TL405
_SOFTMAX = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_SIGMOID = {"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}


def _log_of(op: CallOp):
    """(the argument node, its facts) of ``torch.log(v)`` / ``v.log()``, else ``None``."""
    if op.qual == "torch.log":
        a, facts = _arg_facts(op, 0, "input")
        return (a.value, facts) if a is not None else None
    if op.qual is None and op.attr == "log" and not op.args and op.recv_node is not None:
        return op.recv_node, op.recv_facts
    return None


def _stable_spelling(mm, value):
    """``F.softmax(x, dim=1)`` -> ``torch.log_softmax(x, dim=1)``; ``x.sigmoid()`` -> ...;
    ``None`` when the argument is not itself the activation call."""
    from torchlint.fixes import torch_spelling

    if not isinstance(value, cst.Call):
        return None
    d = dotted(value.func)
    q = mm.qualify(d) if d else None
    args = ", ".join(mm.code_for(a).rstrip(", ") for a in value.args)
    if q in _SOFTMAX:
        name = torch_spelling(mm, "torch.log_softmax")
        return f"{name}({args})" if name else None
    if q in _SIGMOID:
        name = torch_spelling(mm, "torch.nn.functional.logsigmoid")
        return f"{name}({args})" if name else None
    if q is None and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("softmax", "sigmoid"):
        method = "log_softmax" if value.func.attr.value == "softmax" else None
        if method:
            return f"{mm.code_for(value.func.value)}.{method}({args})"
    return None


@register
class LogOfSoftmax(Rule):
    code = "TL405"
    name = "log-of-softmax"
    summary = "`log()` of softmax or sigmoid outputs: -inf/NaN once the logits saturate."
    why = (
        "`softmax` and `sigmoid` round to exactly 0 in floating point once a logit is far from "
        "the others (about 17 apart in float16, 104 in float32). `torch.log` of that 0 is `-inf`, "
        "and its gradient `inf` or NaN, which then spreads through the weights. "
        "`log_softmax` and `logsigmoid` compute the same values with the log-sum-exp trick and "
        "stay finite. Logs computed under `no_grad` (metrics, reports) are not reported."
    )
    example = """\
logits = policy(states)
probs = F.softmax(logits, dim=-1)
log_probs = torch.log(probs)
loss = -(log_probs.gather(1, actions) * advantages).mean()
"""
    use_instead = """\
logits = policy(states)
log_probs = F.log_softmax(logits, dim=-1)
loss = -(log_probs.gather(1, actions) * advantages).mean()
"""
    known_problems = ("Arguments shifted by an epsilon or clamped (`torch.log(p + 1e-8)`, "
                      "`p.clamp(min=eps).log()`) are trusted. Preview: on the real-world benchmark most of "
                      "its 13 findings are in tutorials and RL code whose logits rarely saturate, where a "
                      "maintainer may reasonably leave them (harmless until they are not).")
    fix_safety = "safe"
    fix_doc = ("When the argument is the softmax/sigmoid call itself, replaces `log(softmax(x, d))` "
               "by `torch.log_softmax(x, d)` and `log(sigmoid(x))` by `F.logsigmoid(x)`; when it is "
               "a name bound once to such a call whose arguments are names not bound again "
               "(`p = torch.sigmoid(z)` ... `torch.log(p)`), the call is written out the same way.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.functional.log_softmax.html",)
    default = False  # preview until its precision on the real-world benchmark is measured
    triggers = (b"log",)

    def check(self, mm):
        for fn in mm.all_functions:
            for op in all_ops(fn):
                if not isinstance(op, CallOp):
                    continue
                got = _log_of(op)
                if got is None:
                    continue
                value, facts = got
                if "logprobs" in facts or GRAD_OFF in (op.grad, fn.decorator_grad):
                    continue
                if "probs" in facts:
                    stable = "log_softmax"
                elif "sigmoid" in facts:
                    stable = "logsigmoid"
                else:
                    continue
                yield Report(
                    op.node,
                    f"`log()` of {'softmax' if stable == 'log_softmax' else 'sigmoid'} outputs"
                    f"{_from(mm, fn, cst.Arg(value))} is -inf where they round to 0; use `{stable}`",
                    fix=_stable_log_fix(op.node, value, fn),
                )


def _stable_log_fix(node, value, fn=None):
    def make(mm):
        from torchlint.fixes import replace_node

        new = _stable_spelling(mm, value)
        if new is None and isinstance(value, cst.Name) and fn is not None:
            new = _stable_spelling(mm, _activation_of_name(fn, node, value.value))
        if new is None:
            return None
        return replace_node(mm, node, new, "Use the numerically stable log-activation", "safe")
    return make


def _activation_of_name(fn, use, name):
    """``p = torch.sigmoid(z)`` for ``torch.log(p)``: the activation call bound once to ``name``
    in ``fn`` before ``use``, when its arguments are names and constants that are not bound
    again after it (so writing the call again at ``use`` computes the same values)."""
    ops = all_ops(fn)
    assigns = [o for o in ops if isinstance(o, AssignOp) and o.aug is None
               and any(isinstance(t, cst.Name) and t.value == name for t in o.targets)]
    if len(assigns) != 1 or len(assigns[0].targets) != 1 or not isinstance(assigns[0].value, cst.Call):
        return None
    a = assigns[0]
    args = [x.value for x in a.value.args]
    if any(not isinstance(x, (cst.Name, cst.Integer, cst.Float)) and not (
            isinstance(x, cst.UnaryOperation) and isinstance(x.expression, (cst.Integer, cst.Float))) for x in args):
        return None
    read = {x.value for x in args if isinstance(x, cst.Name)}
    later = ops[ops.index(a) + 1:]
    if any(isinstance(o, AssignOp) and any(dotted(t) in read or names_of_target(t) & read for t in o.targets)
           for o in later):
        return None
    if any(isinstance(o, LoopOp) and o.target is not None and names_of_target(o.target) & read for o in later):
        return None  # a loop binds it again
    if not any(o.node is use for o in later):
        return None
    return a.value

"""Autograd: do not modify what backward needs, do not bypass autograd with `.data`, call
modules, not their `forward`."""
from __future__ import annotations

import re

import libcst as cst

from torchlint.model import catalog
from torchlint.model.callsites import only_called_without_grad
from torchlint.model.roles import plain_instance_classes
from torchlint.model.ir import BACKWARD, GRAD_OFF, STEP, CallOp, all_ops, walk
from torchlint.model.queries import (
    between_forward_and_backward, gradient_cuts, inplace_may_be_differentiated, is_kind, is_scalar_tensor,
)
from torchlint.rule import Report, Rule

from . import register

# parameters updated as a moving average / a frozen copy: not trained by autograd
_EMA_WORDS = re.compile(r"ema|teacher|target|momentum|shadow|average|avg|swa|frozen|frozen|old|"
                        r"prev|copy|clone|polyak|mean_", re.I)
_INIT_NAME = re.compile(r"init|reset_param|weights?($|_)", re.I)


def _grad_off(mm, fn, op) -> bool:
    """``op`` runs with gradients disabled: a no_grad block/decorator, or ``fn`` is only ever
    called (in this module or by the tree) from no_grad code."""
    if op.grad == GRAD_OFF:
        return True
    f = fn
    while f is not None:
        if f.decorator_grad == GRAD_OFF:
            return True
        f = f.parent
    return only_called_without_grad(mm, fn)


def _autograd_function(mm, fn) -> bool:
    """Methods of ``torch.autograd.Function`` subclasses run with grad disabled."""
    f = fn
    while f is not None and f.cls is None:
        f = f.parent
    if f is None or f.cls is None:
        return False
    return any(b in ("torch.autograd.Function", "torch.autograd.function.Function")
               or b.endswith("autograd.Function") for b in f.cls.bases)


_INFERENCE_NAME = re.compile(r"(^|_)(generate|generation|sample|sampling|decode|beam|greedy|infer|"
                             r"inference|predict|eval|evaluate|validate|test|score|benchmark)", re.I)


def _inference_only(mm, fn) -> bool:
    """A plain function (not a module method) that generates / predicts / evaluates and never
    runs backward itself: nothing it modifies is ever differentiated."""
    if mm.is_module_method(fn) or not _INFERENCE_NAME.search(fn.name):
        return False
    return not any(isinstance(o, CallOp) and is_kind(mm, o, BACKWARD) for o in all_ops(fn))


def _loop_source(mm, op, target) -> str:
    """The source of the iterable of the loop that bound ``target`` (``model.parameters()``)."""
    from torchlint.model.binder import dotted

    name = dotted(target) if target is not None else None
    lp = op.loop
    while lp is not None:
        if lp.target is not None and name and name in mm.code_for(lp.target):
            return mm.code_for(lp.iter) if lp.iter is not None else ""
        lp = lp.parent
    return ""


def _describe(mm, r) -> str:
    code = mm.code_for(r.target) if r.target is not None else "the tensor"
    if len(code) > 40:
        code = code[:37] + "..."
    return f"`{code}`"


@register
class InplaceOnSavedTensor(Rule):
    code = "TL301"
    name = "inplace-on-saved-tensor"
    summary = "An in-place operation modifies a tensor that autograd saved for the backward pass."
    why = (
        "Many operations save tensors for their backward: `sigmoid`, `tanh`, `exp`, `softmax` and "
        "`relu` save their *output*, `*`, `@`, `/` and `**` save their *inputs*, and so do linear, "
        "convolution and normalization layers (`x += self.pos_conv(x)`). Changing such a "
        "tensor in place (`x.mul_()`, `x += y`, `x[mask] = 0`, `nn.ReLU(inplace=True)`) before "
        "`backward()` makes autograd raise `RuntimeError: one of the variables needed for gradient "
        "computation has been modified by an inplace operation` - at backward time, far from the "
        "line that caused it, and often only in the training configuration (dropout on, a mask "
        "applied). Modifying a leaf parameter in place outside `torch.no_grad()` fails the same "
        "way (`a leaf Variable that requires grad is being used in an in-place operation`). "
        "In-place ops on the outputs of convolutions, linear layers and batch norm (the ResNet "
        "`out += identity`), on fresh tensors, buffers, under `no_grad`, in `nn.init` and in EMA "
        "updates are fine and not reported, and so are changes no backward can reach (inference "
        "code that keeps only an `argmax` of the changed probabilities, with no backward after it) "
        "and tensors saved only by an op whose result is `.detach()`ed (`std = torch.sqrt((x * x)"
        ".mean(1)).detach()` before `x /= std`: that op's backward never runs)."
    )
    example = """\
class GatedBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gate = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def forward(self, x, keep_mask):
        gate = torch.sigmoid(self.gate(x))
        gate *= keep_mask          # sigmoid's backward needs its output
        return gate * self.value(x)
"""
    use_instead = """\
class GatedBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gate = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def forward(self, x, keep_mask):
        gate = torch.sigmoid(self.gate(x))
        gate = gate * keep_mask
        return gate * self.value(x)
"""
    known_problems = (
        "Only tensors whose origin is visible in the same function are checked: a tensor "
        "passed in from a caller is not known to be a saved activation. Parameter updates are "
        "checked for parameters iterated from `.parameters()` and `nn.Parameter` attributes; "
        "loops over an EMA / teacher / target model are assumed not to require grad."
    )
    fix_safety = "unsafe"
    fix_doc = ("A parameter updated in place is wrapped in `with torch.no_grad():` (the loop over "
               "`.parameters()`, or the statement; safe: the update runs as written). A saved tensor "
               "changed in place by a statement of its own is rewritten out of place (`x.mul_(m)` -> "
               "`x = x.mul(m)`, `x *= m` -> `x = x * m`); unsafe: another name for the same tensor no "
               "longer sees the change.")
    references = (
        "https://pytorch.org/docs/stable/notes/autograd.html#in-place-operations-with-autograd",
    )
    triggers = (b"_(", b"+=", b"-=", b"*=", b"/=", b"inplace", b"] =", b"out=")

    def check(self, mm):
        for fn in mm.all_functions:
            ops = getattr(fn, "inplace_ops", None)
            if not ops or _autograd_function(mm, fn):
                continue
            seen = set()
            for r in ops:
                f = r.facts
                if "fresh" in f or "detached" in f or id(r.node) in seen:
                    continue
                msg = None
                if "saves_out" in f and f & {"graph", "grad_in"}:
                    what = {"probs": "softmax", "sigmoid": "sigmoid", "logprobs": "log_softmax"}
                    src = next((v for k, v in what.items() if k in f), "an activation (relu, exp, tanh ...)")
                    if r.how == "activation":
                        msg = (f"an in-place activation overwrites {_describe(mm, r)}, the output of "
                               f"{src} that autograd saved for backward; backward will fail")
                    else:
                        msg = (f"in-place change of {_describe(mm, r)}, the output of {src}, which "
                               "autograd saved for backward; backward will raise a RuntimeError "
                               "(use an out-of-place op)")
                elif "layer_saved" in f and f & {"graph", "grad_in", "param", "batch", "fresh"}:
                    msg = (f"in-place change of {_describe(mm, r)} after a layer read it (a linear, "
                           "convolution or normalization layer, whose backward needs its input); "
                           "backward will raise a RuntimeError (use an out-of-place op)")
                elif "saved" in f and f & {"graph", "grad_in", "param"}:
                    msg = (f"in-place change of {_describe(mm, r)} after it was used in a "
                           "multiplication/division whose backward needs its value; backward "
                           "will raise a RuntimeError (use an out-of-place op)")
                elif "param" in f and r.how in ("method", "aug", "setitem", "out", "func"):
                    if _EMA_WORDS.search(fn.name) or _EMA_WORDS.search(_loop_source(mm, r.op, r.target)):
                        continue
                    if r.target is not None and _EMA_WORDS.search(mm.code_for(r.target)):
                        continue
                    if _INIT_NAME.search(fn.name) and fn.name != "__init__":
                        continue
                    msg = (f"in-place change of parameter {_describe(mm, r)} outside "
                           "`torch.no_grad()`; autograd rejects in-place ops on leaf tensors that "
                           "require grad (wrap the update in `with torch.no_grad():`)")
                if msg is None or _grad_off(mm, fn, r.op):
                    continue
                if "param" not in f and (_inference_only(mm, fn)
                                         or not inplace_may_be_differentiated(mm, fn, r.op, r.target)):
                    continue  # no backward can reach the changed tensor: nothing raises
                seen.add(id(r.node))
                fix = _no_grad_update(fn, r) if "param" in f and msg.startswith("in-place change of parameter") \
                    else _out_of_place(r)
                yield Report(r.node, msg, fix=fix, scope=fn.qualname)


# in-place tensor methods whose out-of-place twin is the same name without the underscore
_OUT_OF_PLACE = frozenset({
    "masked_fill_", "masked_scatter_", "clamp_", "clamp_min_", "clamp_max_", "clip_", "mul_", "add_",
    "sub_", "div_", "pow_", "exp_", "log_", "sigmoid_", "tanh_", "relu_", "abs_", "neg_", "sqrt_",
    "scatter_", "scatter_add_", "index_fill_", "index_add_", "index_copy_", "addcmul_", "addcdiv_",
})


def _out_of_place(r):
    """Fix (TL301, saved tensors): ``x.mul_(y)`` -> ``x = x.mul(y)``, ``x *= y`` -> ``x = x * y``,
    for a plain name in a statement of its own."""
    def make(mm):
        from torchlint.findings import Edit, Fix, Position

        stmt = r.op.stmt
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 or not isinstance(r.target, cst.Name):
            return None
        small, name = stmt.body[0], r.target.value
        sl, sc, el, ec = mm.span_of(small)
        if r.how == "method" and isinstance(small, cst.Expr) and small.value is r.node \
                and isinstance(r.node.func, cst.Attribute) and isinstance(r.node.func.value, cst.Name) \
                and r.node.func.value.value == name \
                and r.node.func.attr.value in _OUT_OF_PLACE:
            method = r.node.func.attr.value
            asl, asc, ael, aec = mm.span_of(r.node.func.attr)
            return Fix(f"Write it out of place: `{name} = {name}.{method[:-1]}(...)`",
                       (Edit(Position(sl, sc), Position(sl, sc), f"{name} = "),
                        Edit(Position(asl, asc), Position(ael, aec), method[:-1])), "unsafe")
        if r.how == "aug" and isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) \
                and small.target.value == name:
            sym = mm.code_for(small.operator).strip()[:-1]
            if sym not in ("+", "-", "*", "/", "**", "@"):
                return None
            rhs = mm.code_for(small.value).strip()
            if not isinstance(small.value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)):
                rhs = f"({rhs})"
            return Fix(f"Write it out of place: `{name} = {name} {sym} ...`",
                       (Edit(Position(sl, sc), Position(el, ec), f"{name} = {name} {sym} {rhs}"),), "unsafe")
        return None
    return make


def _no_grad_update(fn, r):
    """Fix (TL301, leaf parameters): wrap the loop over the parameters (or the statement) in
    ``with torch.no_grad():``."""
    def make(mm):
        from torchlint.fixes import wrap_in_with

        if id(r.op) not in {id(o) for o in all_ops(fn)}:
            return None
        loop = r.op.loop
        while loop is not None and "parameters" not in mm.code_for(loop.iter or loop.node.body):
            loop = loop.parent
        target = loop.node if loop is not None else r.op.stmt
        if not isinstance(target, (cst.For, cst.SimpleStatementLine)):
            return None
        return wrap_in_with(mm, target, "torch.no_grad()", "Update the parameters under `torch.no_grad()`", "safe")
    return make


def _in_training_loop(mm, op) -> bool:
    """``op`` runs inside a loop whose iterations run backward or step an optimizer (directly
    or through helpers): between one graph and the next."""
    cache = mm.__dict__.setdefault("_tl3_cache", {})
    lp = op.loop
    while lp is not None:
        key = ("trains", id(lp))
        if key not in cache:
            cache[key] = any(isinstance(o, CallOp) and (is_kind(mm, o, BACKWARD) or is_kind(mm, o, STEP))
                             for o in walk(lp.body))
        if cache[key]:
            return True
        lp = lp.parent
    return False


@register
class DataAttribute(Rule):
    code = "TL302"
    name = "data-attribute"
    summary = "`.data` is used on a parameter or on a tensor attached to the autograd graph."
    why = (
        "`x.data` returns the same storage as `x` with autograd switched off and the version "
        "counter bypassed. Reading it from a graph tensor silently cuts the gradient (where "
        "`.detach()` states the intent and still lets autograd detect later in-place changes); "
        "writing through it changes values autograd may have saved, so gradients become "
        "silently wrong instead of raising an error; assigning `p.data = t` swaps a parameter's "
        "tensor without any shape, dtype or device check. `x.detach()` for reads and "
        "`with torch.no_grad():` for in-place updates are the supported spellings.\n\n"
        "Reported where it changes what training computes: `.data` written on a tensor "
        "produced by the model or derived from it; `.data` read from such a tensor inside a "
        "module's `forward` (a gradient of the model silently cut), outside `no_grad`; a "
        "parameter written through `.data` between the forward and the backward that "
        "differentiates it (the gradient is computed from values autograd never saw change); "
        "`loss.data[0]`, which raises `IndexError` on the 0-dim losses of PyTorch 0.4 and later. "
        "Not reported: `.data` under `no_grad`; reads outside a `forward`, for logging and "
        "metrics (`running_loss += loss.data`, `out.data.argmax(1)`) or as a stop-gradient on "
        "the way to the loss (a TD target, the hidden state of truncated BPTT, the inputs of a "
        "gradient penalty: `.detach()` gives the same values and gradients); reads of "
        "parameters; initialisation (`m.weight.data.normal_()`, `emb.weight.data = vectors`); "
        "parameter writes after the backward (WGAN weight clipping after the step, hand-written "
        "SGD, averaged weights swapped in for evaluation) and outside training (surgery, "
        "freezing, loading weights); `.data[\"key\"]`, an item of a mapping such as DGL's "
        "`edges.data` (a tensor is never indexed by a string); reads in a `forward` that only become "
        "NumPy or Python values (`x.cpu().data.numpy()` for a host-side proposal layer: a NumPy "
        "array carries no gradient anyway); in-place view ops on the alias (`out.data.unsqueeze_(1)`, "
        "`squeeze_`, `t_`, `transpose_`), which change its shape, not one value; and `p.grad.data` "
        "(see the option)."
    )
    example = """\
class FrozenEncoderClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(784, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        h = torch.relu(self.encoder(x)).data
        return self.head(h)
"""
    use_instead = """\
class FrozenEncoderClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(784, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        h = torch.relu(self.encoder(x)).detach()
        return self.head(h)
"""
    fix_safety = "unsafe"
    fix_doc = ("`loss.data[0]` becomes `loss.item()` (safe: the only value a 0-dim tensor has). "
               "For other reads, replaces `x.data` with `x.detach()`. Unsafe: unlike `.data`, a detached "
               "tensor shares the version counter, so a later in-place change of it (or of `x`) "
               "that used to go unnoticed now raises an error - which is the point, but it can "
               "change behaviour. A read in `forward` that the output is computed from (a gradient "
               "cut, TL304) gets no fix here: `.detach()` would keep the cut and removing it trains the "
               "layers before it, the author's call (TL304's fix removes it). Writes are not fixed "
               "automatically.")
    options = ("`allow-grad-data` (default `true`): `p.grad.data` is not reported. Gradients are "
               "not part of any graph, so reading or scaling them through `.data` (hand-written "
               "clipping, logging) is harmless; set it to `false` to report it too.")
    references = (
        "https://pytorch.org/docs/stable/notes/autograd.html#in-place-correctness-checks",
        "https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html",
    )
    triggers = (b".data",)

    def check(self, mm):
        allow_grad = self.settings.get("allow-grad-data", True)
        for fn in mm.all_functions:
            accesses = getattr(fn, "data_accesses", None)
            if not accesses:
                continue
            for d in accesses:
                f = d.facts
                base = d.base or ""
                if "grad" in f or base.endswith(".grad"):
                    if allow_grad or _grad_off(mm, fn, d.op):
                        continue
                    yield Report(d.node, "`.grad.data` bypasses autograd; use `.grad` directly "
                                 "(under `torch.no_grad()` to modify it)", scope=fn.qualname)
                    continue
                if d.index0 is not None and not d.write and is_scalar_tensor(mm, fn, d.node.value, f):
                    # `loss.data[0]`: a 0-dim tensor has no element 0 since PyTorch 0.4
                    yield Report(d.index0, f"`{_base_code(mm, d)}.data[0]` indexes a 0-dim tensor "
                                 "(IndexError since PyTorch 0.4); use "
                                 f"`{_base_code(mm, d)}.item()` for its value",
                                 fix=_item_fix(d), scope=fn.qualname)
                    continue
                if _grad_off(mm, fn, d.op) and not d.assign:
                    continue
                if f & {"graph", "grad_in"} and ("graph" in f or d.write):
                    if d.write:
                        msg = ("writing through `.data` changes a tensor of the autograd graph behind "
                               "autograd's back; gradients become silently wrong (modify a "
                               "`.detach()`ed copy or use an out-of-place op)")
                        yield Report(d.node, msg, scope=fn.qualname)
                    elif fn.name == "forward" and mm.is_module_method(fn) and not d.host and not d.meta_only:
                        # inside forward: a gradient of the model silently cut.  Outside a
                        # forward a read is the stop-gradient `.detach()` spells (a TD target,
                        # the hidden state of truncated BPTT, the inputs of a gradient penalty)
                        # or a read for logging and metrics: the same values and gradients
                        msg = ("`.data` silently detaches a tensor of the autograd graph; use "
                               "`.detach()` (same result, but autograd still checks in-place changes)")
                        yield Report(d.node, msg, fix=_detach_fix(d, fn), scope=fn.qualname)
                    continue
                if "param" not in f or not d.write:
                    continue
                init = fn.name == "__init__" or bool(_INIT_NAME.search(fn.name))
                if init or not between_forward_and_backward(mm, fn, d.op):
                    # initialisation, or a write after the backward (weight clipping after the
                    # step, hand-written SGD, swapping averaged weights in for evaluation):
                    # nothing recorded in a graph still to be differentiated saw the old value
                    continue
                if d.assign:
                    yield Report(d.node, "assigning `.data` swaps the parameter's tensor between the forward "
                                 "and the backward that differentiates it, behind autograd's back; use "
                                 "`with torch.no_grad(): param.copy_(value)` after the backward", scope=fn.qualname)
                else:
                    yield Report(d.node, "in-place update of a parameter through `.data` between the forward "
                                 "and the backward that differentiates it: the gradient is computed from "
                                 "values autograd did not see change; update it after `backward()` under "
                                 "`with torch.no_grad():`", scope=fn.qualname)


def _base_code(mm, d) -> str:
    return mm.code_for(d.node.value)


def _item_fix(d):
    def make(mm):
        from torchlint.fixes import replace_node

        return replace_node(mm, d.index0, f"{_base_code(mm, d)}.item()",
                            "Replace `.data[0]` with `.item()`", "safe")
    return make


def _detach_fix(d, fn=None):
    def make(mm):
        from torchlint.fixes import replace_node

        if fn is not None and any(inner is d.node.value for inner, *_ in gradient_cuts(mm, fn)):
            return None  # a cut on the way to the output: keep it (`.detach()`) or not is TL304's fix
        base = mm.code_for(d.node.value)
        return replace_node(mm, d.node, f"{base}.detach()", "Replace `.data` with `.detach()`", "unsafe")
    return make


@register
class ForwardCalledDirectly(Rule):
    code = "TL303"
    # preview: 36 findings on the real-world benchmark, none a bug a maintainer would fix (modules without hooks called through `forward`)
    default = False
    preview_reason = '36 findings on the real-world benchmark, none a bug a maintainer would fix (modules without hooks called through `forward`)'
    name = "forward-called-directly"
    summary = "A module's `forward()` is called directly instead of calling the module."
    why = (
        "`model(x)` runs `nn.Module.__call__`, which runs the forward pre-hooks and hooks, "
        "backward hooks, and the wrappers that rely on them (DistributedDataParallel's gradient "
        "synchronisation, `torch.compile`, FSDP, activation checkpointing, pruning, spectral and "
        "weight norm, quantisation observers). `model.forward(x)` silently skips all of them, so "
        "the code works in a simple test and misbehaves when one of those features is switched on."
    )
    example = """\
outputs = model.forward(images)
"""
    use_instead = """\
outputs = model(images)
"""
    known_problems = ("`super().forward(x)` and `self.forward(x)` inside the module's own class are "
                      "not reported; neither are calls on objects not known to be modules.")
    fix_safety = "unsafe"
    fix_doc = ("Replaces `m.forward(...)` with `m(...)`. Unsafe: hooks registered on the module "
               "start running, which is the intent but changes behaviour.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.forward",)
    triggers = (b".forward(",)

    def check(self, mm):
        import libcst as cst

        for fn in mm.all_functions:
            for op in all_ops(fn):
                if not (isinstance(op, CallOp) and op.attr == "forward" and op.recv_node is not None):
                    continue
                recv = op.recv_node
                if not isinstance(recv, (cst.Name, cst.Attribute)) or op.recv in (None, "self", "cls"):
                    continue
                first = op.recv.split(".", 1)[0]
                if first in mm.classes or (first[:1].isupper() and "." not in op.recv):
                    continue  # Base.forward(self, x): an explicit base-class call
                q = mm.qualify(op.recv) or ""
                if q and (q.startswith("torch.") or q[:1].isupper() or q.rsplit(".", 1)[-1][:1].isupper()):
                    continue  # nn.Module.forward(self, x), SomeClass.forward
                role = mm.resolver.of_expr(fn, recv)[0]
                if role != catalog.MODEL or plain_instance_classes(mm, fn, mm.resolver, op):
                    continue  # not a model; an object of a plain class: its own forward
                yield Report(op.node, f"`{op.recv}.forward(...)` bypasses the module's hooks; call "
                             f"`{op.recv}(...)` instead", fix=_call_fix(op), scope=fn.qualname)


def _call_fix(op):
    def make(mm):
        from torchlint.fixes import replace_node

        return replace_node(mm, op.node.func, mm.code_for(op.recv_node),
                            "Call the module instead of its `forward`", "unsafe")
    return make


@register
class GradientCutInForward(Rule):
    code = "TL304"
    default = False
    preview_reason = (
        "no finding on the real-world benchmark (45 repositories: 33 tuned, 12 held-out; run alone at "
        "01068f9 and again with the default rules at a3d0a79), so its precision on real code is not "
        "measured (the target asks for >= 0.80 over >= 5 findings); preview until it is")
    name = "gradient-cut-in-forward"
    summary = "`forward` detaches (or turns into numbers) a value on the way to its output: the layers before it never learn."
    why = (
        "`.detach()`, `.item()`, `.numpy()`, `.tolist()`, `.data` and rebuilding a tensor with "
        "`torch.tensor(...)` all leave the autograd graph. Done inside `forward` on a value the "
        "output is computed from, they silently stop the gradient: every layer before the cut "
        "keeps its initial weights while the layers after it train, the loss still goes down a "
        "little, and nothing fails. It usually comes from code written for logging or NumPy "
        "post-processing moved into the model."
    )
    example = """\
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(128, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        features = self.encoder(x).detach()
        return self.head(features)
"""
    use_instead = """\
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(128, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        features = self.encoder(x)
        return self.head(features)
"""
    known_problems = (
        "Stop-gradients on purpose stay quiet: under `torch.no_grad()` (EMA and target networks), "
        "under a condition (a `freeze` option), inside a larger expression (the straight-through "
        "estimator `x + (q - x).detach()`), or on a value only returned beside the output. A frozen "
        "backbone detached unconditionally in `forward` is reported: say so with a "
        "`# noqa: TL304` or freeze it with `requires_grad_(False)`."
    )
    fix_safety = "unsafe"
    fix_doc = ("Removes the cut when it is a `.detach()` or `.data` on the submodule's output, or an "
               "`.item()` whose result is only used in arithmetic (a 0-dim tensor computes the same "
               "values and keeps the graph). `.numpy()`, `.tolist()` and tensors rebuilt with "
               "`torch.tensor(...)` are left to the author. Unsafe: the layers before the cut train "
               "from then on (wrong if they were meant to stay frozen).")
    triggers = (b"forward",)

    def check(self, mm):
        for cls in mm.classes.values():
            fwd = cls.methods.get("forward")
            if fwd is None or not mm.class_is_module(cls) or _autograd_function(mm, fwd):
                continue
            for inner, assign, src, ret in gradient_cuts(mm, fwd):
                if _EMA_WORDS.search(src):
                    continue  # a target / teacher / EMA network: updated without gradients on purpose
                cut = mm.code_for(assign.value).strip()
                if len(cut) > 50:
                    cut = cut[:47] + "..."
                yield Report(assign.value, f"`{cut}` cuts the autograd graph inside `forward`, and the output "
                             f"(line {mm.line_of(ret.node)}) is computed from it: `{src}` and every layer "
                             "before it get no gradient", fix=_keep_graph_fix(fwd, inner, assign),
                             scope=fwd.qualname)


def _keep_graph_fix(fwd, inner, assign):
    """Fix (TL304): ``h.detach()`` / ``h.data`` -> ``h``; ``s.item()`` -> ``s`` when the number
    is only used in arithmetic."""
    def make(mm):
        from torchlint.fixes import replace_node

        cut = None
        stack = [assign.value]
        while stack and cut is None:
            e = stack.pop()
            if isinstance(e, cst.Call) and not e.args and isinstance(e.func, cst.Attribute) \
                    and e.func.value is inner and e.func.attr.value in ("detach", "item"):
                cut = e
            elif isinstance(e, cst.Attribute) and e.value is inner and e.attr.value == "data":
                cut = e
            else:
                stack.extend(e.children)
        if cut is None:
            return None
        if isinstance(cut, cst.Call) and cut.func.attr.value == "item":
            name = assign.targets[0].value
            if not _only_arithmetic(fwd.node, name, assign.targets[0]):
                return None
            what = "`.item()`"
        else:
            what = "`.detach()`" if isinstance(cut, cst.Call) else "`.data`"
        return replace_node(mm, cut, mm.code_for(inner), f"Keep the graph: remove {what}", "unsafe")
    return make


def _only_arithmetic(root, name, binding) -> bool:
    """Every use of ``name`` under ``root`` (other than ``binding``) is an operand of ``+ - * /``."""
    stack = [(root, None)]
    while stack:
        n, parent = stack.pop()
        if isinstance(n, cst.Name) and n.value == name and n is not binding:
            if not (isinstance(parent, cst.BinaryOperation) and n in (parent.left, parent.right)):
                return False
        stack.extend((c, n) for c in n.children)
    return True

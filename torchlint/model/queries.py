"""Questions rules ask about loops and functions, answered from the event sequences.

A loop's *iteration* is its body's ops in program order, nested loops and branches
included, with calls of functions in the tree standing for their summaries and an
``opt.step(closure)`` preceded by the closure's own ops (LBFGS).
"""
from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst

from . import catalog
from .binder import dotted
from .dataflow import code_children
from .flow import norm_path
from .ir import (
    AUTOGRAD_GRAD, BACKWARD, CALL, CLEAR, FORWARD, GRAD_OFF, LOSS, MODE, MOVE, SCHED_STEP, STEP, AssignOp, BranchOp,
    CallOp, LoopOp,
    ReturnOp, all_ops, walk,
)


def closure_function(mm, fn, op: CallOp):
    """The nested function passed as ``opt.step(closure)``, if it is defined in the tree."""
    if op.closure is None:
        return None
    name = dotted(op.closure)
    f = fn
    while f is not None:
        for n in f.nested:
            if n.name == name:
                return n
        f = f.parent
    return mm.functions.get(name) if name else None


def iteration(mm, fn, block) -> list:
    """The ops of one pass through ``block`` (deep), closures expanded before their step."""
    out = []
    for op in walk(block):
        if isinstance(op, CallOp) and op.kind == STEP and op.closure is not None:
            cf = closure_function(mm, fn, op)
            if cf is not None:
                out.extend(o for o in walk(cf.body) if isinstance(o, (CallOp, AssignOp)))
        out.append(op)
    return out


def is_kind(mm, op, kind: str) -> bool:
    """``op`` is an event of ``kind``, directly or through a called function's summary."""
    if not isinstance(op, CallOp):
        return False
    if op.kind == kind:
        return True
    if op.kind == CALL:
        s = mm.summary_of(op.info)
        if s:
            key = {BACKWARD: "backward", STEP: "step", CLEAR: "clear", SCHED_STEP: "sched_step",
                   FORWARD: "forward"}.get(kind)
            return bool(key and s.get(key))
    return False


_ZEROS = ("zeros", "zeros_like", "new_zeros")
# methods that return a tensor with the values of their receiver (a copy, a view, on
# another device or dtype): zeros stay zeros
_SAME_VALUES = ("detach", "detach_", "clone", "to", "cuda", "cpu", "contiguous", "float", "double",
                "half", "type_as", "requires_grad_", "view_as", "reshape_as")
# wrappers that return their first argument's values: the pre-0.4 ``Variable(tensor)``
_VALUE_WRAPPERS = ("torch.autograd.Variable", "torch.autograd.variable.Variable")


def _is_zero_literal(node) -> bool:
    if isinstance(node, cst.Integer):
        return node.value == "0"
    if isinstance(node, cst.Float):
        try:
            return float(node.value) == 0.0
        except ValueError:
            return False
    return False


def _clearing_value(value, mm=None) -> bool:
    """What clears a gradient when assigned to ``p.grad``: ``None``, ``0``, a zeros tensor
    (``torch.zeros_like(p)``, ``p.new_zeros(...)``, a tensor zeroed in place by the
    expression itself, ``g.new().resize_as_(g).zero_()`` or ``.fill_(0)``), also a copy of one
    (``.to(device)``, ``.detach()``) or one wrapped in ``Variable(...)`` (with ``mm``, whose
    imports name the wrapper).  Any other value sets the gradients (one network's gradients
    handed to another's parameters)."""
    if isinstance(value, cst.Name):
        return value.value == "None"
    if _is_zero_literal(value):
        return True
    if not isinstance(value, cst.Call):
        return False
    f = dotted(value.func)
    if f and f.rsplit(".", 1)[-1] in _ZEROS:
        return True
    if isinstance(value.func, cst.Attribute):
        m = value.func.attr.value
        if m == "zero_" and not value.args:
            return True  # returns its receiver, every element set to zero
        if m == "fill_" and len(value.args) == 1 and _is_zero_literal(value.args[0].value):
            return True
        if m in _SAME_VALUES:
            return _clearing_value(value.func.value, mm)
    if mm is not None and f and value.args and value.args[0].keyword is None \
            and mm.qualify(f) in _VALUE_WRAPPERS:
        return _clearing_value(value.args[0].value, mm)
    return False


def is_grad_clear(op, mm=None) -> bool:
    """``p.grad = None`` (or a zeros tensor), ``p.grad.zero_()``, ``p.grad.data.zero_()``,
    ``p.grad.detach_()``; ``p.grad = other.grad.clone()`` transfers gradients, it does not
    clear them.  ``mm`` resolves the names of the assigned value (``Variable(zeros)``)."""
    if isinstance(op, AssignOp):
        return op.aug is None and _clearing_value(op.value, mm) \
            and any(isinstance(t, cst.Attribute) and t.attr.value == "grad" for t in op.targets)
    if isinstance(op, CallOp) and op.attr in ("zero_", "detach_", "fill_", "requires_grad_") and op.recv:
        return op.recv.endswith(".grad") or op.recv.endswith(".grad.data")
    return False


def selective_grad_clear(op, mm=None) -> bool:
    """A ``p.grad = None`` (or ``p.grad.zero_()``) that only some parameters get: under a
    condition inside the loop over the parameters that does not test the gradient itself
    (``if "last_layer" in name: p.grad = None`` freezes one layer; ``if p.grad is not None:``
    or ``if p.requires_grad:`` still clears every gradient there is)."""
    if op.loop is None or not is_grad_clear(op, mm):
        return False
    for br, _ in guards_inside(op, op.loop):
        if br.test is None:
            return False  # an except arm
        if not any(n.endswith((".grad", ".requires_grad")) or n in ("grad", "requires_grad")
                   for n in names_in(br.test)):
            return True
    return False


def clears(mm, op) -> bool:
    return is_kind(mm, op, CLEAR) or (is_grad_clear(op, mm) and not selective_grad_clear(op, mm))


def leaves_iteration(op, loop: LoopOp) -> bool:
    """``op`` runs in an arm of a branch inside ``loop`` that ends with ``continue``, ``break``,
    ``return`` or ``raise``: nothing after that branch runs in the same iteration
    (``if not torch.isfinite(norm): optimizer.zero_grad(); continue``)."""
    return any(arm < len(br.leaves) and br.leaves[arm] for br, arm in guards_inside(op, loop))


def guards_inside(op, loop: LoopOp) -> list:
    """The branches enclosing ``op`` that are themselves inside ``loop``."""
    out = []
    for br, arm in op.guards:
        lp = br.loop
        while lp is not None and lp is not loop:
            lp = lp.parent
        if lp is loop:
            out.append((br, arm))
    return out


def exclusive(a, b) -> bool:
    """``a`` and ``b`` sit in different arms of one branch: no run of the function executes both
    (``if amp: scaler.scale(loss).backward() else: loss.backward()``)."""
    arms = {id(br): i for br, i in a.guards}
    return any(id(br) in arms and arms[id(br)] != i for br, i in b.guards)


def within(op, loop: LoopOp) -> bool:
    lp = op.loop
    while lp is not None:
        if lp is loop:
            return True
        lp = lp.parent
    return False


def optimizer_paths(mm, fn) -> set:
    """Optimizers the function can see: created, passed in, or module globals."""
    out = set()
    f = fn
    while f is not None:
        for path, (role, _) in mm.resolver.local_roles(f).items():
            if role == catalog.OPTIMIZER:
                out.add(path)
        for p in f.params:
            if mm.resolver.of_path(f, p)[0] == catalog.OPTIMIZER:
                out.add(p)
        f = f.parent
    if fn.cls is not None:
        for path, (role, _) in mm.resolver.class_roles(fn.cls).items():
            if role == catalog.OPTIMIZER:
                out.add(path)
    for path, (role, _) in mm.resolver.module_roles().items():
        if role == catalog.OPTIMIZER:
            out.add(path)
    return out


_ACCUM = ("accum", "accumulat", "grad_acc", "update_freq", "iters_to_accumulate")


def is_accumulation_test(test) -> bool:
    """``if (i + 1) % accum_steps == 0:`` and its spellings."""
    if test is None:
        return False
    found = [False]

    def visit(e):
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Modulo):
            found[0] = True
        d = dotted(e) if isinstance(e, (cst.Name, cst.Attribute)) else None
        if d and any(a in d.lower() for a in _ACCUM):
            found[0] = True
        for name in ("left", "right", "expression", "value", "comparator"):
            v = getattr(e, name, None)
            if isinstance(v, cst.BaseExpression):
                visit(v)
        if isinstance(e, cst.Comparison):
            visit(e.left)
            for c in e.comparisons:
                visit(c.comparator)
        if isinstance(e, cst.BooleanOperation):
            visit(e.left)
            visit(e.right)
        if isinstance(e, cst.Call):
            for a in e.args:
                visit(a.value)

    visit(test)
    return found[0]


def manual_update(fn, skip=frozenset()) -> bool:
    """Parameters updated by hand (``p -= lr * p.grad``, ``p.data.add_(p.grad, ...)``).
    ``skip``: root names whose updates do not count (see ``weights_updated``)."""
    def counts(e) -> bool:
        d = dotted(e) if isinstance(e, (cst.Name, cst.Attribute)) else None
        return not (d and d.split(".", 1)[0] in skip)

    for op in all_ops(fn):
        if isinstance(op, AssignOp) and op.aug is not None and op.value is not None:
            if _mentions_grad(op.value) and counts(op.targets[0]):
                return True
        if isinstance(op, CallOp) and op.attr and op.attr.endswith("_") and op.args:
            if any(_mentions_grad(a.value) for a in op.args) and (op.recv_node is None or counts(op.recv_node)):
                return True
        if isinstance(op, AssignOp) and op.value is not None and op.aug is None and _mentions_grad(op.value):
            for t in op.targets:
                if isinstance(t, cst.Attribute) and t.attr.value == "data" and counts(t):
                    return True
    return False


def forward_inputs(fn) -> set:
    """Root names passed to a model's forward in ``fn`` (``out = model(imgs)`` gives ``imgs``)."""
    out = set()
    for op in all_ops(fn):
        if isinstance(op, CallOp) and op.kind == FORWARD:
            for a in op.args:
                d = dotted(a.value) if isinstance(a.value, (cst.Name, cst.Attribute)) else None
                if d and not d.startswith("self."):
                    out.add(d.split(".", 1)[0])
    return out


def _mentions_grad(e) -> bool:
    if isinstance(e, cst.Attribute):
        if e.attr.value == "grad":
            return True
        return _mentions_grad(e.value)
    if isinstance(e, cst.BinaryOperation):
        return _mentions_grad(e.left) or _mentions_grad(e.right)
    if isinstance(e, cst.UnaryOperation):
        return _mentions_grad(e.expression)
    if isinstance(e, cst.Call):
        return _mentions_grad(e.func) or any(_mentions_grad(a.value) for a in e.args)
    return False


def trains(mm, block) -> bool:
    return any(is_kind(mm, op, BACKWARD) for op in walk(block) if isinstance(op, CallOp))


def uses_autograd(mm, block, fn=None) -> bool:
    """``block`` computes gradients: a backward or ``torch.autograd.grad``, directly or in a
    function of the tree it calls (an attack's ``pgd(model, x, y)``, a meta-learner's inner
    fine-tuning), or (given ``fn``, to resolve models) in the forward of a model it runs (a
    test-time-adaptation wrapper whose forward runs backward and steps)."""
    for op in walk(block):
        if not isinstance(op, CallOp):
            continue
        if op.kind == AUTOGRAD_GRAD or is_kind(mm, op, BACKWARD):
            return True
        if fn is not None and op.kind is None and _calls_grad_explainer(mm, fn, op):
            return True
        if op.kind == CALL:
            s = mm.summary_of(op.info)
            if s and s.get("autograd"):
                return True
        elif fn is not None and (op.kind == FORWARD or op.recv and op.attr and op.kind is None):
            # ``model(x)`` or ``maml.finetune(...)``: a method of a module class of the tree
            s = model_method_summary(mm, fn, op.target if op.kind == FORWARD else op.recv,
                                     "forward" if op.kind == FORWARD else op.attr)
            if s and (s.get("backward") or s.get("autograd")):
                return True
        if fn is not None and op.kind in (None, FORWARD):
            # ``attack(model, x, y)``: a function the callers pass; ``user_module.test()`` on an
            # instance of a tree class (a meta-test that fine-tunes before it scores)
            called = passed_functions(mm, fn, op) if op.kind is None else []
            called += receiver_methods(mm, fn, op) or [] if op.recv and op.attr else []
            for t in called:
                s = mm.summary_of(t)
                if s and (s.get("backward") or s.get("autograd")):
                    return True
    return False


def eval_arm_forwards(mm, fn, loop: LoopOp) -> list:
    """``(forward, eval call)`` for the forwards of ``loop`` that run with gradients on in the
    arm of a test where the loop computes none, in the eval mode set under that arm: one epoch
    function for training and validation (``if is_train: model.train() else: model.eval()``
    before the loop, ``if is_train: loss.backward(); optimizer.step()`` in it, and one
    ``model(x)`` for both, outside ``no_grad``)."""
    if loop.grad in (GRAD_OFF, "?"):
        return []
    grads = [o for o in walk(loop.body) if isinstance(o, CallOp) and uses_autograd(mm, [o], fn)]
    if not grads:
        return []
    train_arm = set(mm.guard_keys(grads[0]))
    for o in grads[1:]:
        train_arm &= mm.guard_keys(o)
    if not train_arm:
        return []  # a backward on every path
    out = []
    for m in all_ops(fn):
        if not (isinstance(m, CallOp) and m.kind == MODE and m.info == "eval" and m.target):
            continue
        keys = mm.guard_keys(m)
        if not any((t, a) in keys for t, a0 in train_arm for a in (0, 1) if a != a0):
            continue  # not switched to eval on the other arm of the test that guards the backward
        t = norm_path(m.target)
        for f in walk(loop.body):
            if not (isinstance(f, CallOp) and f.kind == FORWARD and f.target and norm_path(f.target) == t):
                continue
            if f.grad in (GRAD_OFF, "?") or mm.guard_keys(f) & train_arm:
                continue
            if "eval" not in {md for md, _ in mm.flow(fn).at.get(id(f), frozenset())}:
                continue
            if forward_records_no_graph(mm, fn, f.target):
                continue
            out.append((f, m))
            break
    return out


def eval_step_helpers(mm, loop: LoopOp) -> list:
    """Calls in ``loop`` of a per-batch evaluation step: a function of this module that runs a
    model forward with gradients on once per call (not in a loop of its own, judged where it
    is), computes no gradients, steps nothing, and is called from nowhere but this loop (no
    other call in this module, none from another module): ParallelWaveGAN's
    ``self._eval_step(batch)`` in ``_eval_epoch``.  A step shared with training is not one."""
    from .binder import FunctionModel

    out = []
    for op in walk(loop.body):
        if not isinstance(op, CallOp) or op.kind != CALL or not isinstance(op.info, FunctionModel):
            continue
        helper = op.info
        if helper.decorator_grad == GRAD_OFF or helper.is_module_level:
            continue
        fwds = [o for o in all_ops(helper) if isinstance(o, CallOp) and o.kind == FORWARD]
        # ... or through a method of this module that runs the model (``self.infer(x)``)
        inner = [(o, (mm.summary_of(o.info) or {}).get("forwards") or ()) for o in all_ops(helper)
                 if isinstance(o, CallOp) and o.kind == CALL and isinstance(o.info, FunctionModel)
                 and not o.info.is_module_level]
        inner = [(o, paths) for o, paths in inner if paths]
        if not fwds and not inner:
            continue
        if any(o.loop is not None or o.grad in (GRAD_OFF, "?") for o in fwds + [o for o, _ in inner]):
            continue
        if any(isinstance(o, CallOp) and o.kind in (STEP, CLEAR) for o in all_ops(helper)):
            continue
        s = mm.summary_of(helper) or {}
        if s.get("backward") or s.get("step") or uses_autograd(mm, helper.body, helper):
            continue
        if any(not within(c, loop) for _, c in mm.callers(helper)):
            continue
        if mm.project.is_called(f"{mm.module_name}.{helper.qualname}"):
            continue
        if all(forward_records_no_graph(mm, helper, o.target) for o in fwds) and \
                all(forward_records_no_graph(mm, o.info, p) for o, paths in inner for p in paths):
            continue
        out.append(op)
    return out


def _calls_grad_explainer(mm, fn, op) -> bool:
    """``cam(x)`` / ``saliency.attribute(x)`` where ``cam`` was built by a library explainer
    that differentiates the model (``catalog.GRAD_EXPLAINERS``: MONAI's ``GradCAM``,
    pytorch-grad-cam's ...), or such an explainer built right there."""
    if catalog.is_grad_explainer(op.qual):
        return True
    for path in (op.func, op.recv):
        if not path or "(" in path:
            continue
        d = mm.resolver.definition(fn, path)
        if d is not None and isinstance(d[1], cst.Call) and catalog.is_grad_explainer(mm.qualify(dotted(d[1].func))):
            return True
    return False


def lightning_eval_hook(mm, fn) -> bool:
    """``fn`` is a Lightning module's or callback's evaluation hook (``validation_step``,
    ``on_validation_epoch_end``, ``on_test_batch_end``, ``on_predict_start`` ...): Lightning
    runs it inside its evaluation loop, with the LightningModule in eval mode and under
    ``no_grad``/``inference_mode``."""
    cls = fn.cls
    if cls is None or not (fn.name in catalog.LIGHTNING_EVAL_HOOKS
                           or fn.name.startswith(catalog.LIGHTNING_EVAL_HOOK_PREFIXES)):
        return False
    if mm.class_is_module(cls) and cls.is_lightning:
        return True
    seen, todo = set(), [cls]
    while todo:
        c = todo.pop()
        if c.qualname in seen or len(seen) > 10:
            continue
        seen.add(c.qualname)
        if any(b in catalog.LIGHTNING_CALLBACK_BASES for b in c.bases):
            return True
        todo.extend(b for b in (mm.find_class(r) for r in c.raw_bases) if b is not None)
    return False


def model_method_summary(mm, fn, path: Optional[str], name: str = "forward") -> Optional[dict]:
    """The summary of method ``name`` (its own or inherited) of the model at ``path`` when the
    model is an instance of a module class of the linted tree, else ``None``."""
    from .roles import _strip_module

    if not path:
        return None
    role, info = mm.resolver.of_path(fn, _strip_module(norm_path(path)))
    if role != catalog.MODEL or not info:
        return None
    target = mm.class_method(info, name)
    return mm.summary_of(target) if target is not None else None


# methods of nn.Module (and of common model libraries) that do not run the model
_MODULE_API = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "modules", "named_modules", "state_dict", "load_state_dict", "to", "cuda", "cpu", "half", "float",
    "double", "bfloat16", "type", "train", "eval", "zero_grad", "apply", "requires_grad_",
    "register_buffer", "register_parameter", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_backward_hook", "add_module", "get_submodule",
    "get_parameter", "extra_repr", "share_memory", "save_pretrained", "generate", "forward",
})
# method names that run a model whose class is not known here (an embedding network's
# ``model.get_embedding(x)``, CLIP's ``model.encode_image(x)``)
# (not ``encode``/``predict``: sentence-transformers' and sklearn-style wrappers' own methods
# disable gradients themselves)
_RUNS_MODEL = re.compile(r"(?:get_)?(?:embedding|embeddings|embed_\w+|encode_\w+|extract_\w*|features"
                         r"|\w+_features|forward_\w+|inference)")


def model_call_target(mm, fn, op) -> Optional[str]:
    """The path of the model that ``op`` runs when ``op`` is no plain forward: a library
    helper given the model (``sliding_window_inference(x, roi, sw, model)``,
    ``inferer(inputs, model)``: ``catalog.INFERENCE_HELPERS``), or a method of the model that
    runs its forward (``model.get_embedding(x)``: the method of a module class of the tree
    whose summary runs a forward, or, for a model of unknown class, a method named like one
    that computes outputs). ``None`` for anything else."""
    if not isinstance(op, CallOp) or op.kind is not None:
        return None
    if op.func and catalog.INFERENCE_HELPERS.search(op.func.rsplit(".", 1)[-1]):
        for a in op.args:
            if a.star or a.keyword is not None and a.keyword.value not in catalog.INFERENCE_MODEL_KEYWORDS:
                continue
            d = dotted(a.value)
            if d and "(" not in d and mm.resolver.of_path(fn, d)[0] == catalog.MODEL \
                    and not _model_param_named_only(mm, fn, d):
                return d
        return None
    if not (op.recv and op.attr) or op.attr in _MODULE_API or op.attr.startswith("_") \
            or op.recv in ("self", "cls") or "(" in op.recv:
        return None
    role, info = mm.resolver.of_path(fn, norm_path(op.recv))
    if role != catalog.MODEL:
        return None
    if info:
        s = model_method_summary(mm, fn, op.recv, op.attr)
        if s is not None:
            return op.recv if s.get("forward") and s.get("grad") != GRAD_OFF else None
    return op.recv if _RUNS_MODEL.fullmatch(op.attr) else None


def _model_param_named_only(mm, fn, path: str) -> bool:
    """``path`` is a parameter of ``fn`` that is a model only by its name (``network``): no
    annotation says so and its call sites pass no model (a plain function handed to an
    inferer, ``run_inference(inferer, brighten, files)``)."""
    from .callsites import param_role

    if path not in fn.params or path in fn.annotations:
        return False
    return param_role(mm, fn, path) is None


def helper_forward_keys(mm, op) -> list:
    """The keys (parameters, ``self.`` attributes) of the models a called function of the
    tree runs forward in the mode its caller left them (its summary's ``forwards``), when the
    function computes no gradients and steps nothing (``self.computeBatchLoss(batch)`` of a
    validation loop, shared with the training loop that backwards its result)."""
    if not isinstance(op, CallOp) or op.kind != CALL:
        return []
    s = mm.summary_of(op.info) or {}
    if s.get("grad") == GRAD_OFF or any(s.get(k) for k in ("backward", "step", "clear", "autograd")):
        return []
    from .binder import FunctionModel

    if isinstance(op.info, FunctionModel) and uses_autograd(mm, op.info.body, op.info):
        return []  # a saliency helper: library explainers differentiate the model
    return list(s.get("forwards") or ())


def forward_summary(mm, fn, path: Optional[str]) -> Optional[dict]:
    return model_method_summary(mm, fn, path, "forward")


def forward_records_no_graph(mm, fn, path: Optional[str]) -> Optional[str]:
    """Why a forward of the model at ``path`` records no autograd graph: every parameter has
    ``requires_grad`` switched off, or its class's ``forward`` runs under ``@torch.no_grad()``
    (a frozen feature extractor, an EMA teacher); else ``None``."""
    why = mm.resolver.grad_switched_off(fn, path)
    if why:
        return why
    s = forward_summary(mm, fn, path)
    if s and s.get("grad") == GRAD_OFF:
        return f"`{s['qualname']}` runs under `no_grad`"
    return None


def analysable_functions(mm) -> Iterator:
    """Functions whose loops are training code: not nn.Module internals like forward, unless
    the method itself runs a training loop (a ``Trainer(nn.Module)`` whose ``forward`` or
    ``train`` loops over batches, backwards and steps)."""
    for fn in mm.all_functions:
        if mm.is_module_method(fn) and not runs_training_loop(mm, fn):
            continue
        yield fn


def runs_training_loop(mm, fn) -> bool:
    """A loop of ``fn`` runs a backward and an optimizer step in its iteration (directly, in a
    closure or through a helper)."""
    got = fn.__dict__.get("_trains_in_loop")
    if got is None:
        got = False
        for op in all_ops(fn):
            if isinstance(op, LoopOp) and op.parent is None:
                seq = iteration(mm, fn, op.body)
                if any(is_kind(mm, o, BACKWARD) for o in seq) and any(is_kind(mm, o, STEP) for o in seq):
                    got = True
                    break
        fn._trains_in_loop = got
    return got


def one_step_function(mm, fn) -> bool:
    """``fn`` runs one training step outside any loop of its own: a backward and an optimizer
    step of its own body, neither in a loop (``def update(): ... loss.backward();
    optimizer.step()``, an RL ``nn.Module``'s ``train_net`` method, a ``@staticmethod
    train_step``). Its caller runs it once per iteration, so the order inside one call is the
    order of every iteration. A function that only runs ``backward()`` (its caller steps) is
    not one."""
    got = fn.__dict__.get("_one_step")
    if got is None:
        kinds = {op.kind for op in all_ops(fn) if isinstance(op, CallOp) and op.loop is None}
        got = fn._one_step = BACKWARD in kinds and STEP in kinds
    return got


def implicit_loop(mm, fn) -> bool:
    """``fn`` is one iteration of a loop a framework runs: a LightningModule's
    ``training_step`` (with manual optimisation it backwards, steps and clears itself, once
    per batch), or the process function an ignite ``Engine(update)`` calls once per batch."""
    if fn.name == "training_step" and mm.is_lightning(fn):
        return True
    return id(fn) in _engine_process_functions(mm)


def _engine_process_functions(mm) -> frozenset:
    """ids of the functions of the module handed to ignite's ``Engine`` as its process
    function (``trainer = Engine(update)``), the class resolved through imports, the function
    through the scopes of the call."""
    got = mm.__dict__.get("_engine_process_fns")
    if got is not None:
        return got
    out = set()
    for g in [mm.module_function] + list(mm.all_functions):
        for op in all_ops(g):
            if not (isinstance(op, CallOp) and op.qual in catalog.ENGINE_CLASSES):
                continue
            a = op.arg(0, "process_function")
            if a is None or not isinstance(a.value, cst.Name):
                continue
            name, f = a.value.value, g
            while f is not None:
                target = next((n for n in f.nested if n.name == name), None)
                if target is not None:
                    out.add(id(target))
                    break
                f = f.parent
            else:
                target = mm.functions.get(name)
                if target is not None:
                    out.add(id(target))
    got = mm._engine_process_fns = frozenset(out)
    return got


def unit_body(fn, loop: Optional[LoopOp]) -> list:
    """The ops of one iteration: ``loop``'s body, or ``fn``'s for an implicit loop."""
    return loop.body if loop is not None else fn.body


def clear_covers(mm, fn, c, step: CallOp, must: bool, n_opts: int = 1, stepped=frozenset()) -> bool:
    """Does the clearing op ``c`` clear the gradients the optimizer of ``step`` applies?

    ``must``: answer True only when sure (for reporting a clear as harmful); otherwise answer
    True whenever it may (for deciding that gradients are cleared).  ``opt.zero_grad()`` clears
    ``opt``; ``model.zero_grad()`` clears the optimizers whose parameters belong to ``model``
    (from the optimizer's constructor: ``Adam(netG.parameters())``); ``p.grad = None`` and
    helpers are taken to clear whatever is being trained.  ``stepped``: optimizers stepped in
    the same loop (a differently named optimizer that is itself stepped is a different one).
    """
    unknown = (n_opts <= 1) if must else True
    if not isinstance(c, CallOp) or c.kind != CLEAR or step.target is None:
        return unknown
    ct, st = norm_path(c.target), norm_path(step.target)
    if ct == st:
        return True
    role = mm.resolver.of_path(fn, ct)[0] if ct else None
    if role == catalog.OPTIMIZER:
        if must:
            return False
        return ct not in stepped
    if role == catalog.MODEL:
        owners = mm.resolver.optimizer_owners(fn, st)
        if owners is None:
            return unknown
        if any(_under(ct, o) or _under(o, ct) for o in owners):
            return True
        if must:
            return False
        # may it clear them? Only a model that another optimizer stepped here owns (GANs:
        # netD.zero_grad() belongs to optD) surely does not; another name may be a wrapper
        # of the same modules (model = DDP(net)).
        for other in stepped:
            if other == st:
                continue
            o2 = mm.resolver.optimizer_owners(fn, other)
            if o2 and any(_under(ct, o) or _under(o, ct) for o in o2):
                return False
        return True
    return unknown


def clears_together(mm, fn, clears_: list, step: CallOp) -> list:
    """The clearings of ``clears_`` that, taken together, clear every parameter the optimizer of
    ``step`` applies, when no single one does: an optimizer over two models (``Adam(chain(
    G.parameters(), D.parameters()))``, infoGAN's) whose models' own optimizers
    (``optD.zero_grad()``, ``optG.zero_grad()``) each clear one of them.  ``[]`` when they do
    not, or when an owner is not known."""
    if step.target is None:
        return []
    owners = mm.resolver.optimizer_owners(fn, norm_path(step.target))
    if not owners:
        return []
    used, covered = [], set()
    for c in clears_:
        if not isinstance(c, CallOp) or c.kind != CLEAR or not c.target:
            continue
        ct = norm_path(c.target)
        role = mm.resolver.of_path(fn, ct)[0]
        if role == catalog.OPTIMIZER:
            theirs = mm.resolver.optimizer_owners(fn, ct) or frozenset()
        elif role == catalog.MODEL:
            theirs = frozenset({ct})
        else:
            continue
        hit = {o for o in owners if any(_under(o, t) for t in theirs)}
        if hit - covered:
            used.append(c)
            covered |= hit
    return used if len(used) > 1 and covered == set(owners) else []


def may_compute_gradients(mm, o) -> bool:
    """``o`` computes or writes gradients (in any spelling), or calls code of the tree whose
    effects are unknown."""
    if isinstance(o, AssignOp):
        return any(isinstance(t, cst.Attribute) and t.attr.value == "grad" for t in o.targets)
    if not isinstance(o, CallOp):
        return False
    if is_kind(mm, o, BACKWARD) or is_kind(mm, o, AUTOGRAD_GRAD):
        return True
    if o.kind == CALL and not mm.summary_of(o.info):
        return True
    names = f"{o.func or ''} {o.qual or ''}"
    if "backward" in names or "autograd" in names or "grad" == (o.attr or "") or "scale_loss" in names:
        return True
    return bool(o.recv and o.recv.endswith((".grad", ".grad.data")) and o.attr not in ("zero_",))


def step_applies_no_gradients(mm, fn, step: CallOp) -> bool:
    """On every path from the start of ``fn`` to ``step``, the last thing done to the
    gradients its optimizer applies is a clear of them (``optimizer.zero_grad()``), with
    nothing after it that may produce gradients: the step has none to apply (a deliberate
    ``optimizer.zero_grad(); optimizer.step()`` before training, so that a warm-up scheduler
    may step first without PyTorch's warning)."""
    from .paths import states_before

    def t(cleared, op):
        if op is step:
            return cleared
        if isinstance(op, CallOp) and op.kind == CLEAR and clear_covers(mm, fn, op, step, must=True):
            return True
        return False if may_compute_gradients(mm, op) else cleared
    got = states_before(mm, fn, fn.body, t, (False,), step)
    return bool(got) and all(got)


def stepped_earlier_in_iteration(mm, fn, block, seq, op) -> bool:
    """An optimizer step (or a helper that steps) comes before ``op`` in one iteration of
    ``block`` (``seq``: the iteration's ops in order) on some path through it.  A step in the
    other arm of a branch around ``op`` does not (``if warm: train(model, warm_opt)`` /
    ``else: sched.step(); train(model, opt)``: the scheduler's arm runs no step before it); a
    step the iteration expands from a closure, not an op of ``block``, counts as before."""
    from .paths import path_in_order

    i = seq.index(op)
    mine = None
    for o in seq[:i]:
        if not is_kind(mm, o, STEP):
            continue
        if mine is None:
            mine = {id(x) for x in walk(block)}
        if id(o) not in mine or id(op) not in mine \
                or path_in_order(mm, fn, block, (lambda x, o=o: x is o, lambda x: x is op)):
            return True
    return False


def stepped_on_every_path_before(mm, fn, op, optimizer: Optional[str] = None) -> bool:
    """An optimizer step (of ``optimizer``, when it is known) runs on every path from the
    start of ``fn`` to ``op``, in the first iteration of the loops around ``op`` too: a
    scheduler stepped at the top of each epoch after a step before the loop is not stepped
    before the optimizer."""
    from .paths import states_before

    def is_step(o) -> bool:
        if not is_kind(mm, o, STEP) or o is op:
            return False
        if optimizer is None or o.kind != STEP or o.target is None:
            return True
        return norm_path(o.target) == optimizer
    got = states_before(mm, fn, fn.body, lambda s, o: s or is_step(o), (False,), op)
    return bool(got) and all(got)


def scheduler_optimizer(mm, fn, path: Optional[str]) -> Optional[str]:
    """The optimizer a scheduler was built on (``StepLR(optimizer, ...)``: its first argument,
    a name), when its definition is seen."""
    d = mm.resolver.definition(fn, path) if path else None
    v = d[1] if d else None
    if not isinstance(v, cst.Call) or not v.args:
        return None
    a = next((x for x in v.args if x.keyword is not None and x.keyword.value == "optimizer"), v.args[0])
    if (a.keyword is None or a.keyword.value == "optimizer") and not a.star \
            and isinstance(a.value, (cst.Name, cst.Attribute)):
        return norm_path(dotted(a.value))
    return None


def optimizer_owners_text(mm, fn, step: CallOp) -> Optional[str]:
    owners = mm.resolver.optimizer_owners(fn, norm_path(step.target)) if step.target else None
    if not owners:
        return None
    return ", ".join(f"`{o}`" for o in sorted(owners))


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + ".")


def local_function(target):
    """``target`` if it is a function of this module (not an ExternalRef), else None."""
    from .binder import FunctionModel

    return target if isinstance(target, FunctionModel) else None


def first_direct(fn, kind: str) -> Optional[CallOp]:
    """The first event of ``kind`` written in ``fn`` itself (not in a helper)."""
    for op in all_ops(fn):
        if isinstance(op, CallOp) and op.kind == kind:
            return op
    return None


def optimizer_wrapper_call(mm, fn, ops) -> Optional[CallOp]:
    """A call in ``ops`` of a method that ``torch.optim.Optimizer`` does not have, on an
    optimizer-like object (``optimizer.step_and_update_lr()``): the object is a wrapper whose
    method may step the optimizer it holds.  Calls resolved to a function of the tree are
    answered by its summary instead."""
    for op in ops:
        if not isinstance(op, CallOp) or op.kind is not None or op.recv_node is None:
            continue
        if op.attr in catalog.OPTIMIZER_API or (op.attr or "").startswith("_"):
            continue
        if mm.resolver.of_expr(fn, op.recv_node)[0] == catalog.OPTIMIZER:
            return op
    return None


def grads_handed_off(fn) -> bool:
    """The gradients are read into a value that is handed to a call (``grads = [p.grad.clone()
    for p in net.parameters()]; queue.put(grads)``, a hand-written all-reduce): another process
    or object applies them."""
    names = set()
    for op in all_ops(fn):
        if isinstance(op, AssignOp) and op.value is not None and op.aug is None and _reads_grad(op.value):
            names |= _assigned_names(op)
    if not names:
        return False
    return any(isinstance(op, CallOp) and op.kind is None and any(names_in(a.value) & names for a in op.args)
               for op in all_ops(fn))


def _reads_grad(e) -> bool:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, cst.Attribute) and x.attr.value == "grad":
            return True
        stack.extend(code_children(x))
    return False


def passes_as_argument(fn, path: str) -> bool:
    """``path`` is passed to some call in ``fn`` that is not a training event (it may step it)."""
    for op in all_ops(fn):
        if isinstance(op, CallOp) and op.kind is None:
            for a in op.args:
                if norm_path(dotted(a.value)) == path:
                    return True
    return False


def steps_or_updates(mm, fn) -> bool:
    """``fn`` updates weights: an optimizer step (directly, in a closure or a helper) or a
    manual parameter update.  A tensor updated from its own gradient that is an input of a
    forward (Langevin sampling, adversarial examples) is not a weight."""
    return any(is_kind(mm, o, STEP) for o in iteration(mm, fn, fn.body)) or manual_update(fn, forward_inputs(fn))


def names_in(expr) -> set:
    """Every dotted name an expression reads (``a.b.c`` gives ``a.b.c``, ``a.b`` and ``a``)."""
    out = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if e is None:
            continue
        if isinstance(e, (cst.Name, cst.Attribute)):
            d = dotted(e)
            if d:
                parts = d.split(".")
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                continue
        stack.extend(code_children(e))
    return out


def _contains(tree, node) -> bool:
    stack = [tree]
    while stack:
        e = stack.pop()
        if e is node:
            return True
        stack.extend(code_children(e))
    return False


def _assigned_names(op) -> set:
    out = set()
    for t in op.targets:
        for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else (t,)):
            e = getattr(e, "value", e) if isinstance(e, (cst.Element, cst.StarredElement)) else e
            d = dotted(e)
            if d:
                out.add(d)
    return out


def reaches_backward(mm, fn, op, node, in_order: bool = False) -> bool:
    """The value of ``node`` (an expression inside ``op``) reaches what ``fn`` differentiates:
    the receiver or arguments of a ``backward()``, the outputs of ``torch.autograd.grad``, a
    helper that runs backward, through the assignments of ``fn`` (augmented ones included),
    across loop iterations.  A loss computed only to be printed does not.  A value read only for logging (``running += loss.data``,
    ``pred = out.data.argmax(1)``) does not.  ``in_order``: follow the assignments from ``op``
    on, in program order, so that a name overwritten before the backward no longer carries the
    value (a name reused for the training forward after an evaluation forward)."""
    ops = all_ops(fn)
    tainted = set()
    stmt = op.stmt
    for o in ops:
        if o.stmt is not stmt or not isinstance(o, (AssignOp, CallOp)):
            continue
        if isinstance(o, CallOp) and o.node is not node and _contains(o.node, node) and (
                o.kind in (BACKWARD, AUTOGRAD_GRAD)
                or (o.kind == CALL and (mm.summary_of(o.info) or {}).get("backward"))):
            return True
        if isinstance(o, AssignOp) and o.value is not None and _contains(o.value, node):
            tainted |= _assigned_names(o)
    if not tainted:
        return False
    if in_order:
        # from ``op`` on, then once more from the start (the next iteration of a loop): a
        # name assigned a value that does not derive from what ``op`` computed no longer
        # holds it (``pred = net(test_x)`` for a plot, then ``pred = net(x_batch)`` trained)
        at = next((k for k, o in enumerate(ops) if o.stmt is stmt), 0)
        order = ops[at:] + ops
    else:
        order = ops + ops  # loops: a value of one iteration reaches the next
    for o in order:
        if in_order and o.stmt is stmt:
            continue
        if isinstance(o, AssignOp) and o.value is not None and names_in(o.value) & tainted:
            tainted |= _assigned_names(o)
        elif in_order and isinstance(o, AssignOp) and o.value is not None and o.aug is None \
                and all(g in op.guards for g in o.guards) and _assigned_names(o) & tainted:
            tainted -= _assigned_names(o)  # overwritten wherever ``op`` ran
        elif isinstance(o, CallOp) and o.kind == AUTOGRAD_GRAD and any(
                names_in(a.value) & tainted for a in o.args):
            return True
        elif isinstance(o, CallOp) and o.kind == CALL and any(names_in(a.value) & tainted for a in o.args) \
                and (mm.summary_of(o.info) or {}).get("backward"):
            return True  # handed to a helper that runs backward (a train_step)
        elif isinstance(o, CallOp) and o.kind == BACKWARD and (
                (o.recv_node is not None and names_in(o.recv_node) & tainted)
                or any(names_in(a.value) & tainted for a in o.args)):
            return True  # loss.backward(), accelerator.backward(loss), autograd.backward([...])
    return False


# calls whose result carries no gradient (integers, booleans, Python values, detached copies):
# what derives from them cannot lead a backward back to the tensor they read
_NO_GRAD_RESULT = frozenset({"argmax", "argmin", "argsort", "item", "tolist", "numpy", "detach", "long", "int",
                             "bool", "nonzero", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite",
                             "size", "numel", "dim", "multinomial", "bernoulli", "randint_like", "sign", "round",
                             "floor", "ceil", "topk_indices"})
# methods that store their argument in the receiver (a list of outputs kept for later)
_STORING_METHODS = frozenset({"append", "extend", "insert", "add", "update", "put", "setdefault", "appendleft",
                              "__setitem__"})


def _no_grad_result(e) -> bool:
    if isinstance(e, cst.Comparison):
        return True
    if isinstance(e, cst.Call):
        f = e.func
        name = f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else None
        return name in _NO_GRAD_RESULT
    return False


def inplace_may_be_differentiated(mm, fn, op, target) -> bool:
    """Whether a backward may still run through ``target``, a tensor that ``op`` of ``fn``
    changes in place after autograd saved it (the error comes only at that backward).

    It may when a backward (``backward()``, ``torch.autograd.grad``, a helper of the tree that
    runs one, or a tree function whose effects are unknown) comes after ``op`` in ``fn`` (later
    in its body, or in the loops around ``op``, whose bodies run again); or when a value derived
    from ``target`` (before or after the change) leaves ``fn``: returned (``fn`` is not the
    module's own code), stored on an attribute or in a container of the caller, or handed to a
    function the model does not know to be a tensor operation.  Derivation stops at results
    that carry no gradient (``argmax``, ``.item()``, comparisons, ``.detach()``): a greedy
    decoding loop that zeroes a softmax column to pick the next token never differentiates it."""
    base = target.value if isinstance(target, cst.Subscript) else target
    name = dotted(base) if base is not None else None
    if not name:
        return True
    ops = all_ops(fn)
    at = next((i for i, o in enumerate(ops) if o is op), None)
    if at is None:
        return True
    later = ops[at + 1:]
    outer = op.loop
    while outer is not None and outer.parent is not None:
        outer = outer.parent
    if outer is not None:
        later = later + list(walk(outer.body))
    for o in later:
        if not isinstance(o, CallOp):
            continue
        if o.kind in (BACKWARD, AUTOGRAD_GRAD) or is_kind(mm, o, BACKWARD):
            return True
        if o.kind == CALL:
            s = mm.summary_of(o.info)
            if s is None or s.get("autograd"):
                return True
    if fn.is_module_level:
        escapes = ()
    else:
        escapes = (ReturnOp,)
    tainted = {name}
    for o in ops + ops:  # what derives from it before the change holds its graph as well
        if isinstance(o, escapes) and o.value is not None and names_in(o.value) & tainted \
                and not _no_grad_result(o.value):
            return True
        if isinstance(o, AssignOp) and o.value is not None and names_in(o.value) & tainted:
            if _no_grad_result(o.value):
                continue
            for t in o.targets:
                for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else (t,)):
                    e = getattr(e, "value", e) if isinstance(e, (cst.Element, cst.StarredElement)) else e
                    if isinstance(e, cst.Attribute) and not fn.is_module_level:
                        return True  # ``self.cache = out``: kept past the call
                    while isinstance(e, cst.Subscript):
                        e = e.value
                    d = dotted(e)
                    if d and _callers_object(fn, d):
                        return True  # ``outputs[k] = out`` into the caller's container
                    if d:
                        tainted.add(d)
        elif isinstance(o, CallOp) and (any(names_in(a.value) & tainted for a in o.args)
                                        or o.recv_node is not None and names_in(o.recv_node) & tainted):
            if o.attr in _STORING_METHODS and o.recv:
                if _callers_object(fn, o.recv):
                    return True  # ``self.outputs.append(out)``
                tainted.add(o.recv)
            elif not (o.kind in (FORWARD, LOSS, MOVE) or (o.qual or "").startswith("torch.")
                      or o.recv_node is not None and names_in(o.recv_node) & tainted
                      or o.func in _BUILTINS or (o.qual or "").partition(".")[0] in catalog.NON_TORCH_PACKAGES):
                return True  # handed to code that may keep it or differentiate it
    return False


def _callers_object(fn, path: str) -> bool:
    """``path`` names an object ``fn``'s caller holds too: an attribute, or a parameter of a
    function (the module's own code has no caller)."""
    if fn.is_module_level:
        return False
    return "." in path or path in fn.params


_BUILTINS = frozenset({"print", "len", "float", "int", "str", "bool", "repr", "format", "isinstance", "min", "max",
                       "abs", "round", "range", "enumerate", "zip", "sorted"})


def call_runs_backward(op: CallOp, summ: Optional[dict]) -> bool:
    """Whether the call ``op`` of a function summarised by ``summ`` may run a backward: not
    when every backward of the callee is guarded by a test of a parameter (``backward_if``)
    that the call passes a literal of the other truth value for (``run_epoch(cross_valid=True)``
    of a ``def run_epoch(loader, cross_valid=False)`` whose backward is under ``if not
    cross_valid``; ``all_batches('valid')`` of one under ``if type_ == 'train':``), or leaves
    at a default of the other truth value (``loss_epoch(model, loss_func, val_dl)`` of a
    ``def loss_epoch(..., opt=None)`` that steps only ``if opt is not None:``)."""
    from .flow import _NOT_PASSED, _cond_arg, test_value

    if not summ or not summ.get("backward"):
        return False
    cond = summ.get("backward_if")
    if not cond:
        return True
    truth = cond[1]
    arg = _cond_arg(op, summ)
    if arg is None:
        return True  # ``*args``/``**kwargs`` may pass it: unknown here
    if arg is _NOT_PASSED:
        default = cond[4] if len(cond) > 4 else None
        return default is None or default == truth
    v = test_value(cond[2] if len(cond) > 2 else "bool", cond[3] if len(cond) > 3 else None, arg)
    return v is None or v == truth


def is_scalar_tensor(mm, fn, expr, facts, depth: int = 0) -> bool:
    """Evidence that ``expr`` is a 0-dim tensor: a loss or a Python-number fact, a reduction
    without ``dim`` (``x.mean()``, ``x.sum()``), an element-wise op of a scalar
    (``loss.exp()``), a name ``fn`` calls ``backward()`` on without a gradient argument (only a
    scalar can do that), or a name bound to what a helper returns after calling ``backward()``
    on it (``loss = compute_td_loss(...)``)."""
    if facts & {"loss", "scalar"}:
        return True
    if depth > 4:
        return False
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args:
        m = expr.func.attr.value
        if m in ("mean", "sum", "norm", "prod", "max", "min", "item"):
            return True
        if m in ("exp", "log", "sqrt", "abs", "neg", "float", "double", "cpu", "cuda", "detach", "clone"):
            return is_scalar_tensor(mm, fn, expr.func.value, frozenset(), depth + 1)
        return False
    d = dotted(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    if not d:
        return False
    for op in all_ops(fn):
        if isinstance(op, CallOp) and op.kind == BACKWARD and op.recv == d and not op.args:
            return True
    df = mm.resolver.definition(fn, d)
    if df is None:
        return False
    owner, value = df
    if isinstance(value, cst.Call):
        for op in all_ops(owner):
            if isinstance(op, CallOp) and op.node is value and op.kind == CALL:
                s = mm.summary_of(op.info)
                return bool(s and s.get("backward") and "graph" in s.get("returns", ()))
    return value is not expr and is_scalar_tensor(mm, owner, value, frozenset(), depth + 1)


def between_forward_and_backward(mm, fn, op) -> bool:
    """``op`` runs, in an iteration of a training loop of ``fn``, after a forward of the model
    (in ``fn`` itself) and before the backward that follows it (no backward or optimizer step in
    between, directly or through a helper): what it changes is differentiated with values the
    forward did not see.  A change
    after the backward or the step (weight clipping, a hand-written update, weights swapped in
    for evaluation) is not; the iteration wraps around, so one at the top of the loop follows
    the previous iteration's step."""
    lp = op.loop
    while lp is not None:
        events = []
        seen = False
        for o in walk(lp.body):
            if o is op:
                events.append("op")
                seen = True
            elif isinstance(o, CallOp):
                if is_kind(mm, o, BACKWARD):
                    events.append(BACKWARD)
                elif is_kind(mm, o, STEP):
                    events.append(STEP)
                elif o.kind == FORWARD:
                    # a forward here: one inside a helper (an evaluate()) leaves no graph
                    # behind for this loop's backward
                    events.append(FORWARD)
        if seen and (BACKWARD in events or STEP in events):
            i = events.index("op")
            before = [e for e in events[:i] if e != "op"] or [e for e in events[i + 1:] if e != "op"]
            after = [e for e in events[i + 1:] if e != "op"] or [e for e in events[:i] if e != "op"]
            return bool(before and after) and before[-1] == FORWARD and after[0] == BACKWARD
        lp = lp.parent
    return False


# ------------------------------------------------------------------ optimizers and the modules they hold
_PARAMETRIC = re.compile(r"Linear|Conv|Embedding|LSTM|GRU|RNN|Norm|Sequential|MultiheadAttention|"
                         r"Transformer|Bilinear|PReLU|ModuleList|ModuleDict")


def optimizer_constructions(mm, fn) -> list:
    """[(assignment, optimizer path, paths of the modules whose ``.parameters()`` it takes)] for
    ``opt = torch.optim.X(model.parameters(), ...)`` (param groups and filters included) in ``fn``."""
    out = []
    for op in all_ops(fn):
        if not isinstance(op, AssignOp) or op.aug is not None or len(op.targets) != 1 \
                or not isinstance(op.value, cst.Call) or not dotted(op.targets[0]):
            continue
        q = mm.qualify(dotted(op.value.func))
        if not q or catalog.role_of_constructor(q)[0] != catalog.OPTIMIZER:
            continue
        owners = set()
        for a in op.value.args:
            for n in names_in(a.value):
                if n.endswith((".parameters", ".named_parameters")):
                    owners.add(n.rsplit(".", 1)[0])
        if owners:
            out.append((op, dotted(op.targets[0]), owners))
    return out


def module_replacement(mm, fn, op) -> Optional[tuple]:
    """(the assigned path, ``True`` for a whole model rebuilt) when ``op`` puts a new module with
    parameters in a model (``model.fc = nn.Linear(...)``, ``model.classifier[-1] = ...``) or
    rebuilds one (``model = Net()``; not a wrapper such as ``nn.DataParallel(model)``)."""
    if not isinstance(op, AssignOp) or op.aug is not None or len(op.targets) != 1 \
            or not isinstance(op.value, cst.Call):
        return None
    t = op.targets[0]
    path = dotted(t.value) if isinstance(t, cst.Subscript) else dotted(t)
    if not path:
        return None
    q = mm.qualify(dotted(op.value.func)) or ""
    last = q.rsplit(".", 1)[-1]
    if q.startswith("torch.nn.") and catalog.role_of_constructor(q)[0] == catalog.MODEL:
        if not _PARAMETRIC.search(last) or q in catalog.DATA_PARALLEL:
            return None
    elif q.startswith("torchvision.models.") or q == "timm.create_model":
        pass
    else:
        cls = mm.find_class(dotted(op.value.func) or "")
        if cls is None or not mm.class_is_module(cls):
            return None
    if isinstance(t, (cst.Name,)) and path in names_in(op.value):
        return None  # wraps the same model
    return path, isinstance(t, cst.Name)


def reads_name(op, path: str) -> bool:
    """``op`` (a call, an assignment's value, a return) reads ``path``."""
    if isinstance(op, CallOp):
        return path in names_in(op.node)
    if isinstance(op, (AssignOp,)) and op.value is not None:
        return path in names_in(op.value)
    value = getattr(op, "value", None)
    return value is not None and path in names_in(value)


# ------------------------------------------------------------------ gradient cuts in forward
_CUT_METHODS = ("detach", "item", "numpy", "tolist")
_PASS_METHODS = ("float", "double", "half", "view", "reshape", "squeeze", "unsqueeze", "flatten", "clone",
                 "contiguous", "to", "cpu", "cuda", "permute", "transpose", "mean", "sum")
_REBUILD = ("torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor")


def _cut_of(mm, value):
    """The expression whose gradient ``value`` cuts (``h.detach()``, ``s.item()``, ``h.data``,
    ``torch.tensor(h)``), looking through casts and reshapes around it; else ``None``."""
    e = value
    while True:
        if isinstance(e, cst.BinaryOperation):  # ``s.item() + 0.5``: a number with a constant
            if isinstance(e.right, (cst.Integer, cst.Float)):
                e = e.left
                continue
            if isinstance(e.left, (cst.Integer, cst.Float)):
                e = e.right
                continue
            return None
        if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute):
            m = e.func.attr.value
            if m in _CUT_METHODS:
                return e.func.value
            if m in _PASS_METHODS and not mm.qualify(dotted(e.func)):
                e = e.func.value
                continue
        if isinstance(e, cst.Attribute) and e.attr.value == "data":
            return e.value
        if isinstance(e, cst.Call) and mm.qualify(dotted(e.func)) in _REBUILD and e.args \
                and not isinstance(e.args[0].value, (cst.List, cst.Tuple, cst.Integer, cst.Float)):
            return e.args[0].value
        return None


def _trained_inside(cls, expr, trained: set) -> Optional[str]:
    """The submodule (``self.encoder``) or trained name whose output ``expr`` holds, if any."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, cst.Call):
            f = e.func
            while isinstance(f, cst.Subscript):
                f = f.value
            d = dotted(f) if isinstance(f, (cst.Name, cst.Attribute)) else None
            if d and d.startswith("self.") and d.count(".") == 1 and d[5:] not in cls.methods:
                return d
        if isinstance(e, cst.Name) and e.value in trained:
            return trained[e.value]
        stack.extend(code_children(e))
    return None


def gradient_cuts(mm, fn) -> list:
    """In a module's ``forward``: [(cut expression, its assignment, the submodule before the
    cut, the return that uses it)] where a value computed by a submodule is detached (or turned
    into a Python number / rebuilt as a new tensor) unconditionally, with gradients on, and then
    used to compute the output (not just returned beside it)."""
    cls = fn.cls
    if cls is None or fn.name != "forward" or fn.decorator_grad == GRAD_OFF:
        return []
    ops = [o for o in all_ops(fn) if isinstance(o, (AssignOp, ReturnOp))]
    trained: dict = {}  # name -> the submodule its value comes from
    out = []
    for i, op in enumerate(ops):
        if not isinstance(op, AssignOp) or op.value is None or len(op.targets) != 1 \
                or not isinstance(op.targets[0], cst.Name):
            continue
        name = op.targets[0].value
        inner = _cut_of(mm, op.value)
        if inner is None or op.grad == GRAD_OFF or op.guards:
            src = _trained_inside(cls, op.value, trained)
            if src is not None and op.grad != GRAD_OFF:
                trained[name] = src
            else:
                trained.pop(name, None)
            continue
        src = _trained_inside(cls, inner, trained)
        trained.pop(name, None)
        if src is None:
            continue
        live = {name}
        for later in ops[i + 1:]:
            if isinstance(later, AssignOp) and later.value is not None:
                bound = {n.value for t in later.targets for n in _target_names(t)}
                if names_in(later.value) & live:
                    live |= bound
                else:
                    live -= bound
            elif isinstance(later, ReturnOp) and later.value is not None:
                v = later.value
                parts = [el.value for el in v.elements] if isinstance(v, cst.Tuple) else [v]
                if any(not (isinstance(p, cst.Name) and p.value in live) and names_in(p) & live for p in parts):
                    out.append((inner, op, src, later))
                    break
    return out


def _target_names(t) -> list:
    """The plain names an assignment target binds (tuple unpacking included)."""
    if isinstance(t, cst.Name):
        return [t]
    if isinstance(t, (cst.Tuple, cst.List)):
        return [n for el in t.elements for n in _target_names(el.value)]
    if isinstance(t, cst.StarredElement):
        return _target_names(t.value)
    return []


def carried_clears(mm, fn, loop: Optional[LoopOp], step: CallOp, covers) -> set:
    """Ids of the clears that run, on some path, while gradients of an earlier iteration of
    ``loop`` (or an earlier call of ``fn``, an implicit loop) still wait for the optimizer of
    ``step``: gradient accumulation undone (``zero_grad()`` every micro-batch, the step only
    every k).  Backwards are followed on every path (``if scaler: scaler.scale(loss).backward()
    else: loss.backward()``); ``covers(clear)`` says whether a clear clears that optimizer."""
    from . import paths

    target = norm_path(step.target) if step.target else None
    hits: set = set()

    def transfer(pending, op):
        if is_kind(mm, op, STEP):
            if not isinstance(op, CallOp) or op.kind != STEP or op.target is None or target is None \
                    or norm_path(op.target) == target:
                return 0
            return pending
        if clears(mm, op) and covers(op):  # a helper that clears and backwards clears first
            if pending == 2:
                hits.add(id(op))
            pending = 0
        if is_kind(mm, op, BACKWARD):
            return max(pending, 1)
        return pending

    paths.iterate(mm, fn, loop, transfer, (0,), carry=lambda p: 2 if p else 0)
    return hits


def unguarded_in(op, loop: Optional[LoopOp]) -> bool:
    """``op`` runs in every pass of ``loop`` (or of its function when ``loop`` is None) as far
    as branches go: directly in its body, under no branch of it."""
    return getattr(op, "loop", None) is loop and not guards_inside(op, loop)


def clears_on_some_paths(mm, fn, loop: Optional[LoopOp], step: CallOp, covering: list) -> bool:
    """Some pass through ``loop`` runs a backward and ``step`` but none of the ``covering``
    clears (``zero_grad()`` only in the fp32 branch, the AMP branch backwards and steps).
    Clears under an accumulation condition are taken to be meant that way."""
    from . import paths

    ids = {id(c) for c in covering}
    if any(is_accumulation_test(br.test) for c in covering for br, _ in guards_inside(c, loop)):
        return False
    entered = {id(lp) for lp in (_parameter_clear_loop(mm, c, loop) for c in covering) if lp is not None}
    return paths.path_without(mm, fn, unit_body(fn, loop), (lambda o: is_kind(mm, o, BACKWARD), lambda o: o is step),
                              lambda o: id(o) in ids or id(o) in entered, enter_loops=bool(entered))


def _parameter_clear_loop(mm, c, loop: Optional[LoopOp]) -> Optional[LoopOp]:
    """The loop over parameters inside ``loop`` in which the gradient clear ``c`` runs, when
    every condition around ``c`` inside that loop tests the gradient itself (``for p in
    params: if p.grad is not None: p.grad = zeros``): a pass through that loop clears every
    gradient there is (a parameter the test skips has none), so entering it is the clear."""
    inner = getattr(c, "loop", None)
    if inner is None or inner is loop or not is_grad_clear(c, mm) or selective_grad_clear(c, mm):
        return None
    lp = inner.parent
    while lp is not None and lp is not loop:
        lp = lp.parent
    return inner if lp is loop else None


_METRIC_CALLS = ("eq", "ne", "argmax", "topk", "item", "accuracy", "decode", "wer", "cer", "f1_score",
                 "accuracy_score", "update", "compute")


def _scores(block) -> bool:
    """The ops of ``block`` score predictions: a comparison (``pred == labels``, ``.eq()``),
    a running total (``correct += ...``, ``test_loss += loss.item()``) or a metric call."""
    for op in walk(block):
        if isinstance(op, AssignOp) and op.aug in ("AddAssign",) and op.value is not None:
            return True
        if isinstance(op, CallOp) and op.attr in _METRIC_CALLS:
            return True
        node = getattr(op, "value", None) if isinstance(op, AssignOp) else None
        stack = [node] if node is not None else []
        while stack:
            e = stack.pop()
            if isinstance(e, cst.Comparison) and any(isinstance(c.operator, (cst.Equal, cst.NotEqual))
                                                     for c in e.comparisons):
                return True
            stack.extend(code_children(e))
    return False


def evaluates_after_training(mm, fn, op) -> bool:
    """``op`` (a forward) runs in an evaluation loop known by evidence, in a scope that trained
    the model before it (module-level scripts and notebooks: the test loop after the training
    loop, with neither ``eval()`` nor ``no_grad``): the loop runs no backward (nor does the
    iteration around it after the loop), it scores the predictions (compared with labels,
    totals accumulated, a metric), and an earlier loop of the same function backwards and
    steps."""
    loop = op.loop
    if loop is None or trains(mm, loop.body):
        return False
    outer = loop.parent.body if loop.parent is not None else fn.body
    seq = iteration(mm, fn, outer)
    if loop in seq and any(is_kind(mm, o, BACKWARD) for o in seq[seq.index(loop) + 1:]
                           if not within(o, loop) and o is not loop):
        return False  # the forwards feed a later backward (unrolled steps)
    if not _scores(loop.body):
        return False
    return training_loop_before(mm, fn, loop, op.target) is not None


def evaluates_drawn_batch(mm, fn, op) -> Optional[cst.BaseExpression]:
    """``op`` (a forward) runs inside a training loop, in a branch that draws one batch of
    another loader with ``next()`` (``j, data = next(enumerate(test_loader))`` every ten
    iterations), runs no backward and scores the predictions: a periodic evaluation on a
    held-out batch. Returns the loader expression, else ``None``."""
    from .resources import strip_iter_wrappers

    loop = op.loop
    if loop is None or not trains(mm, loop.body):
        return None
    inside = guards_inside(op, loop)
    if not inside:
        return None
    br, arm = inside[0]
    if arm >= len(br.arms) or br.test is None:
        return None
    block = br.arms[arm]
    if trains(mm, block) or not _scores(block):
        return None
    own = strip_iter_wrappers(loop.iter) if loop.iter is not None and not loop.is_while else None
    own_code = mm.code_for(own).strip() if own is not None else None
    for o in walk(block):
        if o is op:
            break
        v = getattr(o, "value", None) if isinstance(o, AssignOp) else None
        if isinstance(v, cst.Call) and dotted(v.func) == "next" and v.args:
            src = strip_iter_wrappers(v.args[0].value)
            if mm.resolver.of_expr(fn, src)[0] == catalog.LOADER and mm.code_for(src).strip() != own_code:
                return src
    return None


def training_loop_before(mm, fn, loop: LoopOp, target: Optional[str]) -> Optional[LoopOp]:
    """A loop of ``fn`` before ``loop`` (not around it) whose iteration runs ``target`` forward,
    backwards and steps: the model was trained in this scope before ``loop`` runs."""
    ops = all_ops(fn)
    at = ops.index(loop)
    want = norm_path(target) if target else None
    for o in ops[:at]:
        if isinstance(o, LoopOp) and not within(loop, o) and o is not loop:
            body = iteration(mm, fn, o.body)
            if not any(is_kind(mm, x, BACKWARD) for x in body):
                continue
            if not (any(is_kind(mm, x, STEP) for x in body) or manual_update(fn)):
                continue
            if want is None or any(isinstance(x, CallOp) and x.kind == FORWARD and x.target
                                   and norm_path(x.target) == want for x in body):
                return o
    return None


# ------------------------------------------------------------- models that were never trained
# keyword arguments of a constructor or factory that bring in trained weights
_WEIGHT_KEYWORDS = ("pretrained", "weights", "checkpoint", "ckpt", "state_dict", "pretrained_path",
                    "weights_path", "checkpoint_path", "load_from", "init_from")
# calls that bring trained weights into a model (or hand one over from a file)
_LOAD_CALLS = re.compile(r"(^|\.|_)(load|restore)(_|$)|from_pretrained$|set_weights$")
# calls that take a model and neither train it nor put weights into it
_HARMLESS_METHODS = ("to", "cuda", "cpu", "half", "float", "double", "bfloat16", "eval", "train",
                     "apply", "parameters", "named_parameters", "modules", "named_modules", "children",
                     "requires_grad_", "zero_grad", "register_forward_hook", "extra_repr")
_HARMLESS_BUILTINS = frozenset({"print", "len", "str", "repr", "type", "id", "isinstance", "sum", "format",
                                "hasattr", "getattr", "vars", "dir"})


def _unchained(value):
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train", "eval"):
        value = value.func.value
    return value


def _brings_weights(call: cst.Call) -> bool:
    for a in call.args:
        if a.keyword is not None and a.keyword.value in _WEIGHT_KEYWORDS:
            v = a.value
            return not (isinstance(v, cst.Name) and v.value in ("False", "None"))
    d = dotted(call.func) or ""
    return bool(_LOAD_CALLS.search(d))


def _loads_in(fn) -> bool:
    """``fn``'s own code loads weights or a checkpoint (``load_state_dict``, ``torch.load`` ...)."""
    for op in all_ops(fn):
        if isinstance(op, CallOp) and _LOAD_CALLS.search(op.func or op.qual or ""):
            return True
    return False


def _random_init(mm, fn, value, depth: int = 0) -> bool:
    """``value`` builds a module with random weights: a ``torch.nn`` layer, a module class of
    this file whose constructor loads nothing, or a function of this file that returns one
    (``def ResNet18(): return ResNet(BasicBlock, [2, 2, 2, 2])``), with no argument that
    brings weights (``pretrained=True``, ``weights=...``)."""
    call = _unchained(value)
    if not isinstance(call, cst.Call) or depth > 3 or _brings_weights(call):
        return False
    d = dotted(call.func)
    if not d:
        return False
    q = mm.qualify(d) or ""
    if q.startswith("torch.nn.") and not q.startswith("torch.nn.functional."):
        return True
    cls = mm.find_class(d)
    if cls is not None:
        if not mm.class_is_module(cls):
            return False
        return not any(_loads_in(m) for m in cls.methods.values() if m.name in ("__init__", "_init_weights", "init_weights"))
    factory = mm.functions.get(d)
    if factory is None or factory.cls is not None or _loads_in(factory):
        return False
    rets = [op for op in all_ops(factory) if isinstance(op, ReturnOp)]
    return bool(rets) and all(op.value is not None and _random_init(mm, factory, op.value, depth + 1) for op in rets)


def untrained_here(mm, fn, op) -> bool:
    """The model ``op`` runs (a forward, or a call that hands it to a helper) was built in
    ``fn`` with random weights, and nothing of ``fn`` that may run before ``op`` trains it,
    loads weights into it, changes its attributes or hands it to other code: its outputs
    measure nothing, whatever its mode (``net = ResNet18(); print(net(torch.randn(1, 3, 32,
    32)).size())``, the shape check at the end of a model file)."""
    target = norm_path(op.target) if op.kind == FORWARD else None
    if op.kind == CALL:
        target = None
    return target is not None and untrained_path_here(mm, fn, op, target)


def untrained_path_here(mm, fn, op, target: str) -> bool:
    if not target or "." in target:
        return False  # self.net, args.model: built elsewhere
    ops = all_ops(fn)
    try:
        at = ops.index(op)
    except ValueError:
        return False
    end = at
    lp = op.loop
    while lp is not None:  # inside a loop, all of the outermost loop may run before ``op``
        outer = lp
        lp = lp.parent
        end = max(end, max((ops.index(o) for o in walk(outer.body)), default=end))
    built = None
    for i, o in enumerate(ops[:end + 1]):
        if isinstance(o, AssignOp) and target in _assigned_names(o):
            built = i if (i < at and o.value is not None and o.aug is None and _random_init(mm, fn, o.value)) else None
    if built is None or target in fn.params:
        return False
    for o in ops[built + 1:end + 1]:
        if o is op:
            continue
        if isinstance(o, CallOp):
            if o.kind in (BACKWARD, STEP, AUTOGRAD_GRAD):
                return False  # something is trained in this scope
            if o.kind == FORWARD or path_of_mode(o) == target:
                continue
            recv = norm_path(o.recv) if o.recv else None
            if recv is not None and (recv == target or recv.startswith(target + ".")):
                if o.attr in _HARMLESS_METHODS:
                    continue
                return False  # net.load_state_dict(...), net.fc.reset_parameters()
            if (o.func or "") in _HARMLESS_BUILTINS:
                continue
            if any(target in names_in(a.value) for a in o.args):
                return False  # handed to other code: train(net, ...), load_weights(net)
        elif isinstance(o, AssignOp):
            if any(n == target or n.startswith(target + ".") for n in _assigned_names(o)):
                return False
            if o.value is not None and target in names_in(o.value) and not _only_called(o.value, target):
                return False  # an alias or a part of it kept (``m = net``, ``head = net.fc``)
    return True


def path_of_mode(op) -> Optional[str]:
    from .ir import MODE

    return norm_path(op.target) if op.kind == MODE and op.target else None


def _only_called(expr, target: str) -> bool:
    """Every mention of ``target`` in ``expr`` is a call of it (a forward: ``net(x).size()``)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, cst.Call) and dotted(e.func) == target:
            stack.extend(a.value for a in e.args)
            continue
        if isinstance(e, (cst.Name, cst.Attribute)):
            d = dotted(e)
            if d is not None:
                if d == target or d.startswith(target + "."):
                    return False
                continue
        stack.extend(e.children)
    return True
def grad_context_site(mm, fn, node):
    """What sets the grad mode ``node`` (of ``fn``'s own body) runs in: the innermost ``with``
    statement of ``fn`` whose items include a grad context (``no_grad``, ``inference_mode``,
    ``enable_grad``, ``set_grad_enabled``), else the grad decorator of ``fn``; ``None`` when
    neither holds it (the mode comes from the caller)."""
    def grad_with(w) -> bool:
        for it in w.items:
            e = it.item
            q = mm.qualify(dotted(e.func if isinstance(e, cst.Call) else e) or "")
            if q in catalog.GRAD_OFF_CONTEXTS or q in catalog.GRAD_ON_CONTEXTS or q in catalog.SET_GRAD_ENABLED:
                return True
        return False

    stack = [(fn.node, None)]
    while stack:
        n, around = stack.pop()
        if n is node:
            if around is not None:
                return around
            break
        if isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and n is not fn.node:
            continue
        if isinstance(n, cst.Decorator):
            continue
        if isinstance(n, cst.With) and grad_with(n):
            around = n
        stack.extend((c, around) for c in n.children)
    for d in getattr(fn.node, "decorators", ()):
        e = d.decorator
        q = mm.qualify(dotted(e.func if isinstance(e, cst.Call) else e) or "")
        if q in catalog.GRAD_OFF_CONTEXTS or q in catalog.GRAD_ON_CONTEXTS:
            return d
    return None


_PLATEAU = "torch.optim.lr_scheduler.ReduceLROnPlateau"


def scheduler_sets_epoch(mm, fn, op: CallOp) -> bool:
    """The scheduler step ``op`` is given the epoch explicitly, so it *sets* the learning rate
    of that epoch rather than advancing the schedule by one: ``LRScheduler.step(epoch)`` makes
    ``last_epoch = epoch`` and computes the rate from it (``_get_closed_form_lr`` or
    ``get_lr``). Its order against the optimizer's step then skips no value of the schedule.

    ``step(epoch=e)`` always; ``step(e)`` when ``e`` is the epoch and not
    ``ReduceLROnPlateau``'s metric: the scheduler's class is a torch scheduler other than
    that one or a subclass of the tree, else ``e`` reads the counter of a loop around the
    call (``for epoch in range(n)``). A class of the tree that overrides ``step`` counts only
    when its ``step`` hands the argument on (``super().step(epoch)``) or assigns it to
    ``self.last_epoch``."""
    if op.kind != SCHED_STEP or not op.target:
        return False
    arg = op.keyword("epoch")
    positional = arg is None
    if arg is None:
        arg = op.arg(0)
    if arg is None or _is_none(arg.value):
        return False
    known, plateau, own_step = _scheduler_class(mm, fn, op.target)
    if own_step is not None and not _step_sets_epoch(own_step):
        return False
    if not positional:
        return True
    if plateau:
        return False
    if known:
        return True
    counters = set()
    loop = op.loop
    while loop is not None:
        counters |= _counter_names(loop)
        loop = loop.parent
    return bool(counters & _read_names(arg.value))


def _counter_names(loop: LoopOp) -> set:
    """The names a loop binds to an iteration count: ``for e in range(n)`` (through
    ``tqdm``/``trange``), the index of ``for i, batch in enumerate(loader)``."""
    it, t = loop.iter, loop.target
    if loop.is_while or t is None:
        return set()
    while isinstance(it, cst.Call) and (dotted(it.func) or "").rsplit(".", 1)[-1] in ("tqdm", "track") \
            and it.args:
        it = it.args[0].value
    f = dotted(it.func) if isinstance(it, cst.Call) else None
    if f in ("range", "trange"):
        return {n.value for n in _target_names(t)}
    if f == "enumerate" and isinstance(t, (cst.Tuple, cst.List)) and t.elements:
        return {n.value for n in _target_names(t.elements[0].value)}
    return set()


def _is_none(e) -> bool:
    return isinstance(e, cst.Name) and e.value == "None"


def _read_names(e) -> set:
    out = set()
    stack = [e]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            out.add(n.value)
        elif isinstance(n, cst.Attribute):
            stack.append(n.value)  # ``self.epoch`` reads ``self``, not a counter
        elif isinstance(n, (cst.BinaryOperation, cst.UnaryOperation)):
            stack.extend(code_children(n))
    return out


def _scheduler_class(mm, fn, path: str) -> tuple:
    """(class known, is ReduceLROnPlateau or a subclass, the ``step`` a tree class overrides)
    for the scheduler at ``path``, from the call that builds it."""
    d = mm.resolver.definition(fn, path)
    value = d[1] if d is not None else None
    if not isinstance(value, cst.Call):
        return False, False, None
    name = dotted(value.func)
    if not name:
        return False, False, None
    cls, seen = mm.find_class(name), 0
    own = None
    while cls is not None and seen < 8:
        if own is None and "step" in cls.methods:
            own = cls.methods["step"]
        nxt = None
        for raw, base in zip(cls.raw_bases, cls.bases):
            if mm.find_class(raw) is not None and mm.find_class(raw) is not cls:
                nxt = mm.find_class(raw)
                break
            if base.startswith(catalog.SCHEDULER_PREFIXES):
                return True, base == _PLATEAU, own
        cls, seen = nxt, seen + 1
    if seen:
        return False, False, own  # a tree class whose torch base is not visible
    q = mm.qualify(name) or ""
    if q.startswith(catalog.SCHEDULER_PREFIXES):
        return True, q == _PLATEAU, None
    return False, False, None


def _step_sets_epoch(step) -> bool:
    params = [p for p in step.params if p not in ("self", "cls") and not p.startswith("*")]
    if not params:
        return False
    p = params[0]
    for o in walk(step.body):
        if isinstance(o, AssignOp) and o.value is not None and p in _read_names(o.value) \
                and any(dotted(t) == "self.last_epoch" for t in o.targets):
            return True
        if isinstance(o, CallOp) and o.attr == "step" and any(p in _read_names(a.value) for a in o.args):
            return True
    return False


_SHAPE_ATTRS = frozenset({"shape", "size", "dim", "ndim", "ndimension", "dtype", "device", "numel"})


def shape_probe(mm, fn, op) -> bool:
    """The forward ``op``'s output is only looked at for its shape (``y = model(x);
    print(y.shape)``, ``print(model(x).size())``): a smoke test of a freshly built network,
    which measures nothing whatever the mode.  Every read of the name it is bound to, up to
    the name's next assignment in ``fn``, is ``y.shape``/``y.size()``/``y.dtype``...; a
    forward whose output is unused, returned or read otherwise is no probe."""
    stmt = op.stmt
    if stmt is None:
        return False
    uses = [u for u in _reads_of_node(stmt, op.node)]
    if uses:
        return all(u in _SHAPE_ATTRS for u in uses)
    owner = next((o for o in all_ops(fn) if isinstance(o, AssignOp) and o.value is op.node and o.aug is None), None)
    if owner is None or len(owner.targets) != 1 or not isinstance(owner.targets[0], cst.Name):
        return False
    name = owner.targets[0].value
    ops = all_ops(fn)
    i = ops.index(owner)
    if op.loop is not None:
        return False  # read again by the next iteration's code above it
    seen = False
    for o in ops[i + 1:]:
        if isinstance(o, LoopOp) and o.target is not None and name in names_in(o.target):
            break
        if isinstance(o, AssignOp) and name in _assigned_names(o):
            if o.value is not None and any(True for _ in _reads_of_name(o.value, name)):
                return False
            break
        node = o.node if not isinstance(o, (LoopOp, BranchOp)) else (o.iter if isinstance(o, LoopOp) else o.test)
        if node is None:
            continue
        for attr in _reads_of_name(node, name):
            if attr not in _SHAPE_ATTRS:
                return False
            seen = True
    return seen


def _reads_of_node(root, target):
    """For each place ``target`` (a node) is read inside ``root``: the attribute read on it
    (``"shape"``), or ``""``; nothing when ``target`` is the whole value of an assignment."""
    yield from _reads(root, lambda e: e is target)


def _reads_of_name(root, name: str):
    yield from _reads(root, lambda e: isinstance(e, cst.Name) and e.value == name)


def _reads(root, match):
    stack = [(root, None)]
    while stack:
        e, parent = stack.pop()
        if match(e):
            if isinstance(parent, cst.Attribute) and parent.value is e:
                yield parent.attr.value
            elif isinstance(parent, (cst.Assign, cst.AnnAssign)):
                continue
            else:
                yield ""
            continue
        if isinstance(e, cst.Attribute):
            stack.append((e.value, e))
            continue
        for c in code_children(e):
            stack.append((c, e))


def callers_fail_guard(mm, fn, cond) -> bool:
    """``cond`` (a ``backward_if`` on a ``self.<attr>`` test: ``["self.stage", True, "eq",
    "train", ...]``) is false wherever ``fn`` runs: every call of the method ``fn`` in this
    module (there is one, and no other module calls it) sits in the arm of the same test that
    makes it false (``if self.stage == "train": ... else: return self.eval_step(x)``)."""
    from .callsites import method_sites
    from .flow import _param_truth

    name = cond[0]
    if not name.startswith("self.") or fn.cls is None or fn.parent is not None:
        return False
    if mm.module_name and mm.project.is_called(f"{mm.module_name}.{fn.qualname}"):
        return False
    sites = method_sites(mm, fn)
    if not sites:
        return False
    for _caller, op in sites:
        ok = False
        for br, arm in op.guards:
            t = _param_truth(br.test, {name}) if br.test is not None else None
            if t is not None and t[2:4] == tuple(cond[2:4]) and (t[1] if arm == 0 else not t[1]) != cond[1]:
                ok = True
                break
        if not ok:
            return False
    return True


# clocks and memory probes a benchmark reads around the code it measures
_TIMERS = {"time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.time_ns",
           "time.perf_counter_ns", "timeit.default_timer", "torch.cuda.synchronize",
           "torch.cuda.max_memory_allocated", "torch.cuda.memory_allocated", "torch.cuda.max_memory_reserved",
           "torch.cuda.reset_peak_memory_stats", "pynvml.nvmlDeviceGetMemoryInfo"}
_TIMER_METHODS = {"elapsed_time"}  # ``start.elapsed_time(end)`` of two ``torch.cuda.Event``s


def _is_timer(mm, op) -> bool:
    if not isinstance(op, CallOp):
        return False
    if op.attr in _TIMER_METHODS:
        return True
    name = dotted(op.node.func) or ""
    return (mm.qualify(name) or name) in _TIMERS


def timed_repetition_loop(mm, fn, loop: Optional[LoopOp]) -> bool:
    """``loop`` repeats one fixed computation to time it or measure its memory, not to train:
    it runs over ``range(n)``, every forward in it takes only inputs built before the loop
    (the same tensors every iteration: no batch is drawn), and a clock or memory probe is read
    before it and again inside or after it (``start = time.time()``; ``for i in range(1000):
    out = layer(x); ...; loss.backward(); opt.step()``; ``time.time() - start``).  What the
    optimizer does to the layer's weights there is not what is measured."""
    if loop is None or loop.is_while or not isinstance(loop.iter, cst.Call) or dotted(loop.iter.func) != "range":
        return False
    bound = set(names_in(loop.target)) if loop.target is not None else set()
    forwards = []
    for o in walk(loop.body):
        if isinstance(o, AssignOp):
            bound |= _assigned_names(o)
        elif isinstance(o, LoopOp) and o.target is not None:
            bound |= names_in(o.target)
        if isinstance(o, CallOp) and o.kind == FORWARD:
            forwards.append(o)
    if not forwards:
        return False
    for f in forwards:
        for a in f.args:
            if names_in(a.value) & bound:
                return False  # a batch the loop draws or builds
    first, _, last, _ = mm.span_of(loop.node)
    before = later = False
    for o in all_ops(fn):
        if not _is_timer(mm, o):
            continue
        line = mm.line_of(o.node)
        if line < first:
            before = True
        elif line >= first:
            later = True  # inside the loop or after it
    return before and later


def _site_arguments(mm, owner, param: str) -> Optional[list]:
    """``[(caller, call op, argument or None)]`` for every call of ``owner`` in this module
    (``None`` for a call that leaves ``param`` at its default), or ``None`` when nothing says
    every call is here: no call, a starred argument, or calls from other modules."""
    params = [p for p in owner.params if not p.startswith("*")]
    if param not in params:
        return None
    idx = params.index(param) - (1 if owner.cls is not None and params and params[0] in ("self", "cls")
                                 and "staticmethod" not in " ".join(owner.decorators) else 0)
    if not owner.is_module_level and owner.parent is None and mm.module_name \
            and mm.project.is_called(f"{mm.module_name}.{owner.qualname}"):
        return None
    out = []
    for caller, op in mm.callers(owner):
        if any(a.star for a in op.args):
            return None
        arg = next((a.value for a in op.args if a.keyword is not None and a.keyword.value == param), None)
        positional = [a for a in op.args if a.keyword is None]
        if arg is None and 0 <= idx < len(positional):
            arg = positional[idx].value
        out.append((caller, op, arg))
    return out or None


def _param_of(mm, fn, name: Optional[str]):
    """The function (``fn`` or one around it) whose parameter ``name`` is, when nothing
    assigns it there; else ``None``."""
    if not name or "." in name or name in ("self", "cls"):
        return None
    from . import resources

    return resources.get(mm).param_owner(fn, name)


def instance_classes(mm, fn, path: Optional[str], at, depth: int = 0) -> Optional[list]:
    """The classes of the linted tree (a local qualname, or the key-qualified name of a class of
    another module) whose instances ``path`` holds where ``at`` runs in ``fn``, by evidence: a
    binding to a constructor (``user_module = LocalUpdate(model, u)``; in top-level code the
    binding above ``at``), or, for a parameter, what every call of its function in this module
    passes, resolved the same way at the call (``test_agent(agent, env)`` after ``agent =
    REINFORCE(...)`` and after ``agent = ActorCritic(...)``). ``None`` when anything is unknown."""
    from .roles import _binding

    if not path or depth > 3 or "(" in path or "[" in path or path in ("self", "cls") or path.startswith("self."):
        return None
    owner = _param_of(mm, fn, path)
    if owner is not None:
        sites = _site_arguments(mm, owner, path)
        if not sites:
            return None
        out: list = []
        for caller, op, arg in sites:
            got = _value_classes(mm, caller, arg, op.node, depth + 1) if arg is not None else None
            if not got:
                return None
            out.extend(c for c in got if c not in out)
        return out
    if "." in path:
        return None
    return _value_classes(mm, fn, _binding(mm, fn, mm.resolver, path, at), at, depth)


def _value_classes(mm, fn, value, at, depth: int) -> Optional[list]:
    if isinstance(value, cst.Call):
        d = dotted(value.func)
        if not d:
            return None
        cls = mm.find_class(d)
        if cls is not None:
            return [cls.qualname]
        if mm.external_class(d) is not None:
            return [mm.external_class_name(d)]
        return None
    if isinstance(value, cst.Name):
        return instance_classes(mm, fn, value.value, at, depth + 1)
    return None


def receiver_methods(mm, fn, op) -> Optional[list]:
    """The methods ``obj.name(...)`` runs when ``obj`` is, by evidence, an instance of classes
    of the linted tree (:func:`instance_classes`): one ``FunctionModel`` or ``ExternalRef`` per
    class, or ``None`` when a class or its method is unknown."""
    if not isinstance(op, CallOp) or not op.recv or not op.attr or op.attr.startswith("__"):
        return None
    classes = instance_classes(mm, fn, op.recv, op.node)
    if not classes:
        return None
    out = []
    for c in classes:
        m = mm.class_method(c, op.attr)
        if m is None:
            return None
        out.append(m)
    return out


def passed_functions(mm, fn, op) -> list:
    """The functions of this module a call of a parameter may run: the function each call of
    the enclosing function passes for it, or its default (``attack(model, x, y, loss_fn)`` in
    ``def gen_adv_examples(model, loader, attack, loss_fn)``, called with ``fgsm`` and with
    ``ifgsm``)."""
    from .callsites import _local_target

    if not isinstance(op, CallOp) or op.kind is not None or not op.func or "." in op.func:
        return []
    owner = _param_of(mm, fn, op.func)
    if owner is None:
        return []
    out = []
    default = owner.defaults.get(op.func)
    if isinstance(default, cst.Name):
        t = _local_target(mm, owner.parent or mm.module_function, default.value)
        if t is not None:
            out.append(t)
    for caller, call, arg in _site_arguments_any(mm, owner, op.func):
        if isinstance(arg, cst.Name):
            t = _local_target(mm, caller, arg.value, call.node)
            if t is not None and t not in out:
                out.append(t)
    return out


def _site_arguments_any(mm, owner, param: str) -> list:
    """Like :func:`_site_arguments`, for the calls of this module whatever else calls it."""
    from . import resources

    return resources.get(mm).caller_arg_ops(owner, param)


def method_runs_without_grad(mm, fn, op) -> bool:
    """``agent.policy(state)`` where ``agent`` is, by evidence, an instance of tree classes
    whose ``policy`` methods all run under ``@torch.no_grad()`` (or ``inference_mode``): what
    the call runs records no graph, whatever the caller's context."""
    ms = receiver_methods(mm, fn, op)
    return bool(ms) and all((mm.summary_of(m) or {}).get("grad") == GRAD_OFF for m in ms)


def steps_only_other_modules(mm, fn, op, target: str) -> bool:
    """Every optimizer stepped after the backward that ``op`` feeds (before the next backward of
    its loop's iteration) is known and holds other modules' parameters than ``target``'s (``optimizer = SGD(model.parameters())`` stepped after a loss
    that runs the discriminator ``DAN`` in eval mode): the forward of ``target`` there feeds a
    loss, it does not train ``target``."""
    if op.loop is None or not target:
        return False
    seq = iteration(mm, fn, op.loop.body)
    if any(isinstance(o, CallOp) and o.kind == CALL and (mm.summary_of(o.info) or {}).get("step") for o in seq):
        return False  # a helper steps: which optimizer is not seen here
    # the steps that apply the first backward after ``op`` (up to the next backward)
    at = next((i for i, o in enumerate(seq) if o is op), None)
    if at is None:
        return False
    back = next((i for i in range(at + 1, len(seq)) if isinstance(seq[i], CallOp) and seq[i].kind == BACKWARD), None)
    if back is None:
        return False
    nxt = next((i for i in range(back + 1, len(seq)) if isinstance(seq[i], CallOp) and seq[i].kind == BACKWARD),
               len(seq))
    steps = [o for o in seq[back + 1:nxt] if isinstance(o, CallOp) and o.kind == STEP]
    if not steps:
        return False
    known = {}
    scopes = [fn] + ([mm.module_function] if fn is not mm.module_function else [])
    for f in scopes:
        for _op, path, owners in optimizer_constructions(mm, f):
            known.setdefault(path, set()).update(owners)
    t = norm_path(target)
    for s in steps:
        owners = known.get(s.target or "")
        if not owners:
            return False
        for o in owners:
            o = norm_path(o)
            if o == t or t.startswith(o + ".") or o.startswith(t + "."):
                return False
    return True

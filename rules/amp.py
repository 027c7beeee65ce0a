"""Mixed precision: a `GradScaler` scales the loss, so every use of the gradients between the
scaled backward and `scaler.step()` must go through the scaler."""
from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from torchlint.model import catalog
from torchlint.model.binder import dotted
from torchlint.model.dataflow import constructor_call
from torchlint.model.ir import BACKWARD, STEP, CallOp, all_ops
from torchlint.model.paths import path_in_order
from torchlint.model.queries import analysable_functions, exclusive, iteration
from torchlint.rule import Report, Rule

from . import register

_CLIP = {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
         "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_",
         "torch.nn.utils.clip_grad_norm", "torch.nn.utils.get_total_norm"}


def _scaler_of_backward(mm, fn, op: CallOp) -> Optional[str]:
    """``scaler.scale(loss).backward()`` -> ``"scaler"`` (an enabled GradScaler), else ``None``."""
    if op.kind != BACKWARD or not isinstance(op.recv_node, cst.Call):
        return None
    func = op.recv_node.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "scale"):
        return None
    path = dotted(func.value)
    if not path or mm.resolver.of_path(fn, path)[0] != catalog.SCALER:
        return None
    ctor = constructor_call(mm, fn, path)
    if ctor is not None:
        for a in ctor.args:
            if a.keyword is not None and a.keyword.value == "enabled" and \
                    isinstance(a.value, cst.Name) and a.value.value == "False":
                return None
    return path


def scaled_iterations(mm) -> Iterator[tuple]:
    """(function, the ops of one iteration, index of a scaled backward in it, scaler path, the
    block of that iteration for path queries)."""
    for fn in analysable_functions(mm):
        blocks = {}
        for op in all_ops(fn):
            if isinstance(op, CallOp) and op.kind == BACKWARD:
                scaler = _scaler_of_backward(mm, fn, op)
                if scaler is not None:
                    loop = _stepping_loop(mm, fn, op)
                    blocks.setdefault(id(loop), (loop, []))[1].append((op, scaler))
        for loop, found in blocks.values():
            block = loop.body if loop is not None else fn.body
            seq = iteration(mm, fn, block)
            for op, scaler in found:
                if op in seq:
                    yield fn, seq, seq.index(op), scaler, block


def _stepping_loop(mm, fn, op):
    """The innermost loop around ``op`` whose iteration steps an optimizer (micro-batch loops of
    gradient accumulation step in the loop around them), else the outermost one."""
    loop = op.loop
    while loop is not None:
        if any(isinstance(o, CallOp) and o.kind == STEP for o in iteration(mm, fn, loop.body)):
            return loop
        if loop.parent is None:
            return loop
        loop = loop.parent
    return None


def _on_a_path(mm, fn, block, *ops) -> bool:
    """One path through ``block`` runs ``ops`` in this order."""
    return path_in_order(mm, fn, block, tuple((lambda o, x=x: o is x) for x in ops))


def _is_scaler_call(op, scaler: str, attr: str) -> bool:
    return isinstance(op, CallOp) and op.attr == attr and op.recv == scaler


@register
class StepBypassesScaler(Rule):
    code = "TL107"
    name = "step-bypasses-scaler"
    summary = "`optimizer.step()` after `scaler.scale(loss).backward()` instead of `scaler.step(optimizer)`."
    why = (
        "With a `GradScaler`, `scaler.scale(loss).backward()` leaves gradients multiplied by the "
        "loss scale (65,536 at the start). `scaler.step(optimizer)` divides them back and skips "
        "the step when they overflowed to inf/NaN; `optimizer.step()` called directly applies the "
        "scaled gradients, a learning rate thousands of times too large, and steps on inf/NaN "
        "gradients, so the weights diverge or become NaN."
    )
    example = """\
scaler = torch.cuda.amp.GradScaler()
for images, labels in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(images), labels)
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
"""
    use_instead = """\
scaler = torch.cuda.amp.GradScaler()
for images, labels in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(images), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""
    known_problems = ("A scaler built with `enabled=False` (literally) is trusted. A step in a helper "
                      "function is not followed. Preview: it made no finding on the real-world benchmark "
                      "(45 repositories), so its precision on real code is not measured yet.")
    default = False
    fix_safety = "safe"
    fix_doc = ("Replaces `optimizer.step()` by `scaler.step(optimizer)` when no `scaler.step` of that "
               "optimizer runs in the iteration (one scaler may step several optimizers, a GAN's "
               "discriminator and generator, before its `update()`).")
    references = ("https://pytorch.org/docs/stable/notes/amp_examples.html",)
    triggers = (b".scale(",)

    def check(self, mm):
        seen = set()
        for fn, seq, i, scaler, block in scaled_iterations(mm):
            bwd = scaled = seq[i]
            via_scaler = [o for o in seq if isinstance(o, CallOp) and o.kind == STEP and o.recv == scaler
                          and not exclusive(o, bwd)]
            for op in seq[i + 1:]:
                if not (isinstance(op, CallOp) and op.kind == STEP and op.closure is None) or id(op) in seen:
                    continue
                if op.recv == scaler or op.recv is None or exclusive(op, bwd):
                    continue
                if mm.resolver.of_path(fn, op.recv)[0] != catalog.OPTIMIZER:
                    continue
                if not _on_a_path(mm, fn, block, scaled, op):
                    continue  # ``if scaler: scaler.step(opt) else: opt.step()``, tested twice
                seen.add(id(op))
                bwd = next(o for o in reversed(seq[i:seq.index(op)]) if isinstance(o, CallOp)
                           and _scaler_of_backward(mm, fn, o) == scaler and not exclusive(o, op))
                again = [o for o in via_scaler if o.target == op.recv and _on_a_path(mm, fn, block, scaled, o, op)]
                if again:
                    msg = (f"`{op.recv}.step()` steps again after `{scaler}.step({op.recv})` at line "
                           f"{mm.line_of(again[0].node)}: the optimizer takes two steps per batch")
                    fix = None
                else:
                    msg = (f"`{op.recv}.step()` applies the gradients of `{scaler}.scale(...).backward()` "
                           f"(line {mm.line_of(bwd.node)}) still scaled, and steps on inf/NaN; "
                           f"use `{scaler}.step({op.recv})`")
                    # a second `scaler.step` of the same optimizer before `update()` raises
                    fix = None if any(o.target == op.recv for o in via_scaler) else _scaler_step_fix(op, scaler)
                yield Report(op.node, msg, fix=fix, scope=fn.qualname)


def _scaler_step_fix(op, scaler):
    def make(mm):
        from torchlint.fixes import replace_node

        return replace_node(mm, op.node, f"{scaler}.step({op.recv})",
                            f"Step through the scaler: `{scaler}.step({op.recv})`", "safe")
    return make


@register
class ClipBeforeUnscale(Rule):
    code = "TL106"
    name = "clip-before-unscale"
    summary = "Gradients clipped between `scaler.scale(loss).backward()` and `scaler.step()` without `scaler.unscale_()`."
    why = (
        "After `scaler.scale(loss).backward()` the gradients are multiplied by the loss scale "
        "(65,536 at first, changing as training runs). `clip_grad_norm_(params, 1.0)` then "
        "compares the *scaled* norm with 1.0 and clips almost every step by a factor that "
        "follows the loss scale, so the effective learning rate is tiny and erratic. "
        "`scaler.unscale_(optimizer)` first makes the threshold apply to the true gradients "
        "(and `scaler.step` knows not to unscale twice)."
    )
    example = """\
scaler.scale(loss).backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
"""
    use_instead = """\
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
"""
    known_problems = "Clipping inside a helper function, or by hand from `p.grad`, is not followed."
    fix_safety = "safe"
    fix_doc = "Inserts `scaler.unscale_(optimizer)` before the clip when the iteration steps one optimizer through the scaler."
    references = ("https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping",)
    triggers = (b"clip_grad",)

    def check(self, mm):
        seen = set()
        for fn, seq, i, scaler, block in scaled_iterations(mm):
            bwd = seq[i]
            for j in range(i + 1, len(seq)):
                op = seq[j]
                if not isinstance(op, CallOp) or op.qual not in _CLIP or id(op) in seen or exclusive(op, bwd):
                    continue
                between = seq[i + 1:j]
                if any(_is_scaler_call(o, scaler, "unscale_") and not exclusive(o, op) for o in between):
                    continue
                # the step these gradients feed: through the scaler, or (TL107) directly
                steps = [o for o in seq[j + 1:] if isinstance(o, CallOp) and o.kind == STEP
                         and o.closure is None and not exclusive(o, op) and _on_a_path(mm, fn, block, bwd, op, o)]
                if not steps:
                    continue
                seen.add(id(op))
                targets = sorted({o.target if o.recv == scaler else o.recv for o in steps} - {None})
                fix = _unscale_fix(op, scaler, targets[0]) if len(targets) == 1 else None
                opt = targets[0] if len(targets) == 1 else "optimizer"
                yield Report(op.node, f"gradients are clipped while still scaled by `{scaler}` (backward at "
                             f"line {mm.line_of(bwd.node)}): call `{scaler}.unscale_({opt})` first, or "
                             "the threshold applies to gradients thousands of times too large",
                             fix=fix, scope=fn.qualname)


def _unscale_fix(op, scaler, optimizer):
    def make(mm):
        from torchlint.fixes import insert_before_stmt

        return insert_before_stmt(mm, op, f"{scaler}.unscale_({optimizer})",
                                  f"Unscale the gradients first: `{scaler}.unscale_({optimizer})`", "safe")
    return make

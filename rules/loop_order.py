"""Loop order: the optimizer must step after backward, on gradients nobody cleared in between."""
from __future__ import annotations

from torchlint.model.ir import BACKWARD, CLEAR, SCHED_STEP, STEP, CallOp
from torchlint.model.queries import (
    analysable_functions, clears, guards_inside, is_accumulation_test, is_kind, iteration,
    manual_update, optimizer_paths, within,
)
from torchlint.model.ir import walk
from torchlint.rule import Report, Rule

from . import register


def _steps(mm):
    for fn in analysable_functions(mm):
        for op in walk(fn.body):
            if isinstance(op, CallOp) and op.kind == STEP and op.loop is not None:
                yield fn, op


@register
class StepBeforeBackward(Rule):
    code = "TL101"
    name = "step-before-backward"
    summary = "The optimizer steps before the `backward()` whose gradients it should apply."
    why = (
        "`optimizer.step()` applies the gradients currently stored in `.grad`. Called before "
        "`loss.backward()` in the same iteration, it applies the previous batch's gradients "
        "(or none at all on the first step), so every update lags one batch behind and the "
        "last backward is wasted. Training still runs and the loss may even go down, which is "
        "why this goes unnoticed."
    )
    example = """\
for x, y in loader:
    optimizer.zero_grad()
    optimizer.step()
    loss = criterion(model(x), y)
    loss.backward()
"""
    use_instead = """\
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    known_problems = "`optimizer.step(closure)` (LBFGS) runs backward inside the closure and is not flagged."
    references = ("https://pytorch.org/docs/stable/optim.html#taking-an-optimization-step",)
    triggers = (b".step(",)

    def check(self, mm):
        for fn, op in _steps(mm):
            if op.closure is not None:
                continue
            seq = iteration(mm, fn, op.loop.body)
            i = seq.index(op)
            if any(is_kind(mm, o, BACKWARD) for o in seq[:i]):
                continue
            if any(is_kind(mm, o, BACKWARD) for o in seq[i + 1:]):
                yield Report(op.node, f"`{_src(op)}` runs before `backward()` in this "
                             "iteration, so it applies the previous batch's gradients", scope=fn.qualname)


def _src(op) -> str:
    return f"{op.recv}.step()" if op.recv else "step()"


@register
class ZeroGradBetweenBackwardAndStep(Rule):
    code = "TL102"
    name = "zero-grad-between-backward-and-step"
    summary = "Gradients are cleared after `backward()` and before the `step()` that needs them."
    why = (
        "`zero_grad()` between `loss.backward()` and `optimizer.step()` throws away the "
        "gradients just computed: the step then applies zeros (or nothing, with "
        "`set_to_none=True`) and the model never learns. The gradient-accumulation variant is "
        "subtler: clearing every micro-batch while stepping only every k batches means each "
        "step sees one micro-batch's gradients, not k of them, silently changing the effective "
        "batch size and learning-rate scaling."
    )
    example = """\
for i, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
"""
    use_instead = """\
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
    fix_safety = "unsafe"
    fix_doc = ("Moves the clearing call to just before the `backward()` of the iteration "
               "(plain case) or into the accumulation branch after `step()`. Unsafe because code "
               "between the old and new position might read the gradients.")
    references = ("https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html",)
    triggers = (b"zero_grad", b".grad")

    def check(self, mm):
        reported = set()
        for fn, op in _steps(mm):
            loop = op.loop
            seq = iteration(mm, fn, loop.body)
            i = seq.index(op)
            n_opts = len({o.target for o in seq if isinstance(o, CallOp) and o.kind == STEP})
            last_bwd = max((j for j in range(i) if is_kind(mm, seq[j], BACKWARD)), default=None)
            if last_bwd is not None:
                for c in seq[last_bwd + 1:i]:
                    if clears(mm, c) and _clears_optimizer(c, op, n_opts) and id(c) not in reported:
                        reported.add(id(c))
                        yield Report(c.node, f"gradients are cleared after `backward()` and before "
                                     f"`{_src(op)}`, so the step applies zeros", scope=fn.qualname)
                continue
            # gradient accumulation: clear every iteration, step every k
            step_guards = guards_inside(op, loop)
            if not step_guards or not any(is_accumulation_test(br.test) for br, _ in step_guards):
                continue
            bwds = [o for o in seq if is_kind(mm, o, BACKWARD) and o.loop is loop and not guards_inside(o, loop)]
            if not bwds:
                continue
            for c in seq:
                if clears(mm, c) and getattr(c, "loop", None) is loop and not guards_inside(c, loop) \
                        and _clears_optimizer(c, op, n_opts) and id(c) not in reported:
                    reported.add(id(c))
                    yield Report(c.node, "gradients are cleared every iteration but "
                                 f"`{_src(op)}` runs only every few iterations, so gradients never "
                                 "accumulate; clear them after the step instead", scope=fn.qualname)


def _clears_optimizer(c, step, n_opts: int) -> bool:
    if not isinstance(c, CallOp) or c.kind != CLEAR:
        return n_opts <= 1
    if c.target == step.target:
        return True
    from torchlint.model import catalog
    # model.zero_grad() clears whatever optimizer owns its parameters; with several
    # optimizers (GANs) only a same-named pair is trusted.
    if catalog.role_from_name(c.target or "") == catalog.OPTIMIZER:
        return False
    return n_opts <= 1


@register
class MissingZeroGrad(Rule):
    code = "TL103"
    name = "missing-zero-grad"
    summary = "A training loop never clears the gradients of the optimizer it steps."
    why = (
        "`backward()` adds to `.grad`; it does not overwrite it. Without `zero_grad()` (or "
        "`p.grad = None`) every step applies the sum of all gradients since the start of "
        "training, which behaves like an exploding learning rate with momentum from the past."
    )
    example = """\
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    use_instead = """\
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    fix_safety = "unsafe"
    fix_doc = ("Inserts `optimizer.zero_grad()` as the first statement of the loop body. Unsafe: "
               "code that accumulates on purpose across the whole loop would change behaviour.")
    references = ("https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html",)
    triggers = (b".step(",)

    def check(self, mm):
        for fn, op in _steps(mm):
            loop = op.loop
            seq = iteration(mm, fn, loop.body)
            if not any(is_kind(mm, o, BACKWARD) for o in seq):
                continue
            if any(clears(mm, o) for o in seq):
                continue
            yield Report(op.node, f"`{_src(op)}` runs in a loop that never clears gradients, so "
                         "they accumulate across iterations", fix=_insert_zero_grad(op), scope=fn.qualname)


def _insert_zero_grad(op):
    def make(mm):
        from torchlint.fixes import insert_first_in_loop

        target = op.target or "optimizer"
        return insert_first_in_loop(mm, op.loop, f"{target}.zero_grad()",
                                    f"Insert `{target}.zero_grad()` at the start of the loop", "unsafe")
    return make


@register
class BackwardWithoutStep(Rule):
    code = "TL104"
    name = "backward-without-step"
    summary = "A training loop runs `backward()` but no optimizer ever steps."
    why = (
        "Gradients are computed and then thrown away: the weights never change. Usually the "
        "`optimizer.step()` line was deleted or moved into a branch that never runs."
    )
    example = """\
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
"""
    use_instead = """\
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    known_problems = "Parameters updated by hand from `.grad` are recognised and not flagged."
    triggers = (b".backward(",)

    def check(self, mm):
        for fn in analysable_functions(mm):
            bwds = [o for o in walk(fn.body) if isinstance(o, CallOp) and o.kind == BACKWARD and o.loop is not None]
            if not bwds:
                continue
            if any(is_kind(mm, o, STEP) for o in iteration(mm, fn, fn.body)):
                continue
            if manual_update(fn) or not optimizer_paths(mm, fn):
                continue
            if mm.is_lightning(fn):
                continue
            yield Report(bwds[0].node, "`backward()` computes gradients in this loop but no optimizer "
                         "steps, so the weights never change", scope=fn.qualname)


@register
class SchedulerBeforeOptimizerStep(Rule):
    code = "TL105"
    name = "scheduler-before-optimizer-step"
    summary = "The learning-rate scheduler steps before the optimizer in the same iteration."
    why = (
        "Since PyTorch 1.1 `scheduler.step()` must come after `optimizer.step()`. Stepping it "
        "first skips the first value of the schedule (warm-up starts one step late, the "
        "initial learning rate is never used) and PyTorch only prints a warning once."
    )
    example = """\
for epoch in range(epochs):
    scheduler.step()
    for x, y in loader:
        ...
        optimizer.step()
"""
    use_instead = """\
for epoch in range(epochs):
    for x, y in loader:
        ...
        optimizer.step()
    scheduler.step()
"""
    references = ("https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate",)
    triggers = (b".step(",)

    def check(self, mm):
        for fn in analysable_functions(mm):
            for op in walk(fn.body):
                if not (isinstance(op, CallOp) and op.kind == SCHED_STEP and op.loop is not None):
                    continue
                seq = iteration(mm, fn, op.loop.body)
                i = seq.index(op)
                if any(is_kind(mm, o, STEP) for o in seq[:i]):
                    continue
                if any(is_kind(mm, o, STEP) for o in seq[i + 1:]):
                    yield Report(op.node, f"`{op.recv}.step()` runs before the optimizer's `step()` in "
                                 "this iteration; step the scheduler after the optimizer", scope=fn.qualname)

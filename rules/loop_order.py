"""Loop order: the optimizer must step after backward, on gradients nobody cleared in between."""
from __future__ import annotations

import re

import libcst as cst

from torchlint.model import catalog
from torchlint.model.binder import dotted
from torchlint.model.dataflow import code_children
from torchlint.model.flow import norm_path
from torchlint.model.ir import (
    BACKWARD, CALL, CLEAR, FORWARD, LOSS, SCHED_STEP, STEP, AssignOp, CallOp, LoopOp, all_ops,
)
from torchlint.model.paths import path_in_order, states_before
from torchlint.model.queries import (
    analysable_functions, clear_covers, clears, exclusive, first_direct, grads_handed_off, guards_inside,
    is_accumulation_test, is_kind, iteration, leaves_iteration, local_function, manual_update,
    optimizer_owners_text, optimizer_paths, optimizer_wrapper_call, passes_as_argument,
    carried_clears, clears_on_some_paths, clears_together, implicit_loop, may_compute_gradients,
    one_step_function, timed_repetition_loop,
    scheduler_optimizer, scheduler_sets_epoch,
    step_applies_no_gradients, stepped_earlier_in_iteration, stepped_on_every_path_before, unguarded_in,
    unit_body,
)
from torchlint.rule import Report, Rule

from . import register


def _functions(mm):
    """Training and evaluation code: not nn.Module internals, but framework hooks that are one
    iteration of a training loop (test code is left out by the engine, for every rule exempt
    in tests)."""
    seen = set()
    for fn in analysable_functions(mm):
        seen.add(id(fn))
        yield fn
    for fn in mm.all_functions:
        if id(fn) not in seen and (implicit_loop(mm, fn) or one_step_function(mm, fn)):
            yield fn  # a method of an nn.Module that runs one training step (`train_net`)


def _steps(mm, in_loops_only=True):
    """(function, step) for the steps in a loop, or in a hook the framework calls per batch."""
    for fn in _functions(mm):
        hook = implicit_loop(mm, fn)
        for op in all_ops(fn):
            if isinstance(op, CallOp) and op.kind == STEP and (op.loop is not None or hook or not in_loops_only):
                yield fn, op


def _line(mm, op) -> int:
    return mm.line_of(op.node)


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
    known_problems = ("`optimizer.step(closure)` (LBFGS) runs backward inside the closure and is not flagged; "
                      "nor is an empty step whose gradients were just cleared on every path to it "
                      "(`optimizer.zero_grad(); optimizer.step()` before training, so that a warm-up "
                      "scheduler may step first) when the backward after it has a step of its own.")
    fix_safety = "unsafe"
    fix_doc = ("Moves the step (and a `scaler.update()` right after it) below the statement that "
               "runs the backward, when both are in the same block. Unsafe: code between them that "
               "reads the weights (logging, an EMA update) then sees the old weights.")
    references = ("https://pytorch.org/docs/stable/optim.html#taking-an-optimization-step",)
    triggers = (b".step(",)

    def check(self, mm):
        # a step in a loop, or in a step function (called once per iteration) without a loop
        for fn, op in _steps(mm, in_loops_only=False):
            if op.closure is not None:
                continue
            block = unit_body(fn, op.loop)
            seq = iteration(mm, fn, block)
            i = seq.index(op)
            if _backward_reaches(mm, fn, block, op):
                continue
            # the first backward after the step on a path through the iteration (not one in an
            # arm the step's own arm excludes)
            later = next((o for o in seq[i + 1:] if is_kind(mm, o, BACKWARD)
                          and path_in_order(mm, fn, block, (lambda x: x is op, lambda x, o=o: x is o))), None)
            if later is not None and step_applies_no_gradients(mm, fn, op) and _stepped_after(mm, fn, later, op):
                continue  # a no-op step (its gradients were just cleared); the backward has its own
            if later is not None:
                where = "this iteration" if op.loop is not None else f"`{fn.name}()`"
                via = mm.describe_call(later)  # the backward runs in a helper: name it
                bwd = f"the `backward()` in {via}, called at line" if via else "the `backward()` at line"
                yield Report(op.node, f"`{_src(op)}` runs before {bwd} {_line(mm, later)} "
                             f"in {where}, so it applies the previous batch's gradients",
                             fix=_move_step_after(fn, op, later), scope=fn.qualname)


def _backward_reaches(mm, fn, block, step) -> bool:
    """On some path through one iteration ``block``, a backward runs before ``step`` whose
    gradients ``step`` may apply. A backward in the other arm of `if amp:` does not reach the
    plain branch's step, nor a critic's backward, already applied by the critic's step, a
    generator step after `optimizer_G.zero_grad()` (n_critic GANs). A clear right after the
    backward, before any step (`loss.backward(); opt.zero_grad(); opt.step()`), is TL102's."""
    def t(state, x):  # 0: no backward, 1: a backward, 2: a backward another step has applied
        if is_kind(mm, x, BACKWARD):
            return 1
        if state == 1 and x is not step and is_kind(mm, x, STEP):
            return 2
        if state == 2 and isinstance(x, CallOp) and x.kind == CLEAR and clear_covers(mm, fn, x, step, True):
            return 0
        return state
    return any(states_before(mm, fn, block, t, (0,), step))


def _step_before_its_backward(mm, fn, block, seq, step) -> bool:
    """No backward reaches ``step`` without a clear in between, and a backward follows it on a
    path through the iteration: the step was moved above its backward (TL101 reports it)."""
    if _backward_reaches(mm, fn, block, step):
        return False
    i = seq.index(step)
    return any(is_kind(mm, o, BACKWARD) and path_in_order(mm, fn, block, (lambda x: x is step, lambda x, o=o: x is o))
               for o in seq[i + 1:])


def _stepped_after(mm, fn, bwd, besides) -> bool:
    """A step of the optimizer ``besides`` steps (other than ``besides``) follows the backward
    ``bwd`` on a path through its own iteration: its gradients are applied there."""
    block = unit_body(fn, bwd.loop)
    # an empty step inside the loop runs every iteration: only a step of its own optimizer applies
    # the backward's gradients; one empty step before the loop is harmless whichever steps after
    mine = norm_path(besides.target) if besides.kind == STEP and besides.target and besides.loop is not None else None

    def same_optimizer_step(x) -> bool:  # a step of another optimizer applies none of its gradients
        if x is besides or not is_kind(mm, x, STEP):
            return False
        return mine is None or x.kind != STEP or x.target is None or norm_path(x.target) == mine
    return path_in_order(mm, fn, block, (lambda x: x is bwd, same_optimizer_step))


def _move_step_after(fn, step, backward):
    """Fix (TL101): move the step (with the `scaler.update()` right after it) after the
    statement of the same block that runs the backward."""
    def make(mm):
        import re

        from torchlint.fixes import move_after_sibling, simple_statement, statement_block, statement_code

        stmt = simple_statement(step)
        if stmt is None or id(backward) not in {id(o) for o in all_ops(fn)}:
            return None
        stmts = [stmt]
        if step.recv and step.target and norm_path(step.recv) != norm_path(step.target):
            block = statement_block(fn.node, stmt) or []
            i = next((k for k, s in enumerate(block) if s is stmt), None)
            nxt = block[i + 1] if i is not None and i + 1 < len(block) else None
            if nxt is not None and re.fullmatch(re.escape(step.recv) + r"\.update\(\)", statement_code(mm, nxt) or ""):
                stmts.append(nxt)  # scaler.step(opt); scaler.update() move together
        what = " and ".join(f"`{statement_code(mm, s)}`" for s in stmts)
        return move_after_sibling(mm, fn.node, stmts, backward.node, f"Move {what} after the backward pass",
                                  "unsafe")
    return make


def _src(op) -> str:
    if op.recv and op.target and norm_path(op.recv) != norm_path(op.target):
        return f"{op.recv}.step({op.target})"  # scaler.step(optimizer)
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
    known_problems = (
        "Not reported: a clear in a branch that ends with `continue`/`break`/`return`/`raise` "
        "(a NaN guard skips that step on purpose), a step whose backward runs under the same "
        "every-n-iterations condition (n_critic GAN updates), and `p.grad = None` for only some "
        "parameters (a layer frozen for a few epochs). On the real-world benchmark (issue 19, "
        "docs/evaluation.md) the rule has no finding left on either part once those three "
        "classes (8 false findings on the tuned part) were fixed; it was made a default rule on "
        "that evidence and on its fixtures, not on measured true positives."
    )
    fix_safety = "unsafe"
    fix_doc = ("Moves the clearing call to just before the `backward()` of the iteration "
               "(plain case) or into the accumulation branch after `step()`. Unsafe because code "
               "between the old and new position might read the gradients.")
    references = ("https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html",)
    triggers = (b"zero_grad", b".grad")

    def check(self, mm):
        reported = set()
        for fn, op in _steps(mm, in_loops_only=False):
            loop = op.loop
            # a step outside any loop of a function that runs one training step (its caller
            # loops): the order inside one call is the order of every iteration
            one_call = loop is None and not implicit_loop(mm, fn)
            if one_call and not one_step_function(mm, fn):
                continue
            seq = iteration(mm, fn, unit_body(fn, loop))
            if one_call:  # the function's own step, not what its loops do
                seq = [o for o in seq if o.loop is None]
            i = seq.index(op)
            n_opts = len({o.target for o in seq if isinstance(o, CallOp) and o.kind == STEP})
            last_bwd = max((j for j in range(i) if is_kind(mm, seq[j], BACKWARD)), default=None)
            if last_bwd is not None and _step_before_its_backward(mm, fn, unit_body(fn, loop), seq, op):
                last_bwd = None  # the step runs before its own backward (TL101), the clear is in place
            if last_bwd is not None:
                for c in seq[last_bwd + 1:i]:
                    if leaves_iteration(c, loop) and not leaves_iteration(op, loop):
                        continue  # `zero_grad(); continue` skips this iteration's step on purpose
                    if one_call and not path_in_order(mm, fn, fn.body, (lambda x: x is seq[last_bwd],
                                                                        lambda x: x is c, lambda x: x is op)):
                        continue  # not on one path (`if ...: return` between them)
                    if clears(mm, c) and clear_covers(mm, fn, c, op, True, n_opts) and id(c) not in reported:
                        reported.add(id(c))
                        yield Report(c.node, f"gradients are cleared after the `backward()` at line "
                                     f"{_line(mm, seq[last_bwd])} and before `{_src(op)}` at line "
                                     f"{_line(mm, op)}, so the step applies zeros",
                                     fix=_move_clear(fn, c, _first_backward(mm, seq, i)), scope=fn.qualname)
            if one_call:
                continue  # accumulation across calls: how often the caller calls is not known
            # gradient accumulation: clear every iteration, step every k
            step_guards = guards_inside(op, loop)
            acc = next((br for br, _ in step_guards if is_accumulation_test(br.test)), None)
            if acc is None:
                continue
            arm = next(a for br, a in step_guards if br is acc)
            if any(is_kind(mm, o, BACKWARD) and (acc, arm) in o.guards for o in seq):
                continue  # backward and step both under the condition: every n-th iteration
                # trains this optimizer (n_critic GAN updates), nothing is meant to accumulate
            # a clear in every iteration that, on some path, throws away the gradients earlier
            # iterations left for this step (backwards on every path of the iteration count)
            carried = carried_clears(mm, fn, loop, op, lambda c: clear_covers(mm, fn, c, op, True, n_opts))
            for c in seq:
                if id(c) in carried and unguarded_in(c, loop) and id(c) not in reported:
                    reported.add(id(c))
                    via = mm.describe_call(c)  # the clear runs in a helper: name it
                    every = "every iteration" if loop is not None else f"in every call of `{fn.name}()` (once per batch)"
                    yield Report(c.node, (f"{via} clears gradients {every} but " if via else
                                          f"gradients are cleared {every} but ") +
                                 f"`{_src(op)}` runs only under the accumulation condition at line "
                                 f"{mm.line_of(acc.node)}, so gradients never accumulate; clear them after "
                                 "the step instead", fix=_move_clear(fn, c, op, after=True) if step_guards[-1][0] is acc else None,
                                 scope=fn.qualname)  # a step nested deeper (AMP or not): no single place


def _where(mm, guard) -> str:
    br, arm = guard
    if br.test is None:
        return " (in an `except` handler)"
    test = mm.code_for(br.test).strip()
    return f" (under `if {test}:`)" if arm == 0 else f" (in the `else` of `if {test}:`)"


def _first_backward(mm, seq, i):
    """The first backward of the gradients ``seq[i]`` (a step) applies: after the previous step."""
    start = max((j + 1 for j in range(i) if is_kind(mm, seq[j], STEP)), default=0)
    return next((o for o in seq[start:i] if is_kind(mm, o, BACKWARD)), None)


def _move_clear(fn, clear, anchor, after: bool = False):
    """Fix (TL102): move the clearing statement before ``anchor``'s statement (or after it)."""
    def make(mm):
        from torchlint.fixes import move_statement, simple_statement

        if anchor is None or not isinstance(clear, CallOp) or clear.kind != CLEAR:
            return None
        own = {id(o) for o in all_ops(fn)}
        if id(clear) not in own or id(anchor) not in own:
            return None  # in a closure or a helper: moving it would change other code
        if anchor.loop is not clear.loop:
            return None  # another loop level: the move would change how often it clears
        stmt = simple_statement(clear)
        target = simple_statement(anchor) if after else anchor.stmt
        if stmt is None or target is None:
            return None
        code = mm.code_for(clear.node).strip()
        where = "after `" + (anchor.func or "step") + "()`" if after else "before `backward()`"
        return move_statement(mm, stmt, target, f"Move `{code}` {where}", "unsafe", after=after)
    return make


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
    known_problems = (
        "Not reported: a step whose parameters the loop's clearings cover together (an "
        "optimizer over `chain(G.parameters(), D.parameters())` cleared by `optG.zero_grad()` "
        "and `optD.zero_grad()`), and a loop that times one fixed computation rather than "
        "training (it runs over `range(n)`, every forward takes inputs built before the loop, "
        "and a clock or memory probe such as `time.time()`, `torch.cuda.synchronize()` or "
        "`torch.cuda.max_memory_allocated()` is read before it and again inside or after it)."
    )
    fix_safety = "unsafe"
    fix_doc = ("Inserts `optimizer.zero_grad()` as the first statement of the loop body. Unsafe: "
               "code that accumulates on purpose across the whole loop would change behaviour.")
    references = ("https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html",)
    triggers = (b".step(",)

    def check(self, mm):
        for fn, op in _steps(mm):
            loop = op.loop
            seq = iteration(mm, fn, unit_body(fn, loop))
            bwds = [o for o in seq if is_kind(mm, o, BACKWARD)]
            if not bwds:
                continue
            if all(o.kind == BACKWARD and o.info == catalog.DIST_AUTOGRAD for o in bwds):
                continue  # distributed autograd keeps gradients per context: nothing to clear
            stepped = frozenset(norm_path(o.target) for o in seq
                                if isinstance(o, CallOp) and o.kind == STEP and o.target)
            all_clears = [o for o in seq if clears(mm, o)]
            covering = [o for o in all_clears if clear_covers(mm, fn, o, op, False, stepped=stepped)] \
                or clears_together(mm, fn, all_clears, op)
            if covering:
                if clears_on_some_paths(mm, fn, loop, op, covering):
                    c = covering[0]
                    br = guards_inside(c, loop)
                    where = _where(mm, br[-1]) if br else ""
                    yield Report(op.node, f"`{_src(op)}` runs in {_in_loop(fn, op)} that clears its gradients only on some "
                                 f"paths: the clearing at line {_line(mm, c)}{where} is skipped on a path that "
                                 "runs `backward()` and this step, so there they accumulate across iterations",
                                 scope=fn.qualname)
                continue
            if all_clears:
                c = all_clears[0]
                what = f"`{c.target}.zero_grad()`" if isinstance(c, CallOp) and c.kind == CLEAR else "the clearing"
                owners = optimizer_owners_text(mm, fn, op)
                detail = (f"{what} at line {_line(mm, c)} does not clear the gradients "
                          f"`{op.target}` applies" + (f" (it updates {owners})" if owners else ""))
                yield Report(op.node, f"`{_src(op)}` runs in {_in_loop(fn, op)} that never clears its gradients: "
                             f"{detail}, so they accumulate across iterations",
                             fix=_insert_zero_grad(op), scope=fn.qualname)
                continue
            if timed_repetition_loop(mm, fn, loop):
                continue  # a loop timing one fixed forward/backward/step: what it measures is not the weights
            yield Report(op.node, f"`{_src(op)}` runs in {_in_loop(fn, op)} that never clears gradients, so "
                         "they accumulate across iterations", fix=_insert_zero_grad(op), scope=fn.qualname)
        yield from self._steps_in_helpers(mm)
        yield from self._one_step_methods(mm)

    @staticmethod
    def _one_step_methods(mm):
        """A function that runs one training step outside any loop of its own (a GAN class's
        `step(batch)`, called once per batch by its caller) and clears gradients itself, but
        not those of an optimizer it steps: each call adds that optimizer's gradients to the
        last call's."""
        for fn in mm.all_functions:
            if not one_step_function(mm, fn) or implicit_loop(mm, fn):
                continue
            seq = iteration(mm, fn, fn.body)
            own = [o for o in all_ops(fn) if isinstance(o, CallOp) and o.loop is None]
            all_clears = [o for o in seq if clears(mm, o)]
            if not all_clears or any(o.kind == BACKWARD and o.info == catalog.DIST_AUTOGRAD for o in own):
                continue
            stepped = frozenset(norm_path(o.target) for o in own if o.kind == STEP and o.target)
            for op in own:
                if op.kind != STEP or any(clear_covers(mm, fn, c, op, False, stepped=stepped) for c in all_clears):
                    continue
                c = all_clears[0]
                what = f"`{c.target}.zero_grad()`" if isinstance(c, CallOp) and c.kind == CLEAR else "the clearing"
                yield Report(op.node, f"`{_src(op)}` runs once per call of `{fn.name}()`, one training step "
                             f"that clears gradients itself: {what} at line {_line(mm, c)} does not clear the "
                             f"gradients `{op.target}` applies, so they accumulate across calls",
                             scope=fn.qualname)

    def _steps_in_helpers(self, mm):
        """A loop that steps only through a helper of this module (`self.train_step(batch)`,
        whose own body steps outside any loop of its own, its backward perhaps in a further
        helper): the iteration is the loop's ops with the helpers' summaries, reported at the
        helper's step when nothing in it clears."""
        reported = set()
        for fn in _functions(mm):
            for loop in all_ops(fn):
                if not isinstance(loop, LoopOp):
                    continue
                deep = iteration(mm, fn, loop.body)
                if any(isinstance(o, CallOp) and o.kind == STEP for o in deep):
                    continue  # the loop's own steps are judged above
                if not any(is_kind(mm, o, BACKWARD) for o in deep) or any(clears(mm, o) for o in deep):
                    continue
                for call in (o for o in deep if _in_this_loop(o, loop)):
                    if not (isinstance(call, CallOp) and call.kind == CALL and is_kind(mm, call, STEP)):
                        continue
                    helper = local_function(call.info)
                    inner = first_direct(helper, STEP) if helper is not None else None
                    if inner is None or inner.loop is not None or id(inner.node) in reported:
                        continue
                    if any(isinstance(o, CallOp) and o.kind == BACKWARD and o.info == catalog.DIST_AUTOGRAD
                           for o in all_ops(helper)):
                        continue
                    reported.add(id(inner.node))
                    yield Report(inner.node, f"`{_src(inner)}` in `{helper.name}()` runs once per iteration of the "
                                 f"loop at line {_line(mm, loop)}, which runs `backward()` and never clears "
                                 "gradients, so they accumulate across iterations", scope=helper.qualname)


def _in_this_loop(op, loop) -> bool:
    """``op`` runs in ``loop`` itself, not in a loop nested in it."""
    return getattr(op, "loop", None) is loop


def _in_loop(fn, op) -> str:
    """Where the step runs: "a loop", or the hook a framework calls once per batch."""
    return "a loop" if op.loop is not None else f"`{fn.name}()`, called once per batch,"


def _insert_zero_grad(op):
    def make(mm):
        if op.loop is None:
            return None  # a framework hook: where the clearing belongs is the author's call
        from torchlint.fixes import insert_after_stmt, insert_first_in_loop, simple_statement

        target = op.target or "optimizer"
        if guards_inside(op, op.loop):
            # stepped only sometimes (gradient accumulation): clear right after the step
            if simple_statement(op) is None:
                return None
            return insert_after_stmt(mm, op, f"{target}.zero_grad()",
                                     f"Insert `{target}.zero_grad()` after `{_src(op)}`", "unsafe")
        return insert_first_in_loop(mm, op.loop, f"{target}.zero_grad()",
                                    f"Insert `{target}.zero_grad()` at the start of the loop", "unsafe")
    return make


@register
class BackwardWithoutStep(Rule):
    code = "TL104"
    # preview: no true finding on the real-world benchmark (see preview_reason)
    default = False
    preview_reason = ('no real bug found on the real-world benchmark: its 4 false findings on the tuned part (optimizer wrappers that step the inner optimizer, A3C gradients sent to a shared optimizer, a hand-written `backward` method) are fixed, and the held-out part still has 1 finding, judged FALSE')
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
    fix_safety = "unsafe"
    fix_doc = ("When the loop (or the helper that runs the backward) clears the gradients of one "
               "optimizer, inserts its `step()` after the backward statement and the gradient "
               "clipping/unscaling lines that follow it; `scaler.step(optimizer)` after "
               "`scaler.scale(loss).backward()`. Unsafe: the weights change from then on, which "
               "may not be what a loop that only accumulated gradients meant.")
    triggers = (b".backward(",)

    def check(self, mm):
        reported = set()
        for fn in _functions(mm):
            if mm.is_lightning(fn):
                continue
            whole = iteration(mm, fn, fn.body)
            if any(is_kind(mm, o, STEP) for o in whole):
                yield from self._unstepped_optimizers(mm, fn, whole, reported)
                continue
            backwards = [next((o for o in iteration(mm, fn, loop.body) if is_kind(mm, o, BACKWARD)), None)
                         for loop in all_ops(fn) if isinstance(loop, LoopOp) and loop.parent is None]
            backwards = [b for b in backwards if b is not None]
            if not backwards:
                continue  # (asked first: what follows reads every assignment of the function)
            if manual_update(fn) or grads_handed_off(fn) or optimizer_wrapper_call(mm, fn, whole):
                continue  # updated by hand, by another process, or by a wrapper's own method
            for bwd in backwards:
                node, via = bwd.node, ""
                helper = local_function(bwd.info) if bwd.kind == CALL else None
                if helper is not None:
                    if manual_update(helper) or grads_handed_off(helper) \
                            or optimizer_wrapper_call(mm, helper, all_ops(helper)):
                        continue
                    inner = first_direct(helper, BACKWARD)
                    if inner is not None:
                        node = inner.node
                        via = f" (`{helper.name}()`, called in the loop at line {_line(mm, bwd)})"
                    if not (optimizer_paths(mm, fn) or optimizer_paths(mm, helper)):
                        continue
                elif not optimizer_paths(mm, fn):
                    continue
                if id(node) in reported:
                    continue
                reported.add(id(node))
                owner = helper if helper is not None and inner is not None else fn
                direct = inner if helper is not None else bwd
                cleared = {norm_path(o.target) for o in (all_ops(owner) if owner is not fn else _outer_iteration(mm, fn, bwd))
                           if isinstance(o, CallOp) and o.kind == CLEAR and o.target
                           and mm.resolver.of_path(owner, o.target)[0] == catalog.OPTIMIZER}
                fix = _step_after_backward(owner, direct, cleared.pop()) \
                    if direct is not None and len(cleared) == 1 else None
                yield Report(node, f"`backward()` computes gradients in this training loop{via} but no "
                             "optimizer `step()` runs, so the weights never change", fix=fix, scope=fn.qualname)

    @staticmethod
    def _unstepped_optimizers(mm, fn, whole, reported):
        """An optimizer whose gradients are cleared for a backward but which never steps (GANs)."""
        targets = [o.target for o in whole if isinstance(o, CallOp) and o.kind == STEP]
        if any(t is None for t in targets) or any(
                isinstance(o, CallOp) and o.kind == CALL and is_kind(mm, o, STEP) for o in whole):
            return
        stepped = {norm_path(t) for t in targets}
        for loop in (o for o in all_ops(fn) if isinstance(o, LoopOp)):
            seq = iteration(mm, fn, loop.body)
            for i, c in enumerate(seq):
                if not (isinstance(c, CallOp) and c.kind == CLEAR and c.loop is loop and c.target):
                    continue
                t = norm_path(c.target)
                if t in stepped or mm.resolver.of_path(fn, t)[0] != catalog.OPTIMIZER:
                    continue
                if passes_as_argument(fn, t):
                    continue
                bwd = next((o for o in seq[i + 1:] if isinstance(o, CallOp) and o.kind == BACKWARD), None)
                if bwd is None or id(bwd.node) in reported:
                    continue
                reported.add(id(bwd.node))
                yield Report(bwd.node, f"`backward()` computes gradients for `{c.target}` (cleared at line "
                             f"{_line(mm, c)}) but `{c.target}.step()` never runs, so those weights never "
                             "change", fix=_step_after_backward(fn, bwd, c.target), scope=fn.qualname)


def _outer_iteration(mm, fn, op):
    """The ops of one iteration of the outermost loop around ``op`` (all of ``fn`` outside one)."""
    loop = op.loop
    while loop is not None and loop.parent is not None:
        loop = loop.parent
    return iteration(mm, fn, loop.body) if loop is not None else all_ops(fn)


_GRAD_HANDLING = re.compile(r"\bclip_grad_(?:norm|value)_\s*\(|\.unscale_\s*\(")


def _step_after_backward(fn, bwd, optimizer):
    """Fix (TL104): ``optimizer.step()`` (``scaler.step(optimizer)`` for a scaled backward) after
    the backward's statement and the clipping lines right after it."""
    def make(mm):
        from torchlint.fixes import insert_after_stmt, simple_statement, statement_block, statement_code

        stmt = simple_statement(bwd)
        block = statement_block(fn.node, stmt) if stmt is not None else None
        if block is None:
            return None
        anchor = stmt
        for s in block[block.index(stmt) + 1:]:
            code = statement_code(mm, s) if isinstance(s, cst.SimpleStatementLine) else None
            if code is None or not _GRAD_HANDLING.search(code):
                break
            anchor = s
        code = f"{optimizer}.step()"
        recv = bwd.recv_node
        if isinstance(recv, cst.Call) and isinstance(recv.func, cst.Attribute) and recv.func.attr.value == "scale":
            scaler = dotted(recv.func.value)
            if not scaler or mm.resolver.of_path(fn, scaler)[0] != catalog.SCALER:
                return None
            code = f"{scaler}.step({optimizer})"
        return insert_after_stmt(mm, anchor, code, f"Apply the gradients: `{code}`", "unsafe")
    return make


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
    known_problems = ("A scheduler step that an optimizer step precedes on every path from the start "
                      "of the function is not flagged: an empty `optimizer.zero_grad(); optimizer.step()` "
                      "before the epoch loop (a warm-up from a learning rate of 0 stepped at the start of "
                      "each epoch) is a deliberate order, and PyTorch does not warn about it. A scheduler given the epoch "
                      "explicitly (`scheduler.step(epoch=e)`, or `step(e)` with a loop counter) sets that "
                      "epoch's rate instead of advancing the schedule, so its order skips nothing and is not "
                      "flagged.")
    fix_safety = "unsafe"
    fix_doc = ("Moves `scheduler.step()` below the statement of the same block that steps the optimizer "
               "(below the inner batch loop for a scheduler stepped at the start of each epoch). "
               "Unsafe: code in between that reads the learning rate (logging) then sees the old one.")
    references = ("https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate",)
    triggers = (b".step(",)

    def check(self, mm):
        reported = set()
        for fn in _functions(mm):
            for op in all_ops(fn):
                # a step in a loop, or one of the function's own body outside any loop: the
                # caller runs it once per iteration (a wrapper's `step()` that steps both)
                if not isinstance(op, CallOp):
                    continue
                node, what = op.node, f"`{op.recv}.step()`"
                if op.kind == SCHED_STEP:
                    if scheduler_sets_epoch(mm, fn, op):
                        continue  # step(epoch): sets that epoch's rate, skips nothing
                elif op.kind == CALL and is_kind(mm, op, SCHED_STEP) and not is_kind(mm, op, STEP):
                    helper = local_function(op.info)
                    inner = first_direct(helper, SCHED_STEP) if helper is not None else None
                    if inner is not None:
                        if scheduler_sets_epoch(mm, helper, inner):
                            continue
                        node = inner.node
                        what = f"`{inner.recv}.step()` in `{helper.name}()` (called at line {_line(mm, op)})"
                    else:
                        what = f"the scheduler step in `{op.func}()`"
                else:
                    continue
                # a step of the function's own body is followed by the steps of its body and of
                # its loops: one call of a per-epoch function (its epoch loop in the caller) runs
                # the scheduler step first, then the batch loop's optimizer steps (unless its
                # loops step the scheduler again)
                block = op.loop.body if op.loop is not None else fn.body
                seq = iteration(mm, fn, block)
                if op.loop is None and any(getattr(o, "loop", None) is not None and is_kind(mm, o, SCHED_STEP)
                                           for o in seq):
                    # the function's loops step the scheduler too: the step before them is a one-off
                    # (`scheduler.step()  # skip the warm-up's lr=0`), not the step of each call
                    seq = [o for o in seq if getattr(o, "loop", None) is None]
                i = seq.index(op)
                if stepped_earlier_in_iteration(mm, fn, block, seq, op):
                    continue
                if stepped_on_every_path_before(mm, fn, op, scheduler_optimizer(mm, fn, op.recv)
                                                if op.kind == SCHED_STEP else None):
                    continue  # the optimizer has stepped before (a step before the epoch loop)
                later = next((o for o in seq[i + 1:] if is_kind(mm, o, STEP)
                              and path_in_order(mm, fn, block, (lambda x: x is op, lambda x, o=o: x is o))), None)
                if later is not None and id(node) not in reported:
                    reported.add(id(node))
                    step_txt = f"`{_src(later)}`" if later.kind == STEP else f"the optimizer step in `{later.func}()`"
                    fix = _move_scheduler_after(fn, op, later) if node is op.node else None
                    unit = "iteration" if op.loop is not None else f"call of `{fn.name}()`"
                    yield Report(node, f"{what} runs before {step_txt} (line {_line(mm, later)}) in this "
                                 f"{unit}; step the scheduler after the optimizer", fix=fix, scope=fn.qualname)


def _move_scheduler_after(fn, sched, step):
    """Fix (TL105): move the scheduler step after the statement of its block that steps the
    optimizer (an inner batch loop included: an epoch scheduler then steps after the epoch)."""
    def make(mm):
        import libcst as cst

        from torchlint.fixes import move_after_sibling, simple_statement, statement_code

        stmt = simple_statement(sched)
        if stmt is None or id(step) not in {id(o) for o in all_ops(fn)}:
            return None
        return move_after_sibling(mm, fn.node, [stmt], step.node,
                                  f"Move `{statement_code(mm, stmt)}` after the optimizer step", "unsafe",
                                  kinds=(cst.SimpleStatementLine, cst.With, cst.For, cst.While, cst.If, cst.Try))
    return make


@register
class StepWithoutBackward(Rule):
    code = "TL108"
    default = False
    preview_reason = (
        "no finding on the real-world benchmark (45 repositories: 33 tuned, 12 held-out; run alone at "
        "01068f9 and again with the default rules at a3d0a79), so its precision on real code is not "
        "measured (the target asks for >= 0.80 over >= 5 findings); preview until it is")
    name = "step-without-backward"
    summary = "A training loop clears the gradients and steps the optimizer, but no `backward()` runs in it."
    why = (
        "Without a backward pass there are no gradients: after `zero_grad()` they are zeros (or "
        "`None`, the default since PyTorch 2.0), so `optimizer.step()` leaves the weights as they "
        "are, or only applies weight decay and stale momentum. The loss is computed and logged "
        "every step, so the script looks like it trains. The usual causes are a `loss.backward` "
        "written without its parentheses, or a backward lost in a refactoring."
    )
    example = """\
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward
    optimizer.step()
"""
    use_instead = """\
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    known_problems = (
        "Backward passes in any spelling are recognised: `loss.backward()`, `torch.autograd.backward`, "
        "`torch.autograd.grad`, `accelerator.backward`, `self.manual_backward`, "
        "`scaler.scale(loss).backward()`, a backward inside the `opt.step(closure)` closure or in a "
        "helper of the linted tree. A loop that calls a function of the tree whose effects are "
        "unknown, or that writes `.grad` by hand, is not reported."
    )
    fix_safety = "unsafe"
    fix_doc = ("Inserts `loss.backward()` after the last statement of the step's block that computes the "
               "loss. Unsafe: the loss it picks may not be the one meant to be optimized.")
    triggers = (b".step(",)

    def check(self, mm):
        reported = set()
        for fn, op in _steps(mm, in_loops_only=False):
            block = op.loop.body if op.loop is not None else fn.body
            if id(op) in reported or (op.loop is None and not fn.params):
                continue
            seq = iteration(mm, fn, block)
            if not any(isinstance(o, CallOp) and o.kind == CLEAR for o in seq):
                continue
            if not any(isinstance(o, CallOp) and o.kind in (LOSS, FORWARD) for o in seq):
                continue
            if any(may_compute_gradients(mm, o) for o in seq):
                continue
            reported.add(id(op))
            where = "this loop" if op.loop is not None else f"`{fn.name}()`"
            yield Report(op.node, f"`{_src(op)}` applies gradients, but no `backward()` runs in {where} "
                         "(the gradients were just cleared), so the weights never learn from the loss",
                         fix=_insert_backward(fn, op), scope=fn.qualname)


def _insert_backward(fn, step):
    """Fix (TL108): ``loss.backward()`` right after the last statement of the step's block that
    computes the loss."""
    def make(mm):
        from torchlint.fixes import insert_after_stmt

        own = all_ops(fn)
        i = next((k for k, o in enumerate(own) if o is step), None)
        if i is None:
            return None
        for o in reversed(own[:i]):
            if isinstance(o, AssignOp) and o.loop is step.loop and o.guards == step.guards \
                    and len(o.targets) == 1 and isinstance(o.targets[0], cst.Name) \
                    and ("loss" in o.value_facts or "loss" in o.targets[0].value.lower()):
                name = o.targets[0].value
                return insert_after_stmt(mm, o, f"{name}.backward()",
                                         f"Insert `{name}.backward()` after the loss is computed", "unsafe")
        return None
    return make


_CUTS = ("detach", "item", "numpy", "tolist", "sample", "argmax", "argmin", "long", "int", "bool")


def _live_names(expr) -> set:
    """Root names an expression reads, except under ``.detach()``/``.item()``/``.data``."""
    out, stack = set(), [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in _CUTS:
            continue
        if isinstance(e, cst.Attribute) and e.attr.value == "data" or isinstance(e, cst.Comparison):
            continue  # no gradient flows through .data or a comparison
        if isinstance(e, cst.Name):
            out.add(e.value)
            continue
        stack.extend(code_children(e))
    return out


def _graph_deps(seq, upto: int, name: str) -> set:
    """The assignments (by id) with a forward pass that the value of ``name`` at ``seq[upto]``
    was computed from, through live (not detached) names."""
    forwards = {id(o.stmt) for o in seq if isinstance(o, CallOp) and o.kind == FORWARD and o.stmt is not None}
    out, todo, seen = set(), [(name.split(".")[0], upto)], set()
    while todo:
        n, at = todo.pop()
        if (n, at) in seen:
            continue
        seen.add((n, at))
        j = next((j for j in range(at - 1, -1, -1) if isinstance(seq[j], AssignOp) and seq[j].value is not None
                  and any(n in _live_names(t) or (dotted(t) or "").split(".")[0] == n for t in seq[j].targets)), None)
        if j is None:
            continue
        if id(seq[j].stmt) in forwards:
            out.add(id(seq[j]))
        todo.extend((m, j) for m in _live_names(seq[j].value))
    return out


def _retains_graph(op) -> bool:
    a = op.keyword("retain_graph")
    return a is not None and isinstance(a.value, cst.Name) and a.value.value == "True"


@register
class StepBetweenRetainedBackwards(Rule):
    code = "TL109"
    default = False
    preview_reason = (
        "1 finding on the real-world benchmark (45 repositories; run alone at 01068f9 and again with "
        "the default rules at a3d0a79, the same finding), TRUE: MorvanZhou/PyTorch-Tutorial's "
        "conditional GAN backpropagates the generator loss through the discriminator graph after "
        "`opt_D.step()`, which raises on PyTorch >= 1.5. Precision 1.00 on the tuned part from one "
        "finding and no finding on the held-out part: the target (>= 0.80 over >= 5 findings) is not "
        "shown to be met")
    name = "step-between-retained-backwards"
    summary = "`optimizer.step()` changes the weights between two backward passes through one retained graph."
    why = (
        "`backward(retain_graph=True)` keeps the graph so that a second loss built from the same "
        "forward pass can be backpropagated later. If an optimizer steps in between, the weights "
        "that graph saved for its backward have been changed in place: PyTorch raises `one of the "
        "variables needed for gradient computation has been modified by an inplace operation` at "
        "the second backward (older versions silently computed gradients with the new weights and "
        "the old activations). The classic case is a GAN that computes the discriminator and "
        "generator losses from one `D(fake)`, steps D, then backpropagates the generator loss."
    )
    example = """\
for real, _ in loader:
    fake = generator(torch.randn(real.size(0), z_dim))
    d_fake = discriminator(fake)
    d_loss = bce(discriminator(real), ones) + bce(d_fake, zeros)
    g_loss = bce(d_fake, ones)
    opt_d.zero_grad()
    d_loss.backward(retain_graph=True)
    opt_d.step()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
"""
    use_instead = """\
for real, _ in loader:
    fake = generator(torch.randn(real.size(0), z_dim))
    d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = bce(discriminator(fake), ones)
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
"""
    known_problems = (
        "The second loss must be a name computed before the step (a fresh forward pass after the "
        "step builds a new graph and is fine); whether both losses really share the stepped "
        "weights is not checked: the `retain_graph=True` of the first backward is taken as the "
        "sign that they do."
    )
    triggers = (b"retain_graph",)

    def check(self, mm):
        reported = set()
        for fn in _functions(mm):
            blocks = [fn.body] + [o.body for o in all_ops(fn) if isinstance(o, LoopOp)]
            for block in blocks:
                seq = iteration(mm, fn, block)
                for i, b1 in enumerate(seq):
                    if not (isinstance(b1, CallOp) and b1.kind == BACKWARD and _retains_graph(b1)):
                        continue
                    step = next((o for o in seq[i + 1:] if isinstance(o, CallOp) and o.kind == STEP
                                 and not exclusive(o, b1)), None)
                    if step is None:
                        continue
                    k = seq.index(step)
                    for b2 in seq[k + 1:]:
                        if not (isinstance(b2, CallOp) and b2.kind == BACKWARD and b2.recv) or exclusive(b2, step) \
                                or id(b2) in reported:
                            continue
                        loss = norm_path(b2.recv)
                        assigned = [j for j, o in enumerate(seq[:seq.index(b2)])
                                    if isinstance(o, AssignOp) and any(norm_path(dotted(t) or "") == loss
                                                                       for t in o.targets)]
                        if not assigned or assigned[-1] > k:
                            continue  # built again after the step: a fresh graph
                        if b1.recv is None or not (_graph_deps(seq, seq.index(b2), loss) &
                                                   _graph_deps(seq, i, norm_path(b1.recv))):
                            continue  # no forward pass in common (detached inputs, separate networks)
                        reported.add(id(b2))
                        yield Report(b2.node, f"`{b2.recv}.backward()` goes through a graph built before "
                                     f"`{_src(step)}` (line {_line(mm, step)}) changed the weights, kept by "
                                     f"`retain_graph=True` at line {_line(mm, b1)}: backward fails (weights "
                                     "modified in place) or mixes old activations with new weights; compute "
                                     f"`{b2.recv}` after the step", scope=fn.qualname)

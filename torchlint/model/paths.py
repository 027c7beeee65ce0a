"""Paths through a function's ops: must/may facts per path, not a flattened sequence.

The binder keeps a function's ops as a tree (branches with their arms, loops with their
bodies, ``continue``/``break``/``raise`` as :class:`~torchlint.model.ir.JumpOp`, ``return``).
:func:`run` walks that tree as a control-flow graph: a *state* (any hashable value a query
chooses) flows along every path, an ``if`` sends it down each arm (and past the ``if`` when
there is no ``else``), a ``try`` runs its body and then each handler or none, ``continue``
ends the iteration, ``break`` leaves the loop, ``return``/``raise`` leave the function, a
nested loop runs its body one or more times (to a fixpoint) and ``opt.step(closure)`` runs
the closure first.  Only the distinct states are kept at each point, so the work is bounded
by the number of states a query can produce, not by the number of paths.

Branches whose test is written the same way twice (``if scaler:`` ... ``if scaler:``) are
correlated: a path takes the same arm at both (``not`` flips the arm, and ``x is not None``
is ``x is None`` flipped: ``if opt is not None: opt.zero_grad()`` ... ``if opt is None: sgd()
else: opt.step()``).  Across iterations of
a loop only the choices of tests the loop does not assign survive (``if use_amp:`` keeps its
arm, ``if (i + 1) % k == 0:`` does not).

:func:`iterate` runs one unit of training repeatedly: a loop's body, or a function that is
one iteration of an implicit loop (a Lightning ``training_step``); the states at the end of
an iteration (fall-through, ``continue``, and for a function ``return``) start the next
one, through ``carry``.  The queries rules use are at the end: :func:`runs_on_every_path`,
:func:`path_without`, :func:`states_before`.
"""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional

import libcst as cst

from .binder import dotted
from .dataflow import code_children
from .ir import STEP, AssignOp, BranchOp, CallOp, DefOp, JumpOp, LoopOp, ReturnOp, walk

State = Hashable
Transfer = Callable[[State, object], State]

_MAX_STATES = 256  # a query whose states explode is answered on a sample of them


class Flow:
    """Where the states leave a block: falling through, ``continue``, ``break``, leaving the
    function (``return``/``raise``)."""

    __slots__ = ("out", "cont", "brk", "ret")

    def __init__(self, out=()):
        self.out, self.cont, self.brk, self.ret = set(out), set(), set(), set()


def _code(expr) -> Optional[str]:
    try:
        return cst.Module([]).code_for_node(expr).strip()
    except Exception:  # pragma: no cover - defensive
        return None


def _is_none(expr) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _none_test(test) -> Optional[tuple]:
    """``x is None`` / ``x is not None`` (``==``/``!=``, ``None is x``) as (``x is None``'s
    code, negated): one predicate whichever way it is written."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    cmp = test.comparisons[0]
    if not isinstance(cmp.operator, (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual)):
        return None
    if _is_none(cmp.comparator):
        subject = test.left
    elif _is_none(test.left):
        subject = cmp.comparator
    else:
        return None
    code = _code(subject)
    return (code + " is None", isinstance(cmp.operator, (cst.IsNot, cst.NotEqual))) if code else None


def _test_key(test) -> Optional[tuple]:
    """(the test's code without a leading ``not``, whether it was negated); a comparison
    with ``None`` is keyed as ``x is None`` so ``if x is not None:`` ... ``if x is None:``
    are the same test with opposite arms."""
    neg = False
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, neg = test.expression, not neg
    if test is None:
        return None
    none = _none_test(test)
    if none is not None:
        return (none[0], neg != none[1])
    code = _code(test)
    return (code, neg) if code else None


def _assigned_in(ops) -> set:
    out = set()
    for op in walk(ops):
        if isinstance(op, AssignOp):
            for t in op.targets:
                for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else (t,)):
                    e = e.value if isinstance(e, cst.BaseElement) else e
                    d = dotted(e)
                    if d:
                        out.add(d.split(".")[0])
        elif isinstance(op, LoopOp) and op.target is not None:
            stack = [op.target]
            while stack:
                e = stack.pop()
                if isinstance(e, cst.Name):
                    out.add(e.value)
                else:
                    stack.extend(code_children(e))
    return out


def _names(expr) -> set:
    out, stack = set(), [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, cst.Name):
            out.add(e.value)
        else:
            stack.extend(code_children(e))
    return out


def _dotted_reads(expr) -> set:
    """The names and dotted attributes ``expr`` reads (``self.opt is None``: ``self.opt``)."""
    out, stack = set(), [expr]
    while stack:
        e = stack.pop()
        d = dotted(e) if isinstance(e, (cst.Name, cst.Attribute)) else None
        if d:
            out.add(d)
        else:
            stack.extend(code_children(e))
    return out


def _assigned_dotted(op: AssignOp) -> set:
    out = set()
    for t in op.targets:
        for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else (t,)):
            e = e.value if isinstance(e, cst.BaseElement) else e
            d = dotted(e)
            if d:
                out.add(d)
    return out


class Walker:
    """One analysis: a transfer function over the ops of a function (and its closures)."""

    def __init__(self, mm, fn, transfer: Transfer, closures: bool = True, enter_loops: bool = False):
        self.mm, self.fn, self.transfer, self.closures = mm, fn, transfer, closures
        # ``enter_loops``: the transfer also sees each loop op, once per path, as the path
        # reaches it (before its first iteration)
        self.enter_loops = enter_loops
        self._keys: dict = {}  # id(BranchOp) -> test key, for tests written more than once
        self._reads: dict = {}  # test key's code -> the names and attributes the test reads
        self._drops: dict = {}  # id(AssignOp) -> the test codes whose choice it makes stale
        self._counted = False

    # ------------------------------------------------------------- correlated branches
    def _count_tests(self):
        if self._counted:
            return
        self._counted = True
        seen: dict = {}
        for op in walk(self.fn.body):
            if isinstance(op, BranchOp) and op.test is not None and len(op.arms) <= 2 \
                    and not isinstance(op.node, cst.Match if hasattr(cst, "Match") else ()):
                k = _test_key(op.test)
                if k is not None:
                    seen.setdefault(k[0], []).append((op, k[1]))
        for code, brs in seen.items():
            if len(brs) > 1:
                for br, neg in brs:
                    self._keys[id(br)] = (code, neg)
                self._reads[code] = _dotted_reads(brs[0][0].test)

    def _arm_states(self, br: BranchOp, arm: int, states: set) -> set:
        """The states that may take ``arm`` of ``br`` (a correlated test keeps its choice)."""
        key = self._keys.get(id(br))
        if key is None:
            return states
        code, neg = key
        truth = (arm == 0) != neg
        out = set()
        for st, dec in states:
            d = dict(dec)
            if code in d and d[code] != truth:
                continue
            d[code] = truth
            out.add((st, frozenset(d.items())))
        return out

    # ------------------------------------------------------------------ the walk
    def block(self, ops, states: set) -> Flow:
        flow = Flow(states)
        for op in ops:
            if not flow.out:
                break
            if isinstance(op, BranchOp):
                self._branch(op, flow)
            elif isinstance(op, LoopOp):
                self._loop(op, flow)
            elif isinstance(op, JumpOp):
                (flow.cont if op.jump == "continue" else flow.brk if op.jump == "break" else flow.ret
                 ).update(flow.out)
                flow.out = set()
            elif isinstance(op, ReturnOp):
                flow.ret.update(self._apply(flow.out, op))
                flow.out = set()
            elif isinstance(op, DefOp):
                continue
            else:
                flow.out = self._apply(flow.out, op)
        return flow

    def _forget(self, states: set, op: AssignOp) -> set:
        """A path's choice at a test no longer holds once the test's name is assigned
        (``if scaler is None: scaler = GradScaler()`` ... ``if scaler is None:``)."""
        drop = self._drops.get(id(op))
        if drop is None:
            assigned = _assigned_dotted(op)
            drop = self._drops[id(op)] = frozenset(
                c for c, reads in self._reads.items()
                if any(r == a or r.startswith(a + ".") for r in reads for a in assigned))
        if not drop:
            return states
        return {(s, frozenset((k, v) for k, v in d if k not in drop)) for s, d in states}

    def _apply(self, states: set, op) -> set:
        if self._reads and isinstance(op, AssignOp):
            states = self._forget(states, op)
        if self.closures and isinstance(op, CallOp) and op.kind == STEP and op.closure is not None:
            from .queries import closure_function

            cf = closure_function(self.mm, self.fn, op)
            if cf is not None:
                for o in walk(cf.body):
                    if isinstance(o, (CallOp, AssignOp)):
                        states = {(self.transfer(s, o), d) for s, d in states}
        out = {(self.transfer(s, op), d) for s, d in states}
        if len(out) > _MAX_STATES:
            out = set(sorted(out, key=repr)[:_MAX_STATES])
        return out

    def _branch(self, br: BranchOp, flow: Flow) -> None:
        states, out = flow.out, set()
        n = len(br.arms)
        for i, arm in enumerate(br.arms):
            sub = self.block(arm, self._arm_states(br, i, states))
            out |= sub.out
            flow.cont |= sub.cont
            flow.brk |= sub.brk
            flow.ret |= sub.ret
        if not br.exhaustive:  # no else arm (or no handler runs): the path past the branch
            out |= self._arm_states(br, n if n > 1 else 1, states)
        flow.out = out

    def _loop(self, loop: LoopOp, flow: Flow) -> None:
        """The body runs one or more times (training loops run); ``break`` leaves it."""
        self._count_tests()
        invariant = self._loop_invariant(loop)
        if self.enter_loops:
            flow.out = self._apply(flow.out, loop)
        ends, brk, start = set(), set(), set(flow.out)
        seen = set()
        while start:
            seen |= start
            sub = self.block(loop.body, start)
            flow.ret |= sub.ret
            brk |= sub.brk
            it = sub.out | sub.cont
            ends |= it
            start = {(s, frozenset((k, v) for k, v in d if k in invariant)) for s, d in it} - seen
        after = ends
        if loop.orelse and after:
            sub = self.block(loop.orelse, after)
            flow.ret |= sub.ret
            flow.cont |= sub.cont
            flow.brk |= sub.brk
            after = sub.out
        if loop.is_while and isinstance(loop.iter, cst.Name) and loop.iter.value == "True":
            after = set()  # ``while True``: only ``break`` leaves it
        flow.out = after | brk

    def _loop_invariant(self, loop: LoopOp) -> set:
        """Test codes whose choice survives an iteration of ``loop``: they read nothing it assigns."""
        cache = self.__dict__.setdefault("_inv", {})
        got = cache.get(id(loop))
        if got is None:
            assigned = _assigned_in(loop.body) | _assigned_in([loop])
            got = set()
            for op in walk(self.fn.body):
                k = self._keys.get(id(op))
                if k is not None and not (_names(op.test) & assigned):
                    got.add(k[0])
            cache[id(loop)] = got
        return got

    # ----------------------------------------------------------------- entry points
    def run(self, ops, init: Iterable[State]) -> Flow:
        self._count_tests()
        return self.block(ops, {(s, frozenset()) for s in init})


def _strip(states: set) -> set:
    return {s for s, _ in states}


def run(mm, fn, ops, transfer: Transfer, init: Iterable[State], enter_loops: bool = False) -> Flow:
    """Run ``transfer`` along every path through ``ops`` (a block of ``fn``); the flow's
    states are ``(state, branch choices)`` pairs (see :func:`states`).  ``enter_loops``: the
    transfer also sees each loop op as a path reaches it."""
    return Walker(mm, fn, transfer, enter_loops=enter_loops).run(ops, init)


def states(s: set) -> set:
    """The query's own states of a flow's set (branch choices dropped)."""
    return _strip(s)


def iterate(mm, fn, loop: Optional[LoopOp], transfer: Transfer, init: Iterable[State],
            carry: Callable[[State], State] = lambda s: s, rounds: int = 8) -> set:
    """Run ``transfer`` over successive iterations of ``loop`` (its body) or, when ``loop`` is
    None, of ``fn`` (a function the framework calls once per batch).  The states at the end
    of an iteration pass through ``carry`` into the next one, until nothing new arrives.
    Returns the states seen at the end of an iteration."""
    w = Walker(mm, fn, transfer)
    w._count_tests()
    body = loop.body if loop is not None else fn.body
    invariant = w._loop_invariant(loop) if loop is not None else {k for k, _ in w._keys.values()}
    start = {(s, frozenset()) for s in init}
    seen, ends = set(), set()
    for _ in range(rounds):
        start -= seen
        if not start:
            break
        seen |= start
        sub = w.block(body, start)
        it = sub.out | sub.cont | (sub.ret if loop is None else set())
        ends |= it
        start = {(carry(s), frozenset((k, v) for k, v in d if k in invariant)) for s, d in it}
    return _strip(ends)


# ------------------------------------------------------------------------ queries
def states_before(mm, fn, ops, transfer: Transfer, init: Iterable[State], target) -> set:
    """The query's states on the paths through ``ops`` that reach the op ``target``, as they
    are just before it (every iteration of the loops around it: the first one starts with
    what ran before the loop)."""
    seen: set = set()

    def t(s, op):
        if op is target:
            seen.add(s)
        return transfer(s, op)
    run(mm, fn, ops, t, init)
    return seen


def runs_on_every_path(mm, fn, ops, pred: Callable[[object], bool]) -> bool:
    """Every path through ``ops`` that completes it (falls through or ``continue``s) runs an
    op for which ``pred`` holds: ``if scaler: scaler.scale(loss).backward() else:
    loss.backward()`` is a backward on every path."""
    flow = run(mm, fn, ops, lambda s, op: s or bool(pred(op)), (False,))
    ends = states(flow.out | flow.cont)
    return bool(ends) and all(ends)


def path_without(mm, fn, ops, wanted: Iterable[Callable[[object], bool]],
                 avoided: Callable[[object], bool], enter_loops: bool = False) -> bool:
    """Some path through ``ops`` that completes it runs an op satisfying each of ``wanted``
    and none satisfying ``avoided`` (the AMP branch backwards and steps, only the fp32 branch
    clears).  ``enter_loops``: ``avoided`` is also asked of each loop a path enters."""
    wanted = tuple(wanted)

    def t(s, op):
        seen, hit = s
        if not hit and avoided(op):
            hit = True
        for i, w in enumerate(wanted):
            if not seen & (1 << i) and w(op):
                seen |= 1 << i
        return (seen, hit)
    flow = run(mm, fn, ops, t, ((0, False),), enter_loops=enter_loops)
    full = (1 << len(wanted)) - 1
    return any(seen == full and not hit for seen, hit in states(flow.out | flow.cont))


def path_in_order(mm, fn, ops, wanted: Iterable[Callable[[object], bool]],
                  avoided: Optional[Callable[[object], bool]] = None) -> bool:
    """Some path through ``ops`` (however it leaves them) runs an op satisfying each of
    ``wanted`` in that order, with no op satisfying ``avoided`` between the first and the
    last of them: ``scaler.scale(loss).backward()`` then ``optimizer.step()`` on one path,
    which ``if scaler: ... else: optimizer.step()`` is not."""
    wanted = tuple(wanted)
    n = len(wanted)

    def t(k, op):
        if k == n or k < 0:
            return k
        if k > 0 and avoided is not None and avoided(op):
            return -1
        return k + 1 if wanted[k](op) else k
    flow = run(mm, fn, ops, t, (0,))
    return n in states(flow.out | flow.cont | flow.brk | flow.ret)

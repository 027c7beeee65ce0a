"""The intermediate representation the binder produces: what each function does, in order.

One pass over a module's libcst tree (:mod:`torchlint.model.binder`) turns every function
(and the module's own top-level code) into a structured list of *operations*: calls,
assignments, returns, loops, branches.  Classification (:mod:`torchlint.model.events`) then
labels the calls that matter to training (``CLEAR``, ``FORWARD``, ``BACKWARD``, ``STEP`` …)
and the dataflow pass (:mod:`torchlint.model.dataflow`) attaches value facts.  Rules read
these structures; none of them walks the syntax tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

import libcst as cst

# Grad modes of a region, relative to the function's caller:
GRAD_OFF = "off"  # no_grad / inference_mode / set_grad_enabled(False)
GRAD_ON = "on"  # enable_grad / set_grad_enabled(True)
GRAD_UNKNOWN = "?"  # set_grad_enabled(flag)
# None: inherited from the caller (or the decorator)

# Event kinds (set on CallOp.kind by classification)
CLEAR = "clear"
FORWARD = "forward"
LOSS = "loss"
BACKWARD = "backward"
AUTOGRAD_GRAD = "autograd_grad"
STEP = "step"
SCHED_STEP = "sched_step"
MODE = "mode"
CALL = "call"  # a call of a function defined in the linted tree
MOVE = "move"  # x.to(device) / x.cuda()


@dataclass(eq=False)
class Op:
    node: cst.CSTNode
    grad: Optional[str]
    # index of the innermost enclosing LoopOp inside the function, set by the binder
    loop: Optional["LoopOp"] = field(default=None, repr=False)
    # branches (BranchOp, arm index) enclosing this op, outermost first, inside the function
    guards: tuple = ()
    # the statement this op belongs to (SimpleStatementLine or compound statement)
    stmt: Optional[cst.CSTNode] = field(default=None, repr=False)
    # the context managers of unknown grad mode this op runs inside (qualified names, outermost
    # first, since the innermost known grad context): resolved by the model (user
    # ``@contextmanager`` functions that yield under no_grad, here or in another module)
    ctx: tuple = ()
    # the library mode contexts this op runs inside (``with eval_mode(model):``): (mode, the
    # model's dotted path, the ``with`` item's call), outermost first (see ``catalog.MODE_CONTEXTS``)
    mode_ctx: tuple = ()


@dataclass(eq=False)
class CallOp(Op):
    func: Optional[str] = None  # dotted callee as written ("optimizer.step", "F.softmax")
    qual: Optional[str] = None  # qualified through imports ("torch.nn.functional.softmax")
    recv: Optional[str] = None  # dotted receiver for method calls ("self.optimizer")
    recv_node: Optional[cst.BaseExpression] = None
    attr: Optional[str] = None  # method name
    args: tuple = ()  # libcst Arg nodes
    # classification
    kind: Optional[str] = None
    target: Optional[str] = None  # the optimizer / model / scheduler path the event is about
    info: Any = None  # mode for MODE ("train"/"eval"/None), callee for CALL, loss kind for LOSS
    # dataflow (filled by dataflow pass): facts of each positional/keyword argument and receiver
    arg_facts: tuple = ()
    recv_facts: frozenset = frozenset()
    # for STEP with a closure: the closure's function model
    closure: Any = None

    def arg(self, pos: int, keyword: Optional[str] = None) -> Optional[cst.Arg]:
        positional = [a for a in self.args if a.keyword is None and not a.star]
        if keyword is not None:
            for a in self.args:
                if a.keyword is not None and a.keyword.value == keyword:
                    return a
        if pos is not None and 0 <= pos < len(positional):
            return positional[pos]
        return None

    def keyword(self, name: str) -> Optional[cst.Arg]:
        for a in self.args:
            if a.keyword is not None and a.keyword.value == name:
                return a
        return None


@dataclass(eq=False)
class AssignOp(Op):
    targets: tuple = ()  # target expressions
    value: Optional[cst.BaseExpression] = None
    aug: Optional[str] = None  # "+=", "-=", ... for augmented assignments
    annotation: Optional[cst.BaseExpression] = None
    value_facts: frozenset = frozenset()
    target_facts: frozenset = frozenset()  # for augmented assignment: facts of the target before


@dataclass(eq=False)
class ReturnOp(Op):
    value: Optional[cst.BaseExpression] = None
    value_facts: frozenset = frozenset()
    # ``return a, b``: the facts of each item (a caller unpacking the tuple binds them apart)
    item_facts: tuple = ()


@dataclass(eq=False)
class JumpOp(Op):
    """``continue``, ``break`` or ``raise``: where a path leaves the iteration early (read by
    the path analysis, :mod:`torchlint.model.paths`; every other pass ignores it)."""

    jump: str = "continue"  # "continue" | "break" | "raise"


@dataclass(eq=False)
class DefOp(Op):
    """A nested function definition (closures for LBFGS, local helpers)."""

    function: Any = None


@dataclass(eq=False)
class LoopOp(Op):
    is_while: bool = False
    target: Optional[cst.BaseExpression] = None  # for-loop target
    iter: Optional[cst.BaseExpression] = None  # for-loop iterable or while test
    iter_call: Optional[CallOp] = None
    body: list = field(default_factory=list)
    orelse: list = field(default_factory=list)
    parent: Optional["LoopOp"] = field(default=None, repr=False)
    runs_once: bool = False  # the body ends with an unconditional break/return


@dataclass(eq=False)
class BranchOp(Op):
    test: Optional[cst.BaseExpression] = None  # None for try/except arms
    arms: list = field(default_factory=list)  # list of op lists
    exhaustive: bool = False  # an else arm exists (one arm always runs)
    # per arm: it ends by leaving the block (``continue``/``break``/``return``/``raise`` as its
    # last statement), so nothing after the branch runs on that path
    leaves: tuple = ()


Block = list


def walk(block: Block, into_loops: bool = True) -> Iterator[Op]:
    """Every op in program order (depth first), loops and branches included."""
    stack = [iter(block)]
    while stack:
        for op in stack[-1]:
            yield op
            if type(op) is LoopOp or isinstance(op, LoopOp):
                if into_loops and (op.body or op.orelse):
                    stack.append(iter(op.body + op.orelse) if op.orelse else iter(op.body))
                    break
            elif isinstance(op, BranchOp) and op.arms:
                stack.append(iter([o for arm in op.arms for o in arm]) if len(op.arms) > 1 else iter(op.arms[0]))
                break
        else:
            stack.pop()


def all_ops(fn) -> list:
    """``list(all_ops(fn))`` of a function, computed once (its body does not change after
    binding; rules and analyses ask for it many times)."""
    ops = fn.__dict__.get("_all_ops")
    if ops is None:
        ops = fn._all_ops = list(walk(fn.body))
    return ops


def calls(block: Block, into_loops: bool = True) -> Iterator[CallOp]:
    for op in walk(block, into_loops):
        if isinstance(op, CallOp):
            yield op


def events(block: Block, into_loops: bool = True) -> Iterator[CallOp]:
    for op in walk(block, into_loops):
        if isinstance(op, CallOp) and op.kind is not None:
            yield op


UnionOp = Union[CallOp, AssignOp, ReturnOp, DefOp, LoopOp, BranchOp, JumpOp]

"""How many times a loop runs, when the code says so with literals.

An evaluation loop over a whole loader builds one autograd graph per batch; a loop that
predicts 12 test images for a plot, generates 200 characters of a sample or decodes the
9 tokens of a demo builds a handful of small graphs and frees each at the next step.  The
difference is in the code: ``range(12)``, ``for _ in range(max_len)`` after
``max_len = 100``, ``def sample(model, size=200)`` whose every call passes a literal,
``xs[:8]``, a literal list, ``if i == 3: break`` at the top of an ``enumerate`` loop.

``loop_iterations(mm, fn, loop)`` is an upper bound on a loop's iterations from such
evidence only, or ``None``: a ``while`` loop, an iterable of unknown size (a loader, a
dataset, ``args.words``), a name bound more than once or through an attribute.
``int_values``/``const_values`` give the literal values an expression can take: literals,
arithmetic on them, ``len()`` of a literal string or list, a name assigned only literals in
its scope (the function, the functions around it, the module's top level), a parameter
from its default and the arguments of every call site of this module (a function another
module calls is unknown).
"""
from __future__ import annotations

import itertools
from typing import Optional

import libcst as cst

from .binder import dotted
from .ir import FORWARD, AssignOp, BranchOp, CallOp, JumpOp, LoopOp, all_ops

# The most iterations a loop may run and still be "a few samples to look at": a couple of
# hundred characters of generated text, a grid of images; never a dataset (a 1,000-image scan
# or a 10,000-sample confusion matrix is one graph per item for nothing).
SMALL_LOOP = 500

_DEPTH = 6
_MAX_VALUES = 16
_PASS_ITER = {"enumerate", "reversed", "sorted", "list", "tuple", "iter", "tqdm", "tqdm.tqdm",
              "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "trange"}
_GROWS = {"append", "extend", "insert", "update", "add", "__setitem__"}


def const_values(mm, fn, expr, depth: int = 0) -> Optional[frozenset]:
    """The ``int``/``str`` values ``expr`` may take in ``fn``, from literals only, or ``None``."""
    if depth > _DEPTH or expr is None:
        return None
    if isinstance(expr, cst.Integer):
        return frozenset((int(expr.evaluated_value),))
    if isinstance(expr, cst.SimpleString):
        v = expr.evaluated_value
        return frozenset((v,)) if isinstance(v, str) else None
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        v = const_values(mm, fn, expr.expression, depth + 1)
        return frozenset(-x for x in v) if v and all(isinstance(x, int) for x in v) else None
    if isinstance(expr, cst.BinaryOperation):
        a = const_values(mm, fn, expr.left, depth + 1)
        b = const_values(mm, fn, expr.right, depth + 1) if a else None
        if not a or not b or len(a) * len(b) > _MAX_VALUES:
            return None
        out = set()
        for x, y in itertools.product(a, b):
            r = _arith(expr.operator, x, y)
            if r is None:
                return None
            out.add(r)
        return frozenset(out)
    if isinstance(expr, cst.Call) and dotted(expr.func) == "len" and len(expr.args) == 1 \
            and not expr.args[0].star and expr.args[0].keyword is None:
        n = iter_length(mm, fn, expr.args[0].value, depth + 1)
        return frozenset((n,)) if n is not None else None
    if isinstance(expr, cst.Name):
        return _name_values(mm, fn, expr.value, depth)
    return None


def _arith(op, x, y):
    if type(x) is not type(y):
        return None
    if isinstance(op, cst.Add):
        return x + y
    if isinstance(x, int) and isinstance(op, cst.Subtract):
        return x - y
    if isinstance(x, int) and isinstance(op, cst.Multiply) and abs(x * y) < 10 ** 9:
        return x * y
    if isinstance(x, int) and isinstance(op, cst.FloorDivide) and y:
        return x // y
    return None


def int_values(mm, fn, expr, depth: int = 0) -> Optional[frozenset]:
    v = const_values(mm, fn, expr, depth)
    return v if v and all(isinstance(x, int) for x in v) else None


def _assigns(scope, name: str) -> Optional[list]:
    """The values assigned to ``name`` in ``scope`` (plain ``name = value`` only), or ``None``
    when ``scope`` binds it some other way (an aug-assignment, an unpacking, a loop target)
    or grows it in place (``name.append(...)``)."""
    out = []
    for op in all_ops(scope):
        if isinstance(op, AssignOp):
            for t in op.targets:
                if isinstance(t, cst.Name) and t.value == name:
                    if op.aug is not None:
                        return None
                    if op.value is not None:
                        out.append(op.value)
                elif _binds(t, name):
                    return None
        elif isinstance(op, LoopOp) and op.target is not None and _binds(op.target, name):
            return None
        elif isinstance(op, CallOp) and op.recv == name and op.attr in _GROWS:
            return None
    return out


def _binds(target, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_binds(e.value, name) for e in target.elements)
    if isinstance(target, cst.StarredElement):
        return _binds(target.value, name)
    return False


def _binding(mm, fn, name: str) -> Optional[tuple]:
    """``("param", fn)`` or ``("values", [exprs], scope)`` for what ``name`` is in ``fn``."""
    f = fn
    while f is not None:
        if name in f.params:
            return ("param", f)
        got = _assigns(f, name)
        if got is None:
            return None
        if got:
            return ("values", got, f)
        f = f.parent if f.parent is not None else (mm.module_function if not f.is_module_level else None)
    return None


def _name_values(mm, fn, name: str, depth: int) -> Optional[frozenset]:
    b = _binding(mm, fn, name)
    if b is None:
        return None
    if b[0] == "values":
        out: set = set()
        for v in b[1]:
            got = const_values(mm, b[2], v, depth + 1)
            if got is None:
                return None
            out |= got
        return frozenset(out) if len(out) <= _MAX_VALUES else None
    return _param_values(mm, b[1], name, depth)


def _param_values(mm, fn, name: str, depth: int) -> Optional[frozenset]:
    """A parameter's values: its default where a call leaves it, and what every call site of
    this module passes; unknown when another module calls the function."""
    from .callsites import _bound, _local_sites

    if name.startswith("*"):
        return None
    if not fn.is_module_level and fn.parent is None and mm.module_name:
        if mm.project.is_called(f"{mm.module_name}.{fn.qualname}"):
            return None
    params = [p for p in fn.params if not p.startswith("*")]
    idx = params.index(name) - (1 if _bound(fn) else 0)
    default = fn.defaults.get(name)
    scope = fn.parent or mm.module_function
    sites = _local_sites(mm).get(id(fn), ())
    exprs = []
    for caller, args in sites:
        passed = None
        i = 0
        for a in args:
            if a.star:
                return None
            if a.keyword is not None:
                if a.keyword.value == name:
                    passed = a.value
            else:
                if i == idx:
                    passed = a.value
                i += 1
        if passed is not None:
            exprs.append((caller, passed))
        elif default is not None:
            exprs.append((scope, default))
        else:
            return None
    if not sites:
        if default is None:
            return None
        exprs.append((scope, default))
    out: set = set()
    for where, e in exprs:
        got = const_values(mm, where, e, depth + 1)
        if got is None:
            return None
        out |= got
    return frozenset(out) if len(out) <= _MAX_VALUES else None


def iter_length(mm, fn, expr, depth: int = 0) -> Optional[int]:
    """An upper bound on the number of items ``expr`` yields, from literals only, or ``None``."""
    if depth > _DEPTH or expr is None:
        return None
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        if any(isinstance(e, cst.StarredElement) for e in expr.elements):
            return None
        return len(expr.elements)
    if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
        n, comp = 1, expr.for_in
        while comp is not None:
            k = iter_length(mm, fn, comp.iter, depth + 1)
            if k is None:
                return None
            n, comp = n * k, comp.inner_for_in
        return n
    if isinstance(expr, cst.SimpleString):
        v = expr.evaluated_value
        return len(v) if isinstance(v, str) else None
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Slice):
        s = expr.slice[0].slice
        if s.step is not None:
            return None
        lo = int_values(mm, fn, s.lower, depth + 1) if s.lower is not None else frozenset((0,))
        hi = int_values(mm, fn, s.upper, depth + 1) if s.upper is not None else None
        if not lo or not hi or min(lo) < 0 or min(hi) < 0:
            return None  # ``xs[-5:]``, ``xs[k:]``: as long as ``xs``
        return max(0, max(hi) - min(lo))
    if isinstance(expr, cst.Call):
        name = dotted(expr.func) or ""
        pos = [a.value for a in expr.args if a.keyword is None and not a.star]
        if any(a.star for a in expr.args):
            return None
        if name == "range" and 1 <= len(pos) <= 3 and len(pos) == len(expr.args):
            vals = [int_values(mm, fn, p, depth + 1) for p in pos]
            if any(v is None for v in vals) or _count(vals) > _MAX_VALUES:
                return None
            return max(len(range(*c)) for c in itertools.product(*vals))
        if name in _PASS_ITER and pos:
            return iter_length(mm, fn, pos[0], depth + 1)
        if name == "zip" and pos:
            known = [n for n in (iter_length(mm, fn, p, depth + 1) for p in pos) if n is not None]
            return min(known) if known else None
        return None
    if isinstance(expr, cst.Name):
        b = _binding(mm, fn, expr.value)
        if b is None:
            return None
        if b[0] == "values":
            ns = [iter_length(mm, b[2], v, depth + 1) for v in b[1]]
            return max(ns) if ns and None not in ns else None
        vals = _param_values(mm, b[1], expr.value, depth)
        if vals and all(isinstance(v, str) for v in vals):
            return max(len(v) for v in vals)
    return None


def _count(vals) -> int:
    n = 1
    for v in vals:
        n *= len(v)
    return n


def loop_iterations(mm, fn, loop: LoopOp) -> Optional[int]:
    """An upper bound on how many times ``loop`` runs its body, from literal evidence only
    (see the module's docstring), or ``None``."""
    if loop.is_while:
        return None
    n = iter_length(mm, fn, loop.iter)
    cut = _break_at_index(mm, fn, loop)
    if cut is not None:
        n = cut if n is None else min(n, cut)
    return n


def _break_at_index(mm, fn, loop: LoopOp) -> Optional[int]:
    """``for i, batch in enumerate(loader): if i == 3: break`` (the test first in the body):
    at most 4 iterations."""
    it = loop.iter
    if not (isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and len(it.args) == 1):
        return None
    t = loop.target
    if not (isinstance(t, cst.Tuple) and t.elements and isinstance(t.elements[0].value, cst.Name)):
        return None
    idx = t.elements[0].value.value
    first = loop.body[0] if loop.body else None
    if not (isinstance(first, BranchOp) and isinstance(first.test, cst.Comparison) and first.arms
            and len(first.arms[0]) == 1 and isinstance(first.arms[0][0], JumpOp)
            and first.arms[0][0].jump == "break" and len(first.test.comparisons) == 1):
        return None
    test = first.test
    if not (isinstance(test.left, cst.Name) and test.left.value == idx):
        return None
    op = test.comparisons[0].operator
    k = int_values(mm, fn, test.comparisons[0].comparator)
    if not k or min(k) < 0:
        return None
    if isinstance(op, (cst.Equal, cst.GreaterThanEqual)):
        return max(k) + 1
    if isinstance(op, cst.GreaterThan):
        return max(k) + 2
    return None


def runs_few_times(mm, fn, loop: LoopOp, ops) -> bool:
    """Every op of ``ops`` (inside ``loop``) runs at most :data:`SMALL_LOOP` times per run of
    ``loop``: it sits in ``loop`` itself (not in a loop nested in it: 12 series times 6 slices
    of each is a grid over the data), ``loop`` has a literal bound, and ``loop`` does not walk
    the models it runs (``for net in nets: net(test_x)`` scores each net on a whole test set:
    the count of nets says nothing about the data), and what each op is fed is small by
    evidence (:func:`inputs_small`): the cost of the graphs is the runs times the input."""
    from .queries import names_in

    if not ops or any(o.loop is not loop for o in ops):
        return False
    n = loop_iterations(mm, fn, loop)
    if n is None or n > SMALL_LOOP:
        return False
    walked = names_in(loop.target) if loop.target is not None else set()
    for o in ops:
        t = getattr(o, "target", None) if isinstance(o, CallOp) and o.kind == FORWARD else None
        if t and t.split(".", 1)[0] in walked:
            return False
    return inputs_small(mm, fn, loop, ops)


def chained_outputs(loop: LoopOp) -> set:
    """Names a loop feeds back into its own forwards (``x = model(x)``, ``out, h = rnn(x, h)``):
    each iteration's graph is chained to the next, so the last value holds the graph of them all."""
    from .ir import walk
    from .queries import names_in

    fwd = {id(o.node) for o in walk(loop.body) if isinstance(o, CallOp) and o.kind == FORWARD}
    out: set = set()
    for o in walk(loop.body):
        if isinstance(o, AssignOp) and o.aug is None and id(o.value) in fwd:
            used = set().union(*(names_in(a.value) for a in o.value.args)) if o.value.args else set()
            for t in o.targets:
                out |= {n for n in names_in(t) if n in used}
    return out


def rollout_handed_to_backward(mm, fn, loop: LoopOp) -> bool:
    """A method that rolls a model forward a number of times (``for _ in range(n): x =
    model(x)``) and then stores the result on an object (``learn.preds = x``), in a class
    another method of which runs ``backward()``: the chained graph is the training forward a
    sibling method differentiates (a fastai callback's ``predict``/``backward``), not an
    evaluation pass."""
    from .ir import BACKWARD, walk

    if fn.cls is None:
        return False
    chained = chained_outputs(loop)
    if not chained:
        return False
    end = mm.span_of(loop.node)[2]
    stored = any(isinstance(o, AssignOp) and o.aug is None and isinstance(o.value, cst.Name)
                 and o.value.value in chained and any(isinstance(t, cst.Attribute) for t in o.targets)
                 and mm.span_of(o.node)[0] > end for o in all_ops(fn))
    if not stored:
        return False
    return any(isinstance(o, CallOp) and o.kind == BACKWARD
               for m in fn.cls.methods.values() if m is not fn for o in walk(m.body))


# methods that give a view or a copy of the tensor they are called on, the same size or smaller
_SAME_SIZE = frozenset({
    "unsqueeze", "squeeze", "view", "reshape", "to", "cuda", "cpu", "float", "long", "int", "half", "double",
    "bool", "detach", "clone", "permute", "transpose", "flip", "contiguous", "type", "type_as", "fill_",
    "flatten", "numpy", "tolist", "item", "argmax", "max", "topk", "exp", "softmax", "log_softmax",
    "sigmoid", "t", "data", "expand_dims", "astype", "copy", "__getitem__", "split", "lower", "strip",
    "multinomial", "squeeze_", "unsqueeze_", "requires_grad_", "rot90", "roll",
})
# calls that give one item of what they are given: a random pick, the next batch of a loader
_SCALAR_BUILTINS = frozenset({"len", "int", "float", "bool", "round", "abs", "ord", "chr", "str"})
_ONE_ITEM = frozenset({"random.choice", "next", "np.random.choice", "numpy.random.choice"})


def inputs_small(mm, fn, loop: LoopOp, ops) -> bool:
    """Every op of ``ops`` (forwards, or calls of helpers that run them) is given small inputs
    by evidence: literals and tensors built from literals (``torch.LongTensor([[1, 2, 3]])``,
    ``torch.zeros(1, 1)``), an item of what a loop walks or an index into something
    (``test_set[i]``, ``x[None]``, ``prime_input[p]``), a slice of literal length
    (``images[:8]``), ``random.choice(pairs)``, ``next(iter(loader))``, what a model returns
    for such inputs (``out = model.decode(memory, ys)``, ``x = model(x)``), and views of those
    (``img.unsqueeze(0).to(device)``). A whole tensor of data bound outside the loop
    (``model(test_x)``), a graph object or its attributes (``model(data.x, data.edge_index)``)
    or a parameter whose callers pass nothing of the kind is not: a few runs of a forward over
    a whole dataset are as costly as an evaluation pass."""
    memo: dict = {}
    for o in ops:
        if not isinstance(o, CallOp):
            return False
        for a in o.args:
            if a.star:
                return False
            if _is_model(mm, fn, a.value):
                continue  # the model a helper is given
            if not _small(mm, fn, loop, a.value, memo, 0):
                return False
    return True


def _is_model(mm, fn, expr) -> bool:
    from . import catalog

    d = dotted(expr)
    if not d or "(" in d:
        return False
    try:
        return mm.resolver.of_path(fn, d)[0] == catalog.MODEL
    except Exception:
        return False


_SMALL_DEPTH = 16
_LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


def _small(mm, fn, loop, expr, memo, depth) -> bool:
    if depth > _SMALL_DEPTH or expr is None:
        return False
    if isinstance(expr, _LITERALS):
        return True
    if isinstance(expr, cst.Name):
        if expr.value in ("None", "True", "False"):
            return True
        return _small_name(mm, fn, loop, expr.value, memo, depth)
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return all(_small(mm, fn, loop, e.value, memo, depth) for e in expr.elements)
    if isinstance(expr, cst.UnaryOperation):
        return _small(mm, fn, loop, expr.expression, memo, depth + 1)
    if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
        return _small(mm, fn, loop, expr.for_in.iter, memo, depth + 1)  # one item per item of something small
    if isinstance(expr, cst.BinaryOperation):
        return _small(mm, fn, loop, expr.left, memo, depth + 1) and _small(mm, fn, loop, expr.right, memo, depth + 1)
    if isinstance(expr, cst.Subscript):
        first = expr.slice[0].slice if expr.slice else None
        if isinstance(first, cst.Index):
            # an item (a sample of a dataset, a row, a token) when the index is small itself: a
            # literal, the loop's variable; not a mask or an index tensor bound outside the loop
            # (``feats[data.test_mask]`` selects a whole split)
            return _small(mm, fn, loop, first.value, memo, depth + 1)
        if isinstance(first, cst.Slice):
            if _literal_length(first):
                return True  # ``images[:8]``, ``x[i:i + 1]``
            return _small(mm, fn, loop, expr.value, memo, depth + 1)  # ``out[:, -1]``: a part of it
        return False
    if isinstance(expr, cst.Attribute):
        # ``batch.x`` of the batch or sample this iteration takes; not the attributes of an object
        # the loop runs on every time (``data.x`` of a graph loaded before it: the whole graph)
        if _imported_name(mm, fn, expr.value):
            return True  # ``torch.long``, ``np.float32``: a constant of a library
        if _is_model(mm, fn, expr.value):
            return True  # ``decoder.hidden_size``: a setting of the model
        if expr.attr.value in _TENSOR_VIEWS:
            return _small(mm, fn, loop, expr.value, memo, depth + 1)
        base = expr.value
        while isinstance(base, cst.Attribute):
            base = base.value
        return isinstance(base, cst.Name) and _bound_in_loop(fn, loop, base.value) \
            and _small(mm, fn, loop, expr.value, memo, depth + 1)
    if isinstance(expr, cst.Call):
        d = dotted(expr.func) or ""
        q = mm.qualify(d) if d else ""
        if q in _ONE_ITEM or d in _ONE_ITEM or d in _SCALAR_BUILTINS:
            return True
        args = [a.value for a in expr.args if not a.star]
        if any(a.star for a in expr.args):
            return False
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SAME_SIZE \
                and not _imported_name(mm, fn, expr.func.value):
            return _small(mm, fn, loop, expr.func.value, memo, depth + 1)
        if isinstance(expr.func, cst.Attribute) and not _is_model(mm, fn, expr.func.value) \
                and not _imported_name(mm, fn, expr.func.value) \
                and not _small(mm, fn, loop, expr.func.value, memo, depth + 1):
            return False  # a method of a big object (``dataset.get_all()``)
        data = [a for a in args if not _is_model(mm, fn, a)]
        if isinstance(expr.func, cst.Name) and not _imported_name(mm, fn, expr.func) \
                and not _is_model(mm, fn, expr.func) and data:
            # a function of the code given a small value and the tables it needs
            # (``variable_from_sentence(input_lang, sentence)``)
            return any(_small(mm, fn, loop, a, memo, depth + 1) for a in data)
        return all(_small(mm, fn, loop, a, memo, depth + 1) for a in data)
    return False


def _imported_name(mm, fn, expr) -> bool:
    """``torch``/``np``/``F`` of ``np.roll(...)``: a module (or a name of one) the code imports,
    not a value it binds."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    if not isinstance(expr, cst.Name):
        return False
    if mm.qualify(expr.value):
        return True
    f = fn  # a name nothing binds here (a star import's ``np``)
    while f is not None:
        if expr.value in f.params or any(_binds_op(op, expr.value) for op in all_ops(f)):
            return False
        f = f.parent if f.parent is not None else (mm.module_function if not f.is_module_level else None)
    return expr.value not in mm.classes and expr.value not in mm.functions


def _literal_length(sl) -> bool:
    """``[:8]``, ``[2:5]``, ``[i:i + 1]``: a slice whose length the code gives."""
    lo, hi = sl.lower, sl.upper
    if hi is None:
        return False
    if isinstance(hi, cst.Integer) or (isinstance(hi, cst.UnaryOperation) and isinstance(hi.expression, cst.Integer)):
        return lo is None or isinstance(lo, (cst.Integer, cst.UnaryOperation))
    if isinstance(hi, cst.BinaryOperation) and lo is not None:
        return dotted(hi.left) == dotted(lo) and isinstance(hi.right, cst.Integer)
    return False


_TENSOR_VIEWS = frozenset({"data", "T", "mT", "real"})


def _bound_in_loop(fn, loop, name: str) -> bool:
    """``name`` is bound by ``loop`` (its target, or a loop nested in it) or in its body."""
    if loop is None:
        return False
    for op in all_ops(fn):
        if _binds_op(op, name) and (op is loop or _in_loop(op, loop)):
            return True
    return False


def _small_name(mm, fn, loop, name, memo, depth) -> bool:
    key = (id(fn), name)
    if key in memo:
        return memo[key] is not False  # in progress (``x = model(x)``): the other bindings decide
    memo[key] = None
    got = memo[key] = _small_name_(mm, fn, loop, name, memo, depth)
    return got


def _small_name_(mm, fn, loop, name, memo, depth) -> bool:
    from .callsites import _bound, _local_sites

    f = fn
    while f is not None:
        if name in f.params and not any(_binds_op(op, name) for op in all_ops(f)):
            return _small_param(mm, f, name, memo, depth)
        ops = [op for op in all_ops(f) if _binds_op(op, name)]
        if ops:
            if f.is_module_level and loop is not None and f is fn:
                # top-level code (a notebook): the last binding above the loop and those in it
                line = mm.line_of(loop.node)
                inside = [op for op in ops if _in_loop(op, loop)]
                above = [op for op in ops if not _in_loop(op, loop) and mm.line_of(op.node) < line]
                ops = inside + above[-1:]
                if not ops:
                    return False
            for op in ops:
                if isinstance(op, LoopOp):
                    continue  # an item of what the loop walks
                if isinstance(op, AssignOp) and not _small(mm, f, loop if f is fn else None, op.value, memo, depth + 1):
                    return False
            return True
        f = f.parent if f.parent is not None else (mm.module_function if not f.is_module_level else None)
    return False


def _in_loop(op, loop) -> bool:
    lp = op if isinstance(op, LoopOp) else op.loop
    while lp is not None:
        if lp is loop:
            return True
        lp = lp.parent
    return False


def _binds_op(op, name) -> bool:
    if isinstance(op, AssignOp):
        return any(_binds(t, name) for t in op.targets)
    return isinstance(op, LoopOp) and op.target is not None and _binds(op.target, name)


def _small_param(mm, fn, name, memo, depth) -> bool:
    """A parameter is small when its default and what every call site of this module passes
    are (unknown when another module calls the function)."""
    from .callsites import _bound, _local_sites

    if not fn.is_module_level and fn.parent is None and mm.module_name \
            and mm.project.is_called(f"{mm.module_name}.{fn.qualname}"):
        return False
    params = [p for p in fn.params if not p.startswith("*")]
    if name not in params:
        return False
    idx = params.index(name) - (1 if _bound(fn) else 0)
    default = fn.defaults.get(name)
    scope = fn.parent or mm.module_function
    sites = _local_sites(mm).get(id(fn), ())
    if not sites:
        return default is not None and _small(mm, scope, None, default, memo, depth + 1)
    for caller, args in sites:
        passed, i = None, 0
        for a in args:
            if a.star:
                return False
            if a.keyword is not None:
                if a.keyword.value == name:
                    passed = a.value
            else:
                if i == idx:
                    passed = a.value
                i += 1
        v, where = (passed, caller) if passed is not None else (default, scope)
        if v is None or not _small(mm, where, None, v, memo, depth + 1):
            return False
    return True

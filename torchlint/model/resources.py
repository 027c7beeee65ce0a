"""Where models, loaders and tensors come from, and where values are kept.

The questions of the memory, device, data and debug rules, answered once per module from
the ops and dataflow facts (rules never walk the tree):

* **definitions** of a path (``model``, ``self.loader``, a parameter): its assignments in the
  function, its enclosing functions, its class and the module, and, for a parameter, the
  arguments its callers in this module pass;
* **device placement**: was a model moved to an accelerator (``model.to(device)``,
  ``model = Net().cuda()``, in a caller that passes the moved model), do a loader's batches
  arrive on the device already (``accelerator.prepare``, a ``collate_fn`` or dataset that
  moves them), is a device the CPU;
* **loaders**: each ``DataLoader(...)`` construction with its shuffle/sampler facts, the
  loops that iterate it (through variables, attributes, parameters of helpers) and whether
  they train;
* **accumulation**: values kept across loop iterations (``total += loss``,
  ``losses.append(out)``, ``history[k] = v``), the loops they live across and whether a
  backward consumes them;
* **forward-created tensors**: in ``nn.Module.forward``, tensors created without ``device=``
  that meet the inputs;
* **flattened argmax**: ``out.argmax()`` with no ``dim`` on batched model outputs compared
  with labels.
"""
from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from . import catalog
from .binder import FunctionModel, _child_fields, dotted
from .ir import (
    AUTOGRAD_GRAD, BACKWARD, CALL, FORWARD, GRAD_OFF, LOSS, MOVE, STEP, AssignOp, BranchOp, CallOp,
    LoopOp,
    ReturnOp, all_ops, walk,
)

ITER_WRAPPERS = ("enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "iter", "trange",
                 "tqdm.notebook.tqdm", "progress_bar", "track")
PREPARE_METHODS = ("prepare", "prepare_data_loader", "setup_dataloaders", "setup_dataloader")
DP_WRAPPERS = catalog.DATA_PARALLEL
ANOMALY_SET = {"torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly",
               "torch.set_anomaly_enabled", "torch.autograd.grad_mode.set_detect_anomaly"}
ANOMALY_CTX = {"torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly"}
ITERABLE_DATASET_BASES = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset",
                          "IterableDataset", "data.IterableDataset", "torch.utils.data.IterDataPipe",
                          "IterDataPipe",
                          # MONAI's iterable-style datasets (ShuffleBuffer shuffles what it streams)
                          "monai.data.IterableDataset", "monai.data.ShuffleBuffer", "monai.data.GridPatchDataset",
                          "monai.data.CSVIterableDataset", "monai.data.iterable_dataset.ShuffleBuffer",
                          "monai.data.grid_dataset.GridPatchDataset"}
_DTYPES = {"float", "float16", "float32", "float64", "half", "double", "bfloat16", "int", "int8",
           "int16", "int32", "int64", "long", "uint8", "bool", "complex64", "complex128", "short"}
_TRAIN_NAME = ("train", "trn")
_BUILTIN_NAMES = {"len", "int", "float", "range", "min", "max", "abs", "list", "tuple", "dict", "str",
                  "bool", "isinstance", "print", "round", "sum", "True", "False", "None"}
_EVAL_WORDS = ("val", "valid", "test", "eval", "dev", "holdout", "calib", "query", "gallery",
               "infer", "predict", "memory", "knn", "probe")


# ============================================================== expression helpers
def strip_iter_wrappers(expr):
    """``enumerate(tqdm(loader))`` -> ``loader``."""
    while isinstance(expr, cst.Call) and dotted(expr.func) in ITER_WRAPPERS and expr.args:
        expr = expr.args[0].value
    return expr


def loop_iterable(mm, fn, expr):
    """What a loop of ``fn`` iterates, wrappers stripped (see ``strip_iter_wrappers``), also
    through a local name bound to a wrapped one (``pbar = tqdm(enumerate(loader), total=n)``,
    ``for i, (x, y) in pbar:``) -> ``loader``."""
    expr = strip_iter_wrappers(expr)
    if isinstance(expr, cst.Name):
        d = mm.resolver.definition(fn, expr.value)
        if d is not None and d[0] is fn and isinstance(d[1], cst.Call) and dotted(d[1].func) in ITER_WRAPPERS:
            return strip_iter_wrappers(d[1])
    return expr


def _store(op, fn) -> "Optional[Accumulation]":
    """``c += v`` (``-=``, ``*=``, ``/=``) or ``c.append(v)`` (``extend``, ``insert``,
    ``appendleft``): the value ``op`` stores into the container ``c``, if it is one of those."""
    if isinstance(op, AssignOp) and op.value is not None and op.aug in (
            "AddAssign", "SubtractAssign", "MultiplyAssign", "DivideAssign"):
        c = base_path(op.targets[0])
        return Accumulation(op, fn, c, op.value, op.value_facts, "aug", ()) if c else None
    if isinstance(op, CallOp) and op.attr in ("append", "extend", "insert", "appendleft") \
            and op.recv_node is not None and op.args:
        c = base_path(op.recv_node)
        i = len(op.args) - 1
        facts = op.arg_facts[i] if i < len(op.arg_facts) else frozenset()
        return Accumulation(op, fn, c, op.args[i].value, facts, op.attr, ()) if c else None
    return None


_DETACHING_METHODS = frozenset({"item", "detach", "tolist", "numpy", "detach_"})
_NUMBER_FUNCS = frozenset({"float", "int", "round", "len", "bool", "str", "math.fsum"})


def _carries(expr, name: str) -> bool:
    """The value of ``expr`` may be (or be computed from) the tensor bound to ``name`` with its
    graph: ``name`` occurs in it outside ``.item()``/``.detach()``/``.data``/``float(...)``."""
    if isinstance(expr, cst.Name):
        return expr.value == name
    if isinstance(expr, cst.Attribute):
        return expr.attr.value != "data" and _carries(expr.value, name)
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in _DETACHING_METHODS:
            return False
        if dotted(func) in _NUMBER_FUNCS:
            return False
        inner = _carries(func.value, name) if isinstance(func, cst.Attribute) else False
        return inner or any(_carries(a.value, name) for a in expr.args)
    if isinstance(expr, (cst.Lambda, cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp)):
        return False
    return any(_carries(c, name) for c in children(expr))


def _params_kept_on_self(m) -> frozenset:
    """The parameters of method ``m`` that it adds into an attribute of its own object
    (``self.sum += val * n``, ``self.total = self.total + val``, ``self.values.append(val)``),
    never rebinding them first: the object keeps them across calls."""
    cached = m.__dict__.get("_kept_on_self")
    if cached is not None:
        return cached
    params = [p for p in m.params if p not in ("self", "cls") and not p.startswith("*")]
    ops = all_ops(m)
    rebound = {dotted(t) for o in ops if isinstance(o, AssignOp) for t in o.targets}
    out = set()
    for o in ops:
        acc = _store(o, m)
        if acc is None and isinstance(o, AssignOp) and o.aug is None and o.value is not None \
                and len(o.targets) == 1 and isinstance(o.value, cst.BinaryOperation) \
                and type(o.value.operator).__name__ in ("Add", "Subtract") \
                and dotted(o.targets[0]) in (dotted(o.value.left), dotted(o.value.right)):
            acc = Accumulation(o, m, dotted(o.targets[0]), o.value, frozenset(), "selfadd", ())
        if acc is None or acc.how not in ("aug", "selfadd", "append", "extend") \
                or not (acc.container or "").startswith("self."):
            continue
        out.update(p for p in params if p not in rebound and _carries(acc.value, p))
    m._kept_on_self = frozenset(out)
    return m._kept_on_self


def last_item_backward(fn, acc) -> Optional[CallOp]:
    """``losses[-1].backward()`` in the loop iteration that appended to ``losses``: the backward
    of the item just stored, which consumes none of the items kept from earlier iterations."""
    if acc.how != "append" or acc.op.loop is None:
        return None
    for o in walk(acc.op.loop.body):
        if isinstance(o, CallOp) and o.kind == BACKWARD and o.attr == "backward" \
                and isinstance(o.recv_node, cst.Subscript) and dotted(o.recv_node.value) == acc.container \
                and len(o.recv_node.slice) == 1 and isinstance(o.recv_node.slice[0].slice, cst.Index) \
                and isinstance(o.recv_node.slice[0].slice.value, cst.UnaryOperation) \
                and isinstance(o.recv_node.slice[0].slice.value.expression, cst.Integer) \
                and o.recv_node.slice[0].slice.value.expression.value == "1":
            return o
    return None


def _constant_key(target: cst.Subscript) -> bool:
    """``d["loss"] = v`` / ``row[0] = v``: every index of the subscript is a literal, so each
    iteration replaces the same entry."""
    if not target.slice:
        return False
    for el in target.slice:
        sl = el.slice
        if not isinstance(sl, cst.Index) or not isinstance(
                sl.value, (cst.SimpleString, cst.Integer, cst.Float, cst.ConcatenatedString)):
            return False
    return True


def base_path(expr) -> Optional[str]:
    """``hist["loss"][0]`` -> ``hist``; ``self.losses`` -> ``self.losses``."""
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return dotted(expr)
    return None


def children(n) -> list:
    """The child nodes that can hold code (no whitespace, commas, brackets), cheaply:
    libcst's ``.children`` rebuilds the node through a visitor."""
    out = []
    for name in _child_fields(type(n)):
        v = getattr(n, name, None)
        if isinstance(v, cst.CSTNode):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out.extend(x for x in v if isinstance(x, cst.CSTNode))
    return out


def subnodes(node) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), not entering lambdas or nested defs."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (cst.Lambda, cst.FunctionDef, cst.ClassDef)) and n is not node:
            continue
        stack.extend(reversed(children(n)))


def in_test_tree(mm) -> bool:
    """The module is test code by its place in the tree (``tests/``, ``test_*.py``,
    ``conftest.py``: ``torchlint.selection.is_test_path``), a test helper module included."""
    from ..selection import is_test_path

    return is_test_path(getattr(mm, "path", "") or "", getattr(mm, "root", "") or "")


def _read_names(node) -> set:
    """The maximal dotted names (``self.data``, ``torch.randn``, ``index``) read under ``node``:
    not an attribute's own name, nor a keyword argument's."""
    out = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.Name, cst.Attribute)):
            d = dotted(n)
            if d:
                out.add(d)
                continue
        if isinstance(n, cst.Attribute):
            stack.append(n.value)
            continue
        if isinstance(n, cst.Arg):
            stack.append(n.value)
            continue
        if isinstance(n, (cst.Lambda, cst.FunctionDef, cst.ClassDef)) and n is not node:
            continue
        stack.extend(children(n))
    return out


def names_in(expr) -> set:
    """Dotted names (maximal ``a.b.c`` chains and their bare roots) read in ``expr``."""
    out = set()
    if expr is None:
        return out
    for n in subnodes(expr):
        if isinstance(n, (cst.Name, cst.Attribute)):
            d = dotted(n)
            if d:
                out.add(d)
    return out


def contains(expr, node) -> bool:
    return any(n is node for n in subnodes(expr))


def conditional_in_statement(op) -> bool:
    """The call only runs under a condition inside its own statement: a branch of
    ``a if cond else b``, or the right side of ``cond and f()`` / ``cond or f()``."""
    stmt = op.stmt
    if stmt is None:
        return False
    for n in subnodes(stmt):
        if isinstance(n, cst.IfExp) and (contains(n.body, op.node) or contains(n.orelse, op.node)):
            return True
        if isinstance(n, cst.BooleanOperation) and contains(n.right, op.node):
            return True
    return False


def _is_true(e) -> bool:
    return isinstance(e, cst.Name) and e.value == "True"


def _is_false_or_none(e) -> bool:
    return isinstance(e, cst.Name) and e.value in ("False", "None")


def _string_value(e) -> Optional[str]:
    if isinstance(e, cst.SimpleString):
        try:
            return str(e.evaluated_value)
        except Exception:  # pragma: no cover - defensive
            return None
    return None


def _wraps_same_loader(value, path: str) -> bool:
    """``value`` rebinds the loader ``path`` to itself, wrapped for distributed or mixed
    precision training (``model, opt, train_dl = accelerator.prepare(model, opt, train_dl)``,
    ``fabric.setup_dataloaders(train_dl)``): the batches are still the loader's."""
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
        and value.func.attr.value in PREPARE_METHODS and any(dotted(a.value) == path for a in value.args)


def _train_loader_argument(op, path: str) -> bool:
    """``op`` hands the loader ``path`` to a trainer as the data it trains on: the train loader
    of a ``fit`` (``trainer.fit(model, loader)``, ``trainer.fit(model, train_dataloaders=loader)``)
    or a keyword argument that names the training data of a trainer
    (``SupervisedTrainer(train_data_loader=loader)``, ``BERTTrainer(train_dataloader=loader)``)."""
    positional = [a for a in op.args if a.keyword is None and not a.star]
    for a in op.args:
        if dotted(a.value) != path:
            continue
        if a.keyword is not None:
            kw = a.keyword.value
            ws = words(kw)
            if is_train_name(kw) and any(w.startswith(("loader", "dataloader", "dl", "data", "iter"))
                                         or w.endswith("loader") for w in ws):
                return True
        elif op.attr == "fit" and positional.index(a) == 1:
            return True
    return False


def root_name(path: Optional[str]) -> Optional[str]:
    return path.split(".", 1)[0] if path else None


def words(name: str) -> list:
    """``train_loader`` -> [train, loader]; ``dataloaderTrain`` -> [dataloader, train]."""
    import re

    parts = re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", name)
    return [p.lower() for p in parts if p]


def is_train_name(name: str) -> bool:
    ws = words(name.rsplit(".", 1)[-1])
    if any(w in _EVAL_WORDS or w.startswith(("val", "test", "eval")) for w in ws):
        return False
    return any(w.startswith(_TRAIN_NAME) and not w.startswith("trans") for w in ws) or \
        name.rsplit(".", 1)[-1].lower().startswith(("train", "trainloader", "trn"))


def is_eval_name_word(name: str) -> bool:
    ws = words(name.rsplit(".", 1)[-1])
    return any(w in _EVAL_WORDS or w.startswith(("val", "test", "eval")) for w in ws)



def param_for(params, op, a) -> Optional[str]:
    """The parameter of a callee with ``params`` that the argument ``a`` of the call ``op``
    binds (a method called through an attribute skips its ``self``/``cls``), or ``None``."""
    if a.keyword is not None:
        return a.keyword.value if a.keyword.value in params else None
    if params and params[0] in ("self", "cls") and (op.func or "").count(".") >= 1:
        params = params[1:]
    positional = [x for x in op.args if x.keyword is None and not x.star]
    j = positional.index(a) if a in positional else -1
    return params[j] if 0 <= j < len(params) else None

class Move:
    """A device move of a model: where it happened and the device expression it used."""

    __slots__ = ("node", "device", "fn", "cuda", "dp")

    def __init__(self, node, device, fn, cuda, dp=False):
        self.node, self.device, self.fn, self.cuda, self.dp = node, device, fn, cuda, dp


class Accumulation:
    """A value kept in a container across loop iterations."""

    __slots__ = ("op", "fn", "container", "value", "facts", "how", "loops")

    def __init__(self, op, fn, container, value, facts, how, loops):
        self.op, self.fn, self.container, self.value = op, fn, container, value
        self.facts, self.how, self.loops = facts, how, loops


def _literal_loop_aliases(fn, path: str) -> set:
    """Names a loop of ``fn`` binds to the loader ``path`` by walking a literal list of
    loaders: ``for name, loader in [("train", train_loader), ("val", val_loader)]`` binds
    ``loader``; ``for loader in (train_loader, val_loader)`` too."""
    out = set()
    for o in all_ops(fn):
        if not isinstance(o, LoopOp) or o.is_while or not isinstance(o.iter, (cst.List, cst.Tuple)):
            continue
        for el in o.iter.elements:
            v = el.value
            if isinstance(v, (cst.Name, cst.Attribute)) and dotted(v) == path and dotted(o.target):
                out.add(dotted(o.target))
            elif isinstance(v, (cst.Tuple, cst.List)) and isinstance(o.target, (cst.Tuple, cst.List)) \
                    and len(v.elements) == len(o.target.elements):
                for ve, te in zip(v.elements, o.target.elements):
                    if isinstance(ve.value, (cst.Name, cst.Attribute)) and dotted(ve.value) == path \
                            and dotted(te.value):
                        out.add(dotted(te.value))
    return out


_SHUFFLE_CALLS = ("random.shuffle", "numpy.random.shuffle", "np.random.shuffle")
_PERMUTE_CALLS = ("random.sample", "numpy.random.permutation", "np.random.permutation", "torch.randperm",
                  "sklearn.utils.shuffle")


def _permutes_own_samples(fn) -> bool:
    """``fn`` (a method) permutes a list or array the instance holds: ``random.shuffle(self.x)``
    (or a generator's ``self.rng.shuffle(self.x)``), ``self.x = random.sample(self.x, k)``,
    ``self.order = torch.randperm(n)``."""
    for o in all_ops(fn):
        if isinstance(o, CallOp) and o.args and (o.qual in _SHUFFLE_CALLS or o.attr == "shuffle"):
            first = dotted(o.args[0].value) or ""
            if first.startswith("self."):
                return True
        if isinstance(o, AssignOp) and o.value is not None and o.aug is None \
                and any((dotted(t) or "").startswith("self.") for t in o.targets):
            for n in subnodes(o.value):
                name = dotted(n.func) or "" if isinstance(n, cst.Call) else ""
                if name in _PERMUTE_CALLS or name.endswith((".permutation", ".shuffle")) or name == "randperm":
                    return True
    return False


class LoaderInfo:
    """A ``DataLoader(...)`` construction."""

    __slots__ = ("op", "fn", "shuffle", "sampler", "iterable", "unknown", "shuffle_arg", "full_batch",
                 "random_samples")

    def __init__(self, op, fn):
        self.op, self.fn = op, fn
        self.shuffle = None  # True / False / None (not a literal)
        self.shuffle_arg = None  # the Arg node giving shuffle
        self.sampler = False
        self.iterable = False
        self.unknown = False  # **kwargs / *args: anything may be set
        self.full_batch = False  # batch_size=len(dataset), or a dataset of one graph
        # test code's synthetic data: every sample an independent random draw, no order to keep
        self.random_samples = False


# ============================================================== the per-module answers
class Resources:
    def __init__(self, mm):
        self.mm = mm
        self._assigns: dict = {}
        self._pos: dict = {}
        self._accs: dict = {}
        self._move_cache: dict = {}
        self._before_cache: dict = {}

    # ------------------------------------------------------------ definitions
    def assigns(self, fn) -> dict:
        """path -> [(AssignOp, value expression or None, is_whole_value)] in ``fn`` (not aug)."""
        r = self._assigns.get(id(fn))
        if r is not None:
            return r
        r = {}
        for op in all_ops(fn):
            if not isinstance(op, AssignOp) or op.value is None or op.aug is not None:
                continue
            for t in op.targets:
                self._collect_target(r, op, t, op.value)
        self._assigns[id(fn)] = r
        return r

    def _collect_target(self, r, op, t, value) -> None:
        if isinstance(t, (cst.Tuple, cst.List)):
            elts = [e.value for e in t.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elts):
                for te, ve in zip(elts, value.elements):
                    self._collect_target(r, op, te, ve.value)
            else:
                for i, te in enumerate(elts):
                    d = dotted(te)
                    if d:
                        r.setdefault(d, []).append((op, value, i))
            return
        if isinstance(t, cst.StarredElement):
            return
        d = dotted(t)
        if d:
            r.setdefault(d, []).append((op, value, None))

    def definitions(self, fn, path: str) -> list:
        """[(owner function, AssignOp, value expression, tuple index or None)] for ``path``
        seen from ``fn``: local, enclosing functions, the class (``self.x``), the module."""
        out = []
        f = fn
        while f is not None:
            for op, value, idx in self.assigns(f).get(path, ()):
                out.append((f, op, value, idx))
            if out or path.split(".")[0] in f.params:
                return out
            f = f.parent
        if path.startswith("self."):
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            seen = 0
            while cls is not None and seen < 5:
                for m in cls.methods.values():
                    for op, value, idx in self.assigns(m).get(path, ()):
                        out.append((m, op, value, idx))
                if out:
                    return out
                nxt = None
                for raw in cls.raw_bases:
                    nxt = self.mm.find_class(raw)
                    if nxt is not None and nxt is not cls:
                        break
                    nxt = None
                cls, seen = nxt, seen + 1
            return out
        mf = self.mm.module_function
        if fn is not mf:
            for op, value, idx in self.assigns(mf).get(path, ()):
                out.append((mf, op, value, idx))
        return out

    def param_owner(self, fn, path: str):
        """The function (``fn`` or an enclosing one) that has ``path``'s root as a parameter
        and no local assignment of it, else ``None``."""
        root = root_name(path)
        f = fn
        while f is not None:
            if self.assigns(f).get(path):
                return None
            if root in f.params and root not in ("self", "cls"):
                return f
            f = f.parent
        return None

    def caller_args(self, fn, param: str) -> list:
        """[(caller function, argument expression)] for each call of ``fn`` in this module."""
        return [(caller, arg) for caller, _op, arg in self.caller_arg_ops(fn, param)]

    def caller_arg_ops(self, fn, param: str) -> list:
        """[(caller function, call op, argument expression)] for each call of ``fn`` in this
        module."""
        out = []
        params = [p for p in fn.params if not p.startswith("*")]
        if fn.cls is not None and params and params[0] in ("self", "cls"):
            params = params[1:]
        if param not in params:
            return out
        idx = params.index(param)
        for caller, op in self.mm.callers(fn):
            positional = [a for a in op.args if a.keyword is None and not a.star]
            arg = None
            for a in op.args:
                if a.keyword is not None and a.keyword.value == param:
                    arg = a.value
            if arg is None and idx < len(positional):
                arg = positional[idx].value
            if arg is not None:
                out.append((caller, op, arg))
        return out

    # ------------------------------------------------------------ devices
    def is_cpu_device(self, fn, expr, depth: int = 0) -> bool:
        """``"cpu"``, ``torch.device("cpu")`` or a name only ever bound to one of them."""
        if expr is None or depth > 3:
            return False
        s = _string_value(expr)
        if s is not None:
            return s.split(":")[0] == "cpu"
        if isinstance(expr, cst.Call):
            q = self.mm.qualify(dotted(expr.func))
            if q in catalog.DEVICE_NAMES and expr.args:
                return self.is_cpu_device(fn, expr.args[0].value, depth + 1)
            return False
        if isinstance(expr, (cst.Name, cst.Attribute)):
            d = dotted(expr)
            if not d:
                return False
            defs = self.definitions(fn, d)
            if not defs:
                return False
            return all(v is not None and idx is None and self.is_cpu_device(owner, v, depth + 1)
                       for owner, _op, v, idx in defs)
        return False

    def move_device(self, fn, op: CallOp):
        """For a ``.to(...)``/``.cuda()`` call: (is a device move, device expression or None
        for ``.cuda()``). Dtype-only ``.to(torch.float16)`` and CPU moves are not moves."""
        if op.attr == "cuda":
            return True, None
        if op.attr != "to":
            return False, None
        dev = op.keyword("device")
        if dev is None:
            pos = [a for a in op.args if a.keyword is None and not a.star]
            if not pos:
                return False, None
            dev = pos[0]
        v = dev.value
        d = dotted(v) if isinstance(v, (cst.Name, cst.Attribute)) else None
        if d:
            last = d.rsplit(".", 1)[-1]
            if d.startswith("torch.") and last in _DTYPES:
                return False, None
        if isinstance(v, cst.Name) and v.value in ("dtype",):
            return False, None
        if self.is_cpu_device(fn, v):
            return False, None
        return True, v

    def inline_input_move(self, fn, fwd: CallOp) -> Optional[Move]:
        """The move to an accelerator written in the call of a forward (``self.model(data.to(
        self.device))``): the model runs where its input is sent, even where nothing seen
        moves the model (a trainer class given a model moved by its caller)."""
        for o in walk(fn.body):
            if isinstance(o, CallOp) and o.attr in ("to", "cuda") and o.loop is fwd.loop \
                    and any(a.value is o.node for a in fwd.args):
                ok, dev = self.move_device(fn, o)
                if ok:
                    return Move(o.node, dev, fn, o.attr == "cuda")
        return None

    def model_move(self, fn, path: Optional[str], depth: int = 0) -> Optional[Move]:
        """How the model at ``path`` (seen from ``fn``) was moved to an accelerator, if it was."""
        moves = self.model_moves(fn, path, depth)
        return moves[0] if moves else None

    def model_move_at(self, fn, path: Optional[str], op) -> Optional[Move]:
        """The move of the model at ``path`` that has happened when the op ``op`` of ``fn``
        runs: a move in ``fn`` itself counts only if some path runs it before ``op`` (a
        notebook's cells and a script's statements run top to bottom: a ``.to(device)`` in a
        later cell does not apply to an earlier loop; one later in an enclosing loop does, on
        the next iteration). Moves elsewhere (``__init__``, an enclosing scope, a caller)
        are taken as done."""
        for mv in self.model_moves(fn, path):
            if mv.fn is not fn or self._runs_before(fn, mv.node, op):
                return mv
        return None

    def _runs_before(self, fn, node, op) -> bool:
        key = (id(fn), id(node), id(op))
        got = self._before_cache.get(key)
        if got is None:
            from .paths import path_in_order

            mine = [o for o in walk(fn.body) if isinstance(o, CallOp) and o.node is node]
            if not mine:
                got = True  # not an op of fn's own body (a nested scope): cannot order it
            else:
                got = path_in_order(self.mm, fn, fn.body, (lambda o: o is mine[0], lambda o: o is op))
            self._before_cache[key] = got
        return got

    def model_moves(self, fn, path: Optional[str], depth: int = 0) -> list:
        """Every move of the model at ``path`` (seen from ``fn``) to an accelerator, the one
        :meth:`model_move` answers first."""
        if not path or depth > 3:
            return []
        key = (id(fn), path, depth)
        if key in self._move_cache:
            return self._move_cache[key]
        self._move_cache[key] = []
        r = self._model_moves(fn, path, depth)
        self._move_cache[key] = r
        return r

    def _model_moves(self, fn, path: str, depth: int) -> list:
        norm = path[:-7] if path.endswith(".module") else path  # DataParallel's .module
        scopes = self._scopes(fn, norm)
        wraps: dict = {}  # id(owner) -> (owner, the DataParallel/DDP calls that wrap the model there)
        found = []
        for owner in scopes:
            for o in walk(owner.body):
                if isinstance(o, CallOp) and o.kind == MOVE and o.target is not None:
                    t = o.target[:-7] if o.target.endswith(".module") else o.target
                    if t == norm:
                        ok, dev = self.move_device(owner, o)
                        if ok:
                            found.append(Move(o.node, dev, owner, dev is None))
        for owner, aop, value, idx in self.definitions(fn, norm):
            if value is None:
                continue
            if idx is not None and isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                    and value.func.attr.value in PREPARE_METHODS:
                continue  # accelerator.prepare(model, ...): accelerate places it
            for o in walk(owner.body):
                if isinstance(o, CallOp) and o.stmt is aop.stmt and o.stmt is not None:
                    if o.qual in DP_WRAPPERS:
                        wraps.setdefault(id(owner), (owner, []))[1].append(o)
                    if o.attr in ("to", "cuda") and contains(value, o.node):
                        ok, dev = self.move_device(owner, o)
                        if ok:
                            found.append(Move(o.node, dev, owner, dev is None))
            # model = net / model = DataParallel(net): follow the inner path
            inner = value
            while isinstance(inner, cst.Call):
                q = self.mm.qualify(dotted(inner.func))
                if isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("to", "cuda", "train", "eval",
                                                                                       "float", "half"):
                    inner = inner.func.value
                elif q in DP_WRAPPERS or q in ("torch.compile",) and inner.args:
                    inner = inner.args[0].value if inner.args else None
                else:
                    break
            d = dotted(inner) if isinstance(inner, (cst.Name, cst.Attribute)) else None
            if d and d != norm:
                found.extend(Move(r.node, r.device, r.fn, r.cuda, r.dp)
                             for r in self.model_moves(owner, d, depth + 1))
        if not found:
            owner = self.param_owner(fn, norm)
            if owner is not None:
                rest = norm[len(root_name(norm)):]
                for caller, cop, arg in self.caller_arg_ops(owner, root_name(norm)):
                    d = dotted(arg) if isinstance(arg, (cst.Name, cst.Attribute)) else None
                    if d:
                        # the helper's loops run when it is called: a move in the caller counts
                        # only if it can run before the call (not a later notebook cell's move)
                        r = next((mv for mv in self.model_moves(caller, d + rest, depth + 1)
                                  if mv.fn is not caller or self._runs_before(caller, mv.node, cop)), None)
                        if r is not None:
                            found.append(r)
                            break
                    elif isinstance(arg, cst.Call):
                        for o in walk(caller.body):
                            if isinstance(o, CallOp) and o.attr in ("to", "cuda") and contains(arg, o.node):
                                ok, dev = self.move_device(caller, o)
                                if ok:
                                    found.append(Move(o.node, dev, caller, dev is None))
                                    break
                        if found:
                            break
        if wraps and all(self._wrapped_when_moved(owner, ops, [m.node for m in found if m.fn is owner])
                         for owner, ops in wraps.values()):
            for mv in found:
                mv.dp = True
        return found

    def _wrapped_when_moved(self, owner, wraps, moves) -> bool:
        """On every path through ``owner`` that moves the model (one of ``moves``), one of
        ``wraps`` wraps it in ``DataParallel``/DDP too: ``if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)`` then ``model.to(device)`` leaves a one-GPU machine with
        a plain model on the GPU, whose inputs must be moved. Moves elsewhere: taken as wrapped."""
        if not moves:
            return True
        from .paths import run as run_paths, states

        wrap_ids, move_ids = {id(o) for o in wraps}, {id(n) for n in moves}

        def t(s, op):
            moved, wrapped = s
            if isinstance(op, CallOp):
                if id(op) in wrap_ids:
                    wrapped = True
                if id(op.node) in move_ids:
                    moved = True
            return (moved, wrapped)
        flow = run_paths(self.mm, owner, owner.body, t, ((False, False),))
        return not any(m and not w for m, w in states(flow.out | flow.ret | flow.cont | flow.brk))

    def forward_moves_inputs(self, fn, op: CallOp) -> bool:
        """The model's class ``forward`` moves tensors itself (``x = x.to(self.device)``)."""
        role = self.mm.resolver.of_path(fn, op.target or "")
        info = op.info if isinstance(op.info, str) else role[1]
        cls = self.mm.classes.get(info) if isinstance(info, str) else None
        fwd = cls.methods.get("forward") if cls is not None else None
        if fwd is None:
            return False
        inputs = {p for p in fwd.params if p not in ("self", "cls")}
        return any(isinstance(o, CallOp) and o.attr in ("to", "cuda") and root_name(o.recv) in inputs
                   and self.move_device(fwd, o)[0] for o in walk(fwd.body))

    def loss_forwards(self, fn, op: CallOp) -> list:
        """The forward calls of ``fn`` whose outputs reach the arguments of the loss call
        ``op``: inside the argument (``criterion(model(x), y)``) or through names assigned
        from them (``y_pred = model_0(X)`` ... ``loss_fn(y_pred, y)``), in ``op``'s loop.
        When none can be traced, the forwards of ``op``'s loop, else of ``fn``."""
        fwds = [o for o in all_ops(fn) if isinstance(o, CallOp) and o.kind == FORWARD and o.target]
        if not fwds:
            return []
        scope = list(walk(op.loop.body)) if op.loop is not None else list(all_ops(fn))
        out, names = [], set()
        for a in op.args:
            out.extend(f for f in fwds if contains(a.value, f.node))
            names |= names_in(a.value)
        seen = set()
        for _ in range(4):
            names -= seen
            if not names:
                break
            seen |= names
            nxt = set()
            for o in scope:
                if not isinstance(o, AssignOp) or o.value is None:
                    continue
                if not any(n in names for t in o.targets for n in names_in(t)):
                    continue
                hit = [f for f in fwds if contains(o.value, f.node)]
                out.extend(f for f in hit if f not in out)
                if not hit:
                    nxt |= names_in(o.value)
            names = nxt
        if out:
            return out
        in_loop = [f for f in fwds if op.loop is not None and _within(f, op.loop)]
        return in_loop or fwds

    def _scopes(self, fn, path: str) -> list:
        """Functions where a statement on ``path`` (as seen from ``fn``) can act on it."""
        out = []
        f = fn
        while f is not None:
            out.append(f)
            f = f.parent
        if path.startswith("self."):
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            if cls is not None:
                out.extend(m for m in cls.methods.values() if m not in out)
        elif self.param_owner(fn, path) is None and self.mm.module_function not in out:
            if not any(self.assigns(f).get(path) for f in out):
                out.append(self.mm.module_function)  # a module-level model
        return out

    # ------------------------------------------------------------ loaders
    def loader_values(self, fn, expr, depth: int = 0) -> list:
        """[(owner, value expression)] that the loader expression ``expr`` may be; a value is
        ``"param"`` when it came from a caller outside the module (unknown)."""
        expr = strip_iter_wrappers(expr)
        if isinstance(expr, cst.Call):
            return [(fn, expr)]
        d = dotted(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if not d or depth > 3:
            return [(fn, None)]
        defs = self.definitions(fn, d)
        out = []
        for owner, _op, value, idx in defs:
            if idx is not None:
                if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                        and value.func.attr.value in PREPARE_METHODS:
                    out.append((owner, value))
                else:
                    out.extend(self._returned_item_loaders(owner, value, idx, depth) or [(owner, None)])
                continue
            if isinstance(value, (cst.Name, cst.Attribute)):
                out.extend(self.loader_values(owner, value, depth + 1))
            else:
                out.append((owner, value))
        if not defs:
            owner = self.param_owner(fn, d)
            if owner is not None and d == root_name(d):
                args = self.caller_args(owner, d)
                if not args:
                    return [(fn, None)]
                for caller, arg in args:
                    out.extend(self.loader_values(caller, arg, depth + 1))
            else:
                out.append((fn, None))
        return out

    def _returned_item_loaders(self, fn, value, idx, depth: int) -> list:
        """``train_loader, val_loader = get_dataloaders(...)``: the loaders a function of this
        module returns at ``idx`` of the tuple each of its ``return`` statements writes out,
        else ``[]`` (unknown)."""
        if not isinstance(value, cst.Call) or not isinstance(idx, int) or depth > 3:
            return []
        name = dotted(value.func)
        callee = self.mm.function_named(fn, name) if name and "." not in name else None
        if not isinstance(callee, FunctionModel) or callee.is_module_level:
            return []
        out = []
        for r in walk(callee.body):
            if not isinstance(r, ReturnOp):
                continue
            v = r.value
            if not isinstance(v, (cst.Tuple, cst.List)) or len(v.elements) <= idx \
                    or any(isinstance(e, cst.StarredElement) for e in v.elements):
                return []
            out.extend(self.loader_values(callee, v.elements[idx].value, depth + 1))
        return out

    def is_loader_call(self, fn, value) -> bool:
        if not isinstance(value, cst.Call):
            return False
        q = self.mm.qualify(dotted(value.func))
        return q in catalog.LOADER_NAMES

    def _host_batch_loader(self, fn, value) -> bool:
        """A graph library's loader (PyG, DGL): its batches are collated on the CPU."""
        return isinstance(value, cst.Call) and self.mm.qualify(dotted(value.func)) in catalog.HOST_BATCH_LOADERS

    def full_batch_moves(self, loop: LoopOp) -> list:
        """Assignments in ``loop`` that move full-batch data made on the CPU to the device
        (``input_seq = input_seq.to(device)``, ``input_seq`` from ``torch.from_numpy``), when the
        loop also runs backward: a training loop without a loader whose author moves the data
        by hand, so data it leaves on the CPU was meant to move too."""
        from .queries import trains

        moves = [o for o in walk(loop.body) if isinstance(o, AssignOp) and o.aug is None
                 and {"host_data", "moved"} <= getattr(o, "value_facts", frozenset())]
        return moves if moves and trains(self.mm, loop.body) else []

    def loader_placement(self, fn, loop: LoopOp) -> Optional[str]:
        """``"device"`` when the batches of the loop's loader arrive on the device already,
        ``"host"`` when the loader is a plain ``DataLoader`` (batches on the CPU), ``None``
        when that is not known."""
        vals = self.loader_values(fn, loop.iter)
        if not vals:
            return None
        verdict = "host"
        for owner, v in vals:
            if v is None or not isinstance(v, cst.Call):
                return None
            if isinstance(v.func, cst.Attribute) and v.func.attr.value in PREPARE_METHODS:
                return "device"
            if not self.is_loader_call(owner, v) and not self._host_batch_loader(owner, v):
                return None
            p = self._construction_placement(owner, v)
            if p is None:
                return None
            if p == "device":
                return "device"
        return verdict

    def _construction_placement(self, fn, call: cst.Call) -> Optional[str]:
        for a in call.args:
            if a.star:
                return None
            if a.keyword is not None and a.keyword.value == "collate_fn":
                c = a.value
                if _is_false_or_none(c):
                    continue
                if isinstance(c, cst.Lambda):
                    if any(isinstance(n, cst.Name) and "device" in n.value.lower() or
                           isinstance(n, cst.Attribute) and n.attr.value in ("to", "cuda")
                           for n in subnodes(c)):
                        return "device"
                    continue
                if isinstance(c, cst.Call):
                    if any("device" in n for n in names_in(c)):
                        return "device"
                    c = c.args[0].value if c.args else None
                name = dotted(c) if c is not None else None
                target = self.mm.function_named(fn, name) if name and hasattr(self.mm, "function_named") else None
                if target is None and name and name.startswith("self."):
                    cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
                    target = cls.methods.get(name[5:]) if cls is not None else None
                if target is None:
                    return None  # an unknown collate function may move
                s = self.mm.summary_of(target, "exact")  # unknown: may move; known: it says
                if s is None or s.get("moves") or "moved" in s.get("returns", ()):
                    return "device"
        ds = _dataset_arg(call)
        if ds is not None and self._dataset_on_device(fn, ds):
            return "device"
        if ds is not None and self._dataset_unknown(fn, ds):
            return None
        return "host"

    def _dataset_values(self, fn, ds, depth=0) -> list:
        if isinstance(ds, (cst.Name, cst.Attribute)) and depth < 3:
            d = dotted(ds)
            defs = self.definitions(fn, d) if d else []
            out = []
            for owner, _op, value, idx in defs:
                if value is not None and idx is None:
                    out.extend(self._dataset_values(owner, value, depth + 1))
                else:
                    out.append((owner, None))
            if not defs and d:
                owner = self.param_owner(fn, d)
                if owner is not None and d == root_name(d):
                    for caller, arg in self.caller_args(owner, d):
                        out.extend(self._dataset_values(caller, arg, depth + 1))
            return out
        return [(fn, ds)]

    def _dataset_on_device(self, fn, ds) -> bool:
        if self._formatted_on_device(fn, ds):
            return True
        for owner, v in self._dataset_values(fn, ds):
            if not isinstance(v, cst.Call):
                # ``[g.to(device) for g in dataset]``: a list of samples moved one by one
                if v is not None and any(isinstance(o, cst.Attribute) and o.attr.value in ("to", "cuda")
                                         for o in subnodes(v)):
                    return True
                continue
            name = dotted(v.func)
            cls = self.mm.find_class(name) if name else None
            if cls is not None:
                if self.class_places_on_device(cls):
                    return True
                if self._class_sends_to_host(cls):
                    continue
                # a dataset that keeps what it is given (``torch.tensor(x)`` keeps a tensor's
                # device): built from tensors on the device, its items are on the device
            if name and (self.mm.external_class(name, "device") or {}).get("on_device"):
                return True  # a dataset class of another tree module that moves its tensors
            # TensorDataset(x.to(device), y.to(device)), datasets of tensors created on the device
            for o in walk(owner.body):
                if isinstance(o, CallOp) and o.node is v:
                    if any("moved" in f for f in o.arg_facts):
                        return True
            for a in v.args:
                for n in names_in(a.value):
                    if "device" in n.rsplit(".", 1)[-1].lower() or n.endswith(("cuda", ".to")):
                        return True
                for o in subnodes(a.value):
                    if isinstance(o, cst.Attribute) and o.attr.value in ("to", "cuda"):
                        return True
                    if isinstance(o, (cst.Name, cst.Attribute)):
                        d = dotted(o)
                        if d and self._tensor_on_device(owner, d):
                            return True
        return False

    def _formatted_on_device(self, fn, ds) -> bool:
        """A Hugging Face dataset told to yield tensors on a device that is not the CPU:
        ``train_dataset.set_format(type="torch", device="cuda")`` (in ``fn``, or in the top-level
        code where the dataset is a global); every item, so every batch of a loader over it, is
        already there."""
        d = dotted(ds) if isinstance(ds, (cst.Name, cst.Attribute)) else None
        if not d:
            return False
        scopes = [fn] if fn is self.mm.module_function else [fn, self.mm.module_function]
        for f in scopes:
            for o in all_ops(f):
                if isinstance(o, CallOp) and o.recv == d and o.attr == "set_format":
                    a = o.arg(None, "device")
                    if a is not None and not self.is_cpu_device(f, a.value):
                        return True
        return False

    def _tensor_on_device(self, fn, path: str) -> bool:
        for owner, _op, value, idx in self.definitions(fn, path):
            if value is None:
                continue
            for o in subnodes(value):
                if isinstance(o, cst.Attribute) and o.attr.value in ("to", "cuda"):
                    return True
                if isinstance(o, cst.Arg) and o.keyword is not None and o.keyword.value == "device" \
                        and not self.is_cpu_device(owner, o.value):
                    return True
        return False

    def _dataset_unknown(self, fn, ds) -> bool:
        """A dataset whose class lives in another module of the linted tree and is not known
        to leave its tensors on the CPU (it may place them on the device), or cannot be found."""
        for owner, v in self._dataset_values(fn, ds):
            if v is None:
                return True
            if isinstance(v, cst.Call):
                name = dotted(v.func)
                if name and self.mm.find_class(name) is None and hasattr(self.mm, "external_class_name") \
                        and self.mm.external_class_name(name) \
                        and (self.mm.external_class(name, "device") or {}).get("on_device") is not False:
                    return True
        return False

    def _class_sends_to_host(self, cls) -> bool:
        """A dataset class whose methods bring tensors back to the host (``.cpu()``,
        ``.numpy()``, ``.tolist()``): what it yields need not be where its inputs were."""
        return any(isinstance(o, CallOp) and o.attr in ("cpu", "numpy", "tolist")
                   for m in cls.methods.values() for o in walk(m.body))

    def class_places_on_device(self, cls, depth: int = 0) -> Optional[bool]:
        """Whether a dataset class of this module puts its tensors on a device (a method takes
        a ``device``, moves a tensor, or creates one with a non-CPU ``device=``), its local bases
        included; ``None`` when a base lives in another module of the tree (not known here)."""
        if depth > 5:
            return None
        for m in cls.methods.values():
            if any(p == "device" or p.endswith("_device") for p in m.params):
                return True
            for o in walk(m.body):
                # ``torch.tensor(x).float().to(device)``: a move of a call's result (no role)
                if isinstance(o, CallOp) and (o.kind == MOVE or o.attr in ("to", "cuda")) \
                        and self.move_device(m, o)[0]:
                    return True
                if isinstance(o, CallOp) and o.keyword("device") is not None and \
                        not self.is_cpu_device(m, o.keyword("device").value):
                    return True
        out: Optional[bool] = False
        for raw in cls.raw_bases:
            local = self.mm.find_class(raw)
            if local is not None and local is not cls:
                got = self.class_places_on_device(local, depth + 1)
            elif raw == "object" or (self.mm.qualify(raw) or "").startswith(("torch.", "torchvision.")):
                got = False
            elif self.mm.external_class_name(raw):
                got = None  # a base of another tree module
            else:
                got = False  # a library base: its tensors are where the library puts them, the CPU
            if got:
                return True
            if got is None:
                out = None
        return out

    # ------------------------------------------------------------ loader constructions
    def loader_constructions(self) -> list:
        out = []
        for fn in self.mm.all_functions:
            for op in all_ops(fn):
                if isinstance(op, CallOp) and (op.qual in catalog.LOADER_NAMES
                                               or op.qual in catalog.LIBRARY_LOADERS):
                    out.append(self._loader_info(fn, op))
        return out

    def _loader_info(self, fn, op: CallOp) -> LoaderInfo:
        info = LoaderInfo(op, fn)
        pos = [a for a in op.args if a.keyword is None and not a.star]
        if any(a.star for a in op.args):
            info.unknown = True
        shuffle_at, bs_at = catalog.LIBRARY_LOADERS.get(op.qual, (2, 1))
        shuffle = op.keyword("shuffle") or (pos[shuffle_at] if shuffle_at is not None and len(pos) > shuffle_at
                                            else None)
        if shuffle is not None:
            info.shuffle_arg = shuffle
            v = shuffle.value
            info.shuffle = True if _is_true(v) else (False if _is_false_or_none(v) else None)
        torch_args = op.qual in catalog.LOADER_NAMES
        for kw, i in (("sampler", 3), ("batch_sampler", 4)):
            a = op.keyword(kw) or (pos[i] if torch_args and len(pos) > i else None)
            if a is not None and not _is_false_or_none(a.value):
                info.sampler = True
        ds = _dataset_arg(op.node)
        if ds is not None and self._dataset_iterable(fn, ds):
            info.iterable = True
        bs = op.keyword("batch_size") or (pos[bs_at] if bs_at is not None and len(pos) > bs_at else None)
        if bs is not None and isinstance(bs.value, cst.Call) and dotted(bs.value.func) == "len":
            info.full_batch = True  # one batch per epoch: the order does not matter
        elif ds is not None and self._single_graph_dataset(fn, ds):
            info.full_batch = True  # one graph, one item: the same single batch every epoch
        elif ds is not None:
            # the dataset's size is known (literal samples, ``list(zip(xs, ys))`` of literal
            # lists, ``torch.randn(64, 8)``) and one batch (``batch_size``, 1 by default in
            # torch and the library loaders) holds it
            size = self.dataset_size_bound(fn, ds)
            batch = self.int_value(fn, bs.value) if bs is not None else 1
            if size is not None and batch is not None and 0 < size <= batch:
                info.full_batch = True
        if ds is not None and in_test_tree(self.mm) and self.dataset_random(fn, ds):
            info.random_samples = True  # a test helper's synthetic data (``tests/helpers/``)
        return info

    def dataset_random(self, fn, ds, depth: int = 0) -> bool:
        """Every value the dataset expression may have holds only independent random draws:
        ``torch.randn(n, d)``, a ``TensorDataset`` or ``Subset`` of such tensors, or a dataset
        class of this module whose ``__getitem__`` reads nothing but such draws (``self.data =
        torch.randn(length, size)``; ``return torch.rand(3, 32, 32)``): synthetic data of tests,
        profiling and benchmarks, whose order carries nothing."""
        if depth > 5 or ds is None:
            return False
        if isinstance(ds, (cst.Name, cst.Attribute)):
            vals = self._dataset_values(fn, ds)
            d = dotted(ds) or ""
            cls = fn.cls or (fn.parent.cls if fn.parent is not None else None)
            if not vals and d.count(".") == 1 and d.startswith("self.") and cls is not None:
                # ``self.random_train``, set by another method of the class (``setup``)
                vals = [(m, v) for m in cls.methods.values() for _op, v, idx in self.assigns(m).get(d, ())
                        if idx is None]
            return bool(vals) and all(v is not None and not isinstance(v, (cst.Name, cst.Attribute))
                                      and self.dataset_random(owner, v, depth + 1) for owner, v in vals)
        if not isinstance(ds, cst.Call) or any(a.star for a in ds.args):
            return False
        name = dotted(ds.func) or ""
        qual = self.mm.qualify(name) or name
        pos = [a.value for a in ds.args if a.keyword is None]
        if qual in catalog.RANDOM_FACTORIES:
            return True
        if qual in ("torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"):
            return bool(pos) and all(self.dataset_random(fn, a, depth + 1) for a in pos)
        if qual in ("torch.utils.data.Subset", "torch.utils.data.dataset.Subset"):
            inner = next((a.value for a in ds.args if a.keyword is not None and a.keyword.value == "dataset"),
                         pos[0] if pos else None)
            return self.dataset_random(fn, inner, depth + 1)
        cls = self.mm.find_class(name) if name else None
        return cls is not None and self._class_random(cls)

    def _class_random(self, cls) -> bool:
        get = cls.methods.get("__getitem__")
        if get is None or get.is_module_level:
            return False
        local = set(self.assigns(get)) | set(get.params)
        drawn = False
        for n in _read_names(get.node.body):
            parts = n.split(".")
            if parts[0] == "self":
                if len(parts) < 2:
                    continue
                path = ".".join(parts[:2])
                defs = [(op, v, idx) for m in cls.methods.values() for op, v, idx in self.assigns(m).get(path, ())]
                if not defs or not all(v is not None and idx is None and self._random_draw(v)
                                       for _op, v, idx in defs):
                    return False  # ``self.images``: data the instance was given or read
                drawn = True
            elif parts[0] not in local and parts[0] not in _BUILTIN_NAMES:
                q = self.mm.imports.names.get(parts[0])
                if q is None or q.split(".", 1)[0] not in ("torch", "numpy", "random", "math"):
                    return False  # a global: a table of the notebook, a file list
        for o in all_ops(get):
            if isinstance(o, CallOp) and (self.mm.qualify(dotted(o.node.func)) or "") in catalog.RANDOM_FACTORIES:
                drawn = True
        return drawn

    def _random_draw(self, v) -> bool:
        return isinstance(v, cst.Call) and (self.mm.qualify(dotted(v.func)) or "") in catalog.RANDOM_FACTORIES

    def int_value(self, fn, e, depth: int = 0) -> Optional[int]:
        """The value of an integer expression on evidence: a literal, a name every definition of
        which (here, in enclosing functions, the module) is one, and ``+ - * //`` of those."""
        if depth > 4 or e is None:
            return None
        if isinstance(e, cst.Integer):
            try:
                return int(e.evaluated_value)
            except (TypeError, ValueError):
                return None
        if isinstance(e, cst.BinaryOperation):
            a, b = self.int_value(fn, e.left, depth + 1), self.int_value(fn, e.right, depth + 1)
            if a is None or b is None:
                return None
            if isinstance(e.operator, cst.Add):
                return a + b
            if isinstance(e.operator, cst.Subtract):
                return a - b
            if isinstance(e.operator, cst.Multiply):
                return a * b
            if isinstance(e.operator, cst.FloorDivide) and b:
                return a // b
            return None
        if isinstance(e, cst.Name):
            defs = self.definitions(fn, e.value)
            if not defs or any(v is None or idx is not None for _o, _op, v, idx in defs):
                return None
            got = {self.int_value(owner, v, depth + 1) for owner, _op, v, _idx in defs}
            return got.pop() if len(got) == 1 else None
        return None

    def dataset_size_bound(self, fn, ds, depth: int = 0) -> Optional[int]:
        """At most how many samples the dataset expression ``ds`` holds, on evidence only, else
        ``None``: a literal list or tuple (``[x0, x1, x2, x3]``), ``list(zip(xs, ys))`` (the
        shortest known), ``range(n)``, a literal slice ``xs[:k]``, tensors of literal rows
        (``torch.tensor([[0, 0], [0, 1]])``, ``torch.randn(64, 8)``), ``TensorDataset`` of those,
        MONAI datasets over such a list and ``Subset(ds, indices)``; names are followed through
        every definition (the largest counts) and parameters through the callers' arguments.
        A dataset class of the tree, a file read or anything computed is unknown."""
        if depth > 6 or ds is None:
            return None
        if isinstance(ds, (cst.Name, cst.Attribute)):
            vals = self._dataset_values(fn, ds)
            if not vals or any(v is None or v is ds for _o, v in vals):
                return None
            sizes = [self.dataset_size_bound(owner, v, depth + 1) for owner, v in vals]
            return None if any(n is None for n in sizes) else max(sizes)
        if isinstance(ds, (cst.List, cst.Tuple)):
            if any(isinstance(el, cst.StarredElement) for el in ds.elements):
                return None
            return len(ds.elements)
        if isinstance(ds, cst.Subscript) and len(ds.slice) == 1 and isinstance(ds.slice[0].slice, cst.Slice):
            sl = ds.slice[0].slice
            if sl.step is not None:
                return None
            lo = self.int_value(fn, sl.lower) if sl.lower is not None else 0
            hi = self.int_value(fn, sl.upper) if sl.upper is not None else None
            if lo is not None and lo >= 0 and hi is not None and hi >= lo:
                return hi - lo  # ``xs[:k]``: k at most
            whole = self.dataset_size_bound(fn, ds.value, depth + 1)
            return whole
        if not isinstance(ds, cst.Call):
            return None
        name = dotted(ds.func) or ""
        qual = self.mm.qualify(name) or name
        pos = [a.value for a in ds.args if a.keyword is None and not a.star]
        if any(a.star for a in ds.args):
            return None
        if qual in ("zip", "torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"):
            known = [n for n in (self.dataset_size_bound(fn, a, depth + 1) for a in pos) if n is not None]
            return min(known) if known else None  # as long as its shortest argument
        if qual == "range":
            ints = [self.int_value(fn, a) for a in pos]
            if len(ints) == 1 and ints[0] is not None:
                return max(ints[0], 0)
            if len(ints) == 2 and None not in ints:
                return max(ints[1] - ints[0], 0)
            return None
        if qual in catalog.SIZED_BY_ARGUMENT:
            at, kw = catalog.SIZED_BY_ARGUMENT[qual]
            arg = next((a.value for a in ds.args if a.keyword is not None and a.keyword.value == kw), None)
            if arg is None and len(pos) > at:
                arg = pos[at]
            return self.dataset_size_bound(fn, arg, depth + 1) if arg is not None else None
        if not pos or ds.args[0].keyword is not None:
            return None
        if qual in catalog.SIZED_FACTORIES:
            rows = self.int_value(fn, pos[0])
            if rows is not None:
                return rows
        if qual in catalog.DATA_FACTORIES:
            return self.dataset_size_bound(fn, pos[0], depth + 1)
        return None

    def _single_graph_dataset(self, fn, ds) -> bool:
        """Every value the dataset can have is a library dataset of one graph (``Planetoid``
        for Cora, an ``ogbn-*`` dataset), followed through names and callers' arguments."""
        vals = self._dataset_values(fn, ds)
        return bool(vals) and all(
            isinstance(v, cst.Call) and self.mm.qualify(dotted(v.func)) in catalog.SINGLE_GRAPH_DATASETS
            for _owner, v in vals)

    def _dataset_iterable(self, fn, ds) -> bool:
        for owner, v in self._dataset_values(fn, ds):
            if v is None:
                continue
            for n in subnodes(v):
                if isinstance(n, cst.Attribute) and n.attr.value in ("shuffle", "to_iterable_dataset"):
                    return True  # datasets / webdataset shuffle themselves
                if isinstance(n, cst.Arg) and n.keyword is not None and n.keyword.value == "streaming":
                    return True
            if not isinstance(v, cst.Call):
                continue
            name = dotted(v.func) or ""
            if self.class_iterable(name):
                return True
            last = name.rsplit(".", 1)[-1]
            if "Iterable" in last or "Stream" in last or "WebDataset" in last or "DataPipe" in last \
                    or "IterDataPipe" in last:
                return True
        # a name the dataset is shuffled through later: ds = ds.shuffle(...)
        d = dotted(ds) if isinstance(ds, (cst.Name, cst.Attribute)) else None
        if d and any(w.startswith(("iter", "stream", "pipe", "datapipe")) for w in words(d)):
            return True  # train_iterator, stream, datapipe: iterable-style data
        if d:
            for o in all_ops(fn):
                if isinstance(o, CallOp) and o.recv == d and o.attr in ("shuffle", "shuffled"):
                    return True
        if isinstance(ds, cst.Subscript):
            # ``splits["train"] = splits["train"].shuffle(seed)`` (HF datasets) before the loader
            for o in all_ops(fn):
                if isinstance(o, AssignOp) and o.value is not None and len(o.targets) == 1 \
                        and isinstance(o.targets[0], cst.Subscript) and o.targets[0].deep_equals(ds) \
                        and isinstance(o.value, cst.Call) and isinstance(o.value.func, cst.Attribute) \
                        and o.value.func.attr.value in ("shuffle", "shuffled"):
                    return True
        return False

    def class_iterable(self, name: str, depth: int = 0) -> bool:
        """Whether the class ``name`` is an iterable-style dataset: an ``IterableDataset``
        (through bases here or in other tree modules), or a class with ``__iter__`` and no
        ``__getitem__``."""
        if not name or depth > 5:
            return False
        cls = self.mm.find_class(name)
        if cls is None:
            q = self.mm.qualify(name)
            if q in ITERABLE_DATASET_BASES:
                return True
            return bool((self.mm.external_class(name, "iterable") or {}).get("iterable_dataset"))
        for b, raw in zip(cls.bases, cls.raw_bases):
            if b in ITERABLE_DATASET_BASES or raw in ITERABLE_DATASET_BASES:
                return True
            if self.class_iterable(raw, depth + 1):
                return True
        if "__iter__" in cls.methods and "__getitem__" not in cls.methods:
            return True
        return False

    def class_shuffling_methods(self, name: str, depth: int = 0) -> frozenset:
        """Methods of the dataset class ``name`` (its own or inherited, here or in another tree
        module) that permute the samples the instance holds: ``random.shuffle(self.pos_list)``,
        ``self.order = torch.randperm(len(self.items))``; ``__init__`` is not one (a shuffle at
        construction fixes one order for every epoch)."""
        if not name or depth > 5:
            return frozenset()
        cls = self.mm.find_class(name)
        if cls is None:
            facts = self.mm.external_class(name, "shuffles") or {}
            return frozenset(facts.get("shuffles") or ())
        out = {m for m, f in cls.methods.items() if m != "__init__" and _permutes_own_samples(f)}
        for raw in cls.raw_bases:
            if self.mm.find_class(raw) is not cls:
                out |= self.class_shuffling_methods(raw, depth + 1)
        return frozenset(out)

    def dataset_shuffling_methods(self, info: LoaderInfo) -> frozenset:
        """The shuffling methods (:meth:`class_shuffling_methods`) of the dataset classes a
        loader is built on (every value its dataset argument may have must be one)."""
        ds = _dataset_arg(info.op.node)
        if ds is None:
            return frozenset()
        out = None
        for _owner, v in self._dataset_values(info.fn, ds):
            name = dotted(v.func) if isinstance(v, cst.Call) else None
            m = self.class_shuffling_methods(name) if name else frozenset()
            out = m if out is None else out & m
        return out or frozenset()

    def loader_reshuffles(self, fn, path: str, bind_node=None) -> set:
        """Methods called on the dataset of the loader ``path`` of ``fn`` once per epoch
        (``train_dl.dataset.shuffleSamples()`` in the training function, which the epoch
        loop calls; through helpers it is passed to, here or in other modules)."""
        return {m for m, looped in self._reshuffles(fn, path, 0, set(), bind_node) if looped}

    def reshuffled_params(self, fn) -> list:
        """``[[parameter, method, in a loop]]``: the dataset methods ``fn`` calls on the
        loaders passed to it (for callers: ``loader_reshuffles``)."""
        out = set()
        for p in fn.params:
            if p.startswith("*") or p in ("self", "cls"):
                continue
            for m, looped in self._reshuffles(fn, p, 0, set(), None):
                out.add((p, m, looped))
        return [list(t) for t in sorted(out)]

    def _reshuffles(self, fn, path: str, depth: int, seen: set, bind_node) -> set:
        """{(method, whether a loop runs it)} called on ``path``'s ``.dataset``."""
        key = (id(fn), path)
        if key in seen or depth > 3:
            return set()
        seen.add(key)
        span = self._binding_span(fn, path, bind_node) if bind_node is not None else None
        pos = self._positions(fn) if span is not None else None
        out = set()
        target = path + ".dataset"
        for f in self._loader_scopes(fn, path):
            for o in all_ops(f):
                if not isinstance(o, CallOp):
                    continue
                if f is fn and span is not None and not span[0] < pos.get(id(o), span[0]) < span[1]:
                    continue
                if o.recv == target and o.attr:
                    out.add((o.attr, o.loop is not None))
                    continue
                if o.kind != CALL or isinstance(o.info, str):
                    continue
                for a in o.args:
                    if dotted(a.value) != path:
                        continue
                    callee = o.info
                    if not hasattr(callee, "body"):
                        sm = self.mm.summary_of(callee)
                        param = param_for(sm.get("params", []) if sm else [], o, a)
                        for entry in (sm or {}).get("reshuffles", ()):
                            if len(entry) == 3 and entry[0] == param:
                                out.add((entry[1], bool(entry[2]) or o.loop is not None))
                        continue
                    params = [p for p in callee.params if not p.startswith("*")]
                    param = param_for(params, o, a)
                    if param is not None:
                        for m, looped in self._reshuffles(callee, param, depth + 1, seen, None):
                            out.add((m, looped or o.loop is not None))
        return out

    def _loader_scopes(self, fn, path: str) -> list:
        """The functions that see the loader ``path`` of ``fn`` (as ``loader_sites`` looks)."""
        if path.startswith("self.") and fn.cls is not None:
            scopes = list(fn.cls.methods.values())
            for m in list(scopes):
                scopes.extend(m.nested)
            return scopes
        if fn.is_module_level:
            return [f for f in self.mm.all_functions
                    if f.is_module_level or root_name(path) not in f.params and not self.assigns(f).get(path)]
        return [fn] + list(fn.nested)

    def loader_bindings(self, info: LoaderInfo) -> list:
        """[(function, path)] the loader is bound to, and [(function, 'return')] when the
        constructing function returns it."""
        fn, op = info.fn, info.op
        out = []
        for o in all_ops(fn):
            if isinstance(o, AssignOp) and o.value is not None and o.aug is None and contains(o.value, op.node):
                for t in o.targets:
                    d = dotted(t)
                    if d:
                        out.append((fn, d))
                    elif isinstance(t, (cst.Tuple, cst.List)) and isinstance(o.value, (cst.Tuple, cst.List)):
                        for te, ve in zip(t.elements, o.value.elements):
                            if contains(ve.value, op.node) and dotted(te.value):
                                out.append((fn, dotted(te.value)))
            elif isinstance(o, ReturnOp) and o.value is not None and contains(o.value, op.node):
                out.append((fn, "<return>"))
        return out

    def loader_sites(self, fn, path: str, depth: int = 0, seen=None, bind_node=None) -> list:
        """[(function, LoopOp)] iterating the loader ``path`` of ``fn`` (through helpers it is
        passed to, attributes of the class, module globals, ``iter()``/``next()``, a literal
        list of loaders a loop walks: ``for name, loader in [("train", train_loader), ...]``).
        With ``bind_node``, the ops of ``fn`` itself count only where the binding of ``path``
        whose value holds it is the name's value (a notebook that rebinds ``train_loader``:
        the calls after the rebinding get the other loader).  A site may also be ``"train"`` /
        ``"eval"`` (a helper of another module trains / evaluates on it, by its summary) or
        ``"fit"`` (a trainer is given it as its training data: ``trainer.fit(model, loader)``)."""
        if seen is None:
            seen = set()
        key = (id(fn), path)
        if key in seen or depth > 3:
            return []
        seen.add(key)
        span = self._binding_span(fn, path, bind_node) if bind_node is not None else None
        pos = self._positions(fn) if span is not None else None
        out = []
        scopes = [fn]
        if path.startswith("self.") and fn.cls is not None:
            scopes = list(fn.cls.methods.values())
            for m in list(scopes):
                scopes.extend(m.nested)
        elif fn.is_module_level:
            scopes = [f for f in self.mm.all_functions
                      if f.is_module_level or root_name(path) not in f.params and not self.assigns(f).get(path)]
        else:
            scopes = [fn] + list(fn.nested)
        for f in scopes:
            iters = {path}
            for p, defs in self.assigns(f).items():
                for _op, v, idx in defs:
                    if isinstance(v, cst.Call) and dotted(v.func) == "iter" and v.args and \
                            dotted(v.args[0].value) == path:
                        iters.add(p)
            iters |= _literal_loop_aliases(f, path)
            for o in all_ops(f):
                if f is fn and span is not None and not span[0] < pos.get(id(o), span[0]) < span[1]:
                    continue  # before this loader existed, or after the name was rebound
                if isinstance(o, LoopOp) and not o.is_while and o.iter is not None:
                    it = strip_iter_wrappers(o.iter)
                    targets = [it]
                    if isinstance(it, cst.Call) and dotted(it.func) == "zip":
                        targets = [strip_iter_wrappers(a.value) for a in it.args]
                    if any(dotted(t) in iters for t in targets if isinstance(t, (cst.Name, cst.Attribute))):
                        out.append((f, o))
                elif isinstance(o, CallOp) and o.func == "next" and o.args and o.loop is not None:
                    if dotted(o.args[0].value) in iters and dotted(o.args[0].value) != path:
                        out.append((f, o.loop))
                elif isinstance(o, CallOp) and _train_loader_argument(o, path):
                    out.append((f, "fit"))  # trainer.fit(model, loader), Trainer(train_loader=loader)
                elif isinstance(o, CallOp) and o.kind == CALL and not isinstance(o.info, str):
                    for a in o.args:
                        if dotted(a.value) != path:
                            continue
                        callee = o.info
                        if not hasattr(callee, "body"):
                            # another module: its summary tells which parameters it trains on
                            s = self.mm.summary_of(callee)
                            param = param_for(s.get("params", []) if s else [], o, a)
                            if s and param is not None:
                                if param in s.get("trains_on", ()):
                                    out.append((f, "train"))
                                elif param in s.get("evaluates_on", ()):
                                    out.append((f, "eval"))
                            continue
                        params = [p for p in callee.params if not p.startswith("*")]
                        param = param_for(params, o, a)
                        if param is not None:
                            out.extend(self.loader_sites(callee, param, depth + 1, seen))
        return out

    def loader_escapes(self, fn, path: str, bind_node=None) -> bool:
        """The loader bound to ``path`` in ``fn`` reaches code whose use of it is not seen
        here: passed to a call (``trainer.fit(model, train_loader)``, a helper), returned,
        aliased or put in a container.  ``iter()``, ``next()``, ``len()``, the iteration
        wrappers (``enumerate``, ``tqdm``) and reads of its attributes (``loader.dataset``)
        keep it here.  A loader that does not escape is used only where ``loader_sites`` looks."""
        if self.mm.has_unseen_code:
            return True  # a notebook cell left out (it does not parse) may train on it
        safe = {"iter", "next", "len", "print"} | set(ITER_WRAPPERS)
        if path.startswith("self.") and fn.cls is not None:
            scopes = list(fn.cls.methods.values())
            scopes += [n for m in scopes for n in m.nested]
        elif fn.is_module_level:
            scopes = list(self.mm.all_functions)
        else:
            scopes = [fn] + list(fn.nested)

        def exact(e) -> bool:
            if isinstance(e, (cst.Name, cst.Attribute)):
                return dotted(e) == path
            if isinstance(e, (cst.Tuple, cst.List, cst.Set)):
                return any(exact(el.value) for el in e.elements)
            if isinstance(e, cst.Dict):
                return any(isinstance(el, cst.DictElement) and exact(el.value) for el in e.elements)
            return False

        span = self._binding_span(fn, path, bind_node) if bind_node is not None else None
        pos = self._positions(fn)
        for f in scopes:
            for o in all_ops(f):
                if f is fn and span is not None and not span[0] < pos.get(id(o), span[0]) < span[1]:
                    continue  # before this loader existed, or after the name was rebound
                if isinstance(o, CallOp):
                    if o.func in safe:
                        continue
                    if any(exact(a.value) for a in o.args):
                        return True
                elif isinstance(o, AssignOp) and o.value is not None and exact(o.value):
                    return True
                elif isinstance(o, ReturnOp) and o.value is not None and exact(o.value):
                    return True
        return False

    def _binding_span(self, fn, path: str, bind_node):
        """(first, last) positions in ``all_ops(fn)`` where the binding of ``path`` whose value
        holds ``bind_node`` is the name's value, when it is a straight-line statement of
        ``fn`` (not in a loop, under no other branch than the later bindings): from the binding
        to the next binding of the name.  None when that cannot be told."""
        defs = [op for op, _v, _i in self.assigns(fn).get(path, ())]
        bind = next((op for op in defs if getattr(op, "value", None) is not None
                     and contains(op.value, bind_node)), None)
        if bind is None or bind.loop is not None or bind.guards:
            return None
        pos = self._positions(fn)
        b = pos.get(id(bind))
        if b is None:
            return None
        end = len(pos)
        for r in defs:
            k = pos.get(id(r))
            if r is not bind and k is not None and b < k < end and r.loop is None and not r.guards \
                    and not _wraps_same_loader(getattr(r, "value", None), path):
                end = k
        return b, end

    def _positions(self, fn) -> dict:
        pos = self._pos.get(id(fn))
        if pos is None:
            pos = self._pos[id(fn)] = {id(o): k for k, o in enumerate(all_ops(fn))}
        return pos

    def reaches_site(self, fn, path: str, bind_node, site) -> bool:
        """The binding of ``path`` whose value holds ``bind_node`` is the one a site of
        ``loader_sites`` (a loop of ``fn``) iterates: not when the loop runs before that
        binding, nor after another binding of the name (a notebook that reuses
        ``train_loader`` for a statistics pass and then for training)."""
        f, loop = site
        if f is not fn or not isinstance(loop, LoopOp):
            return True
        span = self._binding_span(fn, path, bind_node)
        at = self._positions(fn).get(id(loop))
        return span is None or at is None or span[0] < at < span[1]

    def loop_trains(self, fn, loop: LoopOp) -> bool:
        """The loop (or one around it) runs backward, directly or through helpers."""
        from .queries import is_kind

        lp = loop
        while lp is not None:
            if any(is_kind(self.mm, o, BACKWARD) for o in walk(lp.body) if isinstance(o, CallOp)):
                return True
            if lp is loop and loop.grad == GRAD_OFF:
                return False  # a pass under no_grad inside a training loop (scoring a pool) does not train
            lp = lp.parent
        return False

    def loop_evaluates(self, fn, loop: LoopOp) -> bool:
        """The loop is evaluation code: under no_grad, or in an evaluation-named function
        that never runs backward."""
        from .roles import is_eval_name

        if loop.grad == GRAD_OFF or fn.decorator_grad == GRAD_OFF:
            return True
        return is_eval_name(fn.name) and not self.loop_trains(fn, loop)

    def loop_precomputes_dataset(self, fn, loop: LoopOp) -> bool:
        """The loop walks a loader once to precompute another dataset: it runs a model on the
        batches and no backward, and a list it fills (``trn_labels.extend(labels)``,
        ``feats.append(backbone(x).cpu())``) is handed, after it, to what builds the dataset of
        another loader (``DataLoader(FeaturesDataset(feats, trn_labels), shuffle=True)``): that
        loader is the one trained on, this one is only read through."""
        from .queries import is_kind

        if self.loop_trains(fn, loop) or not any(is_kind(self.mm, o, FORWARD) for o in walk(loop.body)):
            return False
        filled = {a.container for a in self.accumulations(fn)
                  if a.how in ("append", "extend", "insert") and a.container and _within(a.op, loop)}
        filled = {c for c in filled if not self.assigns(fn).get(c) or all(
            not _within(op, loop) for op, _v, _i in self.assigns(fn).get(c, ()))}
        if not filled:
            return False
        pos = self._positions(fn)
        after = pos.get(id(loop), -1)
        # names (and the lists themselves) whose value is built from a filled list, after the loop
        built = set(filled)
        for op in all_ops(fn):
            if isinstance(op, AssignOp) and op.value is not None and pos.get(id(op), -1) > after \
                    and not _within(op, loop) and names_in(op.value) & built:
                built.update(d for d in (dotted(t) for t in op.targets) if d)
        for op in all_ops(fn):
            if not (isinstance(op, CallOp) and pos.get(id(op), -1) > after
                    and (op.qual in catalog.LOADER_NAMES or op.qual in catalog.LIBRARY_LOADERS)):
                continue
            ds = _dataset_arg(op.node)
            if ds is not None and names_in(ds) & built:
                return True
        return False

    def trains_on_params(self, fn) -> tuple:
        """(params iterated in a loop that trains, params iterated only in evaluation loops)."""
        tr, ev = set(), set()
        for p in fn.params:
            if p.startswith("*") or p in ("self", "cls"):
                continue
            if self.mm.resolver.of_path(fn, p)[0] not in (None, catalog.LOADER):
                continue
            for f, site in self.loader_sites(fn, p):
                if site in ("train", "fit") or isinstance(site, LoopOp) and self.loop_trains(f, site):
                    tr.add(p)
                elif site == "eval" or isinstance(site, LoopOp) and self.loop_evaluates(f, site):
                    ev.add(p)
        return sorted(tr), sorted(ev - tr)

    # ------------------------------------------------------------ accumulation
    def accumulations(self, fn) -> list:
        """Values stored into containers inside loops: aug-assignments, ``x = x + v``,
        ``c.append(v)``/``extend``/``insert``, ``c[k] = v``."""
        cached = self._accs.get(id(fn))
        if cached is not None:
            return cached
        out = []
        for op in all_ops(fn):
            if op.loop is None:
                continue
            store = _store(op, fn) or self._kept_by_method(fn, op)
            if store is not None:
                out.append(store)
            elif isinstance(op, AssignOp) and op.value is not None and op.aug is None:
                for t in op.targets:
                    if isinstance(t, cst.Subscript):
                        if _constant_key(t):
                            continue  # ``stats["d_loss"] = d_loss``: replaced every iteration
                        c = base_path(t)
                        if c:
                            out.append(Accumulation(op, fn, c, op.value, op.value_facts, "setitem", ()))
                    else:
                        d = dotted(t)
                        if d and isinstance(op.value, cst.BinaryOperation) and \
                                type(op.value.operator).__name__ in ("Add", "Subtract") and \
                                d in (dotted(op.value.left), dotted(op.value.right)):
                            out.append(Accumulation(op, fn, d, op.value, op.value_facts, "selfadd", ()))
        for acc in out:
            acc.loops = self._accumulating_loops(fn, acc)
            if acc.how == "append" and acc.loops and last_item_backward(fn, acc) is not None:
                # ``losses.append(total); ...; losses[-1].backward()``: each item is the loss of
                # the iteration that appended it, with its graph
                acc.facts = acc.facts | {"loss", "graph"}
        self._accs[id(fn)] = out
        return out

    def _kept_by_method(self, fn, op) -> "Optional[Accumulation]":
        """``train_loss.update(loss)`` on an instance of a plain class of this module (a metric,
        a running-average meter) whose method adds that argument into one of the object's own
        attributes (``self.sum += hvd.allreduce(val.cpu())``): the object keeps the value, as
        ``train_loss += loss`` would (how ``"method"``, the container the receiver)."""
        from .roles import _plain_object_method

        if not isinstance(op, CallOp) or not op.args or not op.recv or op.kind is not None:
            return None
        m = _plain_object_method(self.mm, fn, self.mm.resolver, op)
        if not isinstance(m, FunctionModel):
            return None
        kept = _params_kept_on_self(m)
        if not kept:
            return None
        params = [p for p in m.params if p not in ("self", "cls")]
        positional = [a for a in op.args if a.keyword is None and not a.star]
        for i, a in enumerate(positional):
            if i < len(params) and params[i] in kept:
                facts = op.arg_facts[i] if i < len(op.arg_facts) else frozenset()
                return Accumulation(op, fn, op.recv, a.value, facts, "method", ())
        for i, a in enumerate(op.args):
            if a.keyword is not None and a.keyword.value in kept:
                facts = op.arg_facts[i] if i < len(op.arg_facts) else frozenset()
                return Accumulation(op, fn, op.recv, a.value, facts, "method", ())
        return None

    def step_accumulations(self, fn) -> list:
        """In a function a framework runs once per training batch (a LightningModule's
        ``training_step``, see ``queries.implicit_loop``): the values stored into a container
        that outlives the call (``self.training_step_outputs.append(log)``) and that the
        function itself never resets: kept across training iterations (until an epoch hook
        empties it, at best)."""
        from .queries import implicit_loop

        if not implicit_loop(self.mm, fn):
            return []
        returned = {r.value.value for r in all_ops(fn) if isinstance(r, ReturnOp) and isinstance(r.value, cst.Name)}
        out = []
        for acc in (_store(op, fn) for op in all_ops(fn) if op.loop is None):
            if acc is not None and acc.container.startswith("self.") and not self._resets(fn, acc.container):
                if isinstance(acc.value, cst.Name) and acc.value.value in returned:
                    # what ``training_step`` returns is the loss Lightning backwards (or a dict
                    # holding it under "loss"): it carries the graph of the step
                    acc.facts = acc.facts | {"holds_loss"}
                out.append(acc)
        return out

    def _resets(self, fn, path: str) -> list:
        """Ops that give ``path`` a fresh value (not ``x = x + v``), or clear it."""
        out = []
        for op, value, idx in self.assigns(fn).get(path, ()):
            if value is not None and idx is None and isinstance(value, cst.BinaryOperation) and \
                    path in (dotted(value.left), dotted(value.right)):
                continue
            out.append(op)
        for op in all_ops(fn):
            if isinstance(op, CallOp) and op.recv == path and op.attr in ("clear", "zero_", "fill_", "reset"):
                out.append(op)
        return out

    def _accumulating_loops(self, fn, acc: Accumulation) -> tuple:
        """Loops around the accumulation, innermost first, across whose iterations the
        container keeps its contents (up to the innermost loop that resets it)."""
        resets = self._resets(fn, acc.container)
        loops = []
        lp = acc.op.loop
        while lp is not None:
            if any(_within(r, lp) for r in resets):
                break
            loops.append(lp)
            lp = lp.parent
        return tuple(loops)

    def kept_across_training_iterations(self, acc: Accumulation) -> bool:
        """One of the loops across whose iterations the container keeps its contents runs
        ``backward()`` in its own body: what is stored in one training iteration is still held
        in the next.  A list re-created every epoch and filled by a loop that does not train
        (an evaluation pass over a few networks for a plot) holds one epoch's values at most."""
        from .queries import is_kind

        return any(any(is_kind(self.mm, o, BACKWARD) for o in walk(lp.body) if isinstance(o, CallOp))
                   for lp in acc.loops)

    def within_one_step(self, acc: Accumulation) -> bool:
        """The container lives for one optimizer step only: a local of ``fn`` given a fresh value
        there outside any loop (each call starts anew), summed in one loop over ``range(k)``
        (micro-batches, not ``len(loader)``) that runs ``backward()`` and no step, the step coming
        after that loop in ``fn``, and the container neither returned nor stored elsewhere.
        ``total += divergence`` over the gradient-accumulation passes of one step holds those
        few passes' graphs until the function returns (their buffers already freed by their
        backward), not every training iteration's."""
        from .queries import is_kind

        fn, c = acc.fn, acc.container
        if len(acc.loops) != 1 or "." in c or not c.isidentifier():
            return False
        loop = acc.loops[0]
        if loop.parent is not None or loop.is_while or not isinstance(loop.iter, cst.Call) \
                or dotted(loop.iter.func) != "range" or any(a.star for a in loop.iter.args) \
                or any(isinstance(a.value, cst.Call) and dotted(a.value.func) == "len" for a in loop.iter.args):
            return False
        if not any(r.loop is None for r in self._resets(fn, c)):
            return False
        first, _, last, _ = self.mm.span_of(loop.node)
        inside = [o for o in walk(loop.body) if isinstance(o, CallOp)]
        if any(o.kind == STEP or is_kind(self.mm, o, STEP) for o in inside):
            return False
        if not any(isinstance(o, CallOp) and o.kind == STEP and o.loop is None and self.mm.line_of(o.node) > last
                   for o in all_ops(fn)):
            return False
        for o in all_ops(fn):
            if isinstance(o, ReturnOp) and o.value is not None and c in names_in(o.value):
                return False
            if isinstance(o, AssignOp) and o.value is not None and dotted(o.value) == c:
                return False  # an alias that may outlive the call
            if isinstance(o, CallOp) and o.attr in ("append", "extend", "insert", "add") and \
                    any(dotted(a.value) == c for a in o.args):
                return False
        return True

    def consumed_by_backward(self, acc: Accumulation) -> bool:
        """A backward (or ``autograd.grad``) whose input derives from the container runs in
        the function, or in a helper of the module that a loop keeping the container calls
        (an actor-critic's ``update()`` that backwards through the values stored during the
        episode): the graph is kept on purpose (full-batch / per-episode losses)."""
        if self._backward_reads(acc.fn, acc.container, last_item_backward(acc.fn, acc)):
            return True
        return any(self._backward_reads(h, path) for h, path in self._helpers_given(acc))

    def _backward_reads(self, fn, container: str, skip=None) -> bool:
        """A backward in ``fn`` (other than ``skip``) differentiates a value derived from
        ``container``: through assignments, a loop over it (``for v, r in zip(values,
        rewards)``) and the lists such values are appended to (``losses.append(f(v))``, then
        ``torch.stack(losses).sum().backward()``)."""
        derived = {container}
        ops = all_ops(fn)
        flows = []  # (names read, names written)
        for o in ops:
            if isinstance(o, AssignOp) and o.value is not None:
                outs = [tn for t in o.targets for tn in _target_names(t)]
                reads = names_in(o.value)
                if o.aug is not None and o.targets:
                    reads = reads | {base_path(o.targets[0])}
                flows.append((reads, outs))
            elif isinstance(o, LoopOp) and not o.is_while and o.target is not None and o.iter is not None:
                flows.append((names_in(o.iter), _target_names(o.target)))
            elif isinstance(o, CallOp) and o.attr in ("append", "extend", "insert") and o.recv \
                    and "(" not in o.recv and "[" not in o.recv:
                reads = set()
                for a in o.args:
                    reads |= names_in(a.value)
                flows.append((reads, [o.recv]))
        changed, rounds = True, 0
        while changed and rounds < 6:
            changed, rounds = False, rounds + 1
            for reads, outs in flows:
                if reads & derived:
                    for tn in outs:
                        if tn and tn not in derived:
                            derived.add(tn)
                            changed = True
        for o in ops:
            if not isinstance(o, CallOp) or o is skip:
                continue
            if o.kind in (BACKWARD, AUTOGRAD_GRAD) or (o.kind == CALL and self._callee_backward(o)):
                ns = set()
                if o.recv_node is not None:
                    ns |= names_in(o.recv_node)
                for a in o.args:
                    ns |= names_in(a.value)
                if ns & derived:
                    return True
        return False

    def _helpers_given(self, acc: Accumulation) -> list:
        """(helper, the container's name there) for each function of this module that a loop
        keeping the container calls and that runs backward: the same object attribute or
        module global (``critic_net.saved_values``; ``self.saved_values`` in a method called
        on ``self``), or the parameter the container is passed to."""
        fn, c = acc.fn, acc.container
        root = c.split(".", 1)[0]
        own = root in fn.params or root in self.assigns(fn)
        seen, out = set(), []
        for lp in acc.loops:
            for o in walk(lp.body):
                if not isinstance(o, CallOp) or o.kind != CALL or not self._callee_backward(o):
                    continue
                h = o.info if isinstance(o.info, FunctionModel) else None
                if h is None or id(h) in seen:
                    continue
                seen.add(id(h))
                if root == "self":
                    if o.recv == "self" and fn.cls is not None and h.cls is fn.cls:
                        out.append((h, c))
                elif not own or fn.is_module_level:
                    if root not in h.params and root not in self.assigns(h):
                        out.append((h, c))
                for a in o.args:
                    if a.star or dotted(a.value) != c:
                        continue
                    p = param_for(list(h.params), o, a)
                    if p:
                        out.append((h, p))
        return out

    def _callee_backward(self, op: CallOp) -> bool:
        s = self.mm.summary_of(op.info)
        return bool(s and s.get("backward"))

    def number_only_uses(self, fn, path: str, exclude=()) -> bool:
        """Every read of ``path`` in ``fn`` (and of names computed from it) treats it as a
        number: arithmetic, comparisons, conditions, f-strings, ``print``/``float``/``round``,
        logging calls. A return, a method call, a subscript or any other call argument is not."""
        ok_calls = {"print", "float", "round", "str", "int", "abs", "min", "max", "format", "math.isnan",
                    "math.isfinite", "np.isnan", "math.exp"}
        ok_methods = ("add_scalar", "add_scalars", "info", "debug", "set_postfix", "set_description",
                      "write", "log_metrics", "format")
        parents = {}
        for n in subnodes(fn.node):
            for c in children(n):
                parents[id(c)] = n
        todo, seen = [path], set()
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            for n in subnodes(fn.node):
                if not isinstance(n, (cst.Name, cst.Attribute)) or dotted(n) != p:
                    continue
                par = parents.get(id(n))
                if isinstance(par, cst.Attribute) and par.value is n:
                    return False  # total.item(), total.backward(), ...
                if isinstance(par, cst.Attribute):
                    continue  # n is the attribute name part
                if isinstance(par, (cst.AssignTarget, cst.AugAssign)) and getattr(par, "target", None) is n:
                    continue
                up = par
                while isinstance(up, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison,
                                      cst.ComparisonTarget, cst.BooleanOperation)):
                    up = parents.get(id(up))
                if isinstance(up, (cst.If, cst.While, cst.IfExp, cst.Assert, cst.Expr,
                                   cst.FormattedStringExpression)):
                    continue
                if isinstance(up, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                    targets = up.targets if isinstance(up, cst.Assign) else [up]
                    for t in targets:
                        for tn in _target_names(t.target):
                            todo.append(tn)
                    continue
                if isinstance(up, cst.Arg):
                    call = parents.get(id(up))
                    if isinstance(call, cst.Call):
                        d = dotted(call.func) or ""
                        if d in ok_calls or d.rsplit(".", 1)[-1] in ok_methods or \
                                d.startswith(("logging.", "logger.", "log.", "print")):
                            continue
                return False
        return True

    # ------------------------------------------------------------ forward tensors
    def forward_cpu_tensors(self, fn) -> list:
        """In ``forward``: [(factory CallOp node, first tensor input name or None)] for tensors
        created without ``device=`` that meet an input-derived tensor."""
        return self._forward_device(fn).run()

    def forward_cpu_attributes(self, fn) -> list:
        """In ``forward``: [(``self.X`` path, the assignment in ``__init__``, the forward op
        that combines it with an input-derived tensor)] for module attributes holding a tensor
        made by a factory without ``device=``, neither a parameter nor a registered buffer
        (``model.to(device)`` does not move them)."""
        fd = self._forward_device(fn)
        fd.run()
        return fd.attr_hits

    def _forward_device(self, fn) -> "_ForwardDevice":
        cache = self.__dict__.setdefault("_fwd_device", {})
        fd = cache.get(id(fn))
        if fd is None:
            fd = cache[id(fn)] = _ForwardDevice(self, fn)
        return fd

    # ------------------------------------------------------------ loss weights
    def cpu_tensor_value(self, fn, expr, depth: int = 0, seen=()) -> bool:
        """``expr`` is a tensor with more than one element made on the CPU: a factory without
        ``device=`` (``torch.tensor([...])``, ``torch.FloatTensor(w)``, ``torch.from_numpy``),
        perhaps cast, reshaped or normalised (``w / w.sum()``), or a name only ever bound to
        one; never moved."""
        if expr is None or depth > 3:
            return False
        if isinstance(expr, (cst.Name, cst.Attribute)):
            d = dotted(expr)
            if d in seen:
                return True  # ``w = w / w.sum()``: its other definitions decide
            defs = self.definitions(fn, d) if d else []
            return bool(defs) and all(v is not None and idx is None and
                                      self.cpu_tensor_value(owner, v, depth + 1, seen + (d,))
                                      for owner, _op, v, idx in defs)
        if isinstance(expr, cst.BinaryOperation):
            if any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("to", "cuda")
                   for n in subnodes(expr)):
                return False
            return self.cpu_tensor_value(fn, expr.left, depth, seen) or \
                self.cpu_tensor_value(fn, expr.right, depth, seen)
        if not isinstance(expr, cst.Call):
            return False
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _RESHAPES \
                and not self.mm.qualify(dotted(expr.func)):
            return self.cpu_tensor_value(fn, expr.func.value, depth, seen)
        q = self.mm.qualify(dotted(expr.func))
        if q not in _FACTORIES and q not in _CPU_TENSOR_MAKERS:
            return False
        if any(a.keyword is not None and a.keyword.value == "device" for a in expr.args):
            return False
        if q in ("torch.tensor", "torch.as_tensor") and expr.args and isinstance(
                expr.args[0].value, (cst.Integer, cst.Float, cst.UnaryOperation)):
            return False  # a 0-dim tensor mixes with CUDA tensors
        return True

    def returns_cpu_tensor(self, fn) -> bool:
        """Every ``return`` of ``fn`` gives a tensor that ``fn`` creates on the CPU: a factory
        that takes sizes (``torch.zeros(n, k)``, ``torch.randn``, ``torch.arange``,
        ``torch.eye`` ...), a ``torch.tensor([...])`` of a literal list or ``torch.from_numpy``,
        without ``device=``, perhaps reshaped or cast, or a local name bound to nothing else
        (``onehot = torch.zeros(idx.size(0), n); onehot.scatter_(1, idx, 1); return onehot``).
        A conversion of a value (``torch.tensor(x)``, ``torch.as_tensor(x)``) keeps the device
        of a tensor given to it and does not count."""
        if fn.is_module_level:
            return False
        rets = [op for op in all_ops(fn) if isinstance(op, ReturnOp)]
        return bool(rets) and all(op.value is not None and self._made_on_cpu(fn, op.value) for op in rets)

    def _made_on_cpu(self, fn, expr, depth: int = 0, seen=()) -> bool:
        if depth > 3:
            return False
        if isinstance(expr, cst.Name):
            name = expr.value
            if name in seen or name in fn.params:
                return False
            defs = self.assigns(fn).get(name, ())
            return bool(defs) and all(v is not None and idx is None and
                                      self._made_on_cpu(fn, v, depth + 1, seen + (name,)) for _op, v, idx in defs)
        if isinstance(expr, cst.BinaryOperation):
            # arithmetic on a tensor made here on the CPU (``gamma ** (n - m) * (n >= m).float()``)
            # stays on the CPU: nothing else in it comes from the caller (a parameter) or is moved
            if any(isinstance(n, cst.Name) and n.value in fn.params and n.value not in ("self", "cls") or
                   isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("to", "cuda")
                   or isinstance(n, cst.Attribute) and n.attr.value == "device"
                   for n in subnodes(expr)):
                return False
            return any(self._made_on_cpu(fn, side, depth, seen) for side in _operands(expr))
        if not isinstance(expr, cst.Call):
            return False
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _RESHAPES \
                and not self.mm.qualify(dotted(expr.func)):
            return self._made_on_cpu(fn, expr.func.value, depth, seen)
        if any(a.star == "**" or a.keyword is not None and a.keyword.value in ("device", "out") for a in expr.args):
            return False
        q = self.mm.qualify(dotted(expr.func))
        if q == "torch.from_numpy":
            return True
        if q in ("torch.tensor", "torch.FloatTensor", "torch.LongTensor", "torch.Tensor"):
            return bool(expr.args) and isinstance(expr.args[0].value, (cst.List, cst.Tuple, cst.ListComp))
        return q in _FACTORIES

    def moved_anywhere(self, path: str) -> bool:
        """``path`` is moved by ``.to(...)``/``.cuda()`` somewhere in the module (in place or
        rebinding itself)."""
        for f in self.mm.all_functions:
            for o in all_ops(f):
                if isinstance(o, CallOp) and o.attr in ("to", "cuda") and o.recv == path:
                    return True
        return False

    def moved_models(self, fn) -> list:
        """[(model path, Move)] for the models of ``fn`` moved to an accelerator."""
        out = []
        for path, role in sorted(self.mm.resolver.local_roles(fn).items()):
            if isinstance(role, tuple) and role and role[0] == catalog.MODEL:
                mv = self.model_move(fn, path)
                if mv is not None:
                    out.append((path, mv))
        return out

    # ------------------------------------------------------------ argmax
    def flat_argmax_compares(self, fn) -> list:
        """``argmax()``/``max()`` calls without ``dim`` on batched model outputs whose result
        is compared with labels from the loader: [CallOp]."""
        cands = []
        scores, targets = self._class_scores(fn)
        for op in all_ops(fn):
            if not isinstance(op, CallOp):
                continue
            if op.attr in ("argmax", "max") and op.recv_node is not None and not op.args and \
                    op.qual not in ("torch.argmax", "torch.max"):
                facts, arg = op.recv_facts, op.recv_node
            elif op.qual in ("torch.argmax", "torch.max") and len(op.args) == 1 and op.args[0].keyword is None:
                facts, arg = (op.arg_facts[0] if op.arg_facts else frozenset()), op.args[0].value
            else:
                continue
            if facts & {"model_out", "logits", "probs", "logprobs", "sigmoid"} or dotted(arg) in scores:
                cands.append(op)
        if not cands:
            return []
        labels = self._label_names(fn) | targets
        if not labels or self._single_sample_batches(fn):
            return []
        out = []
        for op in cands:
            derived = set()
            for o in all_ops(fn):
                if isinstance(o, AssignOp) and o.value is not None and \
                        (contains(o.value, op.node) or names_in(o.value) & derived):
                    for t in o.targets:
                        derived |= set(_target_names(t))
            hit = False
            for n in subnodes(fn.node):
                if isinstance(n, cst.Comparison) and any(isinstance(c.operator, (cst.Equal, cst.NotEqual))
                                                         for c in n.comparisons):
                    sides = [n.left] + [c.comparator for c in n.comparisons]
                elif isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and \
                        n.func.attr.value in ("eq", "ne") and n.args:
                    sides = [n.func.value, n.args[0].value]
                elif isinstance(n, cst.Call) and dotted(n.func) in ("torch.eq", "torch.ne") and len(n.args) >= 2:
                    sides = [n.args[0].value, n.args[1].value]
                else:
                    continue
                pred = [s for s in sides if contains(s, op.node) or names_in(s) & derived]
                lab = [s for s in sides if s not in pred and names_in(s) & labels]
                if pred and lab:
                    hit = True
                    break
            if hit:
                out.append(op)
        return out

    def _class_scores(self, fn) -> tuple:
        """(names given to a cross-entropy or NLL loss of ``fn`` as its input, names given as
        its target): the input is a batch of class scores, ``(N, C)``, whatever computed it
        (``image_logits = ims @ txt.t() * scale``), and the target holds the batch's labels."""
        scores, targets = set(), set()
        for o in all_ops(fn):
            if isinstance(o, CallOp) and o.kind == LOSS and o.info in (catalog.CE, catalog.NLL):
                a, t = o.arg(0, "input"), o.arg(1, "target")
                if a is not None and t is not None and dotted(a.value) and dotted(t.value):
                    scores.add(dotted(a.value))
                    targets.add(dotted(t.value))
        return scores, targets

    def _single_sample_batches(self, fn) -> bool:
        """Every loader iterated in ``fn`` is a ``DataLoader`` with ``batch_size=1`` (the
        default): a flattened argmax of a ``(1, C)`` output is the class index."""
        found = False
        for o in all_ops(fn):
            if not isinstance(o, LoopOp) or o.is_while or o.iter is None:
                continue
            if self.mm.resolver.of_expr(fn, strip_iter_wrappers(o.iter))[0] != catalog.LOADER:
                continue
            for owner, v in self.loader_values(fn, o.iter):
                if not self.is_loader_call(owner, v):
                    return False
                bs = None
                for a in v.args:
                    if a.keyword is not None and a.keyword.value == "batch_size":
                        bs = a.value
                pos = [a for a in v.args if a.keyword is None and not a.star]
                if bs is None and len(pos) > 1:
                    bs = pos[1].value
                if bs is not None and not (isinstance(bs, cst.Integer) and bs.value == "1"):
                    return False
                found = True
        return found

    def _label_names(self, fn) -> set:
        """Names holding batch tensors (loader loop targets and values derived from them)."""
        out = set()
        for o in all_ops(fn):
            if isinstance(o, LoopOp) and not o.is_while and o.target is not None:
                it = strip_iter_wrappers(o.iter)
                role = self.mm.resolver.of_expr(fn, it)[0]
                if role == catalog.LOADER:
                    out |= set(_target_names(o.target))
            elif isinstance(o, AssignOp) and "batch" in o.value_facts:
                for t in o.targets:
                    out |= set(_target_names(t))
        return out


def _target_names(t) -> list:
    if isinstance(t, (cst.Tuple, cst.List)):
        out = []
        for e in t.elements:
            out.extend(_target_names(e.value))
        return out
    if isinstance(t, cst.StarredElement):
        return _target_names(t.value)
    d = dotted(t) if isinstance(t, (cst.Name, cst.Attribute)) else None
    return [d] if d else []


def _within(op, loop: LoopOp) -> bool:
    from .queries import within

    return within(op, loop)


def _dataset_arg(call: cst.Call):
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "dataset":
            return a.value
    pos = [a for a in call.args if a.keyword is None and not a.star]
    return pos[0].value if pos else None


# ================================================================= forward devices
_SHAPE_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout"}
_NON_TENSOR_METHODS = {"size", "dim", "numel", "item", "tolist", "numpy", "element_size", "stride",
                       "is_contiguous", "data_ptr", "get_device", "nelement", "ndimension", "__len__"}
_MOVING_METHODS = {"to", "cuda", "type_as", "to_dense"}
# attributes and methods a tensor has and the other values reaching ``forward`` (lists, dicts,
# PackedSequence, numbers) do not
_TENSOR_ONLY_ATTRS = {"device", "shape", "size", "dim", "unsqueeze", "permute", "contiguous", "masked_fill",
                      "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "is_cuda", "cuda",
                      "type_as", "expand", "bmm", "narrow", "index_select", "softmax", "log_softmax",
                      "float", "long", "half", "detach", "view"}
_SAFE_WITH_CPU_ARG = {"to", "type_as", "new_tensor", "new_zeros", "new_ones", "new_full", "new_empty",
                      "view", "reshape", "expand", "repeat", "size", "split", "chunk", "permute",
                      "expand_as", "view_as", "reshape_as", "__getitem__", "index_put_", "flip", "roll",
                      "transpose", "unflatten", "tile"}
_FACTORIES = catalog.TENSOR_FACTORIES
# the return fact of a function that returns a tensor it creates on the CPU (a summary's
# "returns"; callers' dataflow does not inherit it, see project.RETURN_TOLD)
CPU_TENSOR = "cpu_tensor"
_CPU_TENSOR_MAKERS = {"torch.FloatTensor", "torch.Tensor", "torch.DoubleTensor", "torch.from_numpy",
                      "torch.as_tensor", "torch.HalfTensor"}
_RESHAPES = {"view", "reshape", "unsqueeze", "float", "double", "half", "long", "expand", "t", "repeat",
             "clone", "contiguous", "permute", "transpose", "flip", "sqrt", "log", "exp"}


def _operands(expr) -> list:
    """The leaves of a chain of binary operations (parentheses and comparisons kept whole)."""
    if isinstance(expr, cst.BinaryOperation):
        return _operands(expr.left) + _operands(expr.right)
    return [expr]


def helper_returns_cpu_tensor(mm, op) -> bool:
    """``op`` calls a function of the linted tree (this module or another) whose summary says
    it returns a tensor it creates on the CPU (:meth:`Resources.returns_cpu_tensor`)."""
    s = mm.summary_of(op.info, "ret")
    return bool(s) and CPU_TENSOR in s.get("returns", ())


class _ForwardDevice:
    """A small evaluation of ``forward``'s statements: which values are tensors derived from
    the inputs (``"in"``), which are created on the CPU (a factory node) and where the two
    meet."""

    def __init__(self, res: Resources, fn):
        self.res, self.mm, self.fn = res, res.mm, fn
        self.env: dict = {}
        self.hits: dict = {}
        self.calls = {id(o.node): o for o in all_ops(fn) if isinstance(o, CallOp)}
        self.tensor_params = []
        defaults = fn.defaults
        for p in fn.params:
            if p.startswith("*") or p in ("self", "cls"):
                continue
            ann = fn.annotations.get(p)
            a = (dotted(ann) or "") if ann is not None else ""
            if a in ("int", "bool", "float", "str") or (ann is not None and "int" in
                                                        self.mm.code_for(ann).replace("Tensor", "") and
                                                        "Tensor" not in self.mm.code_for(ann)):
                continue
            dv = defaults.get(p)
            if dv is not None and isinstance(dv, (cst.Integer, cst.Float, cst.SimpleString)) or \
                    isinstance(dv, cst.Name) and dv.value in ("True", "False"):
                continue
            self.tensor_params.append(p)
            self.env[p] = "in"
        self.self_tensors = set()
        cls = fn.cls
        if cls is not None:
            for path, ops in cls.attr_values.items():
                for o in ops:
                    v = o.value
                    if isinstance(v, cst.Call) and self.mm.qualify(dotted(v.func)) in catalog.PARAMETER_CLASSES:
                        self.self_tensors.add(path)
            for m in cls.methods.values():
                for o in walk(m.body):
                    if isinstance(o, CallOp) and o.attr == "register_buffer" and o.args:
                        s = _string_value(o.args[0].value)
                        if s:
                            self.self_tensors.add("self." + s)
        # plain tensor attributes of the module (TL603): what they meet is recorded apart
        self.cpu_attrs: dict = {}
        self.attr_ids: dict = {}
        self.attr_hits: list = []
        self.cur = None
        self._ran = None
        if cls is not None and fn.name == "forward":
            self._cpu_attributes(cls)

    def _cpu_attributes(self, cls) -> None:
        """``self.X = torch.zeros(...)`` (a factory, perhaps reshaped) in ``__init__``, assigned
        nowhere else, in a class that does not move its own tensors (an ``_apply``/``to``
        override)."""
        init = cls.methods.get("__init__")
        if init is None or any(m in cls.methods for m in ("_apply", "to", "cuda")):
            return
        for path, ops in cls.attr_values.items():
            if path in self.self_tensors or path.count(".") != 1 or len(ops) != 1:
                continue
            o = ops[0]
            if id(o) not in {id(x) for x in all_ops(init)} or len(o.targets) != 1 or o.aug is not None:
                continue
            v = o.value
            while isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) \
                    and v.func.attr.value in _RESHAPES and not self.mm.qualify(dotted(v.func)):
                v = v.func.value
            if not isinstance(v, cst.Call):
                continue
            q = self.mm.qualify(dotted(v.func))
            if q not in _FACTORIES or any(a.keyword is not None and a.keyword.value == "device" for a in v.args):
                continue
            if q == "torch.tensor" and (not v.args or v is o.value and not isinstance(
                    v.args[0].value, (cst.List, cst.Tuple, cst.ListComp))):
                continue  # torch.tensor(value): often a 0-dim tensor, which mixes with CUDA ones
            self.cpu_attrs[path] = o

    def run(self) -> list:
        if self._ran is None:
            self.rebound = set()
            self._block(self.fn.body)
            first = self._device_source()
            self._ran = [(node, first) for k, node in self.hits.items() if k not in self.attr_ids]
        return self._ran

    def _device_source(self) -> Optional[str]:
        """The input of ``forward`` whose ``.device`` a fix may read: a tensor by evidence (a
        tensor-only attribute or method used on it: ``x.size(0)``, ``x.device``, ``x.shape``,
        ``x.unsqueeze(1)``...), without a ``None`` default, and never rebound in ``forward`` to a
        value that is not a tensor derived from the inputs.  None when no input qualifies (a
        dict of features, a list of tensors, a PackedSequence): the finding gets no fix."""
        used = set()
        for n in subnodes(self.fn.node):
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.attr.value in _TENSOR_ONLY_ATTRS:
                used.add(n.value.value)
        for p in self.tensor_params:
            dv = self.fn.defaults.get(p)
            if isinstance(dv, cst.Name) and dv.value == "None":
                continue
            if p in used and p not in self.rebound:
                return p
        return None

    def _block(self, block) -> None:
        for op in block:
            self.cur = op
            if isinstance(op, AssignOp):
                if op.value is None:
                    continue
                v = self.ev(op.value)
                if op.aug is not None:
                    t = self.ev(op.targets[0])
                    self._meet(t, v)
                    continue
                for t in op.targets:
                    self._bind(t, op.value, v)
            elif isinstance(op, ReturnOp):
                if op.value is not None:
                    self.ev(op.value)
            elif isinstance(op, CallOp):
                stmt = op.stmt
                if isinstance(stmt, cst.SimpleStatementLine) and any(
                        isinstance(s, cst.Expr) and s.value is op.node for s in stmt.body):
                    self.ev(op.node)
            elif isinstance(op, LoopOp):
                if op.target is not None:
                    self._bind(op.target, None, None)
                self._block(op.body)
                self._block(op.orelse)
            elif isinstance(op, BranchOp):
                for arm in op.arms:
                    self._block(arm)

    def _bind(self, t, value, v) -> None:
        if isinstance(t, (cst.Tuple, cst.List)):
            elts = [e.value for e in t.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elts):
                for te, ve in zip(elts, value.elements):
                    self._bind(te, ve.value, self.ev(ve.value))
            else:
                for te in elts:
                    self._bind(te, None, v if v == "in" else None)
            return
        if isinstance(t, cst.StarredElement):
            return self._bind(t.value, None, None)
        d = dotted(t) if isinstance(t, (cst.Name, cst.Attribute)) else None
        if d:
            self.env[d] = v
            if v != "in":
                self.rebound.add(d)  # an input name now holds something else

    def _meet(self, a, b):
        """Combine two values; a CPU-created tensor meeting an input tensor is a hit."""
        for x, y in ((a, b), (b, a)):
            if isinstance(x, cst.Call) and y == "in":
                if id(x) in self.attr_ids and id(x) not in self.hits:
                    self.attr_hits.append((self.attr_ids[id(x)], self.cpu_attrs[self.attr_ids[id(x)]], self.cur))
                self.hits.setdefault(id(x), x)
                return "in"
        if a == "in" or b == "in":
            return "in"
        if isinstance(a, cst.Call):
            return a
        if isinstance(b, cst.Call):
            return b
        return None

    def ev(self, e):
        tp = type(e)
        if tp is cst.Name or tp is cst.Attribute:
            d = dotted(e)
            if d is not None and d in self.env:
                return self.env[d]
            if d in self.self_tensors:
                return "in"
            if d in self.cpu_attrs:
                node = self.cpu_attrs[d].value
                self.attr_ids[id(node)] = d
                return node
            if tp is cst.Attribute:
                if e.attr.value in _SHAPE_ATTRS:
                    self.ev(e.value)
                    return None
                b = self.ev(e.value)
                return b if e.attr.value in ("T", "mT", "real", "imag", "data") else None
            return None
        if tp is cst.Call:
            return self._call(e)
        if tp is cst.BinaryOperation:
            return self._meet(self.ev(e.left), self.ev(e.right))
        if tp is cst.Comparison:
            r = self.ev(e.left)
            for c in e.comparisons:
                r = self._meet(r, self.ev(c.comparator))
            return r
        if tp is cst.UnaryOperation:
            return self.ev(e.expression)
        if tp is cst.Subscript:
            b = self.ev(e.value)
            for el in e.slice:
                if isinstance(el.slice, cst.Index):
                    self.ev(el.slice.value)
            return b
        if tp is cst.IfExp:
            self.ev(e.test)
            x, y = self.ev(e.body), self.ev(e.orelse)
            return "in" if "in" in (x, y) else (x if isinstance(x, cst.Call) else y)
        if tp in (cst.Tuple, cst.List):
            vals = [self.ev(el.value) for el in e.elements]
            return ("seq", vals)
        return None

    def _args(self, call) -> list:
        out = []
        for a in call.args:
            v = self.ev(a.value)
            if isinstance(v, tuple) and v and v[0] == "seq":
                out.extend(v[1])
            else:
                out.append(v)
        return out

    def _call(self, e: cst.Call):
        op = self.calls.get(id(e))
        q = op.qual if op is not None else self.mm.qualify(dotted(e.func))
        if q in _FACTORIES:
            self._args(e)
            if any(a.keyword is not None and a.keyword.value == "device" for a in e.args):
                return "in"
            if q == "torch.tensor" and e.args and not isinstance(
                    e.args[0].value, (cst.List, cst.Tuple, cst.ListComp, cst.Name, cst.Attribute, cst.Call)):
                return None  # a 0-dim tensor: fine next to CUDA tensors
            if q == "torch.tensor" and e.args and isinstance(e.args[0].value, (cst.Name, cst.Attribute, cst.Call)):
                return None  # torch.tensor(value): shape unknown, often a scalar
            return e
        if op is not None and op.kind == CALL and op.info is not None and helper_returns_cpu_tensor(self.mm, op):
            self._args(e)
            return e  # a function of the tree that returns a tensor it made on the CPU (utils.idx2onehot)
        if isinstance(e.func, cst.Attribute):
            m = e.func.attr.value
            recv = self.ev(e.func.value)
            args = self._args(e)
            if m in _MOVING_METHODS or m == "type" and self._type_of_tensor(e):
                return "in" if recv is not None else None
            if m in _NON_TENSOR_METHODS or m == "cpu":
                return None
            if op is not None and op.kind == FORWARD:
                for a in args:
                    self._meet(a, "in")
                return "in"
            if isinstance(recv, cst.Call):
                if m in _SAFE_WITH_CPU_ARG:
                    return recv
                r = recv
                for a in args:
                    r = self._meet(r, a)
                return r
            if recv == "in":
                if m not in _SAFE_WITH_CPU_ARG:
                    for a in args:
                        self._meet("in", a)
                return "in"
            if q and q.startswith("torch.") or (dotted(e.func) or "").startswith(("F.", "torch.")):
                return self._combine(args)
            return None
        if op is not None and op.kind == FORWARD:
            args = self._args(e)
            for a in args:
                self._meet(a, "in")
            return "in"
        args = self._args(e)
        if q and (q.startswith("torch.") and not q.startswith("torch.nn.init")):
            return self._combine(args)
        return None

    def _type_of_tensor(self, e: cst.Call) -> bool:
        """``x.type(t.type())``: the type string of a tensor ``t`` not made here on the CPU names
        its device (``torch.cuda.FloatTensor``), so ``x`` goes where ``t`` is, as with
        ``x.type_as(t)`` or ``x.to(t)``."""
        a = e.args[0].value if len(e.args) == 1 else None
        if not (isinstance(a, cst.Call) and not a.args and isinstance(a.func, cst.Attribute)
                and a.func.attr.value == "type"):
            return False
        return not isinstance(self.ev(a.func.value), cst.Call)

    def _combine(self, args):
        r = None
        for a in args:
            if a is None or isinstance(a, tuple):
                continue
            r = a if r is None else self._meet(r, a)
        return r


def get(mm) -> Resources:
    r = getattr(mm, "_resources", None)
    if r is None:
        r = Resources(mm)
        mm._resources = r
    return r

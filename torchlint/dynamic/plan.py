"""Which run confirms which finding (parent side; no torch).

For each finding the planner computes the source lines that count as "the finding ran"
(the statement at the anchor line; for TL203 the whole evaluation loop) and how to reach it:

* the **harness**: the finding sits in a function whose parameters have roles the semantic
  model knows (model, loader, optimizer, criterion, scheduler, device, scaler); the child
  imports the module and calls the function with stand-ins;
* the **entry**: the user's command (``--entry``), or, without one, the file itself run as a
  script when it has an ``if __name__ == "__main__":`` block.
"""
from __future__ import annotations

import ast
import os

# codes with a probe, and what the probe looks at
PROBED = {
    "TL101": "optimizer step pre-hooks: gradients present at each step() and backward() order",
    "TL102": "optimizer step pre-hooks and zero_grad wrappers: gradients cleared between backward() and step()",
    "TL103": "gradient snapshots before backward(): gradients left from the previous step",
    "TL104": "backward() wrapper and optimizer step hooks: backward() calls with no step() of the optimizer",
    "TL105": "scheduler step wrapper: scheduler.step() before the first optimizer.step()",
    "TL201": "global forward hooks: model.training and grad mode at each forward",
    "TL202": "global forward hooks: model.training at each training forward",
    "TL203": "global forward hooks: grad mode at each eval-mode forward",
    "TL204": "backward() wrapper: grad mode at backward()",
    "TL301": "anomaly detection and in-place op log: the backward() version-counter error",
    "TL401": "TorchFunctionMode: probabilities reaching cross_entropy",
    "TL402": "TorchFunctionMode: sigmoid outputs reaching binary_cross_entropy_with_logits",
    "TL403": "TorchFunctionMode: non-log-probabilities reaching nll_loss",
    "TL404": "TorchFunctionMode: float class-index targets reaching cross_entropy/nll_loss",
    "TL501": "graph retention: autograd nodes reachable from long-lived variables, step after step",
    "TL502": "graph retention: autograd nodes reachable from long-lived variables, step after step",
    "TL601": "forward pre-hooks and DataLoader taint: batch tensors that reach the model without .to(device)",
    "TL602": "TorchFunctionMode: tensors created without device= inside forward and combined with inputs",
    "TL701": "DataLoader wrapper: the sampler of loaders that feed a backward()",
    "TL702": "TorchFunctionMode: argmax/max without dim on batched tensors",
    "TL801": "set_detect_anomaly wrapper: anomaly detection still on at backward()",
    "TL106": "GradScaler and clip_grad wrappers: gradients clipped while still multiplied by the scale",
    "TL107": "GradScaler and optimizer step hooks: an optimizer step on gradients still multiplied by the scale",
    "TL206": "state_dict()/load_state_dict() wrappers: a kept snapshot that changes with the next step",
    "TL302": "TorchFunctionMode on `.data`: graph tensors cut, in-place writes behind autograd's version counter",
    "TL303": "the trace function: a module's forward() entered without Module.__call__ (its hooks skipped)",
    "TL405": "TorchFunctionMode: log() of softmax/sigmoid outputs",
    "TL703": "normalisation layer constructor wrapper: eps, and its effect on a unit-variance batch",
    "TL108": "optimizer step pre-hooks: steps with no backward() reaching the optimizer's parameters and no gradient",
    "TL109": "backward() wrapper: the graph kept by retain_graph=True, and parameters a step changed before the "
             "next backward() through it",
    "TL205": "Parameter creation order and optimizer step pre-hooks: parameters with gradients that no optimizer "
             "holds, created after the optimizer",
    "TL304": "forward pre-hooks at the finding's line and gradient signatures: the submodule called there gets no "
             "gradient from backward()",
    "TL603": "outermost forward: plain tensor attributes, their absence from state_dict(), Module.to('meta')",
    "TL604": "loss-module forward pre-hooks: the device of weight/pos_weight against the input, and whether the "
             "program moved either",
}
ROLES = ("model", "loader", "optimizer", "loss_fn", "scheduler", "device", "scaler")


class Source:
    """A parsed file: statements by line, enclosing functions."""

    _cache: dict = {}

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                self.text = fh.read()
            self.tree = ast.parse(self.text)
        except (OSError, SyntaxError, ValueError):
            self.text, self.tree = "", None
        self.lines = self.text.splitlines()

    @classmethod
    def of(cls, path: str) -> "Source":
        s = cls._cache.get(path)
        if s is None:
            s = cls(path)
            cls._cache[path] = s
        return s

    def runnable(self) -> bool:
        if self.tree is None:
            return False
        for node in self.tree.body:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "__name__" in test and "__main__" in test:
                    return True
        return False

    def line_text(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""

    def match_lines(self, line: int, code: str) -> list:
        """The lines whose execution counts as reaching the finding."""
        if self.tree is None:
            return [line]
        best = None
        for node in ast.walk(self.tree):
            if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
                if code == "TL203" and isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.lineno == line:
                    return list(range(node.lineno, (node.end_lineno or node.lineno) + 1))
                if best is None or (node.end_lineno - node.lineno) <= (best.end_lineno - best.lineno):
                    best = node
        if best is None:
            return [line]
        if isinstance(best, (ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef, ast.AsyncFor,
                             ast.AsyncWith, ast.AsyncFunctionDef, ast.ClassDef)):
            end = best.body[0].lineno - 1 if best.body else best.lineno
            return list(range(best.lineno, max(best.lineno, end) + 1))
        return list(range(best.lineno, (best.end_lineno or best.lineno) + 1))

    def enclosing(self, line: int):
        """(qualname, FunctionDef node, first line incl. decorators) of the innermost function."""
        if self.tree is None:
            return "", None, 1
        found = ("", None, 1)

        def visit(body, prefix):
            nonlocal found
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        node.lineno <= line <= node.end_lineno or \
                        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list and \
                        node.decorator_list[0].lineno <= line <= node.end_lineno:
                    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                    found = (prefix + node.name, node, first)
                    visit(node.body, prefix + node.name + ".")
                elif isinstance(node, ast.ClassDef) and node.lineno <= line <= node.end_lineno:
                    visit(node.body, prefix + node.name + ".")
                elif isinstance(node, (ast.If, ast.With, ast.Try, ast.For, ast.While)):
                    for field in ("body", "orelse", "finalbody", "handlers"):
                        sub = getattr(node, field, None)
                        if sub:
                            visit([s for s in sub if isinstance(s, ast.stmt)] if field != "handlers"
                                  else [b for h in sub for b in h.body], prefix)
        visit(self.tree.body, "")
        return found

    def function(self, qualname: str):
        if self.tree is None or not qualname:
            return None, None
        parts = qualname.split(".")
        body, cls = self.tree.body, None
        node = None
        for i, p in enumerate(parts):
            node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         and n.name == p), None)
            if node is None:
                return None, None
            if isinstance(node, ast.ClassDef):
                cls = node
            body = node.body
        return (node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None), cls


# ------------------------------------------------------------------ harness specs
def _model_for(path: str):
    """The semantic model of a file (libcst), or None."""
    try:
        import libcst as cst

        from ..model import ModuleModel

        src = Source.of(path)
        mod = cst.parse_module(src.text)
        name = os.path.splitext(os.path.basename(path))[0]
        return ModuleModel(path, path, src.text, mod, name)
    except Exception:
        return None


_MM: dict = {}


def _mm(path):
    if path not in _MM:
        _MM[path] = _model_for(path)
    return _MM[path]


def _roles(mm, fn) -> dict:
    out = {}
    for p in fn.params:
        if p in ("self", "cls"):
            continue
        try:
            role, info = mm.resolver.of_path(fn, p)
        except Exception:
            role, info = None, None
        out[p] = {"role": role if role in ROLES else None, "info": info if isinstance(info, str) else None}
    return out


def _loss_kind(mm, fn, code) -> str:
    from ..model.ir import LOSS, all_ops, CallOp

    kinds = []
    fns = [fn] + list(getattr(fn, "nested", []))
    for f in fns:
        for op in all_ops(f):
            if isinstance(op, CallOp) and op.kind == LOSS and op.info:
                kinds.append(op.info)
    for k in kinds:
        if k in ("cross_entropy", "nll", "bce", "bce_with_logits"):
            return k
    return {"TL402": "bce_with_logits", "TL403": "nll"}.get(code, "unknown" if not kinds else "other")


def _batch_spec(fnode, loader_names) -> dict:
    """How the function's loop unpacks a batch of one of ``loader_names``."""
    for node in ast.walk(fnode):
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
        it = ast.unparse(node.iter)
        if not any(n in it for n in loader_names):
            continue
        target = node.target
        if "enumerate(" in it and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target = target.elts[1]
        if isinstance(target, (ast.Tuple, ast.List)):
            names = [ast.unparse(e) for e in target.elts]
            tg = [i for i, n in enumerate(names) if _is_target_name(n)]
            return {"kind": "tuple", "n": len(names), "targets": tg or [len(names) - 1],
                    "float_targets": [i for i, n in enumerate(names) if _is_float_target(n)]}
        if isinstance(target, ast.Name):
            var = target.id
            keys, idx, unpack = [], set(), 0
            for sub in ast.walk(node):
                if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) and sub.value.id == var:
                    s = sub.slice
                    if isinstance(s, ast.Constant) and isinstance(s.value, str):
                        keys.append(s.value)
                    elif isinstance(s, ast.Constant) and isinstance(s.value, int):
                        idx.add(s.value)
                elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name) and sub.value.id == var \
                        and isinstance(sub.targets[0], ast.Tuple):
                    unpack = len(sub.targets[0].elts)
                    names = [ast.unparse(e) for e in sub.targets[0].elts]
                    tg = [i for i, n in enumerate(names) if _is_target_name(n)]
                    return {"kind": "tuple", "n": unpack, "targets": tg or [unpack - 1]}
                elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and \
                        isinstance(sub.func.value, ast.Name) and sub.func.value.id == var and \
                        sub.func.attr in ("items", "keys", "values"):
                    keys = keys or ["input", "labels"]
            if keys:
                seen = list(dict.fromkeys(keys))
                return {"kind": "dict", "keys": seen, "targets": [k for k in seen if _is_target_name(k)]}
            if idx:
                n = max(idx) + 1
                return {"kind": "tuple", "n": n, "targets": [n - 1] if n > 1 else []}
            return {"kind": "tensor"}
    return {"kind": "tuple", "n": 2, "targets": [1]}


def _iterated(fnode) -> list:
    """Names a loop of the function iterates with a tuple target: `for x, y in data`,
    `for i, (x, y) in enumerate(data)`."""
    out = []
    for node in ast.walk(fnode):
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
        it, target = node.iter, node.target  # noqa: F841
        if isinstance(it, ast.Call) and ast.unparse(it.func) == "enumerate" and it.args:
            it = it.args[0]
            if isinstance(target, ast.Tuple) and len(target.elts) == 2:
                target = target.elts[1]
        if isinstance(it, ast.Name) and isinstance(target, (ast.Tuple, ast.List)):
            out.append(it.id)
    for node in ast.walk(fnode):
        if isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Name) and \
                isinstance(node.target, (ast.Tuple, ast.List)):
            out.append(node.iter.id)
    return out


def _is_float_target(name: str) -> bool:
    n = name.lower()
    return any(w in n for w in ("reg", "score", "value", "float", "rating", "price"))


def _model_outputs(fnode, model_names) -> int:
    """How many values the function unpacks from a model call (``logits, aux = model(x)``)."""
    for node in ast.walk(fnode):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                isinstance(node.targets[0], ast.Tuple):
            if ast.unparse(node.value.func) in model_names:
                return len(node.targets[0].elts)
    return 1


def _is_target_name(name: str) -> bool:
    n = name.lower().split(".")[-1]
    return n in ("y", "yb", "t", "tgt", "gt", "y_true") or "label" in n or "target" in n or n.startswith("y_")


def harness_spec(path: str, scope: str, code: str):
    """A harness job for the function ``scope`` of ``path``, or (None, why not)."""
    if not scope or scope == "<module>":
        return None, "the finding is at module level"
    mm = _mm(path)
    if mm is None:
        return None, "the file could not be analysed"
    fn = next((f for f in mm.all_functions if f.qualname == scope), None)
    if fn is None:
        return None, f"function `{scope}` not found"
    if fn.parent is not None:
        return None, f"`{scope}` is a nested function"
    roles = _roles(mm, fn)
    src = Source.of(path)
    fnode, cnode = src.function(scope)
    if fnode is None:
        return None, f"function `{scope}` not found"
    # a parameter the function's loop unpacks batches from (`for x, y in train_data`) is a loader
    for p in _iterated(fnode):
        if p in roles and roles[p]["role"] is None:
            roles[p] = {"role": "loader", "info": "iterated by a loop that unpacks batches"}
    job = {"kind": "harness", "path": path, "qualname": scope, "params": roles}
    have = {v["role"] for v in roles.values() if v["role"]}
    init_roles = {}
    if fn.cls is not None:
        if mm.class_is_module(fn.cls):
            return _construct_spec(path, scope, fn, code)
        init = fn.cls.methods.get("__init__")
        if init is not None:
            init_roles = _roles(mm, init)
            have |= {v["role"] for v in init_roles.values() if v["role"]}
        job["cls"] = fn.cls.qualname
        job["init_params"] = init_roles
    if not have & {"model", "loader", "optimizer"}:
        return None, f"no parameter of `{scope}` is a model, loader or optimizer"
    # required parameters without a role or a known name cannot be stood in for
    for p, spec in list(roles.items()) + list(init_roles.items()):
        if spec["role"] is None and p not in fn.defaults and not _known_name(p) and \
                not (fn.cls is not None and p in (fn.cls.methods.get("__init__").defaults
                                                  if fn.cls.methods.get("__init__") else {})):
            return None, f"parameter `{p}` of `{scope}` has no role the harness can stand in for"
    loaders = [p for p, s in roles.items() if s["role"] == "loader"]
    loaders += ["self." + p for p, s in init_roles.items() if s["role"] == "loader"]
    if fn.cls is not None:
        loaders += [p.split(".", 1)[1] if p.startswith("self.") else p for p in loaders]
    job["batch"] = _batch_spec(fnode, loaders or ["loader"])
    job["loss"] = _loss_kind(mm, fn, code)
    models = [p for p, s in roles.items() if s["role"] == "model"]
    models += ["self." + p for p, s in init_roles.items() if s["role"] == "model"]
    if fn.cls is not None:
        models += ["self.model", "self.net"]
    job["outputs"] = _model_outputs(fnode, set(models) or {"model"})
    job["tokens"] = "Embedding" in src.text and "nn.Linear" not in src.text
    job["input"] = input_spec(src)
    return job, ""


_SIZE_WORDS = ("channel", "dim", "hidden", "feature", "size", "width", "classes", "vocab", "emb", "units",
               "ch", "nz", "ngf", "ndf", "nc", "heads", "layers", "depth", "filters", "planes", "in_", "out_", "n_")


def _construct_spec(path: str, scope: str, fn, code: str):
    """A finding inside a method of an nn.Module (its __init__ or forward): build the module with
    its defaults (sizes named like sizes get 16), then run a few training steps on a stand-in
    input shaped for its first layer (read from the built module)."""
    if Source.of(path).runnable():  # the program itself builds and feeds its modules: run it instead
        return None, (f"`{scope}` is a method of an nn.Module, and the file runs as a script (which builds "
                      f"and feeds it as the program does)")
    init = fn.cls.methods.get("__init__")
    params = {}
    if init is not None:
        for p in init.params:
            if p in ("self", "cls") or p in init.defaults:
                continue
            n = p.lower()
            if any(w in n for w in _SIZE_WORDS):
                params[p] = 16
            elif "drop" in n or n in ("p", "alpha", "slope"):
                params[p] = 0.1
            elif n.startswith("use_") or n.startswith("is_") or n in ("bias", "affine", "bidirectional"):
                params[p] = False
            else:
                return None, (f"parameter `{p}` of `{fn.cls.qualname}.__init__` has no default and no size-like "
                              f"name the harness can stand in for")
    method = scope.split(".")[-1]
    if method not in ("__init__", "forward"):
        return None, f"`{scope}` is a method of an nn.Module other than __init__ and forward"
    return {"kind": "harness", "construct": True, "path": path, "qualname": scope, "cls": fn.cls.qualname,
            "method": method, "init_args": params, "params": {}}, ""


_LAYERS = {"Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d", "Linear": "linear",
           "Embedding": "tokens", "LSTM": "seq", "GRU": "seq", "RNN": "seq"}


def input_spec(src: "Source") -> dict:
    """The input the program's first layer takes (its model's first Conv/Linear/Embedding/RNN
    with a literal size): how the stand-in batches are shaped.  {} when none is literal."""
    if src.tree is None:
        return {}
    best = None
    for node in ast.walk(src.tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func).split(".")[-1]
        kind = _LAYERS.get(name)
        if kind is None or not node.args or not isinstance(node.args[0], ast.Constant) or \
                not isinstance(node.args[0].value, int) or isinstance(node.args[0].value, bool):
            continue
        key = (node.lineno, node.col_offset)
        if best is None or key < best[0]:
            spec = {"kind": kind, "size": int(node.args[0].value)}
            if kind == "seq":
                spec["batch_first"] = any(k.arg == "batch_first" and isinstance(k.value, ast.Constant)
                                          and k.value.value is True for k in node.keywords)
            best = (key, spec)
    return best[1] if best else {}


_BATCH_INPUTS = ("x", "xb", "inputs", "input", "images", "imgs", "image", "data", "features", "batch_x",
                 "src", "tokens", "input_ids", "x_batch", "samples")


def _known_name(p: str) -> bool:
    n = p.lower()
    return (n in _BATCH_INPUTS or _is_target_name(n) or "epoch" in n or n in _KNOWN
            or "accum" in n or "interval" in n or "every" in n)


_KNOWN = ("steps", "max_steps", "num_steps", "n_steps", "iters", "max_iters", "num_iters", "iterations", "lr",
          "learning_rate", "amp", "use_amp", "verbose", "debug", "clip", "max_norm", "grad_clip", "clip_norm",
          "max_grad_norm", "log_freq", "print_freq")


def scope_of(finding, path: str) -> str:
    if finding.scope:
        return finding.scope
    return Source.of(path).enclosing(finding.line)[0]

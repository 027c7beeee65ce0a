"""Tiny stand-ins for the harness (child side; imports torch).

The parent (:mod:`torchlint.dynamic.plan`) describes the function to call: each parameter's
role, how the loop unpacks a batch, which loss the code uses.  This module builds the
stand-ins on the target device and calls the function.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import types

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

B = 8  # batch size (BatchNorm needs more than one sample)
D = 12  # features of the stand-in inputs
C = 4  # classes


class StandInModel(nn.Module):
    """A small model with dropout and batch norm; its output fits the loss used."""

    def __init__(self, out_shape, outputs=1, loss="cross_entropy"):
        super().__init__()
        self.loss = loss
        self.outputs = max(1, int(outputs))
        self.aux = nn.Linear(16, 1)
        self.emb = nn.Embedding(64, D)
        self.body = nn.Sequential(nn.Linear(D, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(16, C if out_shape == "classes" else 1)
        self.out_shape = out_shape

    def forward(self, *args, **kwargs):
        x = None
        for a in list(args) + [v for k, v in kwargs.items() if not _is_target_name(k)]:
            if isinstance(a, torch.Tensor):
                x = a
                break
        if x is None:
            raise TypeError("the stand-in model got no tensor input")
        if not x.is_floating_point():
            x = self.emb(x.long().clamp(0, 63))
            if x.dim() > 2:
                x = x.mean(dim=1)
        x = x.reshape(x.shape[0], -1) if x.dim() != 2 else x
        if x.shape[1] != D:
            x = nn.functional.adaptive_avg_pool1d(x.unsqueeze(1), D).squeeze(1)
        h = self.body(x)
        y = self.head(h)
        if self.out_shape == "flat":
            y = y.squeeze(1)
        if self.loss == "nll":  # output that fits the loss: log-probabilities for NLLLoss
            y = torch.log_softmax(y, dim=1)
        elif self.loss == "bce":  # probabilities for BCELoss
            y = torch.sigmoid(y)
        if self.outputs > 1:  # extra outputs: one regression value per sample each
            return (y,) + tuple(self.aux(h).squeeze(1) for _ in range(self.outputs - 1))
        return y


def _is_target_name(name: str) -> bool:
    n = name.lower()
    return n in ("y", "yb", "t", "tgt", "gt") or "label" in n or "target" in n or n.startswith("y_")


class _DictDataset(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _target(loss, variant, n):
    if loss in ("cross_entropy", "nll", "other_classes"):
        return torch.randint(0, C, (n,))
    y = (torch.rand(n) > 0.5).float()
    return y.unsqueeze(1) if variant == "column" else y


def make_inputs(spec: dict, n: int, device=None):
    """``n`` inputs shaped for the program's first layer (``plan.input_spec``), or None."""
    kind, size = (spec or {}).get("kind"), int((spec or {}).get("size") or 0)
    if not kind or size <= 0 or size > 4096:
        return None
    if kind == "conv2d":
        return torch.randn(n, size, 32, 32, device=device)
    if kind == "conv1d":
        return torch.randn(n, size, 64, device=device)
    if kind == "conv3d":
        return torch.randn(n, size, 8, 16, 16, device=device)
    if kind == "linear":
        return torch.randn(n, size, device=device)
    if kind == "tokens":
        return torch.randint(0, min(size, 64), (n, 10), device=device)
    if kind == "seq":
        return torch.randn(n, 10, size, device=device)
    return None


def input_for(module: nn.Module, n: int = B, device=None):
    """An input for a built module, shaped for its first layer; (tensor, description)."""
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and not isinstance(m, nn.modules.conv._ConvTransposeNd):
            c = m.in_channels
            shape = {nn.Conv1d: (n, c, 64), nn.Conv2d: (n, c, 32, 32), nn.Conv3d: (n, c, 8, 16, 16)}[type(m)] \
                if type(m) in (nn.Conv1d, nn.Conv2d, nn.Conv3d) else (n, c, 32, 32)
        elif isinstance(m, nn.modules.conv._ConvTransposeNd):
            shape = (n, m.in_channels) + (4,) * (len(m.kernel_size))
        elif isinstance(m, nn.Linear):
            shape = (n, m.in_features)
        elif isinstance(m, nn.Embedding):
            return torch.randint(0, min(m.num_embeddings, 64), (n, 10), device=device), \
                f"integer indices below {min(m.num_embeddings, 64)} of shape [{n}, 10] (its Embedding)"
        elif isinstance(m, nn.RNNBase):
            shape = (n, 10, m.input_size) if m.batch_first else (10, n, m.input_size)
        elif isinstance(m, (nn.modules.batchnorm._NormBase,)) and getattr(m, "num_features", 0):
            shape = {nn.BatchNorm1d: (n, m.num_features)}.get(type(m), (n, m.num_features, 16, 16))
        else:
            continue
        return torch.randn(*shape, device=device), f"a float batch of shape {list(shape)} (its {type(m).__name__})"
    return None, "no layer to shape an input for"


def construct(job: dict, device: str, steps: int, probes, emit) -> str:
    """Build the nn.Module class of the finding and, for a finding in forward, run a few
    training steps on it with a stand-in input (the loss is the mean of its float outputs)."""
    mod = import_module(job["path"])
    cls = mod
    for part in job["cls"].split("."):
        cls = getattr(cls, part)
    kwargs = dict(job.get("init_args") or {})
    dev = torch.device(device)
    emit("harness", variant="construct", call=f"{job['cls']}({', '.join(f'{k}={v}' for k, v in kwargs.items())})")
    model = cls(**kwargs)
    if job.get("method") == "__init__":
        return "ok"
    model = model.to(dev).train()
    probes.suspended += 1
    try:
        x, what = input_for(model, B, dev)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad] or [nn.Parameter(torch.zeros(1))],
                              lr=0.01)
    finally:
        probes.suspended -= 1
    if x is None:
        raise TypeError(f"the stand-in input for {job['cls']}: {what}")
    emit("harness", variant="construct", call=f"{job['cls']}(...)({what}) for {max(3, steps)} training steps")
    for _ in range(max(3, steps)):
        out = model(x)
        ts = [t for t in _flat(out) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
        if not ts:
            return "ok"
        opt.zero_grad()
        sum(t.float().mean() for t in ts).backward()
        opt.step()
    return "ok"


def _flat(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flat(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _flat(o)


def make_loader(batch: dict, loss: str, variant: str, steps: int, tokens: bool = False, device=None,
                inputs: dict = None):
    """Random batches shaped as the loop unpacks them, on the CPU as a dataset yields them, or
    already on ``device`` (for a function that never moves its batches: its caller's data
    pipeline would have); the inputs shaped for the program's first layer when it is known."""
    n = B * 2 * max(3, steps)  # as many batches as one capped loader pass of a real run
    kind = batch.get("kind", "tuple")
    x = make_inputs(inputs, n, device)
    if x is None:
        x = torch.randint(0, 64, (n, 10), device=device) if tokens else torch.randn(n, D, device=device)
    y = _target(loss, variant, n).to(x.device)
    if kind == "dict":
        keys = batch.get("keys") or ["x", "y"]
        targets = set(batch.get("targets") or [k for k in keys if _is_target_name(k)])
        items = []
        for i in range(n):
            d = {}
            for k in keys:
                d[k] = y[i] if k in targets else x[i]
            items.append(d)
        return DataLoader(_DictDataset(items), batch_size=B)
    if kind == "tensor":
        return DataLoader(TensorDataset(x), batch_size=B, collate_fn=lambda b: torch.stack([t[0] for t in b]))
    size = max(1, int(batch.get("n", 2)))
    tidx = set(batch.get("targets", [size - 1] if size > 1 else []))
    fidx = set(batch.get("float_targets") or [])
    cols = [(torch.randn(n, device=x.device) if i in fidx else y) if i in tidx else x for i in range(size)]
    return DataLoader(TensorDataset(*cols), batch_size=B)


def make_criterion(loss: str):
    return {"cross_entropy": nn.CrossEntropyLoss, "nll": nn.NLLLoss, "bce": nn.BCELoss,
            "bce_with_logits": nn.BCEWithLogitsLoss, "other": nn.MSELoss}.get(loss, nn.CrossEntropyLoss)()


def import_module(path: str):
    d = os.path.dirname(os.path.abspath(path))
    if d not in sys.path:
        sys.path.insert(0, d)
    name = "_torchlint_dyn_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _resolve(mod, qualname: str):
    obj = mod
    owner = None
    for part in qualname.split("."):
        owner = obj
        obj = getattr(obj, part)
    return owner, obj


def build_args(fn, spec: dict, env: dict) -> dict:
    """Keyword arguments for ``fn`` from the roles in ``spec``; raises ValueError if one is missing."""
    sig = inspect.signature(fn)
    kwargs = {}
    models = 0
    for name, p in sig.parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        role = (spec.get(name) or {}).get("role")
        v = env.get(role) if role else None
        if role == "model":
            if models and "new_model" in env:
                # a stand-in of its own for each further model (a frozen encoder and its head)
                v = env["new_model"]()
            models += 1
        if role == "loader" and "loader" in env:
            v = env["loader"]
        if v is None and role is None:
            v = _by_name(name, env)
        if v is None:
            if p.default is not p.empty:
                continue
            raise ValueError(f"parameter `{name}` has no role the harness can stand in for")
        kwargs[name] = v
    return kwargs


_INPUTS = ("x", "xb", "inputs", "input", "images", "imgs", "image", "data", "features", "batch_x",
           "src", "tokens", "input_ids", "x_batch", "samples")


def _by_name(name, env):
    n = name.lower()
    if n in _INPUTS:
        return env["batch"][0]
    if _is_target_name(n):
        return env["batch"][-1]
    if "epoch" in n and n not in ("epoch", "cur_epoch", "current_epoch"):
        return 2
    if n in ("epoch", "cur_epoch", "current_epoch"):
        return 0
    if n in ("steps", "max_steps", "num_steps", "n_steps", "iters", "max_iters", "num_iters", "iterations"):
        return env["steps"]
    if "accum" in n:
        return 2
    if "interval" in n or "every" in n or n in ("log_freq", "print_freq"):
        return 1
    if n in ("clip", "max_norm", "grad_clip", "clip_norm", "max_grad_norm"):
        return 1.0
    if n in ("lr", "learning_rate"):
        return 0.01
    if n in ("amp", "use_amp", "verbose", "debug"):
        return False
    return None


def run(job: dict, device: str, steps: int, probes, emit) -> str:
    """Call the job's function with stand-ins; returns a status string. Raises what the code raises."""
    if job.get("construct"):
        return construct(job, device, steps, probes, emit)
    mod = import_module(job["path"])
    owner, fn = _resolve(mod, job["qualname"])
    loss0 = job.get("loss") or "unknown"
    if loss0 in ("cross_entropy", "nll"):
        variants = [("classes", loss0)]
    elif loss0 == "unknown" and (job.get("batch") or {}).get("float_targets"):
        # the criterion is a parameter and the targets are named like regression values
        variants = [("column", "other"), ("flat", "other"), ("classes", "cross_entropy")]
    elif loss0 == "unknown":  # the criterion is a parameter: classification first, then regression
        variants = [("classes", "cross_entropy"), ("column", "other"), ("flat", "other")]
    else:
        variants = [("column", loss0), ("flat", loss0)]
    dev = torch.device(device)
    # the stand-in model is on the target device; a function that never moves its batches gets
    # them on that device too (a retry after a device mismatch), unless a device rule is being
    # confirmed there: then the mismatch is the observation
    may_move_data = dev.type != "cpu" and not {"TL601", "TL602"} & set(job.get("codes") or ())
    # the inputs shaped for the program's first layer first (when its size is literal), then the
    # stand-in model's own width
    shapes = [True, False] if job.get("input") else [False]
    attempts = [(v, l, False, sh) for sh in shapes for v, l in variants]
    last_exc = None
    vi = 0
    while vi < len(attempts):
        variant, loss, data_on_dev, use_shape = attempts[vi]
        probes.suspended += 1
        try:
            model = StandInModel("classes" if variant == "classes" else variant, job.get("outputs", 1), loss).to(dev)
            tokens = bool(job.get("tokens"))
            ddev = dev if data_on_dev else None
            shape = job.get("input") if use_shape else None
            loader = make_loader(job.get("batch") or {}, loss, variant, steps, tokens, ddev, shape)
            val_loader = make_loader(job.get("batch") or {}, loss, variant, steps, tokens, ddev, shape)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

            def new_model(variant=variant, loss=loss, opt=opt):
                m = StandInModel("classes" if variant == "classes" else variant, job.get("outputs", 1), loss).to(dev)
                opt.add_param_group({"params": list(m.parameters())})  # the optimizer steps it too
                return m
            env = {"model": model, "optimizer": opt, "loss_fn": make_criterion(loss), "device": dev,
                   "scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9),
                   "scaler": torch.amp.GradScaler(dev.type, enabled=dev.type == "cuda"),
                   "loader": loader, "val_loader": val_loader, "steps": steps, "dataset": loader.dataset,
                   "new_model": new_model}
            first = next(iter(loader))
            env["batch"] = list(first) if isinstance(first, (list, tuple)) else [first]
            target = fn
            if job.get("cls"):
                cls = getattr(mod, job["cls"].split(".")[0])
                init_kwargs = build_args(cls.__init__, job.get("init_params") or {}, env)
                inst = cls(**init_kwargs)
                target = getattr(inst, job["qualname"].split(".")[-1])
            kwargs = build_args(target, job.get("params") or {}, env)
            for name, spec in (job.get("params") or {}).items():
                if spec.get("role") == "loader" and name in kwargs and _is_val_name(name):
                    kwargs[name] = val_loader
        finally:
            probes.suspended -= 1
        shaped = job.get("input") if use_shape else None
        emit("harness", variant=variant + (" (data on device)" if data_on_dev else "")
             + (f" (inputs for its first {shaped['kind']} layer of size {shaped['size']})" if shaped else ""),
             call=f"{job['qualname']}({', '.join(kwargs)})")
        before = probes.backwards
        try:
            target(**kwargs)
            return "ok"
        except Exception as exc:
            if probes.backwards == before and may_move_data and not data_on_dev and _device_error(exc):
                # the function feeds its batches as they come: its caller would have put them on
                # the model's device; try again with the stand-in data there
                emit("discard", variant=variant, error=f"{type(exc).__name__}: {str(exc)[:200]}")
                attempts.insert(vi + 1, (variant, loss, True, use_shape))
                last_exc = exc
                vi += 1
                continue
            if vi + 1 < len(attempts) and probes.backwards == before and _shape_error(exc):
                # a shape or dtype mismatch of the stand-ins: try the next variant
                emit("discard", variant=variant, error=f"{type(exc).__name__}: {str(exc)[:200]}")
                last_exc = exc
                vi += 1
                continue
            raise
    if last_exc is not None:
        raise last_exc
    return "ok"


def _is_val_name(name):
    n = name.lower()
    return "val" in n or "test" in n or "eval" in n


def _shape_error(exc) -> bool:
    """A stand-in that does not fit the code: wrong shape, or a dtype the loss does not take
    (the wording differs between torch versions and devices)."""
    m = str(exc).lower()
    return any(w in m for w in ("size", "shape", "dimension", "mismatch", "target", "scalar type", "dtype",
                                "not implemented for"))


def _device_error(exc) -> bool:
    m = str(exc)
    return "same device" in m or "Expected all tensors" in m or ("device" in m and "cpu" in m)


def namespace(**kw):
    return types.SimpleNamespace(**kw)

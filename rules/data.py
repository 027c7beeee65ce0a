"""Data: training batches must be shuffled, predictions taken per sample."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from torchlint.model import resources
from torchlint.model.binder import dotted
from torchlint.model.ir import AssignOp, CallOp, LoopOp, all_ops, walk
from torchlint.rule import Report, Rule

from . import register


def _binding_names(mm, res, info):
    """[(function, path)] the loader is bound to, following ``return`` into callers."""
    out = []
    for f, path in res.loader_bindings(info):
        if path != "<return>":
            out.append((f, path))
            continue
        out.append((f, "<return>"))
        for caller, cop in mm.callers(f):
            for o in walk(caller.body):
                if isinstance(o, AssignOp) and o.stmt is cop.stmt and o.value is not None and o.aug is None:
                    for t in o.targets:
                        d = dotted(t)
                        if d:
                            out.append((caller, d))
                        elif isinstance(t, (cst.Tuple, cst.List)):
                            idx = _returned_index(f, info)
                            elts = [e.value for e in t.elements]
                            if idx is not None and idx < len(elts) and dotted(elts[idx]):
                                out.append((caller, dotted(elts[idx])))
    return out


def _returned_names(mm, bindings):
    """[(caller, path)] a name bound to the loader reaches when its function returns it
    (``train_dl = DataLoader(...)``; ``return train_dl``; ``train_dl = self.initTrainDl()``)."""
    from torchlint.model.ir import ReturnOp

    out = []
    for f, p in bindings:
        if p == "<return>":
            continue
        idx = None  # ``return train_dl, val_dl``: the position of the loader in the tuple
        for o in all_ops(f):
            if isinstance(o, ReturnOp) and o.value is not None:
                if dotted(o.value) == p:
                    idx = -1
                elif isinstance(o.value, cst.Tuple):
                    idx = next((i for i, el in enumerate(o.value.elements) if dotted(el.value) == p), idx)
        if idx is None:
            continue
        for caller, cop in mm.callers(f):
            for o in walk(caller.body):
                if isinstance(o, AssignOp) and o.stmt is cop.stmt and o.value is not None and o.aug is None:
                    for t in o.targets:
                        if idx < 0 and dotted(t):
                            out.append((caller, dotted(t)))
                        elif idx >= 0 and isinstance(t, (cst.Tuple, cst.List)) and idx < len(t.elements) \
                                and dotted(t.elements[idx].value):
                            out.append((caller, dotted(t.elements[idx].value)))
    return out


def _returned_index(f, info):
    from torchlint.model.ir import ReturnOp

    for o in all_ops(f):
        if isinstance(o, ReturnOp) and isinstance(o.value, (cst.Tuple, cst.List)):
            for i, el in enumerate(o.value.elements):
                if resources.contains(el.value, info.op.node):
                    return i
                d = dotted(el.value)
                if d and any(p == d for ff, p in _local_bindings(f, info)):
                    return i
    return None


def _local_bindings(f, info):
    for o in all_ops(f):
        if isinstance(o, AssignOp) and o.value is not None and resources.contains(o.value, info.op.node):
            for t in o.targets:
                if dotted(t):
                    yield f, dotted(t)


def training_verdict(mm, res, info):
    """(is a training loader, reason) for a DataLoader construction."""
    bindings = _binding_names(mm, res, info)
    names = [p for _f, p in bindings if p != "<return>"]
    if any(p == "<return>" for _f, p in bindings):
        names.append(info.fn.name)
    if info.fn.name == "train_dataloader" and any(p == "<return>" for _f, p in bindings):
        return True, "it is returned by the `train_dataloader` hook"
    if any(resources.is_eval_name_word(n) for n in names) and not any(resources.is_train_name(n) for n in names):
        return False, ""
    shuffles = res.dataset_shuffling_methods(info)
    if shuffles and any(res.loader_reshuffles(f, p, info.op.node if f is info.fn else None) & shuffles
                        for f, p in bindings + _returned_names(mm, bindings) if p != "<return>"):
        return False, ""  # its dataset permutes its own samples every epoch (dataset.shuffleSamples())
    sites = []
    for o in walk(info.fn.body):
        if isinstance(o, LoopOp) and not o.is_while and o.iter is not None and \
                resources.contains(o.iter, info.op.node):
            sites.append((info.fn, o))
    escapes = any(p == "<return>" for _f, p in bindings)
    for f, p in bindings:
        if p != "<return>":
            sites.extend(s for s in res.loader_sites(f, p, bind_node=info.op.node)
                         if res.reaches_site(f, p, info.op.node, s))
            escapes = escapes or res.loader_escapes(f, p, info.op.node)
    for f, p in _returned_names(mm, bindings):  # the callers of the function that returns it
        sites.extend(res.loader_sites(f, p))
    trains = [s for s in sites if s[1] == "train" or isinstance(s[1], LoopOp) and res.loop_trains(s[0], s[1])]
    if trains:
        return True, "it is iterated by a loop that runs `backward()`"
    if any(s[1] == "fit" for s in sites):
        return True, "a trainer is given it as its training data"
    if not escapes or not mm.has_unseen_code:
        # a training loader on evidence, not on its name: a `dataloader_train_kNN` that only
        # fills a kNN feature bank, or a `train_dataloader` handed to `trainer.validate`
        return False, ""
    # a notebook cell that does not parse may train on it: there the name is all there is
    # (a pass that only precomputes the dataset another loader trains on reads it like an evaluation)
    evals = [s for s in sites if s[1] == "eval" or isinstance(s[1], LoopOp) and (
        res.loop_evaluates(s[0], s[1]) or res.loop_precomputes_dataset(s[0], s[1]))]
    train_named = [n for n in names if resources.is_train_name(n)]
    if train_named and not (sites and len(evals) == len(sites)):
        return True, f"it is named `{train_named[0].rsplit('.', 1)[-1]}` and a cell that does not parse may train on it"
    return False, ""


@register
class TrainLoaderWithoutShuffle(Rule):
    code = "TL701"
    name = "train-loader-without-shuffle"
    summary = "A training `DataLoader` neither shuffles nor uses a sampler."
    why = (
        "Without `shuffle=True` (or a sampler) a `DataLoader` yields the dataset in the same "
        "order every epoch. Datasets are often stored sorted (by class, by source, by length), "
        "so batches are highly correlated, batch-norm statistics are skewed and SGD sees the "
        "same sequence of gradients each epoch: the model trains worse, or learns the order, "
        "and nothing reports it. `shuffle` defaults to `False`."
    )
    example = """\
train_loader = DataLoader(train_set, batch_size=64)
for epoch in range(num_epochs):
    for x, y in train_loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
"""
    use_instead = """\
train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
for epoch in range(num_epochs):
    for x, y in train_loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
"""
    known_problems = (
        "Loaders with a `sampler=`/`batch_sampler=` (distributed training), over an "
        "`IterableDataset` or a dataset that shuffles itself (a dataset class whose own method "
        "permutes its samples, called on the loader's dataset every epoch: "
        "`train_dl.dataset.shuffleSamples()`; a Hugging Face split reshuffled with "
        "`.shuffle(seed)` before the loader is built), whose one batch holds the whole dataset "
        "(`batch_size=len(ds)`, or a size known from literal samples: the four rows of an XOR "
        "table with `batch_size=1000`; a one-item list), over the synthetic random data of a test "
        "helper (a dataset of `torch.randn` draws under `tests/`), with `shuffle=` set from a "
        "variable, or built from `**kwargs` are not flagged. A loader is a training loader on "
        "evidence, not on its name: its batches reach `backward()` (here, through the helpers "
        "it is passed to or the callers of a function that returns it) or a trainer is given it "
        "as its training data (`trainer.fit(model, loader)`, `train_dataloader=loader`). "
        "So validation and test loaders, a `train_loader_knn` that only fills a kNN feature "
        "bank, a `train_dataloader` handed to `trainer.validate`, one batch shown or statistics "
        "computed are not flagged, and neither is a loader handed to code whose use of it is "
        "not seen (a module-level loader that other modules import and train on, a custom "
        "trainer taking it positionally). Only where a notebook cell that does not parse may "
        "train on it does a `train`-named loader count as one, unless every loop seen over it "
        "evaluates or only precomputes the dataset of another loader (a frozen backbone's "
        "features collected with their labels into the `FeaturesDataset` a shuffled loader "
        "trains on)."
    )
    fix_safety = "unsafe"
    fix_doc = ("Adds `shuffle=True` (or turns `shuffle=False` into `shuffle=True`). Unsafe: "
               "code that relies on the order (sequence windows that must stay contiguous, "
               "predictions matched to dataset indices) changes behaviour.")
    references = ("https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader",)
    triggers = (b"DataLoader",)

    def check(self, mm):
        res = resources.get(mm)
        for info in res.loader_constructions():
            if info.unknown or info.sampler or info.iterable or info.full_batch or info.random_samples:
                continue
            if info.shuffle is True or (info.shuffle is None and info.shuffle_arg is not None):
                continue
            training, reason = training_verdict(mm, res, info)
            if not training:
                continue
            how = "sets `shuffle=False`" if info.shuffle is False else "does not shuffle"
            yield Report(info.op.node, f"this training loader ({reason}) {how} and has no sampler, so "
                         "every epoch sees the batches in the same order; pass `shuffle=True`",
                         fix=_fix_701(info), scope=info.fn.qualname)


def _fix_701(info):
    def make(mm):
        from torchlint.fixes import add_keyword, replace_node

        if info.shuffle_arg is not None:
            return replace_node(mm, info.shuffle_arg.value, "True", "Shuffle: `shuffle=True`", "unsafe")
        return add_keyword(mm, info.op.node, "shuffle=True", "Shuffle: `shuffle=True`", "unsafe")
    return make


@register
class ArgmaxWithoutDim(Rule):
    code = "TL702"
    name = "argmax-without-dim"
    summary = "`argmax()`/`max()` without `dim` on batched outputs compared with labels."
    why = (
        "Without `dim`, `argmax()` flattens the tensor and returns one index into the whole "
        "batch, not one class per sample. Compared with the labels it broadcasts to a "
        "meaningless accuracy (usually close to 0 or to the frequency of one class) instead "
        "of raising an error. `max()` without `dim` likewise returns the single largest value."
    )
    example = """\
model.eval()
correct = 0
with torch.no_grad():
    for x, y in val_loader:
        logits = model(x)
        correct += (logits.argmax() == y).sum().item()
"""
    use_instead = """\
model.eval()
correct = 0
with torch.no_grad():
    for x, y in val_loader:
        logits = model(x)
        correct += (logits.argmax(dim=1) == y).sum().item()
"""
    known_problems = ("Only outputs of models (or their softmax/log-softmax) compared with "
                      "loader batches are checked; a deliberate flattened argmax (an action "
                      "index for one state) is not compared with labels and not flagged.")
    fix_safety = "unsafe"
    fix_doc = ("Adds `dim=1` to `argmax()` (the class dimension of `(N, C)` and `(N, C, ...)` "
               "outputs, as `CrossEntropyLoss` expects). Unsafe: for outputs laid out "
               "differently (sequence models with classes last, `(B, T, C)`) the right "
               "dimension is `-1`. `max()` gets no fix (with `dim` it returns a pair).")
    references = ("https://pytorch.org/docs/stable/generated/torch.argmax.html",)
    triggers = (b"argmax", b".max(")

    def check(self, mm):
        res = resources.get(mm)
        for fn in mm.all_functions:
            if fn.name == "forward":
                continue
            for op in res.flat_argmax_compares(fn):
                name = "argmax" if "argmax" in (op.attr or op.qual or "") else "max"
                yield Report(op.node, f"`{name}()` without `dim` flattens the batch into one index, so "
                             "comparing it with the labels measures nothing; pass `dim=1`",
                             fix=_fix_702(op) if name == "argmax" else None, scope=fn.qualname)


def _fix_702(op):
    def make(mm):
        from torchlint.fixes import add_keyword

        return add_keyword(mm, op.node, "dim=1", "Take the argmax per sample: `dim=1`", "unsafe")
    return make


# ------------------------------------------------------------------ TL703
# Normalisation layers whose second positional parameter is ``eps`` (not ``momentum``).
_EPS_SECOND = {f"torch.nn.{n}" for n in (
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d")}
_PLAUSIBLE_EPS = 1e-3


def _number(e) -> Optional[float]:
    """The value of a numeric literal (``0.8``, ``8e-1``), else ``None``."""
    if isinstance(e, (cst.Float, cst.Integer)):
        try:
            return float(e.evaluated_value)
        except (TypeError, ValueError):
            return None
    return None


@register
class BatchNormEpsPositional(Rule):
    code = "TL703"
    name = "batchnorm-eps-positional"
    summary = "A normalisation layer gets a large second positional argument, which is `eps`, not `momentum`."
    why = (
        "The signature is `nn.BatchNorm2d(num_features, eps=1e-05, momentum=0.1, ...)`. "
        "`nn.BatchNorm2d(128, 0.8)` — a line copied into many GAN implementations from Keras's "
        "`BatchNormalization(momentum=0.8)` — sets `eps=0.8`: every activation is divided by "
        "`sqrt(var + 0.8)` instead of `sqrt(var)`, so layers with small variance are barely "
        "normalised, and the model trains and evaluates differently from what the author meant, "
        "without an error."
    )
    example = """\
import torch.nn as nn

def up_block(in_ch, out_ch):
    return nn.Sequential(
        nn.ConvTranspose2d(in_ch, out_ch, 4, stride=2, padding=1),
        nn.BatchNorm2d(out_ch, 0.8),
        nn.LeakyReLU(0.2, inplace=True),
    )
"""
    use_instead = """\
import torch.nn as nn

def up_block(in_ch, out_ch):
    return nn.Sequential(
        nn.ConvTranspose2d(in_ch, out_ch, 4, stride=2, padding=1),
        nn.BatchNorm2d(out_ch, momentum=0.8),  # or 0.2: Keras's momentum is 1 - PyTorch's
        nn.LeakyReLU(0.2, inplace=True),
    )
"""
    known_problems = ("Only numeric literals are checked; a second positional argument of "
                      f"{_PLAUSIBLE_EPS:g} or less is taken as a deliberate epsilon.")
    fix_safety = "unsafe"
    fix_doc = ("Passes the value as `momentum=` instead. Unsafe: the author's intent is unknown "
               "(Keras's `momentum=0.8` corresponds to PyTorch's `momentum=0.2`); review the value.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html",)
    triggers = (b"Norm",)

    def check(self, mm):
        for fn in mm.all_functions:
            for op in all_ops(fn):
                if not isinstance(op, CallOp) or op.qual not in _EPS_SECOND:
                    continue
                if any(a.star for a in op.args):
                    continue
                positional = [a for a in op.args if a.keyword is None]
                if len(positional) < 2:
                    continue
                value = _number(positional[1].value)
                if value is None or value <= _PLAUSIBLE_EPS:
                    continue
                layer = op.qual.rsplit(".", 1)[-1]
                literal = positional[1].value.value
                yield Report(
                    positional[1].value,
                    f"`{layer}(..., {literal})` sets `eps={literal}`, not `momentum`: the second "
                    "positional argument is `eps`; pass `momentum=` (or `eps=`) by keyword",
                    fix=(_momentum_keyword_fix(positional[1].value, literal)
                         if len(positional) == 2 and op.keyword("momentum") is None else None),
                )


def _momentum_keyword_fix(node, literal):
    def make(mm):
        from torchlint.fixes import replace_node

        return replace_node(mm, node, f"momentum={literal}",
                            f"Pass `{literal}` as `momentum=` (review the value)", "unsafe")
    return make

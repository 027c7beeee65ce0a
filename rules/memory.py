"""Memory: values kept across training iterations must not keep their autograd graphs."""
from __future__ import annotations

import libcst as cst

from torchlint.model import resources
from torchlint.model.binder import dotted
from torchlint.model.ir import GRAD_OFF
from torchlint.model.queries import analysable_functions
from torchlint.rule import Report, Rule

from . import register


def _graph_accumulations(mm):
    """(function, accumulation, is_loss) for graph values kept across training iterations."""
    res = resources.get(mm)
    for fn in analysable_functions(mm):
        for acc in res.accumulations(fn):
            if not (acc.facts & {"graph", "holds_loss"}) or not acc.loops:
                continue
            if acc.op.grad == GRAD_OFF or fn.decorator_grad == GRAD_OFF:
                continue
            if not res.loop_trains(fn, acc.loops[0]):
                continue
            if res.consumed_by_backward(acc) or res.within_one_step(acc):
                continue
            yield fn, acc, _is_loss(acc)
    for fn in mm.all_functions:
        for acc in res.step_accumulations(fn):  # a Lightning ``training_step``: one iteration per call
            if not (acc.facts & {"graph", "holds_loss"}) or acc.op.grad == GRAD_OFF:
                continue
            yield fn, acc, _is_loss(acc)


def _is_loss(acc) -> bool:
    """The kept value is a loss (or holds one), by its facts or, failing those, by its name."""
    vname = dotted(acc.value) if isinstance(acc.value, (cst.Name, cst.Attribute)) else ""
    return bool(acc.facts & {"loss", "holds_loss"}) or "loss" in (vname or "").rsplit(".", 1)[-1].lower()


def _wrap(code: str, node, method: str) -> str:
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return f"{code}{method}"
    return f"({code}){method}"


@register
class LossAccumulatedWithGraph(Rule):
    code = "TL501"
    name = "loss-accumulated-with-graph"
    summary = "A loss that requires grad is summed or stored across training iterations."
    why = (
        "A loss tensor carries its autograd graph. `total_loss += loss` makes `total_loss` a "
        "tensor whose graph links every iteration's loss, and `losses.append(loss)` keeps every "
        "iteration's loss object alive: the graph nodes of the whole epoch stay in memory (GPU "
        "memory creeps up until it runs out) and every later operation on the total is "
        "recorded too. The PyTorch FAQ lists this as the first cause of out-of-memory errors "
        "in training loops. Only the number is wanted: take `loss.item()` (or `.detach()`)."
    )
    example = """\
total_loss = 0.0
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total_loss += loss
"""
    use_instead = """\
total_loss = 0.0
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total_loss += loss.item()
"""
    known_problems = (
        "Values that are meant to keep their graph are not flagged: a list of losses (or "
        "per-episode log-probabilities) that a `backward()` later in the same function "
        "consumes, `loss = loss + aux_loss` before `backward()`, and anything under "
        "`torch.no_grad()`. Nor is a local sum over the `range(k)` gradient-accumulation passes "
        "of one optimizer step (fresh at each call, the step after that loop, not returned or "
        "stored): it holds a few passes' graphs until the function returns."
    )
    fix_safety = "unsafe"
    fix_doc = (
        "Running totals (`total += loss`, `total = total + loss`) become `total += loss.item()`; "
        "this fix is marked safe when every other use of the total (and of values computed "
        "from it) in the function is as a number: arithmetic, comparisons, f-strings, "
        "`print`/`float`/`round`, logging calls such as `writer.add_scalar`, and the losses "
        "are not built with `reduction='none'`. Otherwise (the total is returned, has methods "
        "called on it, is passed elsewhere) it becomes `total += loss.detach()`, marked unsafe: "
        "the total stays a tensor, but any code that differentiated through it would change. "
        "Appends and dict stores get `.detach()` (unsafe for the same reason)."
    )
    references = ("https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory",)
    triggers = (b"backward",)

    def check(self, mm):
        for fn, acc, is_loss in _graph_accumulations(mm):
            if not is_loss:
                continue
            what = "summed into" if acc.how in ("aug", "selfadd") else "stored in"
            if acc.how == "method":  # ``meter.update(loss)``: the method adds it to the meter
                what = f"passed to `{acc.op.func}()`, which adds it into an attribute of"
            if "holds_loss" in acc.facts and "graph" not in acc.facts:
                code = mm.code_for(acc.value)
                yield Report(acc.op.node,
                             f"`{code}` holds a loss that requires grad "
                             f"and is {what} `{acc.container}` across training iterations, keeping "
                             "every iteration's autograd graph alive; store the loss item "
                             "`.detach()`ed (or `.item()`)", scope=fn.qualname)
                continue
            origin = mm.value_origin(fn, getattr(acc.op, "value", None))
            via = f" (the loss returned by {origin})" if origin else ""
            yield Report(acc.op.node,
                         f"a loss that requires grad{via} is {what} `{acc.container}` across training "
                         "iterations, keeping every iteration's autograd graph alive; use "
                         "`.item()` (or `.detach()`)", fix=_fix_501(fn, acc), scope=fn.qualname)


def _fix_501(fn, acc):
    def make(mm):
        from torchlint.fixes import replace_node

        res = resources.get(mm)
        code = mm.code_for(acc.value)
        if acc.how in ("aug", "selfadd"):
            if acc.how == "selfadd":
                v = acc.value
                other = v.right if dotted(v.left) == acc.container else v.left
                node = other
            else:
                node = acc.value
            code = mm.code_for(node)
            scalar = "reduction='none'" not in mm.text and 'reduction="none"' not in mm.text
            if scalar and res.number_only_uses(fn, acc.container, exclude=()):
                return replace_node(mm, node, _wrap(code, node, ".item()"),
                                    f"Accumulate `{code}.item()` (a number) instead", "safe")
            return replace_node(mm, node, _wrap(code, node, ".detach()"),
                                f"Accumulate `{code}.detach()` instead", "unsafe")
        if acc.how == "extend" or resources.last_item_backward(fn, acc) is not None:
            return None  # (``losses[-1].backward()`` needs the stored item's graph: no one-line fix)
        return replace_node(mm, acc.value, _wrap(code, acc.value, ".detach()"),
                            f"Store `{code}.detach()` instead", "unsafe")
    return make


@register
class OutputStoredWithGraph(Rule):
    code = "TL502"
    name = "output-stored-with-graph"
    summary = "Model outputs (or other graph tensors) are kept across training iterations without `.detach()`."
    why = (
        "Appending a model output to a list in a training loop (to compute epoch metrics, "
        "to plot predictions later) keeps the output's autograd graph alive, and with it the "
        "activations autograd saved for backward: memory grows with every batch until the "
        "epoch ends or the GPU runs out. The values are only needed as data: detach them "
        "(and usually move them to the CPU)."
    )
    example = """\
all_logits = []
for x, y in loader:
    optimizer.zero_grad()
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward()
    optimizer.step()
    all_logits.append(logits)
"""
    use_instead = """\
all_logits = []
for x, y in loader:
    optimizer.zero_grad()
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward()
    optimizer.step()
    all_logits.append(logits.detach().cpu())
"""
    known_problems = (
        "Lists that a `backward()` later consumes on purpose (outputs gathered for one loss "
        "over several micro-batches) are not flagged, nor anything stored under `torch.no_grad()`, "
        "nor a container emptied by a loop that does not itself run `backward()` (a list "
        "re-created every epoch and filled by an evaluation pass), nor an entry stored under a "
        "literal key (`stats[\"d_loss\"] = d_loss` replaces the same entry every iteration). "
        "On the real-world benchmark (docs/evaluation.md) its 6 false findings on the tuned part "
        "were those two classes; after the fix: tuned part 3 findings, all TRUE (generated "
        "samples kept with their graph every epoch); held-out part no finding."
    )
    fix_safety = "unsafe"
    fix_doc = ("Appends `.detach()` to the stored value. Unsafe: code that later differentiates "
               "through the stored outputs would silently get no gradients.")
    references = ("https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory",
                  "https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html")
    triggers = (b"backward",)

    def check(self, mm):
        res = resources.get(mm)
        for fn, acc, is_loss in _graph_accumulations(mm):
            if is_loss or acc.how in ("aug", "selfadd", "method"):
                continue
            if not res.kept_across_training_iterations(acc):
                continue  # filled and dropped within one training iteration (or epoch)
            yield Report(acc.op.node,
                         f"a tensor attached to the autograd graph is stored in `{acc.container}` "
                         "across training iterations, keeping every iteration's graph (and saved "
                         "activations) alive; store `.detach()`ed values", fix=_fix_502(acc),
                         scope=fn.qualname)


def _fix_502(acc):
    def make(mm):
        from torchlint.fixes import replace_node

        if acc.how == "extend":
            return None
        code = mm.code_for(acc.value)
        return replace_node(mm, acc.value, _wrap(code, acc.value, ".detach()"),
                            f"Store `{code}.detach()` instead", "unsafe")
    return make

"""Devices: what meets the model on the accelerator must be on the accelerator too."""
from __future__ import annotations

import libcst as cst

from torchlint.model import catalog, resources
from torchlint.model.ir import CALL, FORWARD, LOSS, MOVE, CallOp, all_ops
from torchlint.model.queries import analysable_functions
from torchlint.rule import Report, Rule

from . import register


def _loader_loops(mm, fn, op):
    """The loops around ``op`` that iterate a loader (innermost first)."""
    out = []
    lp = op.loop
    while lp is not None:
        if not lp.is_while and lp.iter is not None:
            it = resources.loop_iterable(mm, fn, lp.iter)
            if mm.resolver.of_expr(fn, it)[0] == catalog.LOADER:
                out.append(lp)
        lp = lp.parent
    return out


def _lengths_like(mm, expr) -> bool:
    """Sequence lengths stay on the CPU on purpose (``pack_padded_sequence``, CTC)."""
    text = mm.code_for(expr).lower()
    return any(w in text for w in ("len", "lens", "length", "sizes"))


def _is_ctc(mm, fn, op) -> bool:
    """CTC losses take their targets and lengths on the CPU."""
    if "ctc" in (op.qual or op.func or "").lower():
        return True
    res = resources.get(mm)
    for _owner, _aop, value, _idx in res.definitions(fn, op.func or ""):
        if value is not None and "ctc" in mm.code_for(value).lower():
            return True
    return False


def _unmoved_args(mm, op):
    out = []
    for i, a in enumerate(op.args):
        facts = op.arg_facts[i] if i < len(op.arg_facts) else frozenset()
        if not facts & {"batch", "host_data"} or "moved" in facts:
            continue
        if _lengths_like(mm, a.value):
            continue
        if "moved_inplace" in facts and a.star == "**":
            continue  # batch.to(device) on a dict-like batch (BatchEncoding) moves it in place
        out.append((a, facts))
    return out


@register
class TensorNotMovedToDevice(Rule):
    code = "TL601"
    # preview since the sixteenth session: precise on the tuned part, not on fresh code
    default = False
    preview_reason = ('no real bug in 18 findings on the three clean held-out batches of the real-world benchmark as '
                      'each was first scored (batches 5 to 7: 15 FALSE, 3 DEBATABLE; the data was already on the '
                      'device through a dataset, a collate function, a callee or a framework), against 6 real '
                      'bugs in 9 findings on the tuned part; and the bug it finds is not silent: the first forward '
                      'raises a device-mismatch error')
    name = "tensor-not-moved-to-device"
    summary = "A batch from the loader reaches a model that was moved to the GPU without being moved itself."
    why = (
        "`model.to(device)` moves the parameters, not the data: a `DataLoader` yields CPU "
        "tensors, and each batch must be moved with `.to(device)` too. Forgetting it fails "
        "with a device-mismatch error on the GPU, and a `x.to(device)` whose result is not "
        "assigned is a classic variant: for tensors `.to` returns a moved copy and leaves `x` "
        "where it was. Forgetting to move the targets fails the same way in the loss."
    )
    example = """\
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
loader = DataLoader(train_set, batch_size=64, shuffle=True)
for x, y in loader:
    optimizer.zero_grad()
    x.to(device)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    use_instead = """\
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
loader = DataLoader(train_set, batch_size=64, shuffle=True)
for x, y in loader:
    optimizer.zero_grad()
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    known_problems = (
        "Only loaders built with `DataLoader(...)` (or a PyG/DGL loader, whose batches are "
        "collated on the CPU) in the linted code are followed: batches "
        "from `accelerator.prepare`d or Lightning-managed loaders, from a `collate_fn` or a "
        "dataset that moves tensors (a Hugging Face dataset given `set_format(type=\"torch\", "
        "device=\"cuda\")` too), or from loaders whose construction cannot be seen are "
        "trusted. Models wrapped in `DataParallel`/`DistributedDataParallel` scatter their "
        "inputs themselves, so their forward calls are not checked (unless the wrap only "
        "happens with several GPUs: `if torch.cuda.device_count() > 1`). Scripts that only ever "
        "use the CPU (`device = torch.device('cpu')`) are quiet."
    )
    fix_safety = "unsafe"
    fix_doc = (
        "Wraps the argument in `.to(device)` with the device expression the model was moved "
        "with (`.cuda()` if it was moved with `.cuda()`; `next(model.parameters()).device` "
        "when that expression is not visible where the batch is used). When a `x.to(device)` "
        "statement discarded its result, the fix assigns it instead (`x = x.to(device)`). "
        "Unsafe: moving inside the call leaves other uses of the CPU tensor (metrics, the "
        "loss) where they were."
    )
    references = ("https://pytorch.org/tutorials/beginner/blitz/cifar10_tutorial.html#training-on-gpu",)
    triggers = (b".to(", b".cuda(")

    def check(self, mm):
        res = resources.get(mm)
        for fn in analysable_functions(mm):
            if mm.is_lightning(fn):
                continue
            ops = [o for o in all_ops(fn) if isinstance(o, CallOp) and o.kind in (FORWARD, LOSS)
                   and o.loop is not None]
            if not ops:
                continue
            fwd_moves = {}  # id(forward op) -> the move of its model done when it runs

            def move_at(o):
                if id(o) not in fwd_moves:
                    fwd_moves[id(o)] = res.model_move_at(fn, o.target, o)
                return fwd_moves[id(o)]
            reported = set()  # (loop, tensor) reported at an earlier call; statement lines reported
            for op in ops:
                inline = False
                unmoved = _unmoved_args(mm, op)
                if not unmoved:
                    continue  # (before line_of: positions cost as much as a parse)
                line = mm.line_of(op.stmt if op.stmt is not None else op.node)
                if line in reported:
                    continue  # one finding per statement
                bad = [(a, f) for a, f in unmoved
                       if (id(op.loop), mm.code_for(a.value).strip()) not in reported]
                if not bad or op.kind == LOSS and _is_ctc(mm, fn, op):
                    continue
                if op.kind == FORWARD:
                    mv = move_at(op)
                    if mv is None or mv.dp or res.forward_moves_inputs(fn, op):
                        continue
                    model = op.target
                else:
                    if not any("model_out" in f or "graph" in f for f in op.arg_facts):
                        continue
                    fwds = res.loss_forwards(fn, op)
                    cand = [(f.target, move_at(f)) for f in fwds]
                    cand = [(t, m) for t, m in cand if m is not None]
                    if not cand:
                        # no move of the model seen: the input moved in the forward's own call
                        cand = [(f.target, m) for f in fwds for m in (res.inline_input_move(fn, f),) if m]
                        inline = bool(cand)
                    if not cand:
                        continue
                    model, mv = cand[0]
                full_batch = []
                if all("batch" not in f for _a, f in bad):
                    # data made on the CPU without a loader, moved by hand in this training loop
                    full_batch = res.full_batch_moves(op.loop)
                    if not full_batch:
                        continue
                else:
                    bad = [(x, f) for x, f in bad if "batch" in f]
                    loops = _loader_loops(mm, fn, op)
                    if not loops:
                        continue
                    placements = [res.loader_placement(fn, lp) for lp in loops]
                    if any(p != "host" and not (p is None and inline) for p in placements):
                        continue  # (the loop sends the batch's inputs to the device: they come on the host)
                a, facts = bad[0]
                name = mm.code_for(a.value).strip()
                where = f"line {mm.line_of(mv.node)}"
                moved_with = mm.code_for(mv.node).strip()
                if len(moved_with) > 50:
                    moved_with = moved_with[:47] + "..."
                if op.kind == LOSS and inline:
                    target = "the loss"
                    moved = f"with the outputs of `{model}`, whose input is moved to the accelerator"
                elif op.kind == LOSS:
                    target = "the loss"
                    moved = f"with the outputs of `{model}`, which was moved to the accelerator"
                else:
                    target, moved = f"`{model}`", "which was moved to the accelerator"
                if full_batch:
                    mv_line = mm.line_of(full_batch[0].node)
                    msg = (f"`{name}` is made on the CPU but reaches {target} {moved} "
                           f"(`{moved_with}` at {where}), while line {mv_line} moves the other data of "
                           "this training loop; move it with `.to(device)`")
                elif "moved_inplace" in facts:
                    msg = (f"`{name}` reaches {target} on the CPU: `{name}.to(...)` on its own line "
                           "returns a moved copy and leaves the tensor where it was; assign it "
                           f"(`{name} = {name}.to(...)`)")
                else:
                    origin = mm.value_origin(fn, a.value) if hasattr(a, "value") else None
                    via = f" (through {origin}, which does not move it)" if origin else ""
                    msg = (f"`{name}` comes from the loader on the CPU{via} but reaches {target} {moved} "
                           f"(`{moved_with}` at {where}); move it with `.to(device)`")
                reported.add(line)
                reported.update((id(op.loop), mm.code_for(x.value).strip()) for x, _f in bad)
                more = [x for x, f in bad[1:] if "moved_inplace" not in f]
                yield Report(op.node, msg, fix=_fix_601(fn, a, mv, model, "moved_inplace" in facts, more),
                             scope=fn.qualname)


def _visible(mm, fn, expr) -> bool:
    """Every name the device expression reads is defined where the fix inserts it."""
    res = resources.get(mm)
    for n in resources.names_in(expr):
        root = n.split(".", 1)[0]
        if root == "self":
            if fn.cls is None and (fn.parent is None or fn.parent.cls is None):
                return False
            continue
        if root in mm.imports.names:
            continue
        f, ok = fn, False
        while f is not None:
            if root in f.params or res.assigns(f).get(root):
                ok = True
                break
            f = f.parent
        if not ok and not res.assigns(mm.module_function).get(root):
            return False
    return True


def _fix_601(fn, arg, mv, model, inplace=False, more=()):
    """``more``: the other unmoved arguments of the same call (``model(data.x, data.edge_index)``),
    moved by the same fix."""
    def make(mm):
        from torchlint.findings import Fix
        from torchlint.fixes import replace_node
        from torchlint.model.dataflow import _is_statement_call

        v = arg.value
        code = mm.code_for(v)
        if inplace:
            # `x.to(device)` on its own line: assign its result instead
            for o in all_ops(fn):
                if isinstance(o, CallOp) and o.kind == MOVE and o.recv == code.strip() and \
                        _is_statement_call(o) and mm.line_of(o.node) < mm.line_of(v):
                    new = f"{o.recv} = {mm.code_for(o.node)}"
                    return replace_node(mm, o.node, new, f"Assign the moved tensor: `{new}`", "unsafe")
        if arg.star or any(x.star for x in more):
            return None

        def moved(v):
            code = mm.code_for(v)
            if not isinstance(v, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                code = f"({code})"
            if mv.cuda:
                return f"{code}.cuda()"
            if mv.device is not None and _visible(mm, fn, mv.device):
                return f"{code}.to({mm.code_for(mv.device).strip()})"
            return f"{code}.to(next({model}.parameters()).device)"

        new = moved(v)
        fix = replace_node(mm, v, new, f"Move the batch: `{new}`", "unsafe")
        if not more:
            return fix
        edits = list(fix.edits) + [e for x in more for e in replace_node(mm, x.value, moved(x.value), "", "unsafe").edits]
        names = ", ".join(f"`{mm.code_for(x.value).strip()}`" for x in (arg, *more))
        return Fix(f"Move the batch: {names}", tuple(edits), "unsafe")
    return make


@register
class TensorCreatedWithoutDevice(Rule):
    code = "TL602"
    name = "tensor-created-without-device"
    summary = "`forward` creates a tensor on the CPU and combines it with its (possibly GPU) inputs."
    why = (
        "`torch.zeros(...)`, `torch.arange(...)` and the other factories create tensors on the "
        "default device, the CPU, whatever device the module's inputs are on. The module works "
        "in CPU tests and fails (or silently moves data back and forth) once it runs on a GPU: "
        "a mask, a position index or a padding tensor built inside `forward` must be created "
        "on the inputs' device."
    )
    example = """\
class Encoder(nn.Module):
    def __init__(self, vocab_size, dim, max_len=512):
        super().__init__()
        self.tok_embedding = nn.Embedding(vocab_size, dim)
        self.pos_embedding = nn.Embedding(max_len, dim)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1))
        return self.tok_embedding(tokens) + self.pos_embedding(positions)
"""
    use_instead = """\
class Encoder(nn.Module):
    def __init__(self, vocab_size, dim, max_len=512):
        super().__init__()
        self.tok_embedding = nn.Embedding(vocab_size, dim)
        self.pos_embedding = nn.Embedding(max_len, dim)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.tok_embedding(tokens) + self.pos_embedding(positions)
"""
    known_problems = (
        "0-dim tensors (`torch.tensor(2.0)`) may be mixed with CUDA tensors and are not "
        "flagged, nor tensors only used for shapes or as indices, created with `*_like`, "
        "registered as buffers, or moved with `.to(...)`/`.type_as(...)`/`.type(t.type())` "
        "(the type string of a tensor names its device) before use."
    )
    fix_safety = "unsafe"
    fix_doc = ("Adds `device=x.device` to the factory call, where `x` is the first input of "
               "`forward` known to be a tensor (a tensor-only attribute or method is used on it, it "
               "has no `None` default and is never rebound to anything else); no fix when no input "
               "qualifies or the call passes `**kwargs`. Unsafe: that input may not be on the device "
               "the module runs on (a CPU-side argument). A tensor that a helper function of the "
               "project creates on the CPU and returns (`c = idx2onehot(c, n=10)`, the helper in another "
               "module) is reported at the call in `forward`, with no fix: the helper may have other callers.")
    references = ("https://pytorch.org/docs/stable/notes/cuda.html#device-agnostic-code",)
    triggers = (b"forward",)

    def check(self, mm):
        res = resources.get(mm)
        for cls in mm.classes.values():
            fwd = cls.methods.get("forward")
            if fwd is None or not mm.class_is_module(cls):
                continue
            calls = None
            for node, first in res.forward_cpu_tensors(fwd):
                name = mm.code_for(node.func).strip()
                if calls is None:
                    calls = {id(o.node): o for o in all_ops(fwd) if isinstance(o, CallOp)}
                op = calls.get(id(node))
                if op is not None and op.kind == CALL and op.info is not None:
                    # a function of the tree that returns a tensor it creates on the CPU
                    where = mm.describe_call(op) or f"`{name}()`"
                    advice = f"move it (`.to({first}.device)`)" if first else "move it to the inputs' device"
                    yield Report(node, f"{where} returns a tensor it creates on the CPU (no `device=`) and "
                                 "`forward` combines it with its inputs, which fails once the module runs on "
                                 f"a GPU; {advice} or let the helper create it on the inputs' device",
                                 scope=fwd.qualname)
                    continue
                advice = f"pass `device={first}.device`" if first else "create it on the inputs' device"
                yield Report(node, f"`{name}(...)` creates a tensor on the CPU (no `device=`) and "
                             "combines it with the inputs of `forward`, which fails once the module "
                             f"runs on a GPU; {advice}", fix=_fix_602(node, first), scope=fwd.qualname)


def _fix_602(node, first):
    def make(mm):
        from torchlint.fixes import add_keyword

        if first is None or any(a.star == "**" for a in node.args):
            return None  # no input known to be a tensor; ``**kwargs`` may already hold a device
        return add_keyword(mm, node, f"device={first}.device",
                           f"Create it on the inputs' device: `device={first}.device`", "unsafe")
    return make


@register
class TensorAttributeNotBuffer(Rule):
    code = "TL603"
    default = False
    preview_reason = (
        "no finding on the real-world benchmark (45 repositories: 33 tuned, 12 held-out; run alone at "
        "01068f9 and again with the default rules at a3d0a79), so its precision on real code is not "
        "measured (the target asks for >= 0.80 over >= 5 findings); preview until it is")
    name = "tensor-attribute-not-buffer"
    summary = "A module keeps a tensor as a plain attribute and uses it in `forward`: `model.to(device)` leaves it behind."
    why = (
        "`model.to(device)`, `model.cuda()` and `model.half()` move a module's parameters and "
        "registered buffers, nothing else. A tensor stored as `self.mean = torch.tensor([...])` "
        "in `__init__` stays on the CPU in float32: `forward` fails once the model runs on a "
        "GPU (or, with a 0-dim tensor, silently mixes devices), and `state_dict()` leaves it "
        "out, so a checkpoint does not carry it. `register_buffer` makes the module own it."
    )
    example = """\
class Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)

    def forward(self, images):
        return (images - self.mean) / self.std
"""
    use_instead = """\
class Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, images):
        return (images - self.mean) / self.std
"""
    known_problems = (
        "Only tensors made by a factory (`torch.zeros`, `torch.tensor([...])`, `torch.arange`...) "
        "in `__init__` and combined with the inputs in `forward` itself are followed; a bare "
        "`torch.tensor(value)` (often a 0-dim tensor, which mixes with CUDA tensors) is not "
        "reported, nor a tensor moved in `forward` (`self.mask.to(x.device)`) or a class that "
        "overrides `_apply`/`to`."
    )
    fix_safety = "safe"
    fix_doc = ("Rewrites `self.x = <tensor>` (after `super().__init__()`) as "
               "`self.register_buffer(\"x\", <tensor>, persistent=False)`: the module moves and casts "
               "it with its parameters, and `state_dict()` stays as it was.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_buffer",)
    triggers = (b"forward",)

    def check(self, mm):
        res = resources.get(mm)
        for cls in mm.classes.values():
            fwd = cls.methods.get("forward")
            if fwd is None or not mm.class_is_module(cls):
                continue
            for path, assign, use in res.forward_cpu_attributes(fwd):
                where = f"line {mm.line_of(use.node)}" if use is not None else "`forward`"
                yield Report(assign.node, f"`{path}` is a plain tensor attribute, not a buffer: `forward` "
                             f"combines it with its inputs ({where}) but `model.to(device)` leaves it on "
                             "the CPU and `state_dict()` omits it; use `self.register_buffer`",
                             fix=_fix_603(cls, path, assign), scope=cls.methods["__init__"].qualname)


def _fix_603(cls, path, assign):
    def make(mm):
        from torchlint.fixes import replace_node

        init = cls.methods["__init__"]
        stmt = assign.stmt
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 \
                or not isinstance(stmt.body[0], cst.Assign) or len(stmt.body[0].targets) != 1:
            return None
        supers = [o for o in all_ops(init) if isinstance(o, CallOp) and o.attr == "__init__"
                  and o.loop is None and not o.guards]
        if not any(mm.span_of(o.node)[:2] < mm.span_of(stmt)[:2] for o in supers):
            return None  # register_buffer needs Module.__init__ to have run
        name = path.split(".", 1)[1]
        value = mm.code_for(stmt.body[0].value).strip()
        return replace_node(mm, stmt.body[0], f'self.register_buffer("{name}", {value}, persistent=False)',
                            f"Register `{path}` as a buffer", "safe")
    return make


_WEIGHTED_LOSSES = {
    "torch.nn.CrossEntropyLoss": ("weight", 0), "torch.nn.NLLLoss": ("weight", 0),
    "torch.nn.BCELoss": ("weight", 0), "torch.nn.BCEWithLogitsLoss": ("pos_weight", None),
    "torch.nn.MultiLabelSoftMarginLoss": ("weight", 0), "torch.nn.MultiMarginLoss": ("weight", 2),
}


@register
class LossWeightOnWrongDevice(Rule):
    code = "TL604"
    default = False
    preview_reason = (
        "no finding on the real-world benchmark (45 repositories: 33 tuned, 12 held-out; run alone at "
        "01068f9 and again with the default rules at a3d0a79), so its precision on real code is not "
        "measured (the target asks for >= 0.80 over >= 5 findings); preview until it is")
    name = "loss-weight-on-wrong-device"
    summary = "A loss is built with a CPU `weight`/`pos_weight` tensor and used with a model moved to a GPU."
    why = (
        "Class weights are a registered buffer of the loss module: they move only with "
        "`criterion.to(device)`. A weight tensor made on the CPU (`torch.tensor([...])`, "
        "`torch.FloatTensor(class_weights)`) given to `nn.CrossEntropyLoss` while the model and "
        "the batches go to the GPU makes the first training step fail with a device mismatch - "
        "after data loading, model download and warm-up, and only on the GPU machine; on a CPU "
        "test run everything passes."
    )
    example = """\
device = torch.device("cuda")
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
class_weights = torch.tensor([1.0, 5.0, 10.0])
criterion = nn.CrossEntropyLoss(weight=class_weights)
"""
    use_instead = """\
device = torch.device("cuda")
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
class_weights = torch.tensor([1.0, 5.0, 10.0], device=device)
criterion = nn.CrossEntropyLoss(weight=class_weights)
"""
    known_problems = (
        "The weight and the moved model are followed inside one function (the model's move may be "
        "in a caller). A loss module moved anywhere in the module (`criterion.to(device)`, "
        "`.cuda()`), weights created with `device=` or moved, and 0-dim `pos_weight` tensors "
        "(which mix with CUDA tensors) are not reported."
    )
    fix_safety = "safe"
    fix_doc = "Moves the loss module where the model goes: appends `.to(<the model's device>)` (or `.cuda()`) to its construction."
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html",)
    triggers = (b"weight",)

    def check(self, mm):
        res = resources.get(mm)
        for fn in analysable_functions(mm):
            for op in all_ops(fn):
                if not (isinstance(op, CallOp) and op.qual in _WEIGHTED_LOSSES):
                    continue
                kw, pos = _WEIGHTED_LOSSES[op.qual]
                arg = op.arg(pos, kw)
                if arg is None or not res.cpu_tensor_value(fn, arg.value):
                    continue
                assign = op.stmt.body[0] if isinstance(op.stmt, cst.SimpleStatementLine) else None
                if not (isinstance(assign, cst.Assign) and assign.value is op.node and len(assign.targets) == 1):
                    continue  # built and moved (or passed on) in one expression
                crit = mm.code_for(assign.targets[0].target).strip()
                if res.moved_anywhere(crit):
                    continue
                moved = res.moved_models(fn)
                if not moved:
                    continue
                model, mv = moved[0]
                yield Report(op.node, f"`{crit}` gets a `{kw}` tensor made on the CPU, but `{model}` is moved "
                             f"to an accelerator (line {mm.line_of(mv.node)}) and `{crit}` never is: the loss "
                             "fails with a device mismatch at the first GPU step; move the loss module "
                             "(or create the weight with `device=`)", fix=_fix_604(fn, op, mv), scope=fn.qualname)


def _fix_604(fn, op, mv):
    def make(mm):
        from torchlint.fixes import replace_node

        if mv.cuda or mv.device is None:
            suffix = ".cuda()"
        elif isinstance(mv.device, (cst.Name, cst.Attribute)) and mv.fn is fn:
            suffix = f".to({mm.code_for(mv.device).strip()})"
        else:
            return None
        code = mm.code_for(op.node).strip()
        return replace_node(mm, op.node, code + suffix, f"Move the loss module: `{suffix[1:]}`", "safe")
    return make

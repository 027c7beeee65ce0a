"""Model and optimizer state kept in memory: snapshots must copy the tensors they hold."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from torchlint.model import catalog
from torchlint.model.binder import FunctionModel, dotted
from torchlint.model.ir import STEP, AssignOp, CallOp, LoopOp, ReturnOp, all_ops
from torchlint.model.queries import (
    exclusive, is_kind, iteration, module_replacement, names_in, optimizer_constructions, reads_name,
)
from torchlint.model.resources import param_for
from torchlint.rule import Report, Rule

from . import register

_STATEFUL = (catalog.MODEL, catalog.OPTIMIZER)


def _live_state_dict(mm, fn, value) -> Optional[str]:
    """``model.state_dict()`` / ``model.state_dict().copy()`` -> ``"model"`` (the receiver, a model
    or optimizer): a dict whose tensors are the live parameters and buffers."""
    if not isinstance(value, cst.Call) or any(a for a in value.args):
        return None
    func = value.func
    if not isinstance(func, cst.Attribute):
        return None
    if func.attr.value == "copy" and isinstance(func.value, cst.Call):  # a shallow copy aliases too
        return _live_state_dict(mm, fn, func.value)
    if func.attr.value != "state_dict":
        return None
    owner = dotted(func.value)
    if not owner or (mm.resolver.of_path(fn, owner)[0] not in _STATEFUL and not _optimized(mm, fn, owner)):
        return None
    return owner


def _optimized(mm, fn, owner: str) -> bool:
    """An optimizer is built from ``owner.parameters()`` in ``fn`` or, for a ``self`` attribute,
    in a method of its class (``self.optimizer = optim.SGD(self.trainModel.parameters())`` in a
    ``set_train_model`` method): a module whose weights training changes, whatever made it."""
    fns = [fn]
    if owner.startswith("self.") and fn.cls is not None:
        fns = list(fn.cls.methods.values())
    return any(owner in owners for f in fns for _, _, owners in optimizer_constructions(mm, f))


def _trains(mm, fn, ops) -> Optional[CallOp]:
    """The first op of ``ops`` that steps an optimizer (directly or through a helper)."""
    return next((o for o in ops if is_kind(mm, o, STEP)), None)


def _outer_loops(op):
    loop, out = op.loop, []
    while loop is not None:
        out.append(loop)
        loop = loop.parent
    return out


def _kept_best(snap) -> bool:
    """The snapshot is taken under a test inside its loop (``if acc > best: best = ...``)."""
    return snap.loop is not None and any(b.test is not None and b.loop is snap.loop for b, _ in snap.guards)


def _use_of(mm, fn, op, path: str, kept: bool, depth: int = 0) -> Optional[str]:
    """How ``op`` uses the snapshot ``path`` as the weights it stands for, or ``None``:
    ``load_state_dict(path)`` always; when ``kept`` (a "best so far"), also ``torch.save(path,
    ...)`` (or a dict literal holding it), ``return path`` and a helper of this module that
    does one of these with the argument it is given."""
    if isinstance(op, CallOp):
        if op.attr == "load_state_dict":
            a = op.arg(0, "state_dict")
            return f"`{op.func}({path})`" if a is not None and dotted(a.value) == path else None
        if not kept:
            return None
        if op.qual == "torch.save":
            a = op.arg(0, "obj")
            if a is not None and (dotted(a.value) == path or (isinstance(a.value, cst.Dict) and any(
                    isinstance(e, cst.DictElement) and dotted(e.value) == path for e in a.value.elements))):
                return "`torch.save(...)`"
            return None
        if depth == 0 and op.args:
            param = _param_given(mm, fn, op, path)
            if param is not None:
                callee, name = param
                if any(_use_of(mm, callee, o, name, True, 1) for o in all_ops(callee)):
                    return f"`{op.func}(...)`"
        return None
    if kept and isinstance(op, ReturnOp) and op.value is not None and dotted(op.value) == path:
        return "the `return`"
    return None


def _param_given(mm, fn, op: CallOp, path: str):
    """(callee, parameter name) when the call passes ``path`` to a function of this module."""
    callee = mm.resolve_call(fn, op) if op.func else None
    if not isinstance(callee, FunctionModel):
        return None
    a = next((a for a in op.args if not a.star and dotted(a.value) == path), None)
    name = param_for([p for p in callee.params if not p.startswith("*")], op, a) if a is not None else None
    return (callee, name) if name else None


def _class_methods(mm, cls) -> list:
    """The methods of ``cls`` and of the classes of this module that derive from it."""
    out = list(cls.methods.values())
    for other in getattr(mm, "classes", {}).values():
        if other is not cls and cls.name in [b.rsplit(".", 1)[-1] for b in other.bases]:
            out.extend(other.methods.values())
    return out


@register
class StateDictSnapshotAlias(Rule):
    code = "TL206"
    name = "state-dict-snapshot-alias"
    summary = "A `state_dict()` kept as the \"best\" weights is restored later: it holds the live tensors, so it restores nothing."
    why = (
        "`model.state_dict()` returns references to the model's own parameter and buffer tensors, "
        "not copies (`.copy()` copies only the dict). The optimizer updates those tensors in place, "
        "so a snapshot taken at the best epoch changes with every later step, and "
        "`model.load_state_dict(best)` at the end restores the *last* weights: early stopping and "
        "best-checkpoint selection silently do nothing."
    )
    example = """\
best_acc, best_state = 0.0, None
for epoch in range(epochs):
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    acc = evaluate(model, val_loader)
    if acc > best_acc:
        best_acc, best_state = acc, model.state_dict()
model.load_state_dict(best_state)
"""
    use_instead = """\
best_acc, best_state = 0.0, None
for epoch in range(epochs):
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    acc = evaluate(model, val_loader)
    if acc > best_acc:
        best_acc, best_state = acc, copy.deepcopy(model.state_dict())
model.load_state_dict(best_state)
"""
    known_problems = ("A snapshot is followed to a `load_state_dict` in the same function; one kept "
                      "under a test as the best so far also to a `torch.save`, a `return` or a helper of "
                      "the module that saves or loads it, and, kept on a `self` attribute, to another "
                      "method of its class (or of a subclass in the module). A `torch.save` before any "
                      "further training writes the right weights and is not reported. Preview: it made no "
                      "finding on the real-world benchmark (45 repositories), so its precision on real "
                      "code is not measured yet.")
    default = False
    fix_safety = "unsafe"
    fix_doc = "Wraps the snapshot in `copy.deepcopy(...)` (adds `import copy` when missing). Unsafe: it costs a copy of the weights in memory."
    references = ("https://pytorch.org/tutorials/beginner/saving_loading_models.html",)
    triggers = (b"state_dict",)

    def check(self, mm):
        for fn in mm.all_functions:
            ops = all_ops(fn)
            for i, op in enumerate(ops):
                if not isinstance(op, AssignOp) or op.aug is not None or op.value is None:
                    continue
                snapshots = self._snapshots(mm, fn, op)
                for path, value in snapshots:
                    found = self._restored_after_training(mm, fn, ops, op, path)
                    if found is None:
                        continue
                    use, what, step = found
                    owner = _live_state_dict(mm, fn, value)
                    yield Report(value, f"`{path}` holds `{owner}`'s live tensors, not a copy: the training "
                                 f"step at line {mm.line_of(step.node)} changes it, so {what} at line "
                                 f"{mm.line_of(use.node)} {'restores' if 'load_state_dict' in what else 'gets'} "
                                 f"the latest weights; use `copy.deepcopy({owner}.state_dict())`",
                                 fix=_deepcopy_fix(value), scope=fn.qualname)

    @classmethod
    def _restored_after_training(cls, mm, fn, ops, snap, path):
        """(the use, how it reads, the training step) for the first use of the snapshot that a
        training step runs before: ``load_state_dict(path)``; and, when the snapshot is kept
        under a test inside its loop (a "best so far"), ``torch.save(path, ...)``, ``return
        path`` or a helper of the module that does one of these with it; for a ``self``
        attribute, also such a use in another method of the class (or of a subclass here)."""
        kept = _kept_best(snap)
        for use in ops[ops.index(snap) + 1:]:
            what = _use_of(mm, fn, use, path, kept)
            if what is None:
                continue
            step = cls._training_after(mm, fn, ops, snap, use)
            if step is not None:
                return use, what, step
        if not (kept and path.startswith("self.") and fn.cls is not None):
            return None
        step = next((s for s in (_trains(mm, fn, iteration(mm, fn, loop.body)) for loop in _outer_loops(snap))
                     if s is not None), None)
        if step is None:
            return None
        for other in _class_methods(mm, fn.cls):
            if other is fn:
                continue
            for use in all_ops(other):
                what = _use_of(mm, other, use, path, True)
                if what is not None:
                    return use, what, step
        return None

    @staticmethod
    def _snapshots(mm, fn, op: AssignOp):
        """[(target path, the state_dict() call)] bound by an assignment (tuple targets included)."""
        out = []
        for t in op.targets:
            if dotted(t) and _live_state_dict(mm, fn, op.value):
                out.append((dotted(t), op.value))
            elif isinstance(t, (cst.Tuple, cst.List)) and isinstance(op.value, (cst.Tuple, cst.List)) \
                    and len(t.elements) == len(op.value.elements):
                for te, ve in zip(t.elements, op.value.elements):
                    if dotted(te.value) and _live_state_dict(mm, fn, ve.value):
                        out.append((dotted(te.value), ve.value))
        return out

    @staticmethod
    def _training_after(mm, fn, ops, snap, load) -> Optional[CallOp]:
        """A step that can run after the snapshot and before the restore: later in a loop around
        the snapshot that the restore is outside of, or between the two in program order."""
        load_loops = set(map(id, _outer_loops(load)))
        for loop in _outer_loops(snap):
            if id(loop) in load_loops:
                continue
            step = _trains(mm, fn, iteration(mm, fn, loop.body))
            if step is not None:
                return step
        i, j = ops.index(snap), ops.index(load)
        return _trains(mm, fn, [o for o in ops[i + 1:j] if not isinstance(o, LoopOp)])


def _deepcopy_fix(value):
    def make(mm):
        from torchlint.fixes import Edit, Fix, Position, replace_node

        names = getattr(getattr(mm, "imports", None), "names", {}) or {}
        fix = replace_node(mm, value, f"copy.deepcopy({mm.code_for(value)})",
                           "Snapshot a deep copy of the state", "unsafe")
        if names.get("copy") == "copy":
            return fix
        # `import copy` above the module's first import (after a docstring and __future__ imports)
        for n, line in enumerate(mm.text.splitlines(), 1):
            if line.startswith("import ") or (line.startswith("from ") and not line.startswith("from __future__")):
                return Fix(fix.message, (Edit(Position(n, 0), Position(n, 0), "import copy\n"),) + tuple(fix.edits),
                           "unsafe")
        return None
    return make


@register
class OptimizerMissesParameters(Rule):
    code = "TL205"
    default = False
    preview_reason = (
        "no finding on the real-world benchmark (45 repositories: 33 tuned, 12 held-out; run alone at "
        "01068f9 and again with the default rules at a3d0a79), so its precision on real code is not "
        "measured (the target asks for >= 0.80 over >= 5 findings); preview until it is")
    name = "optimizer-misses-parameters"
    summary = "A submodule is replaced (or the model rebuilt) after the optimizer took the model's parameters: the new weights are never trained."
    why = (
        "`torch.optim.SGD(model.parameters())` keeps the parameter tensors that exist when it is "
        "built. Replacing a layer afterwards (`model.fc = nn.Linear(512, 10)`, "
        "`model.classifier[-1] = ...`) or building a new model under the same name creates new "
        "tensors the optimizer has never seen: they keep their random initial values while the "
        "rest trains (and the old head, still in the optimizer, gets no gradients). Training runs "
        "and the loss may even go down a little, which is why the classic fine-tuning mistake of "
        "building the optimizer first goes unnoticed."
    )
    example = """\
model = torchvision.models.resnet18(weights="IMAGENET1K_V1")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model.fc = nn.Linear(model.fc.in_features, num_classes)
for x, y in loader:
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
"""
    use_instead = """\
model = torchvision.models.resnet18(weights="IMAGENET1K_V1")
model.fc = nn.Linear(model.fc.in_features, num_classes)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for x, y in loader:
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
"""
    known_problems = (
        "Followed inside one function: an optimizer built in one function and a module replaced "
        "in another are not compared. Replacements by modules without parameters (`nn.Identity()`, "
        "`nn.Dropout()`) and wrappers (`nn.DataParallel(model)`) are not reported; an optimizer "
        "built again or given `add_param_group` after the replacement is fine."
    )
    fix_safety = "unsafe"
    fix_doc = ("Builds the optimizer after the change: moves its construction right after the "
               "replacement (into the loop that rebuilds the model, when every use of the optimizer "
               "is in that loop), or, when code in between uses the optimizer (a scheduler), moves the "
               "one-line replacement above the construction. Only when nothing in between changes "
               "what the moved line reads. Unsafe: the new layer's weights are trained from then on "
               "(what the author meant, unless the layer was meant to stay frozen).")
    triggers = (b"parameters(",)

    def check(self, mm):
        for fn in mm.all_functions:
            builds = optimizer_constructions(mm, fn)
            if not builds:
                continue
            ops = all_ops(fn)
            index = {id(o): i for i, o in enumerate(ops)}
            for i, op in enumerate(ops):
                rep = module_replacement(mm, fn, op)
                if rep is None:
                    continue
                path, rebuilt = rep
                for build, opt, owners in builds:
                    b = index.get(id(build))
                    if b is None or b >= i or exclusive(build, op):
                        continue
                    if not any(path == o or path.startswith(o + ".") for o in owners):
                        continue
                    later = ops[i + 1:]
                    if any(isinstance(o, AssignOp) and any(dotted(t) == opt for t in o.targets) for o in later):
                        continue  # the optimizer is built again
                    if any(isinstance(o, CallOp) and o.recv == opt and o.attr == "add_param_group" for o in later):
                        continue
                    use = next((o for o in later if not isinstance(o, LoopOp) and reads_name(o, opt)), None)
                    if use is None and opt.startswith("self.") and fn.cls is not None:
                        # an optimizer kept on the object: used by the other methods (a trainer)
                        use = next((o for m in fn.cls.methods.values() if m is not fn for o in all_ops(m)
                                    if not isinstance(o, LoopOp) and reads_name(o, opt)), None)
                    if use is None:
                        continue
                    what = f"`{path}` is rebuilt" if rebuilt else \
                        f"`{mm.code_for(op.targets[0]).strip()}` is replaced by a new module"
                    yield Report(op.node, f"{what} after `{opt}` took the parameters of "
                                 f"`{sorted(owners)[0]}` (line {mm.line_of(build.node)}): the new parameters "
                                 f"are not in `{opt}` (used at line {mm.line_of(use.node)}), so they never "
                                 "train; build the optimizer after the change",
                                 fix=_optimizer_after_fix(fn, build, opt, owners, op), scope=fn.qualname)
                    break


def _one_line_statement(op) -> bool:
    return isinstance(op.stmt, cst.SimpleStatementLine) and len(op.stmt.body) == 1


def _optimizer_after_fix(fn, build, opt, owners, rep):
    """Fix (TL205): the optimizer built after the replacement ``rep`` (or ``rep`` moved above it)."""
    def make(mm):
        from torchlint.fixes import enclosing_statements, move_lines

        if not (_one_line_statement(build) and _one_line_statement(rep)):
            return None
        ops = all_ops(fn)
        b, i = ops.index(build), ops.index(rep)
        between = [o for o in ops[b + 1:i] if not isinstance(o, LoopOp) and o.stmt is not rep.stmt]
        outer_b = enclosing_statements(fn.node, build.stmt)
        outer_r = enclosing_statements(fn.node, rep.stmt)
        if outer_b is None or outer_r is None or [id(s) for s in outer_r[:len(outer_b)]] != list(map(id, outer_b)):
            return None
        extra = outer_r[len(outer_b):]
        if not all(isinstance(s, (cst.For, cst.While, cst.With)) for s in extra):
            return None

        def assigned(o) -> set:
            return {dotted(t) for t in getattr(o, "targets", ()) if dotted(t)} if isinstance(o, AssignOp) else set()

        reads_b = names_in(build.value) - set(owners)
        loops = [s for s in extra if isinstance(s, (cst.For, cst.While))]
        uses = [o for o in ops if o is not build and not isinstance(o, LoopOp) and reads_name(o, opt)]
        if not any(reads_name(o, opt) for o in between) \
                and not any(assigned(o) & reads_b for o in between) \
                and (not loops or (not opt.startswith("self.") and all(
                    ops.index(o) > i and _holds(mm, loops[-1], o.node) for o in uses))):
            return move_lines(mm, build.stmt, rep.stmt, f"Build `{opt}` after the change", "unsafe", after=True)
        # the optimizer is used in between (a scheduler built on it): the replacement goes first
        path = dotted(rep.targets[0].value) if isinstance(rep.targets[0], cst.Subscript) else dotted(rep.targets[0])
        if extra or any(assigned(o) & names_in(rep.value) for o in between) \
                or any(reads_name(o, path) or path in assigned(o) for o in between if path not in owners):
            return None
        return move_lines(mm, rep.stmt, build.stmt, f"Replace the module before `{opt}` is built", "unsafe")
    return make


def _holds(mm, outer, node) -> bool:
    sl, sc, el, ec = mm.span_of(outer)
    return (sl, sc) <= mm.span_of(node)[:2] <= (el, ec)

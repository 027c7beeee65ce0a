"""Model mode and grad mode: evaluate in eval mode without graphs, train in train mode with them."""
from __future__ import annotations

import libcst as cst

from torchlint.findings import Fix, Related
from torchlint.model import catalog
from torchlint.model.binder import dotted
from torchlint.model.callsites import evaluated_by_callers, only_called_without_grad, subclass_eval_loops
from torchlint.model.flow import ENTRY, norm_path, runs_only_with_grad
from torchlint.model.ir import (
    BACKWARD, CALL, FORWARD, GRAD_OFF, GRAD_ON, GRAD_UNKNOWN, MODE, STEP, AssignOp, CallOp, LoopOp, all_ops, walk,
)
from torchlint.model.queries import (
    analysable_functions, call_runs_backward, callers_fail_guard, eval_arm_forwards, eval_step_helpers, evaluates_after_training, evaluates_drawn_batch,
    forward_records_no_graph, helper_forward_keys, lightning_eval_hook, is_kind, model_call_target, names_in,
    iteration, local_function, method_runs_without_grad, reaches_backward, steps_only_other_modules, shape_probe, steps_or_updates, training_loop_before, trains, untrained_here,
    untrained_path_here, uses_autograd, within,
)
from torchlint.model.roles import is_eval_name
from torchlint.model.sizes import rollout_handed_to_backward, runs_few_times
from torchlint.rule import Report, Rule

from . import register


def _functions(mm):
    """Training and evaluation code: not nn.Module internals (test code is left out by the
    engine, for every rule exempt in tests)."""
    return analysable_functions(mm)


def _origin_text(mm, origin) -> str:
    if origin is None:
        return "the model was built (modules start in train mode)"
    if origin.node is not None:
        if "{}" in origin.text:
            return origin.text.format(mm.line_of(origin.node))
        return f"{origin.text} at line {mm.line_of(origin.node)}"
    if origin.path == mm.display_path:  # a helper of this module
        return f"{origin.text} at line {origin.line}"
    return f"{origin.text} at {origin.path}:{origin.line}"


def _in_training(mm, op) -> bool:
    """The innermost loop around ``op`` runs backward: ``op`` is part of a training step (a
    teacher's forward under no_grad), not evaluation.  A validation loop nested in the epoch
    loop is not part of the training step even though the epoch loop trains."""
    return op.loop is not None and trains(mm, op.loop.body)


def _feeds_backward(mm, fn, loop) -> bool:
    """A backward follows ``loop`` in the enclosing iteration (or the function): the loop's
    forwards build graphs on purpose (micro-steps, unrolled sequences)."""
    outer = loop.parent.body if loop.parent is not None else fn.body
    seq = iteration(mm, fn, outer)
    if loop not in seq:
        return False
    after = [o for o in seq[seq.index(loop) + 1:] if not within(o, loop) and o is not loop]
    return any(is_kind(mm, o, BACKWARD) for o in after)


def _sorted(mm, origins) -> list:
    """Origins in a stable order (modes are sets): explicit switches first, then by line."""
    def key(o):
        if o is not None and o.node is not None:
            conditional = o.text.endswith((".train()`",)) and "eval" not in o.text
            return (1 if conditional else 0, mm.line_of(o.node), o.text)
        return (2, 0, "" if o is None else f"{o.text} at {o.path}:{o.line}")
    return sorted(origins, key=key)


def _loaded(origin) -> bool:
    """The state comes from ``from_pretrained()``, which returns models in eval mode."""
    return origin is not None and origin.loaded


def _deliberate_train(mm, fn, op, origin) -> bool:
    """``net.train()`` and then, with no backward or optimizer step in between, forwards under
    no_grad repeated on the same inputs (``for t in range(100): y_hat.append(net(x))``): train
    mode chosen on purpose for them (Monte-Carlo dropout, batch-norm statistics accumulated
    without training).  A loop over a loader that switches to train mode before each forward
    is not that."""
    if origin is None or origin.node is None or op.grad != GRAD_OFF:
        return False
    lp = op.loop
    if lp is None or lp.is_while or not isinstance(lp.iter, cst.Call) or dotted(lp.iter.func) != "range" \
            or lp.target is None:
        return False
    if names_in(lp.target) & set().union(*(names_in(a.value) for a in op.args)):
        return False  # the loop feeds the forward other inputs each time
    ops = all_ops(fn)
    j = next((i for i, o in enumerate(ops) if o is op), None)
    if j is None:
        return False
    m = next((i for i, o in enumerate(ops[:j]) if isinstance(o, CallOp) and o.node is origin.node
              and o.kind == MODE and o.info == "train"), None)
    if m is None:
        return False
    for o in ops[m + 1:j]:
        if isinstance(o, CallOp) and (o.kind in (BACKWARD, STEP) or (o.kind == CALL and _backward_or_step(mm, o))):
            return False
    return not _in_training(mm, op)


def _backward_or_step(mm, o) -> bool:
    summ = mm.summary_of(o.info)
    return call_runs_backward(o, summ) or bool(summ and summ.get("step"))


def _explicit(origin) -> bool:
    """The train mode was set by the code (``model.train()``, a helper that switches it), not
    the mode a model is built in."""
    return origin is not None and not origin.returned


def _chosen(origin) -> bool:
    """The mode was chosen by a condition on purpose (``if training: model.train() else: model.eval()``)."""
    return origin is not None and origin.chosen


def _in_update_loop(mm, fn, op) -> bool:
    """``op`` is in a loop that trains weights: backward there and an optimizer step (or a
    manual update) in the function, directly or through helpers.  A loop that only runs
    backward for input gradients (saliency maps, adversarial examples) is not training."""
    lp = op.loop
    if lp is None:
        return False
    if not (trains(mm, lp.body) or _feeds_backward(mm, fn, lp)):
        return False  # e.g. a validation loop nested in the epoch loop
    return steps_or_updates(mm, fn)


def _eval_context(mm, fn, op) -> bool:
    if op.grad == GRAD_OFF:
        return not _in_training(mm, op)
    return False


def _callee_key_paths(mm, fn, op, key_field):
    s = mm.summary_of(op.info)
    if not s:
        return None, {}
    argmap = mm.argmap(fn, op, s)
    return s, {k: argmap.get(k) for k in s.get(key_field, ()) if argmap.get(k)}


@register
class EvalWithoutEvalMode(Rule):
    code = "TL201"
    name = "eval-without-eval-mode"
    # preview again since the fifteenth session: precise on the tuned part, not on fresh code
    default = False
    preview_reason = ('precision 0.80 on the tuned part of the real-world benchmark (12 real bugs in 15 findings) but '
                      '0.20 on the two clean held-out batches scored since it became a default rule (batch 6: 3 real '
                      'bugs in 4 findings; batch 7: 1 in 16, most of them evaluation helpers that switch the mode '
                      'inside a branch or restore it before returning)')
    summary = "The model is evaluated while it may still be in train mode."
    why = (
        "In train mode, dropout drops activations at random and batch norm normalises with the "
        "statistics of the current batch and updates its running averages. Validation numbers "
        "computed that way are noisy and wrong, and evaluation silently changes the model's "
        "batch-norm statistics. `torch.no_grad()` does not change this: it only stops graph "
        "building."
    )
    example = """\
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)


def evaluate(model, loader):
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    return correct


model = Classifier()
model.load_state_dict(torch.load("classifier.pt"))
print(evaluate(model, test_loader))
"""
    use_instead = """\
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)


def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    return correct


model = Classifier()
model.load_state_dict(torch.load("classifier.pt"))
print(evaluate(model, test_loader))
"""
    known_problems = (
        "It reports only where the difference between the modes matters by evidence: a layer "
        "whose output depends on the mode (`nn.Dropout` with a rate above 0, batch norm, "
        "`F.dropout`, a read of `self.training`, a torchvision network, a transformers model) is "
        "seen in what builds the model, in this module or another module of the linted tree. A "
        "model of unknown make (a library class such as a diffusers or MONAI network, a model "
        "handed in with no call site saying what it is) is reported only where the code itself "
        "switched it to train mode or trained it in the same function. Instance norm is not such "
        "evidence (in train mode it normalises each sample by its own statistics, as in training). "
        "Train mode chosen on purpose is not reported: a switch under a test of a mode argument, "
        "and `model.train()` followed, with no backward or optimizer step in between, by no_grad "
        "passes repeated over the same inputs (Monte-Carlo dropout, batch-norm statistics "
        "accumulated without training). Evaluation is also known inside a training loop: a branch "
        "that draws one batch of another loader with `next()` (a test batch every ten iterations), "
        "runs no backward and scores the predictions; that finding carries no fix (a lone `eval()` "
        "there would leave the training in eval mode). A torchvision detection model (Faster "
        "R-CNN, Mask R-CNN, keypoint R-CNN, RetinaNet, SSD, FCOS) is not reported: its mode picks "
        "what it returns (a dict of losses in train mode, detections in eval mode), so a "
        "validation loss computed in train mode under no_grad is deliberate and a wrong mode "
        "fails loudly."
    )
    fix_safety = "unsafe"
    fix_doc = ("Inserts `model.eval()` before the evaluation loop. Unsafe: the caller may rely on "
               "the model staying in train mode afterwards (see TL202).")
    triggers = (b"no_grad", b"inference_mode", b"eval", b"valid", b"test", b"set_grad_enabled")

    def check(self, mm):
        reported = set()
        for fn in _functions(mm):
            flow = mm.flow(fn)
            seen = set()
            for op in all_ops(fn):
                if not isinstance(op, CallOp):
                    continue
                if op.kind == FORWARD and op.target:
                    t = norm_path(op.target)
                    if t in seen:
                        continue
                    evalish = _eval_context(mm, fn, op) or (
                        is_eval_name(fn.name) and not uses_autograd(mm, fn.body)) or (
                        evaluates_after_training(mm, fn, op))
                    drawn = None if evalish else evaluates_drawn_batch(mm, fn, op)
                    evalish = evalish or drawn is not None
                    if not evalish or untrained_here(mm, fn, op) or shape_probe(mm, fn, op):
                        continue  # not evaluation, or a model never trained or looked at for its output's shape
                    modes = flow.at.get(id(op), frozenset())
                    if modes and all(_loaded(o) for _, o in modes):
                        continue  # from_pretrained() returned it in eval mode
                    modes = frozenset(mo for mo in modes if not _loaded(mo[1]))
                    train = _sorted(mm, [o for m, o in modes if m == "train" and not _chosen(o)
                                         and not _deliberate_train(mm, fn, op, o)])
                    if not train and any(m == "train" for m, _ in modes) \
                            and not any(m == ENTRY for m, _ in modes):
                        continue  # train mode chosen on purpose for this evaluation
                    layers = mm.resolver.mode_layers(fn, t, op.node) \
                        if train or any(m == ENTRY for m, _ in modes) else True
                    if layers is False:
                        continue  # no dropout/batch norm: train and eval mode compute the same
                    if layers is None:
                        # a model of unknown make (a library's, one handed in): only where the
                        # code itself switched it to train mode, or trained it here
                        train = [o for o in train if _explicit(o)]
                        if not train and not evaluates_after_training(mm, fn, op) and drawn is None:
                            continue  # (a batch drawn inside the training loop: trained here)
                    if drawn is not None and id(op.node) not in reported and (
                            train or any(m == ENTRY for m, _ in modes) and not any(m == "eval" for m, _ in modes)):
                        seen.add(t)
                        reported.add(id(op.node))
                        yield Report(op.node, _drawn_batch_message(mm, op, t, drawn, train),
                                     scope=fn.qualname)
                    elif train and id(op.node) not in reported:
                        seen.add(t)
                        reported.add(id(op.node))
                        yield Report(op.node, f"`{op.target}` runs in evaluation code but may still be in "
                                     f"train mode ({_origin_text(mm, train[0])}); call "
                                     f"`{t}.eval()` first", fix=_insert_eval(fn, op, t, train), scope=fn.qualname)
                    elif any(m == ENTRY for m, _ in modes) and not any(m == "eval" for m, _ in modes) \
                            and layers is True and is_eval_name(fn.name) and not self._has_callers(mm, fn) \
                            and not lightning_eval_hook(mm, fn):  # Lightning switched it to eval
                        seen.add(t)
                        yield Report(op.node, f"`{fn.name}()` evaluates `{op.target}` without calling "
                                     f"`{t}.eval()`, and no caller in the linted code does",
                                     fix=_insert_eval(fn, op, t), scope=fn.qualname)
                    elif any(m == ENTRY for m, _ in modes) and not any(m == "eval" for m, _ in modes) \
                            and id(op.node) not in reported and evaluates_after_training(mm, fn, op):
                        # trained here in the mode the caller gave (train mode, to train), then
                        # evaluated in that same mode
                        seen.add(t)
                        reported.add(id(op.node))
                        trained = training_loop_before(mm, fn, op.loop, op.target)
                        yield Report(op.node, f"`{op.target}` is evaluated here in the mode it was trained in "
                                     f"(the training loop at line {mm.line_of(trained.node)}); call "
                                     f"`{t}.eval()` first", fix=_insert_eval(fn, op, t), scope=fn.qualname)
                elif op.kind == CALL:
                    s, paths = _callee_key_paths(mm, fn, op, "evals_in_entry")
                    at = flow.at_args.get(id(op), {})
                    for key, path in paths.items():
                        train = _sorted(mm, [o for m, o in at.get(key, ()) if m == "train" and not _chosen(o)])
                        if at.get(key) and all(_loaded(o) for _, o in at[key]):
                            continue  # from_pretrained() returned it in eval mode
                        layers = mm.resolver.mode_layers(fn, path, op.node) if train else False
                        if layers is None:
                            train = [o for o in train if _explicit(o)]  # unknown make: switched by the code
                        if train and norm_path(path) not in seen and layers is not False \
                                and not (not (s.get("backward") or s.get("step"))
                                         and untrained_path_here(mm, fn, op, norm_path(path))):
                            seen.add(norm_path(path))
                            helper = local_function(op.info)
                            fwd = _first_eval_forward(mm, helper, key) if helper is not None else None
                            if fwd is not None:
                                # anchor at the evaluation forward in the helper of this module
                                if id(fwd.node) in reported:
                                    continue
                                reported.add(id(fwd.node))
                                yield Report(fwd.node, f"`{fwd.target}` runs in evaluation code "
                                             f"(`{helper.name}()`) without `{norm_path(fwd.target)}.eval()`, and "
                                             f"the call at line {mm.line_of(op.node)} passes `{path}` while it may "
                                             f"still be in train mode ({_origin_text(mm, train[0])})",
                                             fix=_insert_eval(helper, fwd, norm_path(fwd.target)), scope=helper.qualname)
                                continue
                            yield Report(op.node, f"`{s['name']}()` ({s['path']}:{s['line']}) evaluates "
                                         f"`{path}` without switching it to eval mode, and here it may "
                                         f"still be in train mode ({_origin_text(mm, train[0])})",
                                         related=(Related(s["path"], s["line"], f"`{s['name']}()` is defined here"),),
                                         scope=fn.qualname)

    @staticmethod
    def _has_callers(mm, fn) -> bool:
        if any(True for _ in mm.callers(fn)):
            return True
        q = f"{mm.module_name}.{fn.qualname}"
        return mm.project.is_called(q)


def _drawn_batch_message(mm, op, target, loader, train) -> str:
    """TL201 for a periodic evaluation on one batch drawn from another loader inside the
    training loop (no fix: a lone ``eval()`` there would leave the training in eval mode)."""
    mode = f"in train mode ({_origin_text(mm, train[0])})" if train else "in the mode it trains in"
    return (f"`{op.target}` is evaluated here on a batch drawn from `{mm.code_for(loader).strip()}` inside the "
            f"training loop at line {mm.line_of(op.loop.node)} (no backward, its predictions scored), "
            f"{mode}; call `{target}.eval()` before this evaluation and `{target}.train()` after it")


def _first_eval_forward(mm, fn, key: str):
    """The first forward of ``key`` (a parameter or ``self`` attribute of ``fn``) that runs in
    the mode the caller gave (no ``eval()`` before it in ``fn``), not one of a training step."""
    for op in all_ops(fn):
        if isinstance(op, CallOp) and op.kind == FORWARD and op.target and norm_path(op.target) == key \
                and not _in_training(mm, op):
            return op
    return None


def _insert_eval(fn, op, target, train_origins=()):
    """Insert ``target.eval()`` where the evaluation runs: after the switches to train mode
    that reach it (``train_origins``), so that none of them undoes it."""
    undone_by = tuple(o.node for o in train_origins if o is not None and o.node is not None)

    def make(mm):
        from torchlint.fixes import insert_before_loop_or_stmt

        return insert_before_loop_or_stmt(mm, fn, op, f"{target}.eval()",
                                          f"Insert `{target}.eval()` before the evaluation", "unsafe", undone_by)
    return make


@register
class TrainAfterEval(Rule):
    code = "TL202"
    # preview: below the precision target on the real-world benchmark (see preview_reason)
    default = False
    preview_reason = ('precision 0.60 on the tuned part of the real-world benchmark (3 real bugs in 5 findings; the 2 false ones keep a model in eval mode on purpose: a backbone frozen for linear probing in another function, a critic held in eval while alternating phases) and its 1 held-out finding is FALSE')
    name = "train-after-eval"
    summary = "A training step can run with the model left in eval mode."
    why = (
        "`model.eval()` stays in effect until `model.train()` is called. An epoch loop that "
        "validates and never switches back trains every later epoch with dropout disabled and "
        "batch-norm statistics frozen: the model trains, just worse, and nothing reports it."
    )
    example = """\
def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(dim=1) == y).sum().item()
    return correct / len(loader.dataset)


for epoch in range(num_epochs):
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    accuracy = evaluate(model, val_loader)
"""
    use_instead = """\
for epoch in range(num_epochs):
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    accuracy = evaluate(model, val_loader)
"""
    fix_safety = "unsafe"
    fix_doc = ("Inserts `model.train()` before the training code. Unsafe when the model is meant "
               "to stay in eval mode (e.g. a frozen feature extractor).")
    triggers = (b"eval",)

    def check(self, mm):
        for fn in _functions(mm):
            flow = mm.flow(fn)
            seen = set()
            for op in all_ops(fn):
                if not isinstance(op, CallOp):
                    continue
                if op.kind == FORWARD and op.target and op.grad not in (GRAD_OFF, GRAD_UNKNOWN) \
                        and _in_update_loop(mm, fn, op):
                    # under set_grad_enabled(phase == "train") one loop serves both phases
                    t = norm_path(op.target)
                    if mm.resolver.frozen(fn, t):
                        continue  # a frozen feature extractor is meant to stay in eval mode
                    if not reaches_backward(mm, fn, op, op.node, in_order=True):
                        continue  # not a training forward: an evaluation inside the training loop
                    if steps_only_other_modules(mm, fn, op, t):
                        continue  # a critic held in eval mode: the step updates the other models
                    modes = flow.at.get(id(op), frozenset())
                    ev = _sorted(mm, [o for m, o in modes if m == "eval" and not _chosen(o)])
                    if ev and t not in seen and mm.resolver.mode_sensitive(fn, t, op.node):
                        seen.add(t)
                        yield Report(op.node, f"`{op.target}` is trained here but may be in eval mode: "
                                     f"{_origin_text(mm, ev[0])} switches it to eval mode and nothing "
                                     f"switches it back before this training step",
                                     fix=_insert_train(fn, op, t, ev[0]),
                                     scope=fn.qualname)
                elif op.kind == CALL and op.grad != GRAD_OFF:
                    s, paths = _callee_key_paths(mm, fn, op, "trains_in_entry")
                    if s and not s.get("step") and not (
                            op.loop is not None and any(is_kind(mm, o, STEP) for o in iteration(mm, fn, op.loop.body))):
                        continue  # runs backward but nothing here steps: not a training step
                    at = flow.at_args.get(id(op), {})
                    for key, path in paths.items():
                        ev = _sorted(mm, [o for m, o in at.get(key, ()) if m == "eval" and not _chosen(o)])
                        if ev and norm_path(path) not in seen and mm.resolver.mode_sensitive(fn, path, op.node) \
                                and not mm.resolver.frozen(fn, path):
                            seen.add(norm_path(path))
                            yield Report(op.node, f"`{s['name']}()` trains `{path}` in the mode it is given, "
                                         f"and {_origin_text(mm, ev[0])} switches it to eval mode and nothing "
                                         "switches it back before this call",
                                         related=(Related(s["path"], s["line"], f"`{s['name']}()` is defined here"),),
                                         fix=_insert_train(fn, op, norm_path(path), ev[0]), scope=fn.qualname)


def _insert_train(fn, op, target, origin=None):
    """Fix: `model.train()` at the start of the innermost loop around both the training step
    and what switched the model to eval mode (the epoch loop, typically); before the training
    loop when the switch happened before it."""
    def make(mm):
        from torchlint.fixes import insert_before_stmt, insert_in_loop_after
        from torchlint.model.ir import MODE

        code, msg = f"{target}.train()", f"Insert `{target}.train()`"
        node = origin.node if origin is not None else None
        where = None
        if node is not None:
            try:
                ol = mm.span_of(node)[0]
            except Exception:
                ol = None
            lp = op.loop
            while lp is not None and ol is not None:
                sl, _, el, _ = mm.span_of(lp.node)
                if sl <= ol <= el:
                    where = lp
                    break
                lp = lp.parent
        if where is None and op.loop is not None:
            # switched in a helper: the innermost loop that calls a helper of the tree or evals
            lp = op.loop
            while lp is not None and where is None:
                if any(isinstance(o, CallOp) and o is not op and (o.kind == CALL or (o.kind == MODE and o.info == "eval"))
                       for o in walk(lp.body)):
                    where = lp
                lp = lp.parent
        if where is not None:
            # after whatever in the loop may switch it to eval mode before the training step
            undone_by = [o.node for o in walk(where.body) if isinstance(o, CallOp) and o is not op
                         and (o.kind == CALL or (o.kind == MODE and o.info == "eval"))]
            return insert_in_loop_after(mm, where, op, code, msg, "unsafe",
                                        undone_by + ([node] if node is not None else []))
        lp = op.loop
        while lp is not None and lp.parent is not None:
            lp = lp.parent
        if lp is not None:
            return insert_before_stmt(mm, lp, code, msg + " before the training loop", "unsafe")
        return insert_before_stmt(mm, op, code, msg, "unsafe")
    return make


@register
class EvalWithoutNoGrad(Rule):
    code = "TL203"
    name = "eval-without-no-grad"
    summary = "An evaluation loop builds autograd graphs because gradients are not disabled."
    why = (
        "Without `torch.no_grad()` or `torch.inference_mode()`, every forward pass in an "
        "evaluation loop records the autograd graph and keeps activations alive for a backward "
        "that never comes: evaluation uses several times the memory it needs (often the cause of "
        "out-of-memory errors at validation time) and runs slower.\n\n"
        "A loop the code bounds to a few iterations with literals is not reported: twelve test "
        "images predicted for a plot (`for i in range(12):`), a 200-character sample generated "
        "(`range(max_len)` after `max_len = 200`, or a parameter whose default and every call pass "
        "a small literal), `xs[:8]`, a literal list, `if i == 3: break` at the top of the loop. A "
        "handful of small graphs, each freed at the next step, costs nothing worth a warning; a "
        "loop over a loader, a dataset or a size from the command line is reported. The bound "
        "holds only when what each forward is fed is small by evidence (one sample `test_set[i]`, "
        "a literal slice `images[:8]`, a tensor built from literals, the batch the loop takes, "
        "what the model returned for such inputs): fifty passes over a whole graph "
        "(`model(data.x, data.edge_index)` of a graph loaded before the loop) are reported.\n\n"
        "Loops that need gradients are not evaluation: a function the callers pass that runs "
        "`backward()` (`attack(model, x, y)` given `fgsm`), a method of an object of the code that "
        "fine-tunes before it scores (`user_module.test()` of a meta-learner). Neither is a call "
        "of a method decorated `@torch.no_grad()` on an object the callers build "
        "(`agent.policy(state)`)."
    )
    example = """\
model.eval()
for x, y in val_loader:
    correct += (model(x).argmax(1) == y).sum().item()
"""
    use_instead = """\
model.eval()
with torch.no_grad():
    for x, y in val_loader:
        correct += (model(x).argmax(1) == y).sum().item()
"""
    fix_safety = "safe"
    fix_doc = ("Wraps the loop in `with torch.no_grad():`. Safe: the loop runs no backward and "
               "computes no gradients, so only memory and speed change.")
    triggers = (b"eval", b"valid", b"test")

    def check(self, mm):
        if mm.grad_at_import == GRAD_OFF:
            return  # ``torch.set_grad_enabled(False)`` at the top of the module: no graph anywhere
        for fn in _functions(mm):
            if fn.decorator_grad == GRAD_OFF or lightning_eval_hook(mm, fn):
                continue
            flow = mm.flow(fn)
            reported_loops = []
            for loop in [o for o in all_ops(fn) if isinstance(o, LoopOp)]:
                if any(within(loop, r) for r in reported_loops):
                    continue
                if loop.runs_once:
                    continue  # one batch taken to look at (`...; break`): one graph, not one per batch
                # (a method of an object of the tree decorated ``@torch.no_grad()`` records no graph)
                fwds = [o for o in walk(loop.body) if isinstance(o, CallOp) and o.kind == FORWARD
                        and not method_runs_without_grad(mm, fn, o)]
                # forwards through a library helper given the model, or a method of the model
                runs = [(o, p) for o in walk(loop.body) for p in (model_call_target(mm, fn, o),) if p]
                # the forwards run in a per-batch step called only from this loop
                steps = [] if fwds or runs else eval_step_helpers(mm, loop)
                # ... or in a helper shared with training that runs the models it is given
                helpers = [] if fwds or runs or steps else [
                    (o, keys) for o in walk(loop.body) for keys in (helper_forward_keys(mm, o),) if keys]
                seen = fwds + [o for o, _ in runs] + steps + [o for o, _ in helpers]
                if fwds and uses_autograd(mm, loop.body, fn):
                    # one loop for training and validation: the validation arm's forward
                    for f, m in eval_arm_forwards(mm, fn, loop):
                        if self._callers_enable_grad(mm, fn):
                            reported_loops.append(loop)
                            yield Report(f.node, f"this forward also runs in the evaluation pass (`{m.target}.eval()` "
                                         f"at line {mm.line_of(m.node)}), where nothing backpropagates it, "
                                         "without `torch.no_grad()`, so every batch builds an autograd graph "
                                         "for nothing; wrap it in `torch.set_grad_enabled(<training flag>)`",
                                         scope=fn.qualname)
                if not seen or uses_autograd(mm, loop.body, fn):
                    continue  # gradients on purpose: attacks, saliency, test-time adaptation
                if any(o.grad in (GRAD_OFF, "?") for o in seen) or loop.grad in (GRAD_OFF, "?"):
                    continue
                targets = [o.target for o in fwds] + [p for _, p in runs]
                if targets and not helpers and all(forward_records_no_graph(mm, fn, t) for t in targets):
                    continue  # frozen models, forwards that run under no_grad: no graph to build
                if _feeds_backward(mm, fn, loop) or rollout_handed_to_backward(mm, fn, loop):
                    continue
                if runs_few_times(mm, fn, loop, seen):
                    continue  # a few samples to look at (``range(12)``, 200 characters): a handful of small graphs
                modes = set()
                for o in fwds + [o for o, _ in runs]:
                    modes |= {m for m, _ in flow.at.get(id(o), frozenset())}
                for o, keys in helpers:
                    at = flow.at_args.get(id(o), {})
                    for k in keys:
                        modes |= {m for m, _ in at.get(k, frozenset())} or {ENTRY}
                for o in steps:  # the step's models: in the mode it switches them to, or this function leaves them
                    exits = {v[0] for v in ((mm.summary_of(o.info) or {}).get("exit_modes") or {}).values() if v}
                    modes |= exits if exits == {"eval"} else {ENTRY}
                evalmode = "eval" in modes and "train" not in modes
                if not evalmode and modes == {ENTRY} and fwds and not (runs or steps or helpers):
                    # a batch loop of its own that the class's validation methods call after eval()
                    evalmode = evaluated_by_callers(mm, fn, {o.target for o in fwds}) is not None
                if not evalmode and not (ENTRY in modes and "train" not in modes and is_eval_name(fn.name)):
                    continue
                if not self._callers_enable_grad(mm, fn):
                    continue
                reported_loops.append(loop)
                via = f" (in `{steps[0].info.name}()`, called once per batch)" if steps else \
                    f" (in `{helpers[0][0].info.name}()`, called once per batch)" if helpers else ""
                yield Report(loop.node, f"this evaluation loop runs the model{via} without `torch.no_grad()` "
                             "or `torch.inference_mode()`, so every forward pass builds an autograd graph",
                             fix=_wrap_no_grad(loop), scope=fn.qualname)

            # a stub its subclasses in other modules fill in with an evaluation loop, called
            # right after eval() without no_grad (a trainer's test() calling self.evaluate())
            if fn.cls is not None and fn.decorator_grad is None:
                for op in all_ops(fn):
                    got = subclass_eval_loops(mm, fn, op) if isinstance(op, CallOp) and op.recv == "self" else None
                    if got is None or not self._callers_enable_grad(mm, fn):
                        continue
                    found, origin = got
                    first = mm.project.summary(found[0]) or {}
                    where = f"`{first.get('qualname', found[0])}`" + (
                        f" ({first['path']}:{first['line']})" if first.get("path") and first.get("line") else "")
                    more = f" and {len(found) - 1} other override(s)" if len(found) > 1 else ""
                    yield Report(op.node, f"`self.{op.attr}()` runs the evaluation loop its subclasses define "
                                 f"({where}{more}) with the model in eval mode ({_origin_text(mm, origin)}) "
                                 "but without `torch.no_grad()` or `torch.inference_mode()`, so every forward "
                                 "pass builds an autograd graph; call it under `torch.no_grad()`",
                                 scope=fn.qualname)

    @staticmethod
    def _callers_enable_grad(mm, fn) -> bool:
        """False when every caller in the linted code runs ``fn`` under no_grad."""
        return not only_called_without_grad(mm, fn)


def _wrap_no_grad(loop):
    def make(mm):
        from torchlint.fixes import wrap_in_with

        return wrap_in_with(mm, loop.node, "torch.no_grad()", "Wrap the loop in `torch.no_grad()`", "safe")
    return make


@register
class BackwardUnderNoGrad(Rule):
    code = "TL204"
    # preview since the sixteenth session: no real bug found on real code
    default = False
    preview_reason = ('no real bug found on the real-world benchmark (126 repositories): its 3 findings on clean '
                      'held-out batches as each was first scored were all FALSE (a backward guarded by '
                      '`if model.training` or `if loss.requires_grad`, which is false under `no_grad`); and the bug '
                      'it finds is not silent: `backward()` on a loss without a graph raises an error')
    name = "backward-under-no-grad"
    summary = "`backward()` is reached inside `no_grad()` or `inference_mode()`."
    why = (
        "Under `torch.no_grad()` no graph is recorded, so the loss has no `grad_fn`: "
        "`backward()` raises 'element 0 of tensors does not require grad' — or, when only part "
        "of the computation ran under no_grad, silently gives zero gradients to the layers that "
        "ran there. A `@torch.no_grad()` decorator left on a training function is the usual cause.\n\n"
        "A call under `no_grad` of a function that trains is reported, except when every backward "
        "of that function is guarded by one of its parameters and the call passes the value that "
        "skips it (`run_epoch(loader, cross_valid=True)` where the backward sits under "
        "`if not cross_valid:`; `loss_epoch(model, loss_func, val_dl)` that leaves `opt=None` "
        "where it steps under `if opt is not None:`; `all_batches('valid')` where it runs under "
        "`if type_ == 'train':`), except a method called only in the arm of a test of an "
        "attribute that makes the backward's own test of it false (`else: return "
        "self.eval_step(x)` after `if self.stage == 'train':`), and except a backward under a "
        "test that is false under "
        "no_grad or in eval mode (`if loss.requires_grad:`, `if self.model.training:`, "
        "`if torch.is_grad_enabled():`: a step shared by the training and the validation epoch)."
    )
    example = """\
@torch.no_grad()
def train_step(model, x, y, optimizer):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    use_instead = """\
def train_step(model, x, y, optimizer):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    fix_safety = "unsafe"
    fix_doc = ("Removes what turns gradients off around the backward: the `@torch.no_grad()` "
               "decorator of its function, or the one-item `with torch.no_grad():` (`inference_mode`, "
               "`set_grad_enabled(False)`) block around it, whose body is dedented. Unsafe: the "
               "other code of that function or block then records a graph too (more memory), and "
               "a part meant to run without gradients (a frozen encoder) must be wrapped again.")
    triggers = (b"no_grad", b"inference_mode", b"set_grad_enabled")

    def check(self, mm):
        for fn in mm.all_functions:
            for op in all_ops(fn):
                if not isinstance(op, CallOp):
                    continue
                if op.kind == BACKWARD and op.grad == GRAD_OFF and not runs_only_with_grad(mm, op):
                    where = "a `@torch.no_grad()` function" if fn.decorator_grad == GRAD_OFF and \
                        not self._inner_with(op, fn) else "a `no_grad`/`inference_mode` block"
                    yield Report(op.node, f"`backward()` runs inside {where}: no graph was recorded, "
                                 "so there is nothing to differentiate", fix=_grad_back_on(fn, op),
                                 scope=fn.qualname)
                elif op.kind == CALL and op.grad == GRAD_OFF:
                    s = mm.summary_of(op.info)
                    if call_runs_backward(op, s) and s.get("grad") != GRAD_ON \
                            and s.get("backward_inherits_grad", True) \
                            and not (s.get("backward_if") and (op.func or "").startswith("self.")
                                     and callers_fail_guard(mm, fn, s["backward_if"])):
                        yield Report(op.node, f"`{s['name']}()` ({s['path']}:{s['line']}) runs `backward()` "
                                     "but is called inside a `no_grad`/`inference_mode` block",
                                     related=(Related(s["path"], s["line"], f"`{s['name']}()` is defined here"),),
                                     scope=fn.qualname)

    @staticmethod
    def _inner_with(op, fn) -> bool:
        return False


def _grad_back_on(fn, op):
    """Fix (TL204): drop the no_grad decorator or unwrap the one-item no_grad block that holds
    the backward; ``loss.requires_grad = True`` (the workaround that made the backward run
    under no_grad) goes too: with gradients on, the loss is no leaf and that line would raise."""
    def make(mm):
        from torchlint.fixes import delete_lines, delete_statement_edit, statement_block, unwrap_with
        from torchlint.model.queries import grad_context_site

        site = grad_context_site(mm, fn, op.node)
        if not isinstance(site, (cst.Decorator, cst.With)):
            return None
        if isinstance(site, cst.With) and any(
                isinstance(it.item, cst.Call) and mm.qualify(dotted(it.item.func) or "") in catalog.MODE_CONTEXTS
                for it in site.items):
            return None  # ``with eval_mode(model):`` also sets the model's mode: not ours to drop
        region = fn.node if isinstance(site, cst.Decorator) else site
        workarounds = [a.stmt for a in all_ops(fn) if _sets_requires_grad(a, op.recv)
                       and mm.span_of(region)[0] <= mm.span_of(a.stmt)[0] <= mm.span_of(region)[2]]
        if any(a is None or len(statement_block(fn.node, a) or ()) < 2 for a in workarounds):
            return None
        if isinstance(site, cst.With):
            return unwrap_with(mm, site, "Run the block with gradients: remove the `no_grad` context", "unsafe",
                               drop=workarounds)
        fix = delete_lines(mm, site, "Remove the `no_grad` decorator of the training function", "unsafe")
        return Fix(fix.message, fix.edits + tuple(delete_statement_edit(mm, a) for a in workarounds), "unsafe")
    return make


def _sets_requires_grad(op, name) -> bool:
    """``name.requires_grad = True`` alone on its line."""
    if not (isinstance(op, AssignOp) and op.aug is None and name and len(op.targets) == 1):
        return False
    t = op.targets[0]
    return (isinstance(t, cst.Attribute) and t.attr.value == "requires_grad" and dotted(t.value) == name
            and isinstance(op.value, cst.Name) and op.value.value == "True"
            and isinstance(op.stmt, cst.SimpleStatementLine) and len(op.stmt.body) == 1)

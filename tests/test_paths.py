"""Path analysis over a function's ops (torchlint/model/paths.py): must/may facts per path,
with if/else, continue, break, early return, try/except/finally and correlated tests."""
import textwrap

import libcst as cst

from torchlint.model import ModuleModel
from torchlint.model import paths
from torchlint.model.ir import BACKWARD, CLEAR, STEP, CallOp, LoopOp, walk
from torchlint.model.queries import carried_clears, clears_on_some_paths, is_kind


def build(src: str) -> ModuleModel:
    src = textwrap.dedent(src)
    return ModuleModel("train.py", "train.py", src, cst.parse_module(src), "train")


def setup(src, name="train"):
    mm = build(HEADER + textwrap.dedent(src))
    fn = next(f for f in mm.all_functions if f.qualname == name)
    loop = next(op for op in walk(fn.body) if isinstance(op, LoopOp))
    return mm, fn, loop


def kind(mm, k):
    return lambda op: is_kind(mm, op, k)


def first(fn, k, target=None):
    return next(op for op in walk(fn.body) if isinstance(op, CallOp) and op.kind == k
                and (target is None or op.func.startswith(target)))


HEADER = """
import torch
import torch.nn.functional as F

"""


def test_backward_in_both_arms_runs_on_every_path():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, scaler, accum):
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y) / accum
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
    """)
    assert paths.runs_on_every_path(mm, fn, loop.body, kind(mm, BACKWARD))
    assert not paths.runs_on_every_path(mm, fn, loop.body, kind(mm, STEP))
    step = first(fn, STEP)
    assert carried_clears(mm, fn, loop, step, lambda c: True) == {id(first(fn, CLEAR))}


def test_backward_in_one_arm_only_is_not_on_every_path():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, use_amp):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            if use_amp:
                loss.backward()
            optimizer.step()
    """)
    assert not paths.runs_on_every_path(mm, fn, loop.body, kind(mm, BACKWARD))


def test_continue_break_return_and_raise_end_paths():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            if not torch.isfinite(loss):
                continue
            if loss.item() > 1e6:
                raise RuntimeError("diverged")
            if loss.item() < 1e-6:
                return model
            loss.backward()
            optimizer.step()
    """)
    # every path that completes an iteration (falls through or continues) does not backward:
    # the `continue` path skips it
    assert not paths.runs_on_every_path(mm, fn, loop.body, kind(mm, BACKWARD))
    flow = paths.run(mm, fn, loop.body, lambda s, op: s or is_kind(mm, op, BACKWARD), (False,))
    assert paths.states(flow.out) == {True}
    assert paths.states(flow.cont) == {False}
    assert paths.states(flow.ret) == {False}  # the raise and the early return leave before it


def test_break_leaves_the_inner_loop_only():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, accum):
        for epoch in range(10):
            for i, (x, y) in enumerate(loader):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                if i == accum:
                    break
            optimizer.step()
            optimizer.zero_grad()
    """)
    # after the inner loop (left by `break` or by running out) the backward has run
    assert paths.runs_on_every_path(mm, fn, loop.body, kind(mm, BACKWARD))


def test_try_except_finally():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer):
        for x, y in loader:
            try:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            except RuntimeError:
                optimizer.zero_grad()
                continue
            finally:
                torch.cuda.synchronize()
            optimizer.step()
            optimizer.zero_grad()
    """)
    assert not paths.path_without(mm, fn, loop.body, (kind(mm, BACKWARD), kind(mm, STEP)),
                                  kind(mm, CLEAR))
    # the handler's path clears and skips the step
    assert paths.path_in_order(mm, fn, loop.body, (kind(mm, BACKWARD), kind(mm, CLEAR)))
    assert not paths.path_in_order(mm, fn, loop.body, (kind(mm, BACKWARD), kind(mm, CLEAR), kind(mm, STEP)))


def test_same_test_twice_takes_the_same_arm():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, scaler):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
    """)
    scaled = next(op for op in walk(fn.body) if isinstance(op, CallOp) and op.kind == BACKWARD
                  and op.recv != "loss")
    plain_step = next(op for op in walk(fn.body) if isinstance(op, CallOp) and op.func == "optimizer.step")
    scaler_step = next(op for op in walk(fn.body) if isinstance(op, CallOp) and op.func == "scaler.step")
    assert not paths.path_in_order(mm, fn, loop.body, (lambda o: o is scaled, lambda o: o is plain_step))
    assert paths.path_in_order(mm, fn, loop.body, (lambda o: o is scaled, lambda o: o is scaler_step))


def test_negated_test_takes_the_other_arm():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, use_amp):
        for x, y in loader:
            if not use_amp:
                optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if use_amp:
                optimizer.step()
    """)
    clear, step = first(fn, CLEAR), first(fn, STEP)
    assert not paths.path_in_order(mm, fn, loop.body, (lambda o: o is clear, lambda o: o is step))
    assert clears_on_some_paths(mm, fn, loop, step, [clear])


def test_is_none_and_is_not_none_are_one_test_with_opposite_arms():
    mm, fn, loop = setup("""
    def train(net, loader, loss_fn, params, optimizer=None):
        for x, y in loader:
            loss = loss_fn(net(x), y)
            if optimizer is not None:
                optimizer.zero_grad()
            loss.backward()
            if None is optimizer:
                sgd(params)
            else:
                optimizer.step()
    """)
    clear, step = first(fn, CLEAR), first(fn, STEP)
    # the step runs exactly on the paths that cleared
    assert not paths.path_without(mm, fn, loop.body, (lambda o: o is step,), lambda o: o is clear)
    assert not clears_on_some_paths(mm, fn, loop, step, [clear])


def test_assigning_the_tested_name_forgets_the_choice():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, scaler=None):
        for x, y in loader:
            if scaler is None:
                optimizer.zero_grad()
                scaler = make_scaler()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
    """)
    clear = first(fn, CLEAR)
    scaler_step = next(op for op in walk(fn.body) if isinstance(op, CallOp) and op.func == "scaler.step")
    # after `scaler = ...` the first arm's choice no longer says which arm the second test takes
    assert paths.path_in_order(mm, fn, loop.body, (lambda o: o is clear, lambda o: o is scaler_step))


def test_choice_of_a_test_the_loop_assigns_is_not_kept_across_iterations():
    mm, fn, loop = setup("""
    def train(model, loader, optimizer, accum):
        for i, (x, y) in enumerate(loader):
            if i % accum == 0:
                optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if i % accum == 0:
                optimizer.step()
    """)
    clear, step = first(fn, CLEAR), first(fn, STEP)
    # in one iteration the two tests agree: no path clears and then skips the step
    assert not paths.path_without(mm, fn, loop.body, (lambda o: o is clear,), lambda o: o is step)
    assert paths.path_without(mm, fn, loop.body, (kind(mm, BACKWARD),), lambda o: o is step)
    # across iterations they do not have to agree (`i` changes): iterations 1..k-1 leave
    # gradients that the clear of iteration k throws away before its step (a real bug: the
    # clear belongs after the step)
    assert carried_clears(mm, fn, loop, step, lambda c: True) == {id(first(fn, CLEAR))}

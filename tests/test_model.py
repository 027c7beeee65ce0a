"""The semantic model: imports, roles, training events, grad contexts, mode flow, summaries."""
import textwrap

import libcst as cst
import pytest

from torchlint.model import ModuleModel, catalog
from torchlint.model.flow import ENTRY
from torchlint.model.ir import (
    BACKWARD, CALL, CLEAR, FORWARD, GRAD_OFF, GRAD_ON, GRAD_UNKNOWN, MODE, SCHED_STEP, STEP, CallOp,
    walk,
)
from torchlint.model.roles import is_test_function


def build(src: str, path: str = "train.py") -> ModuleModel:
    src = textwrap.dedent(src)
    return ModuleModel(path, path, src, cst.parse_module(src), path.rsplit("/", 1)[-1][:-3])


def fn_named(mm, name):
    return next(f for f in mm.all_functions if f.qualname == name)


def calls_of(fn):
    return [op for op in walk(fn.body) if isinstance(op, CallOp)]


def events(fn):
    """[(callee as written, kind, target)] for the classified calls of ``fn``."""
    return [(op.func, op.kind, op.target) for op in calls_of(fn) if op.kind is not None]


def modes_at(mm, fn, func):
    flow = mm.flow(fn)
    out = []
    for op in calls_of(fn):
        if op.func == func and op.kind == FORWARD:
            out.append(sorted(m for m, _ in flow.at[id(op)]))
    return out


# --------------------------------------------------------------------------- imports
def test_import_aliases_resolve_to_qualified_names():
    mm = build("""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from torch import optim as O
        from torch.optim.lr_scheduler import StepLR as Sched
        from .models import ResNet
    """, path="pkg/train.py")
    q = mm.imports.qualify
    assert q("nn.CrossEntropyLoss") == "torch.nn.CrossEntropyLoss"
    assert q("F.cross_entropy") == "torch.nn.functional.cross_entropy"
    assert q("O.AdamW") == "torch.optim.AdamW"
    assert q("Sched") == "torch.optim.lr_scheduler.StepLR"
    assert q("torch.no_grad") == "torch.no_grad"
    assert q("numpy.zeros") is None


# --------------------------------------------------------------------------- roles
ROLES_SRC = """
    import timm
    import torch
    import torch.nn as nn
    from timm import create_model
    from torch.utils.data import DataLoader

    class Net(nn.Module):
        def forward(self, x):
            return x

    def main(train_set, net_d):
        model = Net().to("cuda")
        backbone = create_model("resnet18")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(optimizer, 10)
        loader = DataLoader(train_set, batch_size=4)
        scaler = torch.cuda.amp.GradScaler()
        criterion = nn.CrossEntropyLoss()
        head = nn.Linear(4, 2)
        ema_model = model
"""


def test_roles_from_constructors_and_names():
    mm = build(ROLES_SRC)
    main = fn_named(mm, "main")
    role = lambda p: mm.resolver.of_path(main, p)  # noqa: E731
    assert role("model") == (catalog.MODEL, "Net")
    assert role("backbone")[0] == catalog.MODEL  # timm.create_model(...)
    assert role("optimizer")[0] == catalog.OPTIMIZER
    assert role("sched")[0] == catalog.SCHEDULER
    assert role("loader")[0] == catalog.LOADER
    assert role("scaler")[0] == catalog.SCALER
    assert role("criterion") == (catalog.LOSS, catalog.CE)
    assert role("head")[0] == catalog.MODEL
    assert role("net_d")[0] is None  # a parameter whose name says nothing known
    # factories and classes are not instances, whatever their names say
    assert role("create_model") == (None, None)
    assert role("timm.create_model") == (None, None)
    assert role("Net") == (None, None)


def test_action_names_are_not_models():
    assert catalog.role_from_name("get_eval_model") is None
    assert catalog.role_from_name("task.get_eval_model") is None
    assert catalog.role_from_name("_create_fx_model") is None
    assert catalog.role_from_name("teacher_model") == catalog.MODEL
    assert catalog.role_from_name("train_loader") == catalog.LOADER
    assert catalog.role_from_name("self.lr_scheduler") == catalog.SCHEDULER


def test_optimizer_owners_from_constructor():
    mm = build("""
        import itertools
        import torch

        def main(netG, netD, model, groups):
            opt_g = torch.optim.Adam(netG.parameters(), lr=2e-4)
            opt_d = torch.optim.Adam(filter(lambda p: p.requires_grad, netD.module.parameters()))
            both = torch.optim.SGD(itertools.chain(netG.parameters(), netD.parameters()), lr=0.1)
            head_body = torch.optim.SGD([
                {"params": model.fc.parameters(), "lr": 1e-2},
                {"params": model.body.parameters()},
            ], lr=1e-3)
            params = [p for p in model.parameters() if p.requires_grad]
            via_var = torch.optim.AdamW(params)
            unknown = torch.optim.AdamW(groups)
    """)
    main = fn_named(mm, "main")
    owners = lambda p: mm.resolver.optimizer_owners(main, p)  # noqa: E731
    assert owners("opt_g") == {"netG"}
    assert owners("opt_d") == {"netD"}  # DataParallel's .module is the same model
    assert owners("both") == {"netG", "netD"}
    assert owners("head_body") == {"model.fc", "model.body"}
    assert owners("via_var") == {"model"}
    assert owners("unknown") is None


def test_frozen_models():
    mm = build("""
        import torch
        import torch.nn as nn

        class Probe:
            def __init__(self, encoder, head):
                self.encoder = encoder
                self.head = head
                self.encoder.requires_grad_(False)

            def step(self, x):
                return self.head(self.encoder(x))

        def finetune(backbone, classifier):
            for p in backbone.parameters():
                p.requires_grad = False
            opt = torch.optim.SGD(classifier.parameters(), lr=0.1)
            return opt

        def unfreeze_later(backbone):
            backbone.requires_grad_(False)
            backbone.requires_grad_(True)

        def two_models():
            student = nn.Linear(4, 2)
            teacher = nn.Linear(4, 2)
            opt = torch.optim.SGD(student.parameters(), lr=0.1)
    """)
    step = fn_named(mm, "Probe.step")
    assert mm.resolver.frozen(step, "self.encoder") is not None
    assert mm.resolver.frozen(step, "self.head") is None
    ft = fn_named(mm, "finetune")
    assert mm.resolver.frozen(ft, "backbone") is not None
    assert mm.resolver.frozen(ft, "classifier") is None
    assert mm.resolver.frozen(fn_named(mm, "unfreeze_later"), "backbone") is None
    two = fn_named(mm, "two_models")
    assert "no optimizer updates `teacher`" in mm.resolver.frozen(two, "teacher")
    assert mm.resolver.frozen(two, "student") is None


def test_mode_sensitivity_of_models():
    mm = build("""
        import torch.nn as nn
        import torchvision

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(4, 8)
                self.act = nn.ReLU()
                self.fc2 = nn.Linear(8, 2)

        class WithDropout(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = MLP()
                self.drop = nn.Dropout(0.1)

        class LM(nn.Module):
            def __init__(self, dropout=0.2):
                super().__init__()
                self.rnn = nn.LSTM(8, 8, num_layers=2, dropout=dropout)

        class UsesFlag(nn.Module):
            def forward(self, x):
                return x * 2 if self.training else x

        def main():
            a = MLP()
            b = WithDropout()
            c = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            d = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
            e = torchvision.models.resnet18()
            f = LM()
            g = UsesFlag()
    """)
    main = fn_named(mm, "main")
    sens = {p: mm.resolver.mode_sensitive(main, p) for p in "abcdefg"}
    assert sens == {"a": False, "b": True, "c": False, "d": True, "e": True, "f": True, "g": True}


def test_unit_tests_are_recognised():
    src = """
        import unittest

        def test_forward():
            pass

        class TestModel(unittest.TestCase):
            def test_eval(self):
                pass

        def evaluate():
            pass
    """
    mm = build(src, path="tests/test_models.py")
    assert is_test_function(mm, fn_named(mm, "test_forward"))
    mm2 = build(src, path="scripts/train.py")
    assert is_test_function(mm2, fn_named(mm2, "TestModel.test_eval"))
    assert not is_test_function(mm2, fn_named(mm2, "evaluate"))
    assert not is_test_function(mm2, fn_named(mm2, "test_forward"))  # `test()` in a script evaluates


# --------------------------------------------------------------------------- events
def test_training_events_are_classified():
    mm = build("""
        import torch
        import torch.nn as nn

        def train(model, loader, optimizer, scheduler, scaler, accelerator):
            criterion = nn.CrossEntropyLoss()
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda"):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                accelerator.backward(loss)
                scheduler.step()
            model.eval()
            model.train(False)
    """)
    ev = events(fn_named(mm, "train"))
    assert ("optimizer.zero_grad", CLEAR, "optimizer") in ev
    assert ("model", FORWARD, "model") in ev
    assert ("scaler.scale(loss).backward", BACKWARD, None) not in ev  # not dotted: func is None
    kinds = [(k, t) for _, k, t in ev]
    assert (STEP, "optimizer") in kinds  # scaler.step(optimizer) steps the optimizer it is given
    assert ("accelerator.backward", BACKWARD, "accelerator") in ev
    assert ("scheduler.step", SCHED_STEP, "scheduler") in ev
    assert [op.info for op in calls_of(fn_named(mm, "train")) if op.kind == MODE] == ["eval", "eval"]
    assert sum(1 for _, k, _ in ev if k == BACKWARD) == 2
    assert not any(f == "scaler.update" for f, _, _ in ev)


def test_lbfgs_closure_and_distributed_autograd():
    mm = build("""
        import torch
        import torch.distributed.autograd as dist_autograd
        from torch.distributed.optim import DistributedOptimizer

        def fit(model, x, y, rrefs):
            optimizer = torch.optim.LBFGS(model.parameters())
            def closure():
                optimizer.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                return loss
            for _ in range(5):
                optimizer.step(closure)
            opt = DistributedOptimizer(torch.optim.SGD, rrefs, lr=0.05)
            for _ in range(5):
                with dist_autograd.context() as cid:
                    dist_autograd.backward(cid, [model(x).sum()])
                    opt.step(cid)
    """)
    fit = fn_named(mm, "fit")
    steps = [op for op in calls_of(fit) if op.kind == STEP]
    assert [s.target for s in steps] == ["optimizer", "opt"]
    assert isinstance(steps[0].closure, cst.Name) and steps[0].closure.value == "closure"
    from torchlint.model.queries import iteration

    seq = iteration(mm, fit, steps[0].loop.body)
    # the closure's clear and backward run before the step that calls it
    assert [o.kind for o in seq if isinstance(o, CallOp) and o.kind in (CLEAR, BACKWARD, STEP)] == \
        [CLEAR, BACKWARD, STEP]
    dist = [op for op in calls_of(fit) if op.kind == BACKWARD and op.loop is steps[1].loop]
    assert [op.info for op in dist] == [catalog.DIST_AUTOGRAD]


def test_helper_calls_are_call_events():
    mm = build("""
        def train_one_epoch(model, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()

        def main(model, loader, optimizer):
            for epoch in range(3):
                train_one_epoch(model, loader, optimizer)
    """)
    main = fn_named(mm, "main")
    call = next(op for op in calls_of(main) if op.func == "train_one_epoch")
    assert call.kind == CALL and call.info is fn_named(mm, "train_one_epoch")


# --------------------------------------------------------------------------- grad contexts
def test_grad_contexts_of_blocks_and_decorators():
    mm = build("""
        import torch
        from torch import no_grad

        @torch.no_grad()
        def evaluate(model, x):
            a = model(x)
            with torch.enable_grad():
                b = model(x)
            return a, b

        @no_grad()
        def predict(model, x):
            return model(x)

        def step(model, x, flag):
            with torch.inference_mode():
                c = model(x)
            with torch.set_grad_enabled(False):
                d = model(x)
            with torch.set_grad_enabled(flag):
                e = model(x)
            f = model(x)
    """)
    grads = lambda name: [op.grad for op in calls_of(fn_named(mm, name)) if op.kind == FORWARD]  # noqa: E731
    assert fn_named(mm, "evaluate").decorator_grad == GRAD_OFF
    assert grads("evaluate") == [GRAD_OFF, GRAD_ON]
    assert grads("predict") == [GRAD_OFF]
    assert grads("step") == [GRAD_OFF, GRAD_OFF, GRAD_UNKNOWN, None]


# --------------------------------------------------------------------------- mode flow
def test_eval_at_end_of_epoch_reaches_next_epoch_through_back_edge():
    mm = build("""
        import torch

        def main(model, loader, val_loader, optimizer):
            model.train()
            for epoch in range(10):
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
                model.eval()
                with torch.no_grad():
                    for x, y in val_loader:
                        model(x)
    """)
    main = fn_named(mm, "main")
    assert modes_at(mm, main, "model") == [["eval", "train"], ["eval"]]


def test_train_at_top_of_epoch_keeps_training_in_train_mode():
    mm = build("""
        def main(model, loader, optimizer, evaluate):
            for epoch in range(10):
                model.train()
                for x, y in loader:
                    model(x).sum().backward()
                model.eval()
                model(x)
    """)
    assert modes_at(mm, fn_named(mm, "main"), "model") == [["train"], ["eval"]]


def test_parameter_models_start_in_entry_mode_and_module_models_in_train_mode():
    mm = build("""
        import torch.nn as nn

        net = nn.Linear(2, 2)
        net(x)

        def f(model, x):
            return model(x)
    """)
    assert modes_at(mm, mm.module_function, "net") == [["train"]]
    assert modes_at(mm, fn_named(mm, "f"), "model") == [[ENTRY]]


def test_helper_exit_mode_flows_into_caller():
    mm = build("""
        import torch

        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    model(x)

        def main(model, loader, optimizer):
            for epoch in range(3):
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(model, loader)
    """)
    main = fn_named(mm, "main")
    assert modes_at(mm, main, "model") == [[ENTRY, "eval"]]
    origins = [o for m, o in mm.flow(main).at[id(next(op for op in calls_of(main) if op.kind == FORWARD))]
               if m == "eval"]
    assert (origins[0].text, origins[0].line) == ("`evaluate()`", 4)
    assert origins[0].path == mm.display_path and origins[0].node is None


# --------------------------------------------------------------------------- summaries
def test_summaries():
    mm = build("""
        import torch

        def train_one_epoch(model, loader, optimizer, teacher):
            for x, y in loader:
                optimizer.zero_grad()
                with torch.no_grad():
                    t = teacher(x)
                loss = (model(x) - t).pow(2).mean()
                loss.backward()
                optimizer.step()

        @torch.no_grad()
        def evaluate(model, loader):
            for x, y in loader:
                model(x)

        def validate_and_restore(model, loader):
            model.eval()
            evaluate(model, loader)
            model.train()

        def grads_for_inputs(model, x):
            with torch.enable_grad():
                model(x).sum().backward()
    """)
    s = mm.summary_of(fn_named(mm, "train_one_epoch"))
    assert s["trains_in_entry"] == ["model"]  # the teacher runs under no_grad: not trained
    assert (s["backward"], s["step"], s["clear"], s["sched_step"]) == (True, True, True, False)
    assert s["backward_inherits_grad"] is True
    e = mm.summary_of(fn_named(mm, "evaluate"))
    assert e["evals_in_entry"] == ["model"] and e["grad"] == GRAD_OFF and e["exit_modes"] == {}
    v = mm.summary_of(fn_named(mm, "validate_and_restore"))
    assert {k: e[0] for k, e in v["exit_modes"].items()} == {"model": "train"}
    assert v["evals_in_entry"] == []  # it sets eval itself before calling evaluate()
    g = mm.summary_of(fn_named(mm, "grads_for_inputs"))
    assert g["backward"] is True and g["backward_inherits_grad"] is False


def test_closure_summary_reports_enclosing_variable_modes():
    mm = build("""
        import torch

        def main(loader):
            model = torch.nn.Dropout(0.1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

            @torch.no_grad()
            def estimate_loss():
                model.eval()
                return [model(x) for x, _ in loader]

            for it in range(100):
                if it % 10 == 0:
                    estimate_loss()
                x = next(iter(loader))
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
    """)
    est = fn_named(mm, "main.<locals>.estimate_loss")
    s = mm.summary_of(est)
    assert s["free"] == ["model"]
    assert {k: e[0] for k, e in s["exit_modes"].items()} == {"model": "eval"}
    main = fn_named(mm, "main")
    assert modes_at(mm, main, "model") == [["eval", "train"]]


def test_mode_chosen_by_a_condition_is_marked_as_deliberate():
    mm = build("""
        import torch

        def export(model, x, training):
            if training:
                model.train()
            else:
                model.eval()
            with torch.inference_mode():
                return model(x)
    """)
    fn = fn_named(mm, "export")
    fwd = next(op for op in calls_of(fn) if op.kind == FORWARD)
    modes = mm.flow(fn).at[id(fwd)]
    assert sorted(m for m, _ in modes) == ["eval", "train"]
    assert all(o.chosen for _, o in modes)


def test_chained_eval_in_assignment_sets_the_mode():
    mm = build("""
        import torch
        import torch.nn as nn

        def predict(x):
            model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)).eval()
            with torch.no_grad():
                return model(x)
    """)
    assert modes_at(mm, fn_named(mm, "predict"), "model") == [["eval"]]


def test_wrappers_keep_the_mode_of_the_wrapped_model():
    mm = build("""
        import torch
        import torch.nn as nn

        def infer(x, distributed):
            model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
            model.eval()
            model = torch.compile(model)
            if distributed:
                model = nn.parallel.DistributedDataParallel(model)
            ddp = nn.DataParallel(model)
            with torch.no_grad():
                return model(x), ddp(x)
    """)
    fn = fn_named(mm, "infer")
    assert modes_at(mm, fn, "model") == [["eval"]]
    assert modes_at(mm, fn, "ddp") == [["eval"]]


POSITIONED = '''\
"""Training utilities.

Example::

    def train(model):
        model.train()
"""
import torch
import torch.nn as nn


class Trainer:
    """Fits a model.

    def fit(self): a docstring that looks like code
    """

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    @torch.no_grad()
    def evaluate(self, loader):
        total = 0.0
        for x, y in loader:
            out = self.model(
                x,
            )
            total += (out.argmax(dim=1) == y).float().mean().item()
        return total

    def fit(self, loader, epochs=1):
        def step(x, y):
            self.optimizer.zero_grad()
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            return loss.item()

        for _ in range(epochs):
            for x, y in loader:
                step(x, y)


async def serve(model):
\tawait model.ready()  # a tab-indented body
\treturn model


def last(x):
    return x  # the file ends here without a newline'''


SCRIPT_POSITIONED = '''"""Module-level training, as in a notebook's program."""
import torch; import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

# data
x = torch.randn(256, 8); y = (x.sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y),
                    batch_size=32,
                    shuffle=True)


@torch.no_grad()
def evaluate(model):
    return model(x).argmax(1).eq(y).float().mean()


class Head(nn.Module):
    scale = 2.0  # a class-level statement

    def forward(self, h):
        return h * self.scale


model = nn.Sequential(nn.Linear(8, 2), Head())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    if epoch % 2 == 0:
        print(epoch, (
            loss.item()))
print(evaluate(model))
'''


@pytest.mark.parametrize("text", [SCRIPT_POSITIONED, SCRIPT_POSITIONED.replace("\n", "\r\n"),
                                  SCRIPT_POSITIONED.rstrip("\n")], ids=["lf", "crlf", "no-final-newline"])
def test_positions_of_one_top_level_statement_equal_the_module_positions(text):
    """Module-level code (a script's, a notebook's program) is placed statement by statement,
    never differently from the whole module's positions."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    from torchlint.model.dataflow import _code_children
    from torchlint.parse import parse_module

    module = parse_module(text)
    mm = ModuleModel("script.py", "script.py", text, module, "script")
    full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes, stack = [], [module]
    while stack:
        n = stack.pop()
        nodes.append(n)
        stack.extend(_code_children(n))
    local = 0
    for n in nodes:
        r = mm._local_position(n)
        if r is not None:
            local += 1
            assert (r.start, r.end) == (full[n].start, full[n].end), mm.code_for(n)
    assert mm._positions is None
    assert local > len(nodes) * 0.9  # the last statement too, unless the file lacks its newline
    loop = next(s for s in module.body if isinstance(s, cst.For))
    assert mm._local_position(loop) is not None


def test_positions_of_one_function_equal_the_module_positions():
    from libcst.metadata import MetadataWrapper, PositionProvider

    from torchlint.model.dataflow import _code_children
    from torchlint.parse import parse_module

    module = parse_module(POSITIONED)
    mm = ModuleModel("trainer.py", "trainer.py", POSITIONED, module, "trainer")
    full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes, stack = [], [module]
    while stack:
        n = stack.pop()
        nodes.append(n)
        stack.extend(_code_children(n))
    local = 0
    for n in nodes:
        r = mm._local_position(n)
        if r is not None:
            local += 1
            assert (r.start, r.end) == (full[n].start, full[n].end), mm.code_for(n)
    assert local > len(nodes) // 2  # most nodes are inside a function
    fn = {f.name: f for f in mm.all_functions}
    # the ``def``s in the docstrings are not taken for the functions' lines
    assert (mm.def_line(fn["fit"]), mm.def_line(fn["step"]), mm.def_line(fn["serve"])) == (32, 33, 45)
    assert mm._function_positions(fn["fit"].node) is not None
    # the last function's generated code ends with a newline the file does not have: it is
    # placed with the whole module's positions instead, and still right
    assert mm._function_positions(fn["last"].node) is None
    assert mm._positions is None  # so far nothing needed the whole module's positions
    ret = fn["last"].node.body.body[0]
    assert mm.span_of(ret) == (full[ret].start.line, full[ret].start.column,
                               full[ret].end.line, full[ret].end.column)
    assert mm._positions is not None


# --------------------------------------------------------------------------- roles on evidence
def test_names_do_not_make_roles_where_evidence_says_otherwise():
    mm = build("""
        import cv2
        import ignite.distributed as idist
        import torch
        from diffusers import DDPMScheduler

        face_net = cv2.dnn.readNetFromONNX("face.onnx")

        def run(model, loader, optimizer, model_fn, model_name):
            model = idist.auto_model(model)
            noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
            wrapped_model = lambda x: model(x)
            for x, t in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                face_net.forward()
                noise_scheduler.step(x, t, x)
                model_fn(x)
                wrapped_model(x)
                model_name.eval()
    """)
    ev = events(fn_named(mm, "run"))
    kinds = {(f, k) for f, k, _ in ev}
    assert ("model", FORWARD) in kinds and ("optimizer.step", STEP) in kinds
    assert ("idist.auto_model", FORWARD) not in kinds  # an imported function, not a model
    assert not any(f in ("face_net.forward", "noise_scheduler.step", "model_fn", "wrapped_model",
                         "model_name.eval") for f, _, _ in ev), ev


def test_modules_of_another_framework_have_no_training_events():
    src = """
        import mxnet as mx
        from mxnet import autograd, gluon

        def train(net, loader, trainer, loss_fn):
            for data, label in loader:
                with autograd.record():
                    loss = loss_fn(net(data), label)
                loss.backward()
                trainer.step(data.shape[0])
    """
    assert events(fn_named(build(src), "train")) == []
    # the same code in a module that also imports torch (a conversion script) is analysed
    mixed = build(src.replace("import mxnet as mx", "import mxnet as mx\n        import torch"))
    assert ("net", FORWARD, "net") in events(fn_named(mixed, "train"))


def test_grad_contexts_of_user_decorators_and_exit_stacks():
    mm = build("""
        import contextlib
        import functools
        import torch

        no_grad = torch.no_grad()

        def inference(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                with torch.inference_mode():
                    return func(*args, **kwargs)
            return wrapper

        def timed(func):
            def wrapper(*args, **kwargs):
                return func(*args, **kwargs)
            return wrapper

        @inference
        def evaluate(model, x):
            return model(x)

        @no_grad
        def predict(model, x):
            return model(x)

        @timed
        def run(model, x):
            return model(x)

        def stacked(model, x, amp):
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                a = model(x)
            b = model(x)
            with contextlib.ExitStack() as stack:
                if amp:
                    stack.enter_context(torch.no_grad())
                c = model(x)
            return a, b, c
    """)
    fwd = lambda name: [op.grad for op in calls_of(fn_named(mm, name)) if op.kind == FORWARD]
    assert fwd("evaluate") == [GRAD_OFF] and fn_named(mm, "evaluate").decorator_grad == GRAD_OFF
    assert fwd("predict") == [GRAD_OFF]
    assert fwd("run") == [None]
    assert fwd("stacked") == [GRAD_OFF, None, "?"]


def test_loss_stored_on_self_per_task_takes_the_kind_assigned_under_the_same_test():
    """A head that picks its loss in ``__init__`` by task type (``if self.task == "segment":
    self.loss_func = lambda logits, y: F.cross_entropy(...)``): a call under the same test in
    ``forward`` is that loss; a test of an attribute that other methods change proves nothing."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "loss", "bad", "task_head_lambda_loss_float_masks.py")
    with open(path, encoding="utf-8") as fh:
        mm = build(fh.read(), "heads.py")
    kinds = [(op.kind, op.info) for op in calls_of(fn_named(mm, "TaskHead.forward")) if op.func == "self.loss_func"]
    # segment: cross-entropy; bin_segment: a function that takes argmax first (no loss kind it
    # hands on: not a loss call); regress: a squared error written out (not a loss function);
    # the last arm: BCE with logits
    assert kinds == [("loss", catalog.CE), (None, None), (None, None), ("loss", catalog.BCE_LOGITS)]

    mm = build("""
        import torch.nn as nn
        import torch.nn.functional as F

        class Head(nn.Module):
            def __init__(self, task):
                super().__init__()
                self.task = task
                self.fc = nn.Linear(8, 3)
                if self.task == "classify":
                    self.criterion = lambda logits, y: F.cross_entropy(logits, y)
                else:
                    self.criterion = nn.BCEWithLogitsLoss()

            def set_task(self, task):
                self.task = task

            def forward(self, x, y):
                logits = self.fc(x)
                if self.task == "classify":
                    return self.criterion(logits, y)
                return self.criterion(logits, y)

        def train_step(model, x, y):
            criterion = lambda out, target: F.nll_loss(out.log_softmax(-1), target)
            scaled = lambda out, target: F.cross_entropy(out, target.long()) * 0.5
            return criterion(model(x), y) + scaled(model(x), y)
    """)
    kinds = [op.info for op in calls_of(fn_named(mm, "Head.forward")) if op.func == "self.criterion"]
    assert kinds == [catalog.OTHER_LOSS, catalog.OTHER_LOSS]  # set_task() changes self.task
    kinds = [(op.func, op.info) for op in calls_of(fn_named(mm, "train_step")) if op.kind == "loss"]
    # the first hands log-probabilities, not its own parameter, as the input; the second's body is
    # not a loss call (a product): neither is a loss of a known kind
    assert kinds == [("criterion", catalog.OTHER_LOSS)]


def test_schedule_functions_return_numbers_not_the_batch_they_are_given():
    mm = build("""
        import math
        import torch

        WARMUP = 500

        def linear_warmup(step: int, warmup_steps: int, start: float, end: float) -> float:
            if step < warmup_steps:
                return start + step / warmup_steps * (end - start)
            return end

        def cosine(step: int, total: int, base: float):
            progress = min(step / total, 1.0)
            return base * 0.5 * (1 + math.cos(math.pi * progress))

        def warmup_factor(step: int):
            return min(1.0, step / WARMUP)

        def untyped(step, total):
            return step / total

        def first_views(views, n: int):
            return torch.cat(views[:n])

        def keep(x):
            return x

        def train(loader, model):
            for i, (x, y) in enumerate(loader):
                a = linear_warmup(i, 100, 0.04, 0.07)
                b = keep(x)
                c = untyped(i, 100)
    """)
    assert mm.return_facts(fn_named(mm, "linear_warmup")) == {"scalar"}
    assert mm.return_facts(fn_named(mm, "cosine")) == {"scalar"}
    assert mm.return_facts(fn_named(mm, "warmup_factor")) == {"scalar"}
    # no evidence: parameters of unknown type, a torch op, a parameter passed through
    for name in ("untyped", "first_views", "keep"):
        assert "scalar" not in mm.return_facts(fn_named(mm, name)), name
    train = fn_named(mm, "train")
    facts = {op.func: mm.call_result_facts(train, op, op.arg_facts) for op in calls_of(train)
             if op.func in ("linear_warmup", "keep")}
    assert facts["linear_warmup"] == {"scalar"}  # given the loop's counter, still a number
    assert "batch" in facts["keep"]  # the batch passed through is still the batch


def test_loop_iterations_from_literal_evidence_only():
    from torchlint.model.ir import LoopOp, all_ops
    from torchlint.model.sizes import loop_iterations

    mm = build('''
        import torch
        MAX_LENGTH = 10
        STEPS = 5
        STEPS = 7

        def decode(decoder, x, max_length=MAX_LENGTH):
            for di in range(max_length):
                x = decoder(x)

        def sample(model, prime, size):
            for ch in prime:
                model(ch)
            for ii in range(size):
                model(ii)

        def generate(model, args):
            for i in range(args.words):
                model(i)

        def run(model, loader, xs):
            max_len = 100
            for _ in range(max_len):
                model(None)
            for i in range(-5, 6):
                model(i)
            for img in xs[:8]:
                model(img)
            for img in [xs[0], xs[1], xs[2]]:
                model(img)
            for ix, batch in enumerate(loader):
                if ix == 3:
                    break
                model(batch)
            for batch in loader:
                model(batch)
            for k in range(STEPS):
                model(k)
            while True:
                model(None)
            grown = [1, 2]
            grown.append(3)
            for g in grown:
                model(g)

        sample(None, "Anna", 1000)
        sample(None, "The", size=200)
    ''')

    def bounds(name):
        fn = fn_named(mm, name)
        return [loop_iterations(mm, fn, o) for o in all_ops(fn) if isinstance(o, LoopOp)]

    assert bounds("decode") == [10]  # the default, a module constant; no call passes another
    assert bounds("sample") == [4, 1000]  # the longest prime and size any call passes
    assert bounds("generate") == [None]  # a command-line argument: no bound
    assert bounds("run") == [100, 11, 8, 3, 4, None, 7, None, None]


def test_runs_few_times_needs_one_bounded_loop_over_data_not_models():
    from torchlint.model.ir import FORWARD, LoopOp, all_ops
    from torchlint.model.sizes import runs_few_times

    mm = build('''
        import torch
        import torch.nn as nn

        def show(model, ds, nets, test_x, series):
            model = nn.Linear(4, 2)
            for i in range(12):
                model(ds[i])
            for net in nets[:2]:
                net(test_x)
            for s in series[:12]:
                for k in range(6):
                    model(s[k])
    ''')
    fn = fn_named(mm, "show")
    loops = [o for o in all_ops(fn) if isinstance(o, LoopOp)]

    def fwds(loop):
        return [o for o in all_ops(fn) if getattr(o, "kind", None) == FORWARD and o.loop is not None
                and (o.loop is loop or o.loop.parent is loop)]

    # twelve items predicted: a few graphs; each net on a whole test tensor, or a grid of 12 x 6
    # slices: not "a few samples"
    assert [runs_few_times(mm, fn, lp, fwds(lp)) for lp in loops[:3]] == [True, False, False]

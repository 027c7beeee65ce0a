"""Loop-order (TL101-TL105) and mode (TL201-TL204) rules on short training programs."""
import textwrap

import pytest

SEL = ("TL1", "TL2", "TL201")  # TL201 is a preview rule: selected by its code


@pytest.fixture
def lint(lint_source):
    def _lint(src, name="train.py"):
        return lint_source(textwrap.dedent(src), name=name, select=SEL)
    return _lint


@pytest.fixture
def messages(tmp_path):
    from torchlint.engine import LintOptions, lint_text
    from torchlint.selection import enabled_codes, preview_codes

    def _msgs(src, name="train.py"):
        src = textwrap.dedent(src)
        p = tmp_path / name
        p.write_text(src)
        res = lint_text(str(p), src, LintOptions(frozenset(enabled_codes(list(SEL), [], [c for c in preview_codes() if any(c.startswith(x) for x in SEL)]))),
                        module_name=name[:-3])
        return [(f.code, f.line, f.message) for f in res.findings]
    return _msgs


HEADER = """
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.fc(self.drop(x))
"""


# ------------------------------------------------------------------------ TL101
def test_step_before_backward_in_a_step_function(lint):
    src = HEADER + """
class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def train_step(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.step()
        self.optimizer.zero_grad()
        loss.backward()
        return loss.item()
"""
    assert lint(src) == [("TL101", 20)]


def test_lbfgs_closure_is_not_step_before_backward(lint):
    src = HEADER + """
def fit(x, y):
    model = Net()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5)
    for i in range(10):
        def closure():
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        optimizer.step(closure)
"""
    assert lint(src) == []


# ------------------------------------------------------------------------ TL102
def test_model_zero_grad_of_the_other_gan_network_is_not_a_clear_before_step(lint):
    src = HEADER + """
def train(loader, nz=8):
    netG, netD = Net(), Net()
    optG = torch.optim.Adam(netG.parameters())
    optD = torch.optim.Adam(netD.parameters())
    for real, _ in loader:
        netD.zero_grad()
        fake = netG(torch.randn(real.size(0), nz))
        lossD = netD(real).mean() - netD(fake.detach()).mean()
        lossD.backward()
        optD.step()
        netG.zero_grad()
        lossG = -netD(fake).mean()
        lossG.backward()
        optG.step()
"""
    assert lint(src) == []


def test_zero_grad_every_micro_batch_with_accumulation(messages):
    src = HEADER + """
def train(loader, accum_steps=4):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
"""
    got = messages(src)
    assert [(c, ln) for c, ln, _ in got] == [("TL102", 18)]
    assert "accumulation condition at line 21" in got[0][2]


# ------------------------------------------------------------------------ TL103
def test_model_zero_grad_of_one_network_does_not_clear_the_other(messages):
    src = HEADER + """
def train(loader, nz=8):
    netG, netD = Net(), Net()
    optG = torch.optim.Adam(netG.parameters())
    optD = torch.optim.Adam(netD.parameters())
    for real, _ in loader:
        netD.zero_grad()
        fake = netG(torch.randn(real.size(0), nz))
        lossD = netD(real).mean() - netD(fake.detach()).mean()
        lossD.backward()
        optD.step()
        lossG = -netD(fake).mean()
        lossG.backward()
        optG.step()
"""
    got = messages(src)
    assert [(c, ln) for c, ln, _ in got] == [("TL103", 26)]
    assert "`netD.zero_grad()` at line 19" in got[0][2] and "`netG`" in got[0][2]


def test_distributed_autograd_needs_no_clearing(lint):
    src = HEADER + """
import torch.distributed.autograd as dist_autograd
from torch.distributed.optim import DistributedOptimizer

def train(model, rrefs, loader):
    opt = DistributedOptimizer(torch.optim.SGD, rrefs, lr=0.05)
    for x, y in loader:
        with dist_autograd.context() as context_id:
            loss = nn.functional.cross_entropy(model(x), y)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
"""
    assert lint(src) == []


def test_clearing_only_in_the_epoch_loop_still_fires(lint):
    src = HEADER + """
def train(loader, epochs=2):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        optimizer.zero_grad()
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
"""
    assert lint(src) == [("TL103", 21)]


# ------------------------------------------------------------------------ TL104
def test_backward_in_a_helper_that_nobody_steps(messages):
    src = HEADER + """
class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def training_step(self, x, y):
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss.item()

    def fit(self, loader):
        for x, y in loader:
            self.training_step(x, y)
"""
    got = messages(src)
    assert [(c, ln) for c, ln, _ in got] == [("TL104", 21)]
    assert "`training_step()`, called in the loop at line 26" in got[0][2]


def test_saliency_backward_without_optimizer_is_quiet(lint):
    src = HEADER + """
def saliency(model, loader):
    model.eval()
    maps = []
    for x, y in loader:
        x.requires_grad_(True)
        model(x).gather(1, y[:, None]).sum().backward()
        maps.append(x.grad.abs())
    return maps
"""
    assert lint(src) == []


# ------------------------------------------------------------------------ TL105
def test_scheduler_stepped_in_epoch_start_hook(lint):
    src = HEADER + """
class Trainer:
    def __init__(self, model, optimizer, scheduler):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def on_epoch_start(self):
        self.scheduler.step()

    def train_epoch(self, loader):
        for x, y in loader:
            self.optimizer.zero_grad()
            nn.functional.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()

    def fit(self, loader, epochs):
        for epoch in range(epochs):
            self.model.train()
            self.on_epoch_start()
            self.train_epoch(loader)
"""
    assert lint(src) == [("TL105", 19)]


WARMUP = HEADER + """
def main(loader, epochs=3):
    model = Net()
    encoder_opt = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: min(1.0, e / 5))
    PRE
    for epoch in range(epochs):
        warmup.step()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
"""


@pytest.mark.parametrize("pre, expected", [
    # an empty step of the scheduler's optimizer before the loop: stepped on every path
    ("optimizer.zero_grad(); optimizer.step()", []),
    # no step before the loop, a step of another optimizer, a step only on some paths
    ("optimizer.zero_grad()", [("TL105", 21)]),
    ("encoder_opt.zero_grad(); encoder_opt.step()", [("TL105", 21)]),
    ("if epochs > 10: optimizer.zero_grad(); optimizer.step()", [("TL105", 21)]),
])
def test_scheduler_at_epoch_start_after_a_step_before_the_loop(lint, pre, expected):
    assert lint(WARMUP.replace("PRE", pre)) == expected


@pytest.mark.parametrize("pre, expected", [
    # the gradients were just cleared: an empty step, and the backward has its own step
    ("optimizer.zero_grad(); optimizer.step()", []),
    # no clear before it (gradients of an earlier backward may be there), or a clear of
    # another optimizer's gradients
    ("optimizer.step()", [("TL101", 19)]),
    ("encoder_opt.zero_grad(); optimizer.step()", [("TL101", 19)]),
])
def test_empty_step_before_the_training_loop(lint, pre, expected):
    src = WARMUP.replace("PRE", pre)
    assert [f for f in lint(src) if f[0] == "TL101"] == expected


def test_plateau_scheduler_after_validation_is_quiet(lint):
    src = HEADER + """
def main(loader, val_loader, epochs=3):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val = sum(nn.functional.cross_entropy(model(x), y).item() for x, y in val_loader)
        scheduler.step(val)
"""
    assert lint(src) == []


# ------------------------------------------------------------------------ TL201
def test_eval_helper_is_reported_at_its_forward(messages):
    src = HEADER + """
@torch.no_grad()
def evaluate(model, loader):
    return sum((model(x).argmax(1) == y).sum().item() for x, y in loader)

def main(loader):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        print(evaluate(model, loader))
"""
    got = messages(src)
    assert [(c, ln) for c, ln, _ in got] == [("TL201", 16)]
    assert "the call at line 27" in got[0][2] and "`model.train()` at line 22" in got[0][2]


def test_model_without_dropout_or_batchnorm_is_quiet(lint):
    src = """
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in [(torch.randn(2, 4), torch.tensor([0, 1]))]:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
with torch.no_grad():
    print(model(torch.randn(2, 4)))
"""
    assert lint(src) == []
    assert lint(src.replace("nn.ReLU()", "nn.Dropout(0.5)")) == [("TL201", 12)]


def test_unit_tests_are_not_evaluation_code(lint):
    src = HEADER + """
def test_forward_shape():
    model = Net()
    with torch.no_grad():
        assert model(torch.randn(2, 8)).shape == (2, 2)
"""
    assert lint(src, name="test_net.py") == []
    # outside test code too, a model built here with random weights (never trained nor loaded)
    # run on random input is a shape check, not an evaluation
    assert lint(src, name="train.py") == []
    loaded = src.replace("    model = Net()\n", "    model = Net()\n    model.load_state_dict(torch.load('net.pt'))\n")
    assert lint(loaded, name="test_net.py") == []
    # a loaded model whose output is only looked at for its shape is a smoke test too (the
    # cookbook's `y = model(torch.zeros(...)); print(y.shape)`); its predictions are evaluation
    assert lint(loaded, name="train.py") == []
    predicted = loaded.replace("assert model(torch.randn(2, 8)).shape == (2, 2)",
                               "assert model(torch.randn(2, 8)).argmax(1).tolist() == [0, 1]")
    assert lint(predicted, name="train.py") == [("TL201", 18)]


# ------------------------------------------------------------------------ TL202
def test_frozen_encoder_kept_in_eval_mode_is_quiet(lint):
    src = HEADER + """
class Probe:
    def __init__(self, encoder, head, optimizer):
        self.encoder, self.head, self.optimizer = encoder, head, optimizer
        self.encoder.requires_grad_(False)

    def train_step(self, x, y):
        with torch.no_grad():
            feats = self.encoder(x)
        loss = nn.functional.cross_entropy(self.head(feats), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def fit(self, loader):
        for epoch in range(2):
            self.encoder.eval()
            self.head.train()
            for x, y in loader:
                self.train_step(x, y)
"""
    assert lint(src) == []


def test_evaluate_in_epoch_loop_without_train(messages):
    src = HEADER + """
def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        return [model(x) for x, _ in loader]

def main(loader):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        evaluate(model, loader)
"""
    got = messages(src)
    assert [(c, ln) for c, ln, _ in got] == [("TL202", 26)]
    assert "`evaluate()` at line 14 switches it to eval mode" in got[0][2]


def test_phase_loop_with_set_grad_enabled_is_quiet(lint):
    src = HEADER + """
def train_model(model, loaders, optimizer, epochs):
    for epoch in range(epochs):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            for x, y in loaders[phase]:
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    loss = nn.functional.cross_entropy(model(x), y)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
"""
    assert lint(src) == []


# ------------------------------------------------------------------------ TL203 / TL204
def test_validation_loop_nested_in_epoch_loop_without_no_grad(lint):
    src = HEADER + """
def main(loader, val_loader):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        for x, y in val_loader:
            print(model(x).argmax(1))
"""
    assert lint(src) == [("TL203", 24)]


def test_user_context_manager_that_yields_under_no_grad_disables_grad(lint):
    # a @contextmanager of the module that yields inside no_grad / inference_mode covers the
    # body of a `with` over it; one that yields with grad on (a timer) does not
    src = HEADER + """
import contextlib
import time

@contextlib.contextmanager
def frozen(model):
    model.eval()
    with torch.inference_mode():
        yield model

@contextlib.contextmanager
def timer(name):
    start = time.time()
    yield
    print(name, time.time() - start)

def validate(model, loader):
    model.eval()
    with frozen(model), timer("val"):
        hits = 0
        for x, y in loader:
            hits += (model(x).argmax(1) == y).sum().item()
    return hits

def test_pass(model, loader):
    model.eval()
    with timer("test"):
        for x, y in loader:
            print(model(x).argmax(1))
"""
    assert lint(src) == [("TL203", 40)]


def test_monai_mode_contexts_set_grad_and_mode_through_imports(lint, tmp_path):
    # MONAI's ``eval_mode(model)`` runs its body in eval mode under no_grad and restores the
    # mode at exit; ``train_mode(model)`` trains with grad on. Resolved through the imports:
    # the same name bound to something else (here a local context manager) is not trusted.
    src = HEADER + """
from monai.networks import utils as mnu
from monai.networks.utils import eval_mode

def validate(model, loader):
    hits = 0
    with eval_mode(model):
        for x, y in loader:
            hits += (model(x).argmax(1) == y).sum().item()
    return hits

def fit(model, loader, optimizer, epochs):
    model.train()
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        with eval_mode(model):
            for x, y in loader:
                print(model(x).argmax(1))

def adapt_under_no_grad(model, loader, optimizer):
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            with mnu.train_mode(model):
                loss = model(x).logsumexp(1).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

def probe(model, x):
    with eval_mode(model):
        model(x).sum().backward()
"""
    # the backward under eval_mode is reported (no fix: removing the block drops the mode switch)
    assert lint(src) == [("TL204", 47)]
    from torchlint.engine import LintOptions, lint_text

    (tmp_path / "probe.py").write_text(src)
    res = lint_text(str(tmp_path / "probe.py"), src, LintOptions(frozenset({"TL204"})), module_name="probe")
    assert [(f.code, f.fix) for f in res.findings] == [("TL204", None)]
    import libcst as cst
    from torchlint.model import ModuleModel
    from torchlint.model.ir import CallOp, FORWARD, GRAD_OFF, GRAD_ON, all_ops

    mm = ModuleModel("train.py", "train.py", src, cst.parse_module(src), "train")
    seen = {}
    for fn in mm.all_functions:
        flow = mm.flow(fn)
        for op in all_ops(fn):
            if isinstance(op, CallOp) and op.kind == FORWARD:
                seen[(fn.name, mm.span_of(op.node)[0])] = (op.grad, sorted(m for m, _ in flow.at[id(op)]))
    assert seen[("validate", 21)] == (GRAD_OFF, ["eval"])
    assert seen[("fit", 29)] == (None, ["train"])  # the next epoch: eval_mode gave back train mode
    assert seen[("fit", 33)] == (GRAD_OFF, ["eval"])
    assert seen[("adapt_under_no_grad", 40)] == (GRAD_ON, ["train"])
    local = src.replace("from monai.networks.utils import eval_mode",
                        "from contextlib import contextmanager\n\n@contextmanager\ndef eval_mode(m):\n"
                        "    m.eval()\n    yield m")
    assert ("TL203", 25) in lint(local)  # the validation loop, 5 lines down


def test_a_loop_running_a_gradient_explainer_needs_autograd(lint):
    # pytorch-grad-cam's GradCAM backpropagates through the model on every call (under no_grad
    # it raises); ScoreCAM only runs forwards, so its loop is an ordinary evaluation loop
    src = HEADER + """
from pytorch_grad_cam import GradCAM, ScoreCAM

def explain(model, loader):
    model.eval()
    cam = GradCAM(model=model, target_layers=[model.fc])
    for x, _ in loader:
        pred = model(x).argmax(1)
        print(pred, cam(input_tensor=x).max())

def score(model, loader):
    model.eval()
    cam = ScoreCAM(model=model, target_layers=[model.fc])
    for x, _ in loader:
        pred = model(x).argmax(1)
        print(pred, cam(input_tensor=x).max())
"""
    assert lint(src) == [("TL203", 26)]
    assert lint(src.replace("from pytorch_grad_cam import GradCAM, ScoreCAM",
                            "from pytorch_grad_cam.grad_cam import GradCAM\n"
                            "from pytorch_grad_cam.score_cam import ScoreCAM")) == [("TL203", 27)]


def test_helper_with_enable_grad_called_under_no_grad_is_quiet(lint):
    src = HEADER + """
def input_gradients(model, x):
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        model(x).sum().backward()
    return x.grad

@torch.no_grad()
def explain(model, loader):
    model.eval()
    return [input_gradients(model, x) for x, _ in loader]
"""
    assert lint(src) == []
    assert lint(src.replace("    with torch.enable_grad():\n", "    if True:\n")) == [("TL204", 23)]


@pytest.mark.parametrize("call, reported", [
    ("run_epoch(model, loader, optimizer, True)", False),  # positional: the backward is skipped
    ("run_epoch(model, loader, optimizer, validate=1)", False),
    ("run_epoch(model, loader, optimizer, validate=False)", True),  # the training value, under no_grad
    ("run_epoch(model, loader, optimizer)", True),  # the default trains
    ("run_epoch(model, loader, optimizer, **opts)", True),  # unknown here
    ("run_epoch(model, loader, optimizer, flag)", True),
])
def test_backward_guarded_by_a_parameter_follows_the_call(lint, call, reported):
    src = HEADER + f"""
def run_epoch(model, loader, optimizer, validate=False):
    total = 0.0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        if not validate:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        total += loss.item()
    return total

def fit(model, loader, optimizer, opts, flag):
    model.train()
    run_epoch(model, loader, optimizer)
    model.eval()
    with torch.no_grad():
        return {call}
"""
    line = src.splitlines().index(f"        return {call}") + 1
    assert [f for f in lint(src) if f[0] == "TL204"] == ([("TL204", line)] if reported else [])


def test_zero_grad_through_a_wrapper_name_is_trusted(lint):
    src = HEADER + """
def train(loader):
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = nn.DataParallel(net)
    for x, y in loader:
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
"""
    assert lint(src) == []

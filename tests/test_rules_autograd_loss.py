"""Autograd (TL301-TL303) and loss (TL401-TL404) rules on short, realistic training code."""
import textwrap

import pytest

SEL = ("TL3", "TL4")


@pytest.fixture
def run(tmp_path):
    """Lint ``src``; returns the findings (code, line, message, fix)."""
    from torchlint.engine import LintOptions, lint_text
    from torchlint.selection import enabled_codes, preview_codes

    def _run(src, settings=None, name="train.py"):
        src = textwrap.dedent(src)
        p = tmp_path / name
        p.write_text(src)
        opts = LintOptions(frozenset(enabled_codes(list(SEL), [], [c for c in preview_codes() if any(c.startswith(x) for x in SEL)])), settings=settings or {})
        res = lint_text(str(p), src, opts, module_name=name[:-3])
        return src, res.findings
    return _run


@pytest.fixture
def lint(run):
    def _lint(src, **kw):
        return [(f.code, f.line) for f in run(src, **kw)[1]]
    return _lint


def _fixed(src, findings, code):
    from torchlint.fixes import apply_fixes

    fixes = [f.fix for f in findings if f.code == code and f.fix is not None]
    return apply_fixes(src, fixes)[0], fixes


TRAIN_LOOP = """
    def train(model, loader, optimizer, criterion):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
"""


# ------------------------------------------------------------------------ TL301
def test_inplace_on_sigmoid_output_in_forward(lint):
    src = """
    import torch
    import torch.nn as nn

    class Gate(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.gate = nn.Linear(d, d)

        def forward(self, x, keep):
            g = torch.sigmoid(self.gate(x))
            g *= keep
            return x * g
    """
    assert lint(src) == [("TL301", 12)]


def test_residual_add_after_inplace_relu_fires_but_after_bn_is_quiet(lint):
    block = """
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1)
            self.bn2 = nn.BatchNorm2d(c)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out)){late}
            out += identity
            return self.relu(out)
    """
    # torchvision's BasicBlock: add after bn2, relu afterwards
    assert lint(block.format(late="")) == []
    # the relu moved before the residual add: its saved output is modified
    assert lint(block.format(late="\n            out = self.relu(out)")) == [("TL301", 18)]


def test_inplace_change_of_a_layers_input_fires_unless_every_build_reads_nothing(lint):
    # wav2vec's positional convolution: the conv (and a LayerNorm) read their input in backward
    block = """
    import torch.nn as nn

    class Encoder(nn.Module):
        def __init__(self, d, use_pos=True):
            super().__init__()
            {build}
            self.norm = nn.LayerNorm(d)

        def forward(self, x):
            pos = self.pos(x.transpose(1, 2)).transpose(1, 2)
            x += pos
            return self.norm(x)
    """
    conv = "self.pos = nn.utils.weight_norm(nn.Conv1d(d, d, 3, padding=1), dim=2)"
    assert lint(block.format(build=conv)) == [("TL301", 12)]
    seq = "self.pos = nn.Sequential(nn.Conv1d(d, d, 3, padding=1), nn.GELU())"
    assert lint(block.format(build=seq)) == [("TL301", 12)]
    # a layer that may be an nn.Identity() (one branch of __init__) reads nothing in backward
    branch = ("if use_pos:\n                self.pos = nn.Conv1d(d, d, 3, padding=1)\n"
              "            else:\n                self.pos = nn.Identity()")
    assert lint(block.format(build=branch)) == []
    # the output of a layer is not what it saved
    out = block.format(build=conv).replace("x += pos", "pos += x")
    assert lint(out) == []
    # under no_grad the layer saves nothing
    nograd = block.format(build=conv).replace(
        "            pos = self.pos(x.transpose(1, 2)).transpose(1, 2)",
        "            with torch.no_grad():\n                pos = self.pos(x.transpose(1, 2)).transpose(1, 2)")
    assert lint("import torch\n" + textwrap.dedent(nograd)) == []


def test_inplace_dropout_on_attention_probabilities(lint):
    # timm's TNT attention: nn.Dropout(inplace=True) right after softmax
    src = """
    import torch.nn as nn

    class Attention(nn.Module):
        def __init__(self, dim, attn_drop=0.1):
            super().__init__()
            self.qk = nn.Linear(dim, 2 * dim)
            self.attn_drop = nn.Dropout(attn_drop, inplace=True)

        def forward(self, x):
            q, k = self.qk(x).chunk(2, dim=-1)
            attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
            attn = self.attn_drop(attn)
            return attn @ x
    """
    assert lint(src) == [("TL301", 13)]


def test_quiet_on_fresh_tensors_buffers_no_grad_init_and_ema(lint):
    src = """
    import copy
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("running", torch.zeros(4))
            nn.init.zeros_(self.fc.bias)

        def forward(self, x):
            h = self.fc(x)
            pooled = h.new_zeros(h.size(0), 8)
            pooled[:, :4] = h
            self.running.mul_(0.9).add_(0.1 * h.detach().mean(0))
            mask = torch.zeros_like(h)
            mask[h > 0] = 1.0
            return pooled

    @torch.no_grad()
    def update_ema(ema, model, decay):
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(decay).add_(p, alpha=1 - decay)

    def clip(model, c):
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-c, c)

    def reparameterize(model):
        for name, p in model.named_parameters():
            p.detach_()
    """
    assert lint(src) == []


def test_leaf_parameter_update_outside_no_grad(lint):
    src = """
    import torch

    def train(model, loader, opt, clip=0.01):
        for x, y in loader:
            opt.zero_grad()
            loss = model(x).mean()
            loss.backward()
            opt.step()
            for p in model.parameters():
                p.clamp_(-clip, clip)
    """
    assert lint(src) == [("TL301", 11)]


def test_ema_parameter_loop_is_not_reported(lint):
    src = """
    def update_teacher(student, teacher, m):
        for pt, ps in zip(teacher.parameters(), student.parameters()):
            pt.mul_(m).add_(ps.detach(), alpha=1 - m)
    """
    assert lint(src) == []


def test_operand_of_multiplication_modified_before_backward(lint):
    src = """
    import torch.nn as nn

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            w = self.fc(h)
            y = h * w
            h.add_(1.0)
            return y
    """
    assert lint(src) == [("TL301", 13)]


def test_inplace_on_saved_tensor_that_no_backward_reaches(lint):
    # a notebook's top level: training first, then greedy healing of tokens where a softmax
    # column is zeroed in place and only its argmax is kept; no backward comes after it, and
    # nothing derived from ``probs`` leaves the loop (argmax gives indices)
    src = """
    import torch
    import torch.nn.functional as F

    prior = torch.nn.Sequential(torch.nn.Embedding(33, 16), torch.nn.Linear(16, 33))
    opt = torch.optim.Adam(prior.parameters())
    for batch in loader:
        logits = prior(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    healed = tokens.clone()
    for i in range(1, tokens.shape[1]):
        logits = prior(healed[:, :i])
        probs = F.softmax(logits, dim=-1)
        probs[:, :, 32] = 0
        healed[:, i] = torch.argmax(probs[0, -1, :])
    print(healed)
    """
    assert lint(src) == []
    # the probabilities are fine-tuned on afterwards: the backward goes through the changed softmax
    tuned = src + """
    loss = 1 - probs[0, -1, healed[0, -1]]
    loss.backward()
    """
    assert lint(tuned) == [("TL301", 18)]
    # inside a function: what derives from the changed tensor and leaves it may be differentiated
    kept = """
    import torch.nn as nn
    import torch.nn.functional as F

    class Healer(nn.Module):
        def __init__(self):
            super().__init__()
            self.prior = nn.Sequential(nn.Embedding(33, 16), nn.Linear(16, 33))
            self.history = []

        def heal_step(self, tokens):
            probs = F.softmax(self.prior(tokens), dim=-1)
            probs[:, :, 0] = 0
            self.history.append(probs)
            return probs.argmax(-1)
    """
    assert lint(kept) == [("TL301", 13)]
    assert lint(kept.replace("self.history.append(probs)", "print(probs.max())")) == []


def test_inplace_after_backward_is_fine(lint):
    src = """
    import torch

    def step(model, x):
        probs = torch.softmax(model(x), dim=-1)
        loss = -(probs * probs).sum(-1).mean()
        loss.backward()
        probs.mul_(0.5)
        return probs
    """
    assert lint(src) == []


# ------------------------------------------------------------------------ TL302
def test_data_read_of_graph_tensor_has_detach_fix(run):
    src, findings = run("""
    import torch
    import torch.nn as nn

    class Probe(nn.Module):
        def __init__(self, backbone, dim, classes):
            super().__init__()
            self.backbone = backbone
            self.head = nn.Linear(dim, classes)

        def forward(self, x):
            feats = self.backbone(x).data
            return self.head(feats)
    """)
    # the preview TL304 (gradient-cut-in-forward) reports the same cut: the backbone gets no
    # gradient. `.detach()` would keep that cut, so TL302 leaves the choice to TL304's fix
    assert [(f.code, f.line) for f in findings] == [("TL302", 12), ("TL304", 12)]
    assert findings[0].fix is None
    fixed, fixes = _fixed(src, findings, "TL304")
    assert fixes[0].applicability == "unsafe"
    assert "feats = self.backbone(x)\n" in fixed


def test_data_stop_gradient_on_the_way_to_the_loss_is_quiet(lint):
    # outside a forward, `.data` on the way to the loss is the stop-gradient `.detach()`
    # spells (a SimSiam target, a TD target, truncated BPTT): same values, same gradients
    src = """
    import torch.nn.functional as F

    def train(model, target_net, loader, optimizer, gamma):
        h = None
        for x1, x2, r in loader:
            optimizer.zero_grad()
            p, z = model(x1), model(x2)
            target = z.data
            td = r + gamma * target_net(x2).max(1)[0].data
            loss = -F.cosine_similarity(p, target).mean() + (p.sum(1) - td).pow(2).mean()
            loss.backward()
            optimizer.step()
    """
    assert lint(src) == []


def test_grad_data_is_allowed_by_default_and_reported_when_disallowed(lint):
    src = """
    def clip(model, max_norm):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.data.mul_(max_norm)
    """
    assert lint(src) == []
    assert lint(src, settings={"allow-grad-data": False}) == [("TL302", 5)]


def test_data_in_training_loop_vs_init_and_surgery(lint):
    src = """
    import torch
    import torch.nn as nn

    class Emb(nn.Module):
        def __init__(self, vectors):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.emb.weight.data = vectors.clone()
            self.fc = nn.Linear(4, 2)
            self.fc.weight.data.normal_(0, 0.01)
            self.fc.bias.data.zero_()

        def fuse(self, kernel):
            self.fc.weight.data = kernel

    class Dataset:
        def __init__(self, data):
            self.data = data.float()

    def train(critic, loader, opt):
        for (x,) in loader:
            opt.zero_grad()
            critic(x).mean().backward()
            opt.step()
            for p in critic.parameters():
                p.data.clamp_(-0.01, 0.01)

    def train_constrained(model, loader, opt, averaged):
        for (x, y) in loader:
            out = model(x)
            for p in model.parameters():
                p.data.clamp_(-1.0, 1.0)
            loss = (out - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            for p in model.parameters():
                p.data = averaged[p].clone()
    """
    # initialisation, surgery and writes after the step are quiet; a write between the forward
    # and its backward is reported
    assert lint(src) == [("TL302", 33)]


def test_data_under_no_grad_is_quiet(lint):
    src = """
    import torch

    def evaluate(model, loader):
        model.eval()
        with torch.no_grad():
            for x, y in loader:
                out = model(x)
                _, pred = torch.max(out.data, 1)
    """
    assert lint(src) == []


# ------------------------------------------------------------------------ TL303
def test_forward_called_directly(run):
    src, findings = run("""
    import torch.nn as nn

    class Base(nn.Module):
        def forward(self, x):
            return x

    class Net(Base):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(4, 4)

        def forward(self, x):
            x = super().forward(x)
            x = Base.forward(self, x)
            return self.enc.forward(x)

        def predict(self, x):
            return self.forward(x).argmax(-1)

    def run(model, x):
        return model.forward(x)
    """)
    assert [(f.code, f.line) for f in findings] == [("TL303", 16), ("TL303", 22)]
    fixed, _ = _fixed(src, findings, "TL303")
    assert "return self.enc(x)" in fixed and "return model(x)" in fixed


# ------------------------------------------------------------------------ TL401
def test_inline_softmax_into_cross_entropy_has_safe_fix(run):
    src, findings = run("""
    import torch.nn.functional as F

    def train(model, loader, optimizer):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(F.softmax(model(x), dim=1), y)
            loss.backward()
            optimizer.step()
    """)
    assert [(f.code, f.line) for f in findings] == [("TL401", 7)]
    fixed, fixes = _fixed(src, findings, "TL401")
    assert fixes[0].applicability == "safe"
    assert "loss = F.cross_entropy(model(x), y)" in fixed


def test_named_probabilities_with_another_use_get_an_unsafe_fix(run):
    src, findings = run("""
    import torch
    import torch.nn as nn

    def train(model, loader, optimizer):
        criterion = nn.CrossEntropyLoss()
        for x, y in loader:
            optimizer.zero_grad()
            probs = torch.softmax(model(x), dim=-1)
            loss = criterion(probs, y)
            loss.backward()
            optimizer.step()
            print(probs.max().item())
    """)
    assert [(f.code, f.line) for f in findings] == [("TL401", 10)]
    fixed, fixes = _fixed(src, findings, "TL401")
    assert fixes[0].applicability == "unsafe"
    assert "probs = model(x)" in fixed


def test_softmax_last_layer_of_a_factory_model_through_a_helper(lint):
    src = """
    import torch
    import torch.nn as nn

    def build(d, c):
        return nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, c), nn.Softmax(dim=1))
    """ + TRAIN_LOOP + """
    def main(loader):
        model = build(8, 3).to("cpu")
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, loader, optimizer, criterion)
    """
    assert lint(src) == [("TL401", 12)]


def test_softmax_for_metrics_detached_or_as_soft_target_is_quiet(lint):
    src = """
    import torch
    import torch.nn.functional as F

    def train(student, teacher, loader, optimizer):
        for x, y in loader:
            optimizer.zero_grad()
            logits = student(x)
            with torch.no_grad():
                soft = F.softmax(teacher(x), dim=-1)
            loss = F.cross_entropy(logits, y) + F.cross_entropy(logits, soft)
            loss.backward()
            optimizer.step()
            conf = F.softmax(logits.detach(), dim=-1).max(-1).values.mean()
            F.cross_entropy(logits.detach().softmax(-1), y)
    """
    assert lint(src) == []


# ------------------------------------------------------------------------ TL402
def test_sigmoid_model_into_bce_with_logits(lint):
    src = """
    import torch
    import torch.nn as nn

    class Churn(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(8, 1)

        def forward(self, x):
            return torch.sigmoid(self.out(x)).squeeze(-1)
""" + TRAIN_LOOP + """
    def main(loader):
        model = Churn()
        opt = torch.optim.Adam(model.parameters())
        train(model, loader, opt, nn.BCEWithLogitsLoss())
        train(model, loader, opt, nn.BCELoss())
    """
    findings = lint(src)
    # reported once per criterion that expects logits: the helper is shared, so the kind is
    # ambiguous (BCELoss and BCEWithLogitsLoss passed) and nothing is reported
    assert findings == []
    src_one = src.replace("    train(model, loader, opt, nn.BCELoss())\n", "")
    assert lint(src_one) == [("TL402", 17)]


def test_sigmoid_then_bce_loss_is_quiet(lint):
    src = """
    import torch
    import torch.nn as nn

    def train(model, loader, optimizer):
        criterion = nn.BCELoss()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(torch.sigmoid(model(x)), y)
            loss.backward()
            optimizer.step()
    """
    assert lint(src) == []


# ------------------------------------------------------------------------ TL403
def test_nll_loss_on_raw_logits_and_on_log_softmax(lint):
    src = """
    import torch.nn as nn
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(x)

    def train(loader, optimizer):
        model = Net()
        for x, y in loader:
            optimizer.zero_grad()
            bad = F.nll_loss(model(x), y)
            good = F.nll_loss(F.log_softmax(model(x), dim=1), y)
            (bad + good).backward()
            optimizer.step()
    """
    assert lint(src) == [("TL403", 17)]


# ------------------------------------------------------------------------ TL404
def test_float_class_targets(lint):
    src = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def train(model, loader, optimizer, num_classes, mixup):
        criterion = nn.CrossEntropyLoss()
        for x, y in loader:
            optimizer.zero_grad()
            out = model(x)
            l1 = criterion(out, y.float())
            l2 = criterion(out, F.one_hot(y, num_classes).float())
            xm, ym = mixup(x, y)
            l3 = criterion(model(xm), ym.float())
            l4 = F.cross_entropy(out, y.to(torch.float32))
            l5 = F.cross_entropy(out, y.long())
            (l1 + l2 + l3 + l4 + l5).backward()
            optimizer.step()
    """
    assert lint(src) == [("TL404", 11), ("TL404", 15)]


def test_every_rule_has_docs_metadata():
    from torchlint.rule import all_rules

    rules = all_rules()
    for code in ("TL301", "TL302", "TL303", "TL401", "TL402", "TL403", "TL404"):
        r = rules[code]
        assert r.name and r.summary and r.why and r.example and r.use_instead and r.triggers
        assert r.references
        if r.fix_safety:
            assert r.fix_doc
    assert "allow-grad-data" in rules["TL302"].options

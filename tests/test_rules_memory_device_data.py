"""Memory (TL501/TL502), device (TL601/TL602), data (TL701/TL702) and debug (TL801) rules.

Each case is a small but complete piece of training code; the tests check which findings the
rules make, where, and what their fixes produce when applied.
"""
import textwrap

import pytest

from torchlint.engine import LintOptions, lint_text
from torchlint.fixes import apply_fixes
from torchlint.selection import enabled_codes, preview_codes


def _lint(tmp_path, src, select=("TL5", "TL6", "TL7", "TL8"), name="train.py"):
    text = textwrap.dedent(src)
    p = tmp_path / name
    p.write_text(text)
    opts = LintOptions(frozenset(enabled_codes(list(select), [], [c for c in preview_codes() if any(c.startswith(x) for x in select)])))
    res = lint_text(str(p), text, opts, module_name=name[:-3])
    assert res.error is None
    return text, res.findings


def codes(tmp_path, src, **kw):
    return sorted((f.code, f.line) for f in _lint(tmp_path, src, **kw)[1])


def fixed(tmp_path, src, code):
    """The source after applying the fixes of every ``code`` finding, and their applicabilities."""
    text, findings = _lint(tmp_path, src)
    fixes = [f.fix for f in findings if f.code == code and f.fix is not None]
    assert fixes, f"no fix for {code}"
    out, n = apply_fixes(text, fixes)
    assert n == len(fixes)
    return out, [f.applicability for f in fixes]


HEADER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x)


"""


def prog(body):
    return HEADER + textwrap.dedent(body)


def line_of(src, needle):
    for i, ln in enumerate(textwrap.dedent(src).splitlines(), 1):
        if needle in ln:
            return i
    raise AssertionError(needle)


# ----------------------------------------------------------------------------- TL501
TOTAL_LOSS = HEADER + """\
def train_epoch(model, loader, optimizer, criterion):
    model.train()
    total_loss = 0.0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss
    print(f"train loss {total_loss / len(loader):.4f}")
"""


def test_running_total_of_loss_is_flagged_with_a_safe_item_fix(tmp_path):
    assert codes(tmp_path, TOTAL_LOSS) == [("TL501", line_of(TOTAL_LOSS, "total_loss += loss"))]
    out, kinds = fixed(tmp_path, TOTAL_LOSS, "TL501")
    assert "total_loss += loss.item()" in out
    assert kinds == ["safe"]


def test_total_returned_gets_the_unsafe_detach_fix(tmp_path):
    src = TOTAL_LOSS.replace('    print(f"train loss {total_loss / len(loader):.4f}")\n',
                             "    return total_loss / len(loader)\n")
    out, kinds = fixed(tmp_path, src, "TL501")
    assert "total_loss += loss.detach()" in out
    assert kinds == ["unsafe"]


def test_loss_list_and_dict_store_are_flagged(tmp_path):
    src = prog("""\
    def fit(model, loader, optimizer, criterion, epochs):
        history = {"loss": []}
        step_losses = {}
        for epoch in range(epochs):
            for step, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                history["loss"].append(loss)
                step_losses[(epoch, step)] = loss
        return history, step_losses
    """)
    assert codes(tmp_path, src) == [("TL501", line_of(src, 'history["loss"].append')),
                                    ("TL501", line_of(src, "step_losses[(epoch"))]
    out, kinds = fixed(tmp_path, src, "TL501")
    assert 'history["loss"].append(loss.detach())' in out
    assert kinds == ["unsafe", "unsafe"]


@pytest.mark.parametrize("stmt", ["total_loss += loss.item()", "total_loss += loss.detach()",
                                  "total_loss += float(loss)", "total_loss += loss.data.cpu().numpy()"])
def test_numbers_and_detached_values_are_quiet(tmp_path, stmt):
    assert codes(tmp_path, TOTAL_LOSS.replace("total_loss += loss", stmt)) == []


def test_quiet_under_no_grad_and_for_aux_losses_before_backward(tmp_path):
    src = prog("""\
    def train(model, loader, optimizer, criterion):
        for x, y in loader:
            optimizer.zero_grad()
            out = model(x)
            loss = criterion(out, y)
            for aux in (out.pow(2).mean(), out.abs().mean()):
                loss = loss + 0.1 * aux
            loss.backward()
            optimizer.step()


    def validate(model, loader, criterion):
        total = 0
        with torch.no_grad():
            for x, y in loader:
                total += criterion(model(x), y)
        return total
    """)
    assert codes(tmp_path, src) == []


def test_losses_consumed_by_backward_are_quiet(tmp_path):
    src = prog("""\
    def reinforce(policy, env_batches, optimizer, criterion):
        for episode in env_batches:
            losses = []
            for x, y in episode:
                losses.append(criterion(policy(x), y))
            optimizer.zero_grad()
            torch.stack(losses).sum().backward()
            optimizer.step()
    """)
    assert codes(tmp_path, src) == []


# ----------------------------------------------------------------------------- TL502
def test_outputs_kept_across_training_iterations(tmp_path):
    src = prog("""\
    def train(model, loader, optimizer, criterion):
        all_logits, all_preds, all_idx = [], [], []
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = criterion(logits, y)
            loss.backward()
            optimizer.step()
            all_logits.append(logits)
            all_preds.append(logits.argmax(dim=1))
            _, idx = logits.max(1)
            all_idx.append(idx)
        return torch.cat(all_logits)
    """)
    assert codes(tmp_path, src) == [("TL502", line_of(src, "all_logits.append(logits)"))]
    out, _ = fixed(tmp_path, src, "TL502")
    assert "all_logits.append(logits.detach())" in out


# ----------------------------------------------------------------------------- TL601
MOVED = HEADER + """\
def train(model, loader, optimizer, criterion, device):
    model.train()
    for x, y in loader:
        MOVE
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, loader, optimizer, nn.CrossEntropyLoss(), device)
"""


def test_batch_not_moved_to_the_moved_model_in_a_caller(tmp_path):
    src = MOVED.replace("MOVE", "pass")
    assert codes(tmp_path, src) == [("TL601", line_of(src, "loss = criterion(model(x), y)"))]
    out, kinds = fixed(tmp_path, src, "TL601")
    assert "criterion(model(x.to(device)), y)" in out and kinds == ["unsafe"]


def test_to_on_its_own_line_does_not_move_a_tensor(tmp_path):
    src = MOVED.replace("MOVE", "x.to(device); y = y.to(device)")
    found = _lint(tmp_path, src)[1]
    assert [(f.code, f.line) for f in found] == [("TL601", line_of(src, "criterion(model(x), y)"))]
    assert "own line" in found[0].message
    out, _ = fixed(tmp_path, src, "TL601")
    assert "x = x.to(device); y = y.to(device)" in out


def test_labels_left_on_the_cpu_reach_the_loss(tmp_path):
    src = MOVED.replace("MOVE", "x = x.to(device)")
    assert codes(tmp_path, src) == [("TL601", line_of(src, "criterion(model(x), y)"))]
    out, _ = fixed(tmp_path, src, "TL601")
    assert "criterion(model(x), y.to(device))" in out


@pytest.mark.parametrize("move", ["x, y = x.to(device), y.to(device)",
                                  "x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)"])
def test_moved_batches_are_quiet(tmp_path, move):
    assert codes(tmp_path, MOVED.replace("MOVE", move)) == []


def test_cpu_only_script_and_data_parallel_are_quiet(tmp_path):
    cpu = MOVED.replace("MOVE", "pass").replace(
        'torch.device("cuda" if torch.cuda.is_available() else "cpu")', 'torch.device("cpu")')
    assert codes(tmp_path, cpu) == []
    dp = MOVED.replace("MOVE", "y = y.cuda()").replace("model = Net().to(device)",
                                                      "model = nn.DataParallel(Net()).cuda()")
    assert codes(tmp_path, dp) == []


def test_collate_fn_accelerate_and_device_datasets_are_quiet(tmp_path):
    collate = MOVED.replace("MOVE", "pass").replace(
        "loader = DataLoader(data, batch_size=16, shuffle=True)",
        "loader = DataLoader(data, batch_size=16, shuffle=True, collate_fn=to_device)").replace(
        "def main():", "def to_device(samples):\n    x, y = zip(*samples)\n"
                       "    return torch.stack(x).cuda(), torch.stack(y).cuda()\n\n\ndef main():")
    assert codes(tmp_path, collate) == []
    on_device = MOVED.replace("MOVE", "pass").replace(
        "TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))",
        "TensorDataset(torch.randn(64, 8).to(device), torch.randint(0, 3, (64,)).to(device))")
    assert codes(tmp_path, on_device) == []
    accel = prog("""\
    from accelerate import Accelerator


    def main():
        accelerator = Accelerator()
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        loader = DataLoader(data, batch_size=16, shuffle=True)
        model = Net().to(accelerator.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
    """)
    assert codes(tmp_path, accel) == []


def test_dict_batches(tmp_path):
    src = prog("""\
    def train(model, loader, optimizer, device):
        for batch in loader:
            BATCH
            optimizer.zero_grad()
            loss = model(**batch).sum()
            loss.backward()
            optimizer.step()


    def main():
        device = torch.device("cuda")
        loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16, shuffle=True)
        model = Net().to(device)
        train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), device)
    """)
    assert codes(tmp_path, src.replace("BATCH", "pass")) == [("TL601", line_of(src, "model(**batch)"))]
    for ok in ("batch = {k: v.to(device) for k, v in batch.items()}", "batch.to(device)"):
        assert codes(tmp_path, src.replace("BATCH", ok)) == []


def test_cpu_lengths_and_ctc_targets_are_quiet(tmp_path):
    src = prog("""\
    def train(model, loader, optimizer, device):
        ctc = nn.CTCLoss()
        for feats, lengths, targets, target_lengths in loader:
            feats = feats.to(device)
            optimizer.zero_grad()
            log_probs = model(feats, lengths)
            loss = ctc(log_probs, targets, lengths, target_lengths)
            loss.backward()
            optimizer.step()


    def main():
        device = torch.device("cuda")
        data = TensorDataset(torch.randn(64, 8), torch.full((64,), 8), torch.randint(1, 3, (64, 4)),
                             torch.full((64,), 4))
        model = Net().to(device)
        train(model, DataLoader(data, batch_size=16, shuffle=True),
              torch.optim.SGD(model.parameters(), lr=0.1), device)
    """)
    assert codes(tmp_path, src) == []


# ----------------------------------------------------------------------------- TL602
def test_tensor_created_in_forward_without_device(tmp_path):
    src = """\
    import math

    import torch
    import torch.nn as nn


    class Encoder(nn.Module):
        def __init__(self, vocab, d, max_len=128):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(max_len, d)
            self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)))

        def forward(self, ids, lengths):
            B, T = ids.shape
            positions = torch.arange(T)
            h = self.tok(ids) + self.pos(positions)
            h = h / torch.tensor(math.sqrt(h.size(-1)))
            pad_mask = torch.arange(T, device=ids.device)[None, :] >= lengths[:, None]
            order = torch.randperm(B)
            h = h[order]
            cls = torch.zeros(B, 1, h.size(-1))
            h = torch.cat([cls, h], dim=1)
            return h.masked_fill(pad_mask[:, :, None], 0.0) + self.causal[:T, :T].sum()
    """
    assert codes(tmp_path, src) == [("TL602", line_of(src, "positions = torch.arange(T)")),
                                    ("TL602", line_of(src, "cls = torch.zeros"))]
    out, kinds = fixed(tmp_path, src, "TL602")
    assert "torch.arange(T, device=ids.device)" in out
    assert "torch.zeros(B, 1, h.size(-1), device=ids.device)" in out
    assert kinds == ["unsafe", "unsafe"]


def test_tl602_fix_reads_the_device_of_an_input_known_to_be_a_tensor(tmp_path):
    """Issue 19 item 5: the first input of ``forward`` is a list of token-id lists here, so
    ``device=token_lists.device`` would raise; the fix takes the mask (a tensor by its use), and
    the fixed module runs.  A factory given ``**kwargs`` (which may hold a device) gets no fix."""
    src = """\
    import torch
    import torch.nn as nn


    class BagEncoder(nn.Module):
        def __init__(self, vocab, dim, factory_kwargs=None):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.factory_kwargs = factory_kwargs or {}

        def forward(self, token_lists, mask, scale=None):
            B = len(token_lists)
            T = max(len(t) for t in token_lists)
            ids = torch.zeros(B, T, dtype=torch.long)
            for i, toks in enumerate(token_lists):
                ids[i, :len(toks)] = torch.tensor(toks)
            h = self.embed(ids) * mask.unsqueeze(-1)
            bias = torch.ones(B, T, h.size(-1), **self.factory_kwargs)
            return (h + bias).sum(dim=1)


    if __name__ == "__main__":
        enc = BagEncoder(50, 8)
        print(enc([[1, 2, 3], [4, 5]], torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])).shape)
    """
    text, findings = _lint(tmp_path, src)
    tl602 = sorted((f.line, f.fix is not None) for f in findings if f.code == "TL602")
    assert tl602 == [(line_of(src, "ids = torch.zeros"), True), (line_of(src, "bias = torch.ones"), False)]
    out, _ = fixed(tmp_path, src, "TL602")
    assert "ids = torch.zeros(B, T, dtype=torch.long, device=mask.device)" in out
    assert "token_lists.device" not in out and "scale.device" not in out
    torch = pytest.importorskip("torch")
    ns = {}
    exec(compile(out, "fixed.py", "exec"), ns)  # the fixed module is valid and runs (CPU)
    enc = ns["BagEncoder"](50, 8)
    got = enc([[1, 2, 3], [4, 5]], torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    assert tuple(got.shape) == (2, 8)


# ----------------------------------------------------------------------------- TL701
LOADERS = HEADER + """\
class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from zip(torch.randn(64, 8), torch.randint(0, 3, (64,)))


def build(batch_size, sampler=None):
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    train_loader = DataLoader(data, batch_size=batch_size)
    val_loader = DataLoader(data, batch_size=batch_size)
    test_loader = DataLoader(data, batch_size=batch_size, shuffle=False)
    stream_loader = DataLoader(Stream(), batch_size=batch_size)
    dist_loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    flag_loader = DataLoader(data, batch_size=batch_size, shuffle=sampler is None)
    return train_loader, val_loader, test_loader, stream_loader, dist_loader, flag_loader


def fit(model, optimizer):
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=8)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def train_epoch(model, optimizer, loader):
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@torch.no_grad()
def evaluate(model, loader):
    return sum((model(x).argmax(1) == y).sum().item() for x, y in loader)


def main(model, optimizer, sampler=None):
    train_loader, val_loader, test_loader, stream_loader, dist_loader, flag_loader = build(8, sampler)
    for epoch in range(3):
        train_epoch(model, optimizer, train_loader)
        train_epoch(model, optimizer, stream_loader)
        train_epoch(model, optimizer, dist_loader)
        train_epoch(model, optimizer, flag_loader)
        print(evaluate(model, val_loader), evaluate(model, test_loader))
"""


def test_training_loaders_without_shuffle(tmp_path):
    # build()'s loaders are returned and trained on by main() (a stream, a sampler and a
    # shuffle chosen by a flag are fine); val and test loaders are only evaluated
    assert codes(tmp_path, LOADERS) == [("TL701", line_of(LOADERS, "train_loader = DataLoader")),
                                        ("TL701", line_of(LOADERS, "loader = DataLoader(TensorDataset"))]
    out, kinds = fixed(tmp_path, LOADERS, "TL701")
    assert "DataLoader(data, batch_size=batch_size, shuffle=True)" in out
    assert kinds == ["unsafe", "unsafe"]


def test_lightning_train_dataloader_hook(tmp_path):
    src = """\
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8, shuffle=False)

        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8, shuffle=False)
    """
    assert codes(tmp_path, src) == [("TL701", line_of(src, "def train_dataloader") + 1)]
    out, _ = fixed(tmp_path, src, "TL701")
    assert out.count("shuffle=True") == 1


def test_full_batch_loader_is_quiet(tmp_path):
    src = prog("""\
    def fit(model, optimizer, data):
        train_loader = DataLoader(data, batch_size=len(data))
        for x, y in train_loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    """)
    assert codes(tmp_path, src) == []


RESHUFFLED = prog("""\
import random

import numpy as np


class WindowDataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y
        self.order = list(range(len(x)))
        random.shuffle(self.order)

    def METHOD(self):
        BODY

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        j = self.order[i]
        return self.x[j], self.y[j]


def train_epoch(model, optimizer, train_dl):
    CALL_IN_EPOCH
    for x, y in train_dl:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def main(model, optimizer, x, y, epochs):
    train_dl = DataLoader(WindowDataset(x, y), batch_size=16)
    CALL_ONCE
    for epoch in range(epochs):
        train_epoch(model, optimizer, train_dl)
""")


@pytest.mark.parametrize("method, body, in_epoch, once, reported", [
    # the dataset permutes its own samples, every epoch (in the function the epoch loop calls)
    ("shuffleSamples", "random.shuffle(self.order)", "train_dl.dataset.shuffleSamples()", "pass", False),
    ("reshuffle", "self.order = np.random.permutation(len(self.x)).tolist()",
     "train_dl.dataset.reshuffle()", "pass", False),
    # once before the epoch loop only (or at construction): the order repeats every epoch
    ("shuffleSamples", "random.shuffle(self.order)", "pass", "train_dl.dataset.shuffleSamples()", True),
    # a method whose name says shuffle but that only sorts: no evidence
    ("shuffleSamples", "self.order.sort()", "train_dl.dataset.shuffleSamples()", "pass", True),
])
def test_dataset_that_reshuffles_itself_every_epoch(tmp_path, method, body, in_epoch, once, reported):
    src = RESHUFFLED.replace("METHOD", method).replace("BODY", body).replace("CALL_IN_EPOCH", in_epoch) \
        .replace("CALL_ONCE", once)
    expected = [("TL701", line_of(src, "train_dl = DataLoader"))] if reported else []
    assert codes(tmp_path, src) == expected


# ----------------------------------------------------------------------------- TL702
def test_argmax_without_dim_compared_with_labels(tmp_path):
    src = prog("""\
    def evaluate(model, loader):
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in loader:
                logits = model(x)
                pred = logits.argmax()
                correct += (pred == y).sum().item()
                correct += torch.argmax(logits, dim=1).eq(y).sum().item()
        return correct


    def act(policy, state):
        return policy(state).argmax().item()
    """)
    assert codes(tmp_path, src) == [("TL702", line_of(src, "pred = logits.argmax()"))]
    out, _ = fixed(tmp_path, src, "TL702")
    assert "pred = logits.argmax(dim=1)" in out


def test_flat_argmax_with_single_sample_batches_is_quiet(tmp_path):
    src = prog("""\
    def predict_one_by_one(model, data):
        correct = 0
        with torch.no_grad():
            for x, y in DataLoader(data):
                correct += int(model(x).argmax() == y)
        return correct
    """)
    assert codes(tmp_path, src) == []


# ----------------------------------------------------------------------------- TL801
def test_detect_anomaly_left_on(tmp_path):
    src = prog("""\
    import argparse

    torch.autograd.set_detect_anomaly(True)


    def train(model, loader, optimizer, debug=False):
        if debug:
            torch.autograd.set_detect_anomaly(True)
        torch.autograd.set_detect_anomaly(debug)
        with torch.autograd.detect_anomaly():
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()


    if __name__ == "__main__":
        torch.autograd.set_detect_anomaly(mode=True)
    """)
    assert codes(tmp_path, src) == [("TL801", line_of(src, "import argparse") + 2),
                                    ("TL801", line_of(src, "with torch.autograd.detect_anomaly()")),
                                    ("TL801", line_of(src, "set_detect_anomaly(mode=True)"))]


def test_rules_have_full_metadata():
    from torchlint.rule import all_rules

    for code in ("TL501", "TL502", "TL601", "TL602", "TL701", "TL702", "TL801"):
        r = all_rules()[code]
        assert r.name and r.summary and r.why and r.example and r.use_instead and r.references
        assert r.triggers
        if code != "TL801":
            assert r.fix_safety in ("safe", "unsafe") and r.fix_doc


def test_batch_items_moved_by_assignment_are_quiet(tmp_path):
    src = prog("""\
    def train(model, loader, optimizer, device):
        for batch in loader:
            for key in batch.keys():
                batch[key] = batch[key].to(device)
            optimizer.zero_grad()
            loss = model(batch["x"]).sum()
            loss.backward()
            optimizer.step()


    def main():
        device = torch.device("cuda")
        loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16, shuffle=True)
        model = Net().to(device)
        train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), device)
    """)
    assert codes(tmp_path, src) == []
    assert codes(tmp_path, src.replace("batch[key] = batch[key].to(device)", "pass")) == [
        ("TL601", line_of(src, 'model(batch["x"])'))]


def test_detect_anomaly_chosen_by_a_flag_is_quiet(tmp_path):
    src = prog("""\
    import contextlib


    def train(model, loader, optimizer, debug):
        ctx = torch.autograd.detect_anomaly() if debug else contextlib.nullcontext()
        debug and torch.autograd.set_detect_anomaly(True)
        with ctx:
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
    """)
    assert codes(tmp_path, src) == []

"""Autofixes: the fixture pairs, the fix loop's guarantees, the CLI flags and `--add-noqa`."""
import glob
import os
import stat
import textwrap

import libcst as cst
import pytest
from click.testing import CliRunner

from torchlint.cli import main
from torchlint.engine import LintOptions, lint_text
from torchlint.findings import Edit, Finding, Fix, Position, Span
from torchlint.fixer import add_noqa, fix_text, noqa_text
from torchlint.fixes import apply_fixes, apply_fixes_detailed
from torchlint.selection import enabled_codes, preview_codes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pair_sources():
    """The programs of the fix pairs: each `fixtures/fixes/X.fixed.py` is what `--fix` makes of
    `fixtures/fixes/X.py`, or, where no such file is there, of the buggy fixture
    `fixtures/<family>/bad/X.py` (kept once, not copied)."""
    out = []
    for fixed in glob.glob(os.path.join(ROOT, "fixtures", "fixes", "*.fixed.py")):
        name = os.path.basename(fixed)[:-len(".fixed.py")] + ".py"
        beside = os.path.join(os.path.dirname(fixed), name)
        found = [beside] if os.path.exists(beside) else glob.glob(os.path.join(ROOT, "fixtures", "*", "bad", name))
        assert len(found) == 1, (fixed, found)
        out.append(found[0])
    return sorted(out)


PAIRS = _pair_sources()
OPTS = LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))  # preview rules too


def _read(p):
    with open(p, encoding="utf-8", newline="") as fh:
        return fh.read()


def _lint(path, text):
    return lint_text(str(path), text, OPTS).findings


def _ids(findings):
    return {(f.code, f.fingerprint) for f in findings}


_FIXED: dict = {}


def _fix_pair(path):
    if path not in _FIXED:
        _FIXED[path] = fix_text(path, _read(path), OPTS, unsafe=True)
    return _FIXED[path]


# ------------------------------------------------------------------ fixture pairs
@pytest.mark.parametrize("path", PAIRS, ids=[os.path.basename(p) for p in PAIRS])
def test_fixture_pair(path):
    original = _read(path)
    expected = _read(os.path.join(ROOT, "fixtures", "fixes", os.path.basename(path)[:-3] + ".fixed.py"))
    before = _lint(path, original)
    fixable = [f for f in before if f.fix is not None]
    assert fixable, "a pair must exercise at least one fix"
    res = _fix_pair(path)
    cst.parse_module(res.fixed)  # the fixed program parses
    assert res.fixed == expected
    # the fixed findings are gone
    after = _lint(path, res.fixed)
    assert not (_ids(fixable) & _ids(after)), [f"{f.code}:{f.line}" for f in after]
    assert {a.code for a in res.applied} == {f.code for f in fixable}
    # a second pass changes nothing
    again = fix_text(path, res.fixed, OPTS, unsafe=True)
    assert again.fixed == res.fixed and again.applied == []


def test_pairs_cover_the_loop_order_and_mode_fixes():
    from torchlint.rule import all_rules

    covered = set()
    for p in PAIRS:
        covered |= {a.code for a in _fix_pair(p).applied}
    with_fixes = {c for c, r in all_rules().items() if r.fix_safety and c[:3] in ("TL1", "TL2")}
    assert with_fixes - covered == set()


def test_cli_fix_writes_the_expected_file(tmp_path):
    src = os.path.join(ROOT, "fixtures", "fixes", "mlp_never_zero_grad.py")
    p = tmp_path / "train.py"
    p.write_text(_read(src))
    r = CliRunner().invoke(main, ["check", "--no-cache", "--fix", "--unsafe-fixes", str(p)])
    assert r.exit_code == 0, r.output
    assert _read(p) == _read(src[:-3] + ".fixed.py")


# ------------------------------------------------------------------ safe / unsafe, --diff, --show-fixes
BUGGY = '''\
"""Train a tiny regressor and report the validation loss."""
import torch
import torch.nn as nn


def validate(model, batches):
    model.eval()
    total = 0.0
    for x, y in batches:
        total += nn.functional.mse_loss(model(x), y).item()
    return total / len(batches)


def train(model, batches, optimizer):
    model.train()
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()


def main():
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
    train(model, batches, optimizer)
    print(validate(model, batches))


if __name__ == "__main__":
    main()
'''


def _codes(path):
    return sorted(f.code for f in _lint(path, _read(path)))


def test_fix_applies_safe_fixes_only_unless_asked(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(BUGGY)
    assert _codes(p) == ["TL103", "TL203"]
    r = CliRunner().invoke(main, ["check", "--no-cache", "--fix", str(p)])
    assert r.exit_code == 1  # TL103 remains (its fix is unsafe)
    assert "TL103" in r.output and "TL203" not in r.output
    assert "with torch.no_grad():\n        for x, y in batches:\n            total +=" in _read(p)
    assert _codes(p) == ["TL103"]
    r = CliRunner().invoke(main, ["check", "--no-cache", "--fix", "--unsafe-fixes", "--show-fixes", str(p)])
    assert r.exit_code == 0, r.output
    assert "TL103 (missing-zero-grad)" in r.output and "(unsafe)" in r.output
    assert "    for x, y in batches:\n        optimizer.zero_grad()\n        loss =" in _read(p)
    assert _codes(p) == []


def test_diff_writes_nothing_and_exits_1(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(BUGGY)
    os.utime(p, (1_000_000_000, 1_000_000_000))
    r = CliRunner().invoke(main, ["check", "--no-cache", "--diff", str(p)])
    assert r.exit_code == 1
    assert f"--- {p}" in r.output or "--- " in r.output
    assert "+    with torch.no_grad():" in r.output
    assert "zero_grad" not in r.output  # unsafe: not without --unsafe-fixes
    assert _read(p) == BUGGY and os.stat(p).st_mtime == 1_000_000_000
    r = CliRunner().invoke(main, ["check", "--no-cache", "--diff", "--unsafe-fixes", str(p)])
    assert r.exit_code == 1 and "+        optimizer.zero_grad()" in r.output
    # nothing to fix -> no diff, exit 0
    clean = tmp_path / "clean.py"
    clean.write_text('"""Nothing to do."""\nimport torch\n\nprint(torch.ones(2).sum())\n')
    r = CliRunner().invoke(main, ["check", "--no-cache", "--diff", str(clean)])
    assert r.exit_code == 0 and "---" not in r.output


# ------------------------------------------------------------------ files: encoding, BOM, CRLF, mode, mtime
def test_crlf_bom_encoding_and_permissions_are_kept(tmp_path):
    crlf = tmp_path / "crlf.py"
    crlf.write_bytes(b"\xef\xbb\xbf" + BUGGY.replace("\n", "\r\n").encode("utf-8"))
    os.chmod(crlf, 0o640)
    latin = tmp_path / "latin.py"
    latin.write_bytes(("# -*- coding: latin-1 -*-\n# d\xe9j\xe0 vu\n" + BUGGY).encode("latin-1"))
    clean = tmp_path / "clean.py"
    clean.write_text('"""Nothing to fix here."""\nimport torch\n\nmodel = torch.nn.Linear(2, 2)\nmodel.eval()\n')
    os.utime(clean, (1_000_000_000, 1_000_000_000))
    r = CliRunner().invoke(main, ["check", "--no-cache", "--fix", "--unsafe-fixes", str(tmp_path)])
    assert r.exit_code == 0, r.output
    data = crlf.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    text = data[3:].decode("utf-8")
    assert "\n" not in text.replace("\r\n", "")  # every line ending is still CRLF
    assert "    with torch.no_grad():\r\n        for x, y in batches:\r\n" in text
    assert stat.S_IMODE(os.stat(crlf).st_mode) == 0o640
    ldata = latin.read_bytes()
    assert b"# d\xe9j\xe0 vu\n" in ldata and b"optimizer.zero_grad()" in ldata
    assert os.stat(clean).st_mtime == 1_000_000_000  # untouched
    assert not [n for n in os.listdir(tmp_path) if "torchlint-tmp" in n]


def test_symlink_stays_a_link(tmp_path):
    real = tmp_path / "real_train.py"
    real.write_text(BUGGY)
    link = tmp_path / "train.py"
    link.symlink_to(real)
    r = CliRunner().invoke(main, ["check", "--no-cache", "--fix", str(link)])
    assert r.exit_code == 1
    assert os.path.islink(link) and "torch.no_grad()" in real.read_text()


# ------------------------------------------------------------------ the fix loop's guarantees
def _finding(code, line, fix, fp="x"):
    return Finding(code, "synthetic", "m", "t.py", Span.of(line, 0, line, 1), fix=fix, fingerprint=fp)


def test_overlapping_edits_skip_the_later_fix():
    text = "a = 1\nb = 2\nc = 3\n"
    f1 = Fix("one", (Edit(Position(1, 0), Position(2, 0), "a = 10\n"),))
    f2 = Fix("two", (Edit(Position(1, 4), Position(1, 5), "99"),))  # inside f1's range
    f3 = Fix("three", (Edit(Position(3, 4), Position(3, 5), "30"),))
    out, idx = apply_fixes_detailed(text, [f1, f2, f3])
    assert out == "a = 10\nb = 2\nc = 30\n" and idx == [0, 2]
    # two insertions at the same place: only the first
    g1 = Fix("g1", (Edit(Position(2, 0), Position(2, 0), "x = 0\n"),))
    g2 = Fix("g2", (Edit(Position(2, 0), Position(2, 0), "y = 0\n"),))
    assert apply_fixes(text, [g1, g2]) == ("a = 1\nx = 0\nb = 2\nc = 3\n", 1)


def test_a_fix_that_breaks_the_syntax_is_discarded(tmp_path):
    text = '"""Clean."""\nimport torch\n\nx = torch.ones(3)\nprint(x.sum())\n'
    broken = _finding("TL999", 4, Fix("break it", (Edit(Position(4, 0), Position(4, 0), "def (:\n"),)), "b")
    fine = _finding("TL998", 5, Fix("rename", (Edit(Position(5, 6), Position(5, 7), "x "),)), "f")
    res = fix_text(str(tmp_path / "t.py"), text, OPTS, first=[broken, fine])
    assert res.fixed == text.replace("print(x.sum())", "print(x .sum())")
    assert [d.code for d in res.discarded] == ["TL999"] and [a.code for a in res.applied] == ["TL998"]


EVALUATE = """\
import torch
import torch.nn as nn


def evaluate(model, loader):
    correct = 0
    for x, y in loader:
        out = model(x)
        correct += (out.argmax(1) == y).sum().item()
    return correct


def main(loader):
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    print(evaluate(model, loader))
"""


def test_later_passes_fix_only_what_check_reported(tmp_path):
    """TL203's fix wraps the loop in no_grad; the loop is then evaluation code without eval()
    (TL201, a finding check never reported): the next pass must not fix it."""
    p = tmp_path / "evaluate.py"
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], ["TL201"])))
    assert [f.code for f in lint_text(str(p), EVALUATE, opts).findings] == ["TL203"]
    res = fix_text(str(p), EVALUATE, opts, unsafe=True)
    assert [(a.code, a.reported_line) for a in res.applied] == [("TL203", 7)]
    assert "with torch.no_grad():" in res.fixed and "eval()" not in res.fixed
    assert [f.code for f in lint_text(str(p), res.fixed, opts).findings] == ["TL201"]  # for the next check


def test_a_finding_moved_by_an_earlier_fix_is_still_fixed():
    from torchlint.fixer import _map_position

    edits = [(None, Edit(Position(3, 4), Position(3, 4), "with x:\n        ")),
             (None, Edit(Position(5, 0), Position(6, 0), ""))]
    assert _map_position(Position(3, 10), None, edits) == Position(4, 14)
    assert _map_position(Position(2, 1), None, edits) == Position(2, 1)
    assert _map_position(Position(5, 3), None, edits) is None  # removed
    assert _map_position(Position(7, 2), None, edits) == Position(7, 2)  # +1 line, -1 line
    assert _map_position(Position(7, 2), 2, edits) == Position(7, 2)  # another cell's edits


def test_a_fix_that_does_not_remove_its_finding_is_undone(tmp_path):
    path = tmp_path / "train.py"
    real = next(f for f in _lint(path, BUGGY) if f.code == "TL103")
    useless = Fix("add a comment", (Edit(Position(real.line, 0), Position(real.line, 0), "        # hm\n"),))
    fake = Finding(real.code, real.name, real.message, real.path, real.span, fix=useless,
                   fingerprint=real.fingerprint)
    res = fix_text(str(path), BUGGY, OPTS, first=[fake])
    assert "# hm" not in res.fixed
    assert [d.code for d in res.discarded] == ["TL103"]


# ------------------------------------------------------------------ noqa
def test_add_noqa_merges_and_suppresses(tmp_path):
    p = tmp_path / "train.py"
    text = BUGGY.replace("        optimizer.step()\n", "        optimizer.step()  # noqa:TL101\n")
    p.write_bytes(text.replace("\n", "\r\n").encode())
    findings = [f for f in lint_text(str(p), text, OPTS).findings]
    assert sorted(f.code for f in findings) == ["TL103", "TL203"]
    n = add_noqa(findings)
    assert n == 2
    out = p.read_bytes().decode()
    assert "        optimizer.step()  # noqa: TL101, TL103\r\n" in out
    assert "    for x, y in batches:  # noqa: TL203\r\n" in out
    assert _lint(p, out.replace("\r\n", "\n")) == []
    assert add_noqa(findings) == 0  # already there: nothing added, file untouched


def test_noqa_is_not_put_inside_a_multiline_string():
    text = 'x = """a\nb"""\ny = 1\n'
    new, n = noqa_text(text, {1: {"TL101"}, 3: {"TL102"}})
    assert n == 1 and new == 'x = """a\nb"""\ny = 1  # noqa: TL102\n'
    bare = "y = 1  # noqa\n"
    assert noqa_text(bare, {1: {"TL102"}}) == (bare, 0)


# ------------------------------------------------------------------ offered fixes apply
BAD = sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "bad", "*.py")))


@pytest.mark.parametrize("path", BAD, ids=[os.path.relpath(p, ROOT) for p in BAD])
def test_every_offered_fix_removes_its_finding(path):
    """What `check` counts as fixable ("[*] N fixable", "N more fixes available") is what
    `--fix` can apply: each fix alone parses and makes its own finding go away (TL201 once
    put `model.eval()` above an epoch loop whose `model.train()` undid it)."""
    text = _read(path)
    offered = [f for f in _lint(path, text) if f.fix is not None and f.fix.edits]
    for f in offered:
        new, _ = apply_fixes(text, [f.fix])
        assert new != text, f"{f.code}:{f.line}"
        cst.parse_module(new)
        # findings on identical lines share a fingerprint: the fixed one must be one fewer
        before = sum(1 for g in _lint(path, text) if (g.code, g.fingerprint) == (f.code, f.fingerprint))
        after = sum(1 for g in _lint(path, new) if (g.code, g.fingerprint) == (f.code, f.fingerprint))
        assert after < before, f"{f.code}:{f.line}: {f.fix.message} leaves the finding"


# ------------------------------------------------------------------ fixes valid for what they touch
def test_unsafe_fixes_never_call_eval_on_callables_or_pipelines(tmp_path):
    """A lambda or a diffusers pipeline is not a module: no finding about it, so no
    ``model_fn.eval()`` / ``pipeline.eval()`` (AttributeError) is ever inserted."""
    src = textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from diffusers import StableDiffusionPipeline


        def evaluate(model_fn, loader):
            correct = 0
            with torch.no_grad():
                for x, y in loader:
                    correct += (model_fn(x).argmax(dim=1) == y).sum().item()
            return correct


        def evaluate_ensemble(models, loader):
            model_fn = lambda x: sum(m(x).softmax(dim=1) for m in models)
            correct = 0
            with torch.no_grad():
                for x, y in loader:
                    correct += (model_fn(x).argmax(dim=1) == y).sum().item()
            return correct


        def sample_images(prompts, steps=30):
            pipeline = StableDiffusionPipeline.from_pretrained("runwayml/stable-diffusion-v1-5")
            images = []
            with torch.no_grad():
                for prompt in prompts:
                    images.append(pipeline(prompt, num_inference_steps=steps).images[0])
            return images


        def train(model, loader, optimizer, epochs):
            for epoch in range(epochs):
                model.train()
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
                print(evaluate_ensemble([model], loader))
    ''')
    p = tmp_path / "train.py"
    p.write_text(src)
    res = fix_text(str(p), src, OPTS, unsafe=True)
    cst.parse_module(res.fixed)
    assert "model_fn.eval()" not in res.fixed and "pipeline.eval()" not in res.fixed


# ------------------------------------------------------------------ fix coverage over the buggy fixtures
def test_fix_coverage_on_the_buggy_fixtures():
    """Issue 22: `--fix --unsafe-fixes` with every rule selected (preview included) leaves at
    most a quarter of the findings of the buggy fixture programs; every fixed file parses and a
    second run changes nothing (or fixes only findings that the first run's fixes brought to light,
    and a third run changes nothing)."""
    found = left = 0
    remaining = []
    for path in BAD:
        text = _read(path)
        before = _lint(path, text)
        # `first`: the findings of a lint of exactly this text with these options (`_lint` is the
        # fixer's own lint of a file), so each fix starts without linting its text a second time
        res = fix_text(path, text, OPTS, unsafe=True, first=before)
        cst.parse_module(res.fixed)
        after = _lint(path, res.fixed)
        again = fix_text(path, res.fixed, OPTS, unsafe=True, first=after)
        if again.fixed != res.fixed:
            # `--fix` edits only what `check` reported on the text it was given: a finding that a
            # fix brought to light (an evaluation loop known once `model.eval()` is in place) is
            # listed as remaining and fixed by the next run, which must then be the last
            cascade = {f.code for f in after} - {f.code for f in before}
            assert cascade, os.path.relpath(path, ROOT)
            assert fix_text(path, again.fixed, OPTS, unsafe=True).fixed == again.fixed, \
                os.path.relpath(path, ROOT)
        found += len(before)
        left += len(after)
        remaining += [f"{os.path.relpath(path, ROOT)}:{f.code}" for f in after]
    assert found >= 100  # the fixtures are the measure: they must not shrink unnoticed
    assert left * 4 <= found, f"{left} of {found} findings left, more than a quarter: {remaining}"


def _fixed(src, name="train.py"):
    src = textwrap.dedent(src)
    return fix_text(name, src, OPTS, unsafe=True).fixed


def test_step_is_not_moved_into_a_branch_or_out_of_its_helper():
    """TL101: the step moves only below a backward of its own block: a backward under a
    condition (the step would then run on iterations without one) is left to the author."""
    src = '''\
        import torch
        import torch.nn.functional as F


        def train(model, loader, optimizer, warmup):
            model.train()
            for i, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                optimizer.step()
                loss = F.cross_entropy(model(x), y)
                if i >= warmup:
                    loss.backward()
    '''
    assert _codes_of(src) == ["TL101"]
    assert _fixed(src) == textwrap.dedent(src)


def _codes_of(src):
    return sorted(f.code for f in _lint("train.py", textwrap.dedent(src)))


def test_anomaly_detection_alone_in_a_block_becomes_pass():
    """TL801: deleting the only statement of a block would not parse: `pass` replaces it."""
    src = '''\
        import torch
        import torch.nn.functional as F


        def setup():
            torch.autograd.set_detect_anomaly(True)


        def train(model, loader, optimizer):
            setup()
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
    '''
    assert _codes_of(src) == ["TL801"]
    fixed = _fixed(src)
    assert "def setup():\n    pass\n" in fixed
    assert _codes_of(fixed) == []


def test_float_targets_fix_leaves_a_cast_it_cannot_see():
    """TL404: only a cast written on the target argument is rewritten; a dtype given when the
    batch is moved (which other code may rely on) is left alone."""
    src = '''\
        import torch
        import torch.nn.functional as F


        def train(model, loader, optimizer, device):
            model.train()
            for x, y in loader:
                x, y = x.to(device), y.to(device, dtype=torch.float32)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y.float()).backward()
                optimizer.step()
    '''
    fixed = _fixed(src)
    assert "y.to(device, dtype=torch.float32)" in fixed
    assert "F.cross_entropy(model(x), y.long()).backward()" in fixed
    assert _codes_of(fixed) == ["TL404"]


def test_optimizer_is_not_moved_past_its_users_nor_out_of_reach():
    """TL205: the optimizer's construction moves after the replacement only when nothing in
    between uses it and every later use can see it; the replacement moves above it only when
    nothing in between changes what it reads. Otherwise the finding keeps no fix."""
    used_in_between = '''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import torchvision


        def finetune(loader, classes, epochs=3):
            model = torchvision.models.resnet18(weights="IMAGENET1K_V1")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7)
            num_classes = len(classes)
            model.fc = nn.Linear(model.fc.in_features, num_classes)
            for epoch in range(epochs):
                model.train()
                for x, y in loader:
                    optimizer.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    optimizer.step()
                scheduler.step()
    '''
    used_after_the_folds = '''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        def cross_validate(folds, epochs=2):
            model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2))
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            for train_loader in folds:
                model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2))
                for epoch in range(epochs):
                    model.train()
                    for x, y in train_loader:
                        optimizer.zero_grad()
                        F.cross_entropy(model(x), y).backward()
                        optimizer.step()
            torch.save(optimizer.state_dict(), "optimizer.pt")
    '''
    for src in (used_in_between, used_after_the_folds):
        assert _codes_of(src) == ["TL205"]
        assert _fixed(src) == textwrap.dedent(src)


def test_loss_fixes_leave_shared_criteria_and_rebound_names_alone():
    """TL403: an `NLLLoss` also given log-probabilities elsewhere is not turned into
    `CrossEntropyLoss` (only `F.nll_loss` on the logits becomes `F.cross_entropy`); TL405: a
    sigmoid whose input is bound again after it is not written out at the log."""
    src = '''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.hidden = nn.Linear(784, 128)
                self.fc = nn.Linear(128, 10)

            def forward(self, x):
                return self.fc(F.relu(self.hidden(x)))


        def train(loader):
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            criterion = nn.NLLLoss()
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                main = criterion(model(x), y)
                aux = criterion(F.log_softmax(model(x.flip(1)), dim=1), y)
                extra = F.nll_loss(model(x), y, reduction="sum")
                (main + aux + extra).backward()
                optimizer.step()


        def bce(logits, targets):
            p = torch.sigmoid(logits)
            logits = logits.detach()
            return -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p + 1e-7)).mean()
    '''
    assert _codes_of(src) == ["TL403", "TL403", "TL405"]
    expected = textwrap.dedent(src).replace('extra = F.nll_loss(', 'extra = F.cross_entropy(')
    assert _fixed(src) == expected


def test_gradient_cut_fix_removes_detach_but_keeps_numbers_used_as_numbers():
    """TL304: `.detach()` on the way to the output goes; an `.item()` whose number is handed to
    Python code (`max`) stays, since a tensor there could change the program."""
    src = '''\
        import torch
        import torch.nn as nn


        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(128, 64), nn.ReLU())
                self.head = nn.Linear(64, 10)

            def forward(self, x):
                features = self.encoder(x).detach()
                return self.head(features)


        class Tempered(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(64, 64)
                self.temperature_net = nn.Linear(64, 1)

            def forward(self, h):
                t = self.temperature_net(h).mean().item()
                return self.body(h) / max(t, 0.1)
    '''
    assert _codes_of(src) == ["TL304", "TL304"]
    expected = textwrap.dedent(src).replace("self.encoder(x).detach()", "self.encoder(x)")
    assert _fixed(src) == expected



def test_missing_step_is_not_guessed_between_two_optimizers():
    """TL104: the step inserted is that of the one optimizer the loop clears; with two cleared
    (an encoder's and a head's) which ones should step is the author's call."""
    src = '''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        def train(loader, epochs=2):
            encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
            head = nn.Linear(64, 4)
            enc_opt = torch.optim.Adam(encoder.parameters(), lr=1e-4)
            head_opt = torch.optim.SGD(head.parameters(), lr=1e-2)
            for epoch in range(epochs):
                for x, y in loader:
                    enc_opt.zero_grad()
                    head_opt.zero_grad()
                    loss = F.cross_entropy(head(encoder(x)), y)
                    loss.backward()
    '''
    assert _codes_of(src) == ["TL104"]
    assert _fixed(src) == textwrap.dedent(src)


def test_module_level_script_gets_its_grad_and_optimizer_fixes():
    """TL204 and TL205 in a script's top-level code (the module is the function): the `no_grad`
    block is unwrapped without its `requires_grad` workaround, the optimizer built after the head."""
    src = '''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import torchvision

        model = torchvision.models.resnet18(weights="IMAGENET1K_V1")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        model.fc = nn.Linear(model.fc.in_features, 10)
        loader = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))]

        with torch.no_grad():
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.requires_grad = True
                loss.backward()
                optimizer.step()
    '''
    expected = '''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import torchvision

        model = torchvision.models.resnet18(weights="IMAGENET1K_V1")
        model.fc = nn.Linear(model.fc.in_features, 10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loader = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))]

        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    '''
    assert _codes_of(src) == ["TL204", "TL205"]
    assert _fixed(src) == textwrap.dedent(expected)


def test_a_reported_finding_is_fixed_in_one_run_when_another_fix_uncovers_one_like_it():
    """TL204's unsafe fix removes a `no_grad` block around a `total += loss`; the reported
    `total += loss` after the block looks the same (code and fingerprint), and judged next to the
    uncovered one its fix would seem useless: it is tried again alone and kept."""
    from torchlint.engine import LintOptions
    from torchlint.fixer import fix_text
    from torchlint.selection import enabled_codes

    src = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\ncriterion = nn.CrossEntropyLoss()\n"
        "loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 4, (32,))), batch_size=4, shuffle=True)\n\n\n"
        "def fit(epochs):\n    total = 0.0\n    for epoch in range(epochs):\n        for x, y in loader:\n"
        "            loss = criterion(model(x), y)\n"
        "            with torch.no_grad():\n                loss.backward()\n                total += loss\n"
        "            total += loss\n"
    )
    # TL204 is a preview rule: selected by its code, as a user would
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], ["TL204"])))
    once = fix_text("train.py", src, opts, unsafe=True)
    assert [a.code for a in once.applied] == ["TL204", "TL501"]
    assert once.fixed.endswith("            loss.backward()\n            total += loss\n            total += loss.item()\n")

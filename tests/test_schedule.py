"""Dependency-ordered linting: imports read without parsing, imported modules linted first,
so a connected tree is parsed once and cross-module results match a run that knew everything."""
import os
import textwrap

from torchlint import engine
from torchlint.engine import LintOptions, run
from torchlint.rule import all_rules
from torchlint.schedule import dependency_order, import_graph, imported_names
from torchlint.project import Workspace

OPTS = LintOptions(enabled=frozenset(c for c in all_rules() if c != "TL002"))


def test_imported_names_reads_every_import_form():
    src = textwrap.dedent("""\
        import os, torch.nn as nn
        from . import engine, utils as u
        from ..data import (
            loader,
            collate_batch,  # the project's collate
        )
        from .models.resnet import *
        if TYPE_CHECKING:
            from trainer.callbacks import EarlyStopping
        def late():
            from .metrics import accuracy
    """).encode()
    names = imported_names(src, "proj.train.loop", False)
    assert {"os", "torch.nn", "proj.train", "proj.train.engine", "proj.train.utils", "proj.data",
            "proj.data.loader", "proj.data.collate_batch", "proj.train.models.resnet",
            "trainer.callbacks", "trainer.callbacks.EarlyStopping", "proj.train.metrics",
            "proj.train.metrics.accuracy"} <= names
    # from a package __init__, one dot is the package itself
    assert "proj.train.engine" in imported_names(b"from .engine import fit\n", "proj.train", True)


def test_dependency_order_puts_imports_first_and_survives_cycles():
    # 0 imports 1 and 2; 1 imports 2; 2 and 3 import each other
    order = dependency_order([[1, 2], [2], [3], [2]])
    assert sorted(order) == [0, 1, 2, 3]
    assert order.index(2) < order.index(1) < order.index(0)


def test_import_cycle_puts_the_module_everyone_imports_first():
    # a package like torch: 0 is the package __init__ that imports every submodule, and every
    # submodule does ``import pkg``; 1 (graph_module) is also imported by 2, 3 and 4 directly.
    # Any order of a cycle leaves some import linted late; the one imported most goes first.
    deps = [[1, 2, 3, 4], [0], [0, 1], [0, 1], [0, 1, 2]]
    order = dependency_order(deps)
    assert sorted(order) == [0, 1, 2, 3, 4]
    assert order[0] == 1
    assert order.index(2) < order.index(4)
    late = sum(1 for i, ds in enumerate(deps) for d in ds if order.index(d) > order.index(i))
    assert late == 4  # only the edges to the package __init__ itself


def test_strongly_connected_components_come_after_what_they_import():
    from torchlint.schedule import strongly_connected

    # 0 -> 1 <-> 2 -> 3; 4 alone
    comps = strongly_connected([[1], [2], [1, 3], [], []])
    assert sorted(map(sorted, comps)) == [[0], [1, 2], [3], [4]]
    at = {i: n for n, c in enumerate(comps) for i in c}
    assert at[3] < at[1] < at[0]


def _tree(tmp_path):
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .engine import train_step\n")
    (pkg / "engine.py").write_text(textwrap.dedent("""\
        def train_step(model, batch, criterion, optimizer):
            inputs, targets = batch
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            return loss
    """))
    (pkg / "train.py").write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        from proj import train_step

        def main(loader):
            model = nn.Linear(10, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            criterion = nn.CrossEntropyLoss()
            for epoch in range(10):
                for batch in loader:
                    train_step(model, batch, criterion, optimizer)
    """))
    return [str(pkg / "__init__.py"), str(pkg / "engine.py"), str(pkg / "train.py")]


def test_import_graph_links_importers_to_tree_modules(tmp_path):
    files = _tree(tmp_path)
    deps = import_graph(files, Workspace(files).index, lambda p: open(p, "rb").read())
    assert deps[0] == [1]  # __init__ re-exports from engine
    assert 0 in deps[2]  # train imports the package
    # ... and the module that defines what it takes from the package (``from proj import
    # train_step`` asks about proj.engine.train_step)
    assert 1 in deps[2]


FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "crossfn")


def _fixture_files(*names):
    out = []
    for name in names:
        for d, _, fs in sorted(os.walk(os.path.join(FIXTURES, name))):
            out += [os.path.join(d, f) for f in sorted(fs) if f.endswith(".py")]
    return out


def test_connected_tree_is_linted_once_and_finds_the_cross_module_bugs(monkeypatch):
    # importers listed before what they import: the order of discovery does not matter
    files = sorted(_fixture_files("amp_helpers_never_clear_grads", "trainer_base_class_in_package"),
                   key=lambda p: ("train.py" not in p, p))
    linted = []
    real = engine.lint_path

    def counting(path, opts, project=None, *args, **kwargs):
        linted.append(os.path.relpath(path, FIXTURES))
        return real(path, opts, project, *args, **kwargs)

    monkeypatch.setattr(engine, "lint_path", counting)
    results = run(files, OPTS, jobs=1)
    found = {(os.path.relpath(r.path, FIXTURES), f.code, f.line) for r in results for f in r.findings}
    # the helpers never clear gradients (amp_utils.py); the base class's epoch helper leaves
    # the model in eval mode for the subclass's training loop (trainers/base.py)
    assert found == {("amp_helpers_never_clear_grads/train.py", "TL103", 31),
                     ("trainer_base_class_in_package/trainers/regression.py", "TL202", 25)}
    # each once, except the two modules whose parameters only their importers' call sites
    # describe (``backward_and_clip(loss, model, ...)`` is given train.py's ``Net``,
    # ``BaseTrainer(model, ...)`` the ``KeypointNet`` of train.py): linted again once those
    # call sites are known (imports are linted first)
    again = ["amp_helpers_never_clear_grads/amp_utils.py", "trainer_base_class_in_package/trainers/base.py"]
    assert sorted(linted) == sorted([os.path.relpath(f, FIXTURES) for f in files] + again)


def test_process_pool_gives_the_results_of_one_process():
    files = _fixture_files(*sorted(os.listdir(FIXTURES)))  # 32 small projects, one tree

    def shown(results):
        return [(r.path, [(f.code, f.line, f.message) for f in r.findings]) for r in results]

    one, two = shown(run(files, OPTS, jobs=1)), shown(run(files, OPTS, jobs=2))
    assert one == two
    # and what each project gives when linted on its own (fixtures/crossfn/expected.toml)
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    with open(os.path.join(FIXTURES, "expected.toml"), "rb") as fh:
        expected = {(path, c) for path, codes in tomllib.load(fh).items() for c in codes}
    assert {(os.path.relpath(p, FIXTURES), f"{c}:{line}") for p, fs in one for c, line, _ in fs} == expected


def test_import_statements_are_found_from_the_word_import():
    from torchlint.schedule import _IMPORT_RE, _import_statements

    src = textwrap.dedent('''\
        import torch.nn as nn; import os
        """A docstring that says: import this, from here import that."""
        from .models import (
            resnet,  # import resnet50 too?
            vit,
        )
        x = 1; import json
        if TYPE_CHECKING: import typing
        # import commented_out
        def f():
            from .utils import importer, import_module
            s = "import inside a string"
        from a import b  # and import c
        important = True
        import_thing = 2
    ''').encode()
    # the same statements as trying the pattern at every line start
    assert [m.groups() for m in _import_statements(src)] == [m.groups() for m in _IMPORT_RE.finditer(src)]
    assert list(_import_statements(b"x = 1\nimportant = 2\n")) == []


def test_dotted_uses_of_an_imported_package_are_names_but_not_of_other_objects():
    src = textwrap.dedent("""\
        import torch
        torch.nn.functional.relu(x)
        y = my_torch.cuda.device
        z = obj.torch.optim.SGD
        w = torch_utils.amp.autocast
    """).encode()
    names = imported_names(src, "proj.train", False)
    assert "torch.nn.functional.relu" in names
    assert not {n for n in names if n.startswith(("torch.cuda", "torch.optim", "torch.amp"))}
    assert "torch.nn.Linear" in imported_names(b"torch.nn.Linear\nimport torch\n", "m", False)  # at the start


def test_a_worker_that_dies_fails_only_its_file(monkeypatch):
    # enough files that each worker is sent its next one while it lints: the files queued
    # behind the one a worker died on are linted by its replacement
    files = _fixture_files(*sorted(os.listdir(FIXTURES)))
    victim = next(f for f in files if f.endswith("train.py"))
    real = engine.lint_job

    def dying(args, keep=None):
        if args[0] == victim:
            os._exit(3)
        return real(args, keep)

    expected = {r.path: [(f.code, f.line) for f in r.findings] for r in run(files, OPTS, jobs=1)}
    monkeypatch.setattr(engine, "lint_job", dying)
    got = {r.path: [(f.code, f.line) for f in r.findings] for r in run(files, OPTS, jobs=2)}
    assert len(got) == len(files)
    shown = engine.display_path(victim)
    assert [c for c, _ in got.pop(shown)] == ["TL000"]
    expected.pop(shown)
    assert got == expected


def _cycle_tree(tmp_path):
    """A small classifier project whose engine and utils import each other (utils' ``fit``
    runs the engine's loops; the engine moves batches with a utils helper)."""
    pkg = tmp_path / "cls"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Image classification: model, loops and helpers."""\n')
    (pkg / "model.py").write_text(textwrap.dedent("""\
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self, num_classes=10):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1))
                self.head = nn.Linear(16, num_classes)

            def forward(self, x):
                return self.head(self.body(x))
    """))
    (pkg / "engine.py").write_text(textwrap.dedent("""\
        import torch
        import torch.nn.functional as F

        from cls import utils


        def train_one_epoch(model, loader, optimizer, device):
            for batch in loader:
                images, targets = utils.to_device(batch, device)
                loss = F.cross_entropy(model(images), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        @torch.no_grad()
        def evaluate(model, loader, device):
            model.eval()
            correct = 0
            for batch in loader:
                images, targets = utils.to_device(batch, device)
                correct += (model(images).argmax(dim=1) == targets).sum().item()
            return correct
    """))
    (pkg / "utils.py").write_text(textwrap.dedent("""\
        import torch

        from cls.engine import evaluate, train_one_epoch


        def to_device(batch, device):
            images, targets = batch
            return images.to(device, non_blocking=True), targets.to(device, non_blocking=True)


        def fit(model, train_loader, val_loader, epochs, device):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for epoch in range(epochs):
                train_one_epoch(model, train_loader, optimizer, device)
                print(epoch, evaluate(model, val_loader, device))
    """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from cls.model import Net
        from cls.utils import fit

        if __name__ == "__main__":
            data = TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 10, (64,)))
            device = "cuda" if torch.cuda.is_available() else "cpu"
            fit(Net().to(device), DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=8),
                epochs=3, device=device)
    """))
    return [str(pkg / f) for f in ("__init__.py", "engine.py", "model.py", "utils.py")] + [str(tmp_path / "train.py")]


def test_a_file_of_an_import_cycle_is_checked_again_from_its_kept_tree(tmp_path, monkeypatch):
    # engine.py and utils.py import each other, and engine.py is linted first: it asks about
    # utils.to_device before utils.py is linted. Its worker keeps its tree; once utils.py is
    # done, it checks the file again and lints the kept tree (no second parse of engine.py).
    from torchlint import schedule

    files = _cycle_tree(tmp_path)
    one = [(r.path, [(f.code, f.line) for f in r.findings]) for r in run(files, OPTS, jobs=1)]
    # the engine's evaluate leaves the model in eval mode for the next epoch's training
    assert ("TL202", 14) in dict((os.path.basename(p), fs) for p, fs in one)["utils.py"]

    parses = tmp_path / "parses.log"
    real_parse = engine.parse_module

    def logged(text):
        with open(parses, "a") as fh:  # from the worker processes
            fh.write(("engine" if "def train_one_epoch" in text else "other") + "\n")
        return real_parse(text)

    monkeypatch.setattr(engine, "parse_module", logged)
    passes = []
    real_run = schedule.OrderedPool.run

    def recorded(self, order, *args, **kwargs):
        got = real_run(self, order, *args, **kwargs)
        passes.append(([os.path.relpath(files[i], tmp_path) for i in order], dict(self.stats)))
        return got

    monkeypatch.setattr(schedule.OrderedPool, "run", recorded)
    two = [(r.path, [(f.code, f.line) for f in r.findings]) for r in run(files, OPTS, jobs=2)]
    assert two == one
    order, stats = passes[0]
    assert order.index("cls/engine.py") < order.index("cls/utils.py")
    assert stats["kept"] >= 1 and stats["relinted"] >= 1
    # the later passes are for call sites only: train.py gives ``fit`` a ``Net`` (utils.py
    # again), then ``fit`` hands it to ``train_one_epoch`` (engine.py again, and train.py,
    # which asked what ``fit`` does); the cycle itself was settled from the kept tree
    assert [later for later, _ in passes[1:]] == [["cls/utils.py"], ["cls/engine.py", "train.py"]]
    assert parses.read_text().splitlines().count("engine") == 2

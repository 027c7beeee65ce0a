"""Cross-function and cross-module analysis: the call graph over the linted tree, summaries
flowing through calls (both ways), the project index, the multi-pass engine and its cache.

Every test lints a small multi-module tree written to a temporary folder with the real
engine (``torchlint.engine.run``) and checks findings, messages or the model's facts.
"""
import os
import textwrap

from torchlint.cache import Cache
from torchlint.engine import LintOptions, run
from torchlint.model import ExternalRef, ModuleModel, ProjectIndex
from torchlint.model.ir import CALL, AssignOp, CallOp, walk
from torchlint.selection import enabled_codes, preview_codes
from sample_projects import ENGINE  # shared with tests/test_cache.py

OPTS = LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))


def write(root, files: dict) -> list:
    paths = []
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        paths.append(str(p))
    return sorted(paths)


def lint(paths, **kw):
    """{path relative to the common folder: [(code, line, message)]}."""
    results = run(paths, OPTS, **kw)
    base = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
    out = {}
    for p, r in zip(paths, results):
        assert r.error is None, r.error
        out[os.path.relpath(p, base)] = [(f.code, f.line, f.message) for f in r.findings]
    return out


def codes(found) -> dict:
    return {k: [f"{c}:{l}" for c, l, _ in sorted(v)] for k, v in found.items() if v}


def model_of(paths, target):
    """The ModuleModel of ``target`` built with the project the engine ends with."""
    import libcst as cst
    from torchlint.project import Workspace

    workspace = Workspace(paths)
    run(paths, OPTS, workspace=workspace)
    project = workspace.index
    text = open(target).read()
    from torchlint.discover import module_name_for

    name, is_pkg = module_name_for(target)
    return ModuleModel(target, target, text, cst.parse_module(text), name, is_pkg, project)


MAIN = """
    import torch
    import torch.nn as nn

    from engine import evaluate, train_one_epoch


    def main(loader):
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            train_one_epoch(model, loader, optimizer)
            print(evaluate(model, loader))
"""


# ------------------------------------------------------------------ effects through calls
def test_helper_eval_mode_reaches_next_epoch_of_imported_training_loop(tmp_path):
    paths = write(tmp_path, {"engine.py": ENGINE.format(train_line="pass"), "main.py": MAIN})
    found = lint(paths)
    assert codes(found) == {"main.py": ["TL202:11"]}
    (_, _, msg), = found["main.py"]
    # the message names the function and the file:line that made the difference
    assert "`evaluate()` at " in msg and "engine.py:15" in msg and "`train_one_epoch()`" in msg


def test_helper_that_sets_train_mode_itself_is_quiet(tmp_path):
    paths = write(tmp_path, {"engine.py": ENGINE.format(train_line="model.train()"), "main.py": MAIN})
    assert codes(lint(paths)) == {}


def test_caller_setting_train_mode_satisfies_the_helper(tmp_path):
    main = MAIN.replace("            train_one_epoch(model",
                        "            model.train()\n            train_one_epoch(model")
    paths = write(tmp_path, {"engine.py": ENGINE.format(train_line="pass"), "main.py": main})
    assert codes(lint(paths)) == {}


def test_relative_imports_and_package_reexports(tmp_path):
    paths = write(tmp_path, {
        "proj/__init__.py": "",
        "proj/training/__init__.py": """
            from .engine import train_one_epoch
            from .evaluation import evaluate as run_eval
        """,
        "proj/training/engine.py": ENGINE.format(train_line="pass").split("@torch.no_grad()")[0],
        "proj/training/evaluation.py": """
            import torch


            @torch.no_grad()
            def evaluate(model, loader):
                model.eval()
                for x, y in loader:
                    model(x)
        """,
        "proj/run.py": """
            from . import training as T
            from .training import run_eval, train_one_epoch


            def fit(model, loader, optimizer, epochs):
                for epoch in range(epochs):
                    train_one_epoch(model, loader, optimizer)
                    run_eval(model, loader)


            def fit_qualified(model, loader, optimizer, epochs):
                for epoch in range(epochs):
                    T.train_one_epoch(model, loader, optimizer)
                    T.run_eval(model, loader)
        """,
    })
    found = lint(paths)
    assert codes(found) == {"run.py": ["TL202:7", "TL202:13"]}
    assert all("evaluation.py:5" in m for _, _, m in found["run.py"])


def test_star_reexport(tmp_path):
    paths = write(tmp_path, {
        "lib/__init__.py": "from .loops import *\n",
        "lib/loops.py": ENGINE.format(train_line="pass"),
        "main.py": MAIN.replace("from engine import", "from lib import"),
    })
    assert codes(lint(paths)) == {"main.py": ["TL202:11"]}


def test_trainer_class_method_to_method_and_imported_base_class(tmp_path):
    paths = write(tmp_path, {
        "base.py": """
            import torch


            class BaseTrainer:
                def __init__(self, model, optimizer):
                    self.model = model
                    self.optimizer = optimizer

                @torch.no_grad()
                def validate(self, loader):
                    self.model.eval()
                    return sum((self.model(x).argmax(1) == y).sum().item() for x, y in loader)
        """,
        "trainer.py": """
            import torch.nn.functional as F

            from base import BaseTrainer


            class Trainer(BaseTrainer):
                def train_epoch(self, loader):
                    for x, y in loader:
                        self.optimizer.zero_grad()
                        F.cross_entropy(self.model(x), y).backward()
                        self.optimizer.step()

                def fit(self, train_loader, val_loader, epochs):
                    for epoch in range(epochs):
                        self.train_epoch(train_loader)
                        self.validate(val_loader)
        """,
    })
    found = lint(paths)
    assert codes(found) == {"trainer.py": ["TL202:15"]}
    assert "`validate()` at " in found["trainer.py"][0][2] and "base.py:10" in found["trainer.py"][0][2]


def test_no_grad_decorated_helper_summary_and_caller_under_no_grad(tmp_path):
    paths = write(tmp_path, {
        "metrics.py": """
            import torch


            @torch.no_grad()
            def accuracy(model, loader):
                model.eval()
                return sum((model(x).argmax(1) == y).sum().item() for x, y in loader)


            def reconstruction(model, loader):
                model.eval()
                total = 0.0
                for x, _ in loader:
                    total += (model(x) - x).pow(2).mean().item()
                return total
        """,
        "main.py": """
            import torch

            from metrics import accuracy, reconstruction


            def report(model, val_loader, ae, ae_loader):
                print(accuracy(model, val_loader))
                with torch.no_grad():
                    print(reconstruction(ae, ae_loader))
        """,
    })
    assert codes(lint(paths)) == {}
    mm = model_of(paths, paths[1])
    acc = mm.summary_of(ExternalRef(mm.module_name, "accuracy"))
    assert acc["grad"] == "off" and acc["exit_modes"]["model"][0] == "eval"
    # without the caller's no_grad the un-decorated helper's loop is reported where it is
    main = open(paths[0]).read().replace("with torch.no_grad():\n        print(recon", "if True:\n        print(recon")
    open(paths[0], "w").write(main)
    assert codes(lint(paths)) == {"metrics.py": ["TL203:13"]}


def test_helper_backward_called_under_no_grad(tmp_path):
    adapt = """
        import torch


        {decorator}
        def adapt(model, x, optimizer):
            loss = model(x).logsumexp(1).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
    main = """
        import torch

        from tta import adapt


        def predict(model, test_loader, optimizer):
            with torch.no_grad():
                for x, _ in test_loader:
                    adapt(model, x, optimizer)
    """
    paths = write(tmp_path, {"tta.py": adapt.format(decorator=""), "main.py": main})
    found = lint(paths)
    assert codes(found) == {"main.py": ["TL204:9"]}
    assert "tta.py:5" in found["main.py"][0][2]
    paths = write(tmp_path, {"tta.py": adapt.format(decorator="@torch.enable_grad()"), "main.py": main})
    assert codes(lint(paths)) == {}


def test_step_and_clear_through_helpers(tmp_path):
    helpers = """
        def backward_step(loss, optimizer, clip):
            {clear}
            loss.backward()
            clip()
    """
    main = """
        import torch.nn.functional as F

        from helpers import backward_step


        def train(model, loader, optimizer, clip):
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                backward_step(loss, optimizer, clip)
                optimizer.step()
    """
    paths = write(tmp_path, {"helpers.py": helpers.format(clear="pass"), "main.py": main})
    assert codes(lint(paths)) == {"main.py": ["TL103:10"]}
    # the step before a helper's backward names the helper
    swapped = main.replace("backward_step(loss, optimizer, clip)\n                optimizer.step()",
                           "optimizer.step()\n                backward_step(loss, optimizer, clip)")
    paths = write(tmp_path, {"helpers.py": helpers.format(clear="optimizer.zero_grad()"), "main.py": swapped})
    found = lint(paths)
    assert codes(found) == {"main.py": ["TL101:9"]}
    assert "`backward_step()` (" in found["main.py"][0][2] and "helpers.py:1)" in found["main.py"][0][2]
    paths = write(tmp_path, {"helpers.py": helpers.format(clear="optimizer.zero_grad()"), "main.py": main})
    assert codes(lint(paths)) == {}


# ------------------------------------------------------------------ values through calls
def test_values_returned_by_helpers_carry_their_facts(tmp_path):
    paths = write(tmp_path, {
        "steps.py": """
            import torch.nn.functional as F


            def train_step(model, optimizer, x, y):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                return loss


            def predict_proba(model, x):
                return F.softmax(model(x), dim=1)


            def to_device(x, y, device):
                return x.to(device), y.to(device)


            def unpack(batch):
                x, y = batch
                return x, y.long()
        """,
        "main.py": """
            from steps import predict_proba, to_device, train_step, unpack


            def main(model, loader, optimizer, device):
                total = 0.0
                for batch in loader:
                    a = train_step(model, optimizer, *batch)
                    x, y = to_device(*unpack(batch), device)
                    u, v = unpack(batch)
                    p = predict_proba(model, x)
        """,
    })
    mm = model_of(paths, paths[0])
    facts = {}
    for op in walk(mm.functions["main"].body):
        if isinstance(op, AssignOp) and op.value is not None:
            facts[mm.code_for(op.targets[0])] = op.value_facts
    assert {"graph", "loss"} <= facts["a"]
    assert {"batch", "moved"} <= facts["x, y"]
    assert "batch" in facts["u, v"] and "moved" not in facts["u, v"]
    assert "probs" in facts["p"]
    # rules can say which function made the value: `predict_proba()` (steps.py:12)
    import libcst as cst

    from torchlint.findings import render_text

    origin = render_text(mm.value_origin(mm.functions["main"], cst.Name("p")))  # paths rendered in reports
    assert origin.startswith("`predict_proba()` (") and origin.endswith("steps.py:12)")
    assert mm.value_origin(mm.functions["main"], cst.Name("total")) is None


def test_tuple_returned_by_a_helper_keeps_each_items_facts(tmp_path):
    """``logits, loss, acc = compute_loss(model, x, y)`` where the helper returns the logits,
    the loss and ``acc.item()``: the logits and the loss carry the graph, the accuracy does not
    (as ``return output, loss.data[0]`` in the char-RNN tutorials); read from the summary of
    another module, and in the same module."""
    helper = """
        import torch.nn.functional as F


        def compute_loss(model, x, y):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            acc = (logits.argmax(dim=1) == y).float().mean()
            return logits, loss, acc.item()
    """
    loop = """
        def main(model, loader, optimizer, epochs):
            accs, kept = [], []
            for epoch in range(epochs):
                for x, y in loader:
                    optimizer.zero_grad()
                    logits, loss, acc = compute_loss(model, x, y)
                    loss.backward()
                    optimizer.step()
                    accs.append(acc)
                    kept.append(logits)
    """
    paths = write(tmp_path / "two", {"steps.py": helper,
                                     "main.py": "from steps import compute_loss\n\n" + textwrap.dedent(loop)})
    found = lint(paths)
    assert codes(found) == {"main.py": ["TL502:13"]}
    assert "`kept`" in found["main.py"][0][2]
    paths = write(tmp_path / "one", {"train.py": textwrap.dedent(helper) + "\n" + textwrap.dedent(loop)})
    assert codes(lint(paths)) == {"train.py": ["TL502:20"]}


def test_dataset_reshuffled_by_an_imported_training_function(tmp_path):
    """TL701: the dataset class inherits a method that permutes its samples (a base class of
    another module: class fact ``shuffles``), and the training function of a third module
    calls it on the loader's dataset (summary ``reshuffles``), once per epoch of the caller's
    loop; called once before the loop, the order repeats and the loader is reported."""
    files = {
        "windows.py": """
            import random

            from torch.utils.data import Dataset


            class ShuffledWindows(Dataset):
                def __init__(self, series, width):
                    self.series, self.width = series, width
                    self.starts = list(range(0, len(series) - width))

                def shuffle_windows(self):
                    random.shuffle(self.starts)


            class ForecastWindows(ShuffledWindows):
                def __len__(self):
                    return len(self.starts)

                def __getitem__(self, i):
                    s = self.starts[i]
                    return self.series[s:s + self.width], self.series[s + self.width]
        """,
        "engine.py": """
            import torch.nn.functional as F


            def train_epoch(model, optimizer, train_loader):
                train_loader.dataset.shuffle_windows()
                for x, y in train_loader:
                    optimizer.zero_grad()
                    F.mse_loss(model(x), y).backward()
                    optimizer.step()
        """,
        "main.py": """
            from torch.utils.data import DataLoader

            from engine import train_epoch
            from windows import ForecastWindows


            def main(model, optimizer, series, epochs):
                train_loader = DataLoader(ForecastWindows(series, 24), batch_size=32)
                for epoch in range(epochs):
                    train_epoch(model, optimizer, train_loader)
        """,
    }
    assert codes(lint(write(tmp_path / "each", files))) == {}
    call = "train_loader.dataset.shuffle_windows()\n" + " " * 16
    files["engine.py"] = files["engine.py"].replace(call, "")
    files["main.py"] = files["main.py"].replace("for epoch", call + "for epoch")
    assert codes(lint(write(tmp_path / "once", files))) == {"main.py": ["TL701:8"]}


def test_collate_fn_of_another_module_moves_batches(tmp_path):
    paths = write(tmp_path, {
        "data.py": """
            import torch


            def collate_to_device(items, device):
                xs = torch.stack([x for x, _ in items])
                ys = torch.stack([y for _, y in items])
                return xs.to(device), ys.to(device)


            def collate(items):
                return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])
        """,
        "main.py": """
            from functools import partial

            from torch.utils.data import DataLoader

            from data import collate, collate_to_device


            def loaders(ds, device):
                moved = DataLoader(ds, batch_size=8, collate_fn=partial(collate_to_device, device=device))
                plain = DataLoader(ds, batch_size=8, collate_fn=collate)
                for xb, yb in moved:
                    pass
                for xc, yc in plain:
                    pass
        """,
    })
    mm = model_of(paths, paths[1])
    fn = mm.functions["loaders"]
    loops = mm.loops(fn)
    assert mm.loader_moves(fn, loops[0].iter) is True
    assert mm.loader_moves(fn, loops[1].iter) is False


def test_model_class_of_another_module_exports_forward_facts(tmp_path):
    paths = write(tmp_path, {
        "models.py": """
            import torch.nn as nn
            import torch.nn.functional as F


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 3)

                def forward(self, x):
                    return F.softmax(self.fc(x), dim=1)


            class Wider(Net):
                pass


            class Plain:
                pass
        """,
        "train.py": """
            from models import Wider


            def main(loader):
                tagger = Wider()
                for x, y in loader:
                    out = tagger(x)
        """,
    })
    mm = model_of(paths, paths[1])
    cls = {q: mm.project.class_facts(q) for q in ("models.Net", "models.Wider", "models.Plain")}
    assert cls["models.Net"]["forward"] == ["probs"] and cls["models.Net"]["is_module"]
    assert cls["models.Wider"]["bases"] == ["models.Net"] and cls["models.Wider"]["forward"] == ["probs"]
    assert cls["models.Plain"]["is_module"] is False
    assert mm.resolver.of_path(mm.functions["main"], "tagger")[0] == "model"
    out = next(op for op in walk(mm.functions["main"].body) if isinstance(op, AssignOp)
               and mm.code_for(op.targets[0]) == "out")
    assert "probs" in out.value_facts


# ------------------------------------------------------------------ the project index
def test_same_module_name_in_sibling_folders_resolves_to_the_importers_folder(tmp_path):
    good = ENGINE.format(train_line="model.train()")
    bad = ENGINE.format(train_line="pass")
    paths = write(tmp_path, {"a/engine.py": good, "a/main.py": MAIN, "b/engine.py": bad, "b/main.py": MAIN,
                             "c/main.py": MAIN})
    found = lint(paths)
    # a/ trains correctly, b/ has the bug, c/ imports an `engine` that is ambiguous: unresolved
    assert codes(found) == {"b/main.py": ["TL202:11"]}
    project = ProjectIndex.for_files(paths)
    keys = project.by_name["engine"]
    assert len(keys) == 2 and all(k.startswith("engine@") for k in keys)
    assert project.locate("engine.train_one_epoch", str(tmp_path / "a")) == \
        project.key_for(str(tmp_path / "a" / "engine.py"), "engine") + ".train_one_epoch"
    assert project.locate("engine.train_one_epoch", str(tmp_path / "c")) is None


def test_project_index_resolution_rules(tmp_path):
    p = ProjectIndex.for_files(write(tmp_path, {"pkg/__init__.py": "", "pkg/engine.py": "", "pkg/base.py": "",
                                                "main.py": ""}))
    assert set(p.modules) == {"pkg", "pkg.engine", "pkg.base", "main"}
    p.reexports.update({"pkg.train": "pkg.engine.train", "pkg.T": "pkg.base.Trainer"})
    p.classes.update({"pkg.base.Base": {"methods": ["validate"], "bases": []},
                      "pkg.base.Trainer": {"methods": ["fit"], "bases": ["pkg.base.Base"]}})
    assert p.locate("pkg.train") == "pkg.engine.train"
    assert p.locate("pkg.engine.train") == "pkg.engine.train"
    assert p.locate("torch.nn.Linear") is None
    assert p.method("pkg.T", "validate") == "pkg.base.Base.validate"
    assert p.method("pkg.base.Trainer", "missing") is None
    p.reexports["pkg.loop"] = "pkg.loop"  # a cycle stops
    assert p.resolve("pkg.loop") == "pkg.loop"


def test_prefiltered_helper_module_is_linted_when_imported(tmp_path):
    # utils.py contains none of the rules' trigger words; it is still summarised because
    # train.py asks about it, and its `prepare()` does not move the batch
    paths = write(tmp_path, {
        "utils.py": """
            def prepare(batch):
                x, y = batch
                return (x - 0.5) / 0.25, y.long()
        """,
        "train.py": """
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, TensorDataset

            from utils import prepare


            def main():
                device = torch.device("cuda")
                loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.zeros(8)), batch_size=4, shuffle=True)
                model = nn.Linear(4, 2).to(device)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for batch in loader:
                    x, y = prepare(batch)
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
        """,
    })
    results = run(paths, OPTS)
    assert "utils.prepare" in results[1].summaries
    found = lint(paths)
    assert codes(found).get("train.py") == ["TL601:16"]


# ------------------------------------------------------------------ engine: parallel and cache
def test_parallel_run_matches_serial(tmp_path):
    files = {f"p{i}/engine.py": ENGINE.format(train_line="pass" if i % 2 else "model.train()")
             for i in range(3)}
    files.update({f"p{i}/main.py": MAIN for i in range(3)})
    paths = write(tmp_path, files)
    assert codes(lint(paths, jobs=2)) == codes(lint(paths, jobs=1)) == {"p1/main.py": ["TL202:11"]}


def test_cache_invalidates_dependents_when_an_imported_module_changes(tmp_path):
    src = tmp_path / "src"
    paths = write(src, {"engine.py": ENGINE.format(train_line="pass"), "main.py": MAIN})
    engine_py, main_py = paths
    cache = Cache(str(tmp_path / "cache"))

    first = run(paths, OPTS, cache=cache)
    assert [f"{f.code}:{f.line}" for f in first[1].findings] == ["TL202:11"]

    # unchanged tree: both files come from the cache, same findings
    cache2 = Cache(str(tmp_path / "cache"))
    again = run(paths, OPTS, cache=cache2)
    assert cache2.hits == 2 and [f.code for f in again[1].findings] == ["TL202"]

    # fix the helper only: main.py is unchanged (a cache hit) but its answer changed
    open(engine_py, "w").write(textwrap.dedent(ENGINE.format(train_line="model.train()")).lstrip("\n"))
    cache3 = Cache(str(tmp_path / "cache"))
    fixed = run(paths, OPTS, cache=cache3)
    assert cache3.hits == 1  # main.py was found in the cache, and re-linted anyway
    assert fixed[1].findings == []

    # and break it again: the finding comes back from the stored entries
    open(engine_py, "w").write(textwrap.dedent(ENGINE.format(train_line="pass")).lstrip("\n"))
    broken = run(paths, OPTS, cache=Cache(str(tmp_path / "cache")))
    assert [f"{f.code}:{f.line}" for f in broken[1].findings] == ["TL202:11"]


def test_cache_relints_importers_of_a_deleted_module(tmp_path):
    src = tmp_path / "src"
    engine_py, main_py = write(src, {"engine.py": ENGINE.format(train_line="pass"), "main.py": MAIN})
    first = run([engine_py, main_py], OPTS, cache=Cache(str(tmp_path / "cache")))
    assert [f"{f.code}:{f.line}" for f in first[1].findings] == ["TL202:11"]
    # the helper's module is gone: main.py is unchanged (cached) but what it imports is unknown now
    os.remove(engine_py)
    cache = Cache(str(tmp_path / "cache"))
    after = run([main_py], OPTS, cache=cache)
    assert after[0].findings == [] and cache.hits == 1


def test_cache_invalidates_dependents_when_an_imported_model_class_changes(tmp_path):
    models = """
        import torch.nn as nn
        import torch.nn.functional as F


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return {ret}
    """
    train = """
        import torch
        import torch.nn as nn

        from models import Net


        def main(loader):
            clf = Net()
            opt = torch.optim.SGD(clf.parameters(), lr=0.1)
            criterion = nn.CrossEntropyLoss()
            for x, y in loader:
                opt.zero_grad()
                loss = criterion(clf(x), y)
                loss.backward()
                opt.step()
    """
    paths = write(tmp_path / "src", {"models.py": models.format(ret="self.fc(x)"), "train.py": train})
    cache_dir = str(tmp_path / "cache")
    assert all(r.findings == [] for r in run(paths, OPTS, cache=Cache(cache_dir)))
    open(paths[0], "w").write(textwrap.dedent(models.format(ret="F.softmax(self.fc(x), dim=1)")).lstrip("\n"))
    c = Cache(cache_dir)
    res = run(paths, OPTS, cache=c)
    assert c.hits == 1
    assert [f"{f.code}:{f.line}" for f in res[1].findings] == ["TL401:13"]


def test_call_graph_edges_are_resolved(tmp_path):
    paths = write(tmp_path, {"engine.py": ENGINE.format(train_line="pass"), "main.py": MAIN})
    mm = model_of(paths, paths[1])
    callees = {op.func: op.info for op in walk(mm.functions["main"].body)
               if isinstance(op, CallOp) and op.kind == CALL}
    assert isinstance(callees["train_one_epoch"], ExternalRef)
    assert callees["train_one_epoch"].qualname == "engine.train_one_epoch"
    assert callees["evaluate"].qualname == "engine.evaluate"


CALL_SITE_PROJECT = {
    "nets.py": """
        import torch.nn as nn
        import torch.nn.functional as F


        class SpeakerNet(nn.Module):
            def __init__(self, n_speakers=10):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(80, 256), nn.ReLU(), nn.Dropout(0.1))
                self.out = nn.Linear(256, n_speakers)

            def forward(self, x):
                return F.softmax(self.out(self.body(x)), dim=-1)


        class SpeakerLogits(nn.Module):
            def __init__(self, n_speakers=10):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(80, 256), nn.ReLU(), nn.Dropout(0.1))
                self.out = nn.Linear(256, n_speakers)

            def forward(self, x):
                return self.out(self.body(x))
    """,
    "loops.py": """
        import torch.nn as nn


        def fit(net, loader, opt, epochs):
            criterion = nn.CrossEntropyLoss()
            for _ in range(epochs):
                for feats, speaker in loader:
                    opt.zero_grad()
                    loss = criterion(net(feats), speaker)
                    loss.backward()
                    opt.step()
    """,
    "main.py": """
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from loops import fit
        from nets import SpeakerNet

        data = TensorDataset(torch.randn(64, 80), torch.randint(0, 10, (64,)))
        model = SpeakerNet().to("cpu")
        fit(model, DataLoader(data, batch_size=8), torch.optim.Adam(model.parameters()), epochs=2)
    """,
}


def test_a_parameter_takes_the_class_its_call_sites_in_another_module_pass(tmp_path):
    """Only main.py says what ``fit``'s ``net`` is; an edit of main.py (the logits model)
    changes the findings of loops.py, with the cache and two workers as without them."""
    paths = write(tmp_path, CALL_SITE_PROJECT)
    cache_dir = str(tmp_path / "cache")
    first = lint(paths)
    assert codes(first) == {"loops.py": ["TL401:9"]}
    assert lint(paths, cache=Cache(cache_dir), jobs=2) == first
    assert lint(paths, cache=Cache(cache_dir)) == first  # from the cache
    main = tmp_path / "main.py"
    main.write_text(main.read_text().replace("SpeakerNet", "SpeakerLogits"))
    cold = lint(paths)
    assert codes(cold) == {}
    assert lint(paths, cache=Cache(cache_dir)) == cold
    assert lint(paths, cache=Cache(cache_dir), jobs=2) == cold
    # two call sites that disagree say nothing; a name alone is no evidence either
    main.write_text(main.read_text() + "fit(SpeakerNet(), None, None, 1)\n")
    assert codes(lint(paths, cache=Cache(cache_dir), jobs=2)) == codes(lint(paths)) == {}
    main.write_text(main.read_text().replace("fit(SpeakerNet(), None, None, 1)\n", "fit(make_net(), None, None, 1)\n")
                    .replace("SpeakerLogits", "SpeakerNet"))
    assert codes(lint(paths, cache=Cache(cache_dir))) == codes(lint(paths)) == {}


STAR_UTILS = """
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader
    import collections as _collections


    def masked_mse(pred, target):
        mask = (target != 0).float()
        return (F.mse_loss(pred, target, reduction="none") * mask).mean()


    def _private_helper():
        return _collections.Counter()
"""

STAR_MAIN = """
    from utils import *


    def validate(model, loader):
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in loader:
                total += masked_mse(model(x), y).item()
        return total / len(loader)


    def train(model, loader, optimizer):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = masked_mse(model(x), y)
            loss.backward()
            optimizer.step()
"""


def test_a_star_import_binds_what_the_module_imports_and_defines(tmp_path):
    """``from utils import *`` binds utils' torch names and functions (not ``_private`` ones),
    and only what ``__all__`` lists when it has one; each name asked is a recorded question."""
    paths = write(tmp_path, {"utils.py": STAR_UTILS, "main.py": STAR_MAIN})
    assert codes(lint(paths)) == {}  # the validation loop is under utils' torch.no_grad()
    mm = model_of(paths, str(tmp_path / "main.py"))
    assert mm.qualify("torch.no_grad") == "torch.no_grad"
    assert mm.qualify("F.mse_loss") == "torch.nn.functional.mse_loss"
    assert mm.qualify("DataLoader") == "torch.utils.data.DataLoader"
    assert mm.qualify("masked_mse") == "utils.masked_mse"
    assert mm.qualify("_private_helper") is None and mm.qualify("_collections") is None
    assert mm.qualify("numpy") is None
    asked = {str(q) for q in mm.external_queries}
    assert {"star:utils.torch", "star:utils.masked_mse"} <= asked

    (tmp_path / "utils.py").write_text('__all__ = ["masked_mse"]\n' + textwrap.dedent(STAR_UTILS))
    mm = model_of(paths, str(tmp_path / "main.py"))
    assert mm.qualify("masked_mse") == "utils.masked_mse"
    assert mm.qualify("torch.no_grad") is None and mm.qualify("F.mse_loss") is None


def test_a_star_imported_module_edited_relints_its_importer(tmp_path):
    """The names a star import binds come from the other module's exports: a cached importer
    gets the answers of the edited module, as a cold run does."""
    src = tmp_path / "src"
    paths = write(src, {"utils.py": STAR_UTILS, "main.py": STAR_MAIN})
    assert codes(lint(paths)) == codes(lint(paths, cache=Cache(str(tmp_path / "cache")))) == {}
    # utils binds no torch for its importers any more: main's ``torch.no_grad()`` is unknown
    (src / "utils.py").write_text('__all__ = ["masked_mse"]\n' + textwrap.dedent(STAR_UTILS))
    cache = Cache(str(tmp_path / "cache"))
    edited = codes(lint(paths, cache=cache))
    assert cache.hits == 1 and edited == codes(lint(paths)) == {"main.py": ["TL203:8"]}
    (src / "utils.py").write_text(textwrap.dedent(STAR_UTILS))
    cache = Cache(str(tmp_path / "cache"))
    assert codes(lint(paths, cache=cache)) == {} and cache.hits == 1


def test_lowercase_module_classes_through_a_star_import_keep_their_mode_sensitivity(tmp_path):
    """``from .parts import *`` binds ``nn`` and the package's lowercase layer classes
    (``class double_conv(nn.Module)`` with batch norm): the network built from them is
    mode-sensitive, so evaluating it in train mode is still reported (a lowercase name is a
    function only when it is not a module class)."""
    paths = write(tmp_path, {
        "net/__init__.py": "from .model import SegNet\n",
        "net/parts.py": """
            import torch.nn as nn


            class double_conv(nn.Module):
                def __init__(self, in_ch, out_ch):
                    super().__init__()
                    self.conv = nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch),
                                              nn.ReLU(inplace=True))

                def forward(self, x):
                    return self.conv(x)


            class inconv(nn.Module):
                def __init__(self, in_ch, out_ch):
                    super().__init__()
                    self.conv = double_conv(in_ch, out_ch)

                def forward(self, x):
                    return self.conv(x)
        """,
        "net/model.py": """
            from .parts import *


            class SegNet(nn.Module):
                def __init__(self, n_channels, n_classes):
                    super().__init__()
                    self.inc = inconv(n_channels, 16)
                    self.out = nn.Conv2d(16, n_classes, 1)

                def forward(self, x):
                    return self.out(self.inc(x))
        """,
        "predict.py": """
            import torch
            from net import SegNet


            def predict(net, images):
                with torch.no_grad():
                    return [net(x).argmax(1) for x in images]


            def main(images):
                net = SegNet(3, 2)
                net.load_state_dict(torch.load("segnet.pth"))
                print(predict(net, images))
        """,
    })
    found = lint(paths)
    facts = {}
    from torchlint.project import Workspace

    ws = Workspace(paths)
    run(paths, OPTS, workspace=ws)
    for k in ("net.parts.inconv", "net.model.SegNet"):
        facts[k] = ws.index.classes[k]["mode_sensitive"]
    assert facts == {"net.parts.inconv": True, "net.model.SegNet": True}
    assert [c for c, _, _ in found["predict.py"]] == ["TL201"]


# ------------------------------------------------------------------ overrides in subclasses
BASE_TRAINER = """
    import torch


    class Trainer:
        def __init__(self, model, device):
            self.model = model.to(device)
            self.device = device

        def test(self, loaders):
            self.model.eval()
            scores = []
            self.evaluate(loaders, scores)
            return scores

        def evaluate(self, loaders, scores):
            raise NotImplementedError
"""
TASK_TRAINER = """
    import torch

    from base import Trainer


    class TaskTrainer(Trainer):
        def evaluate(self, loaders, scores):
            for loader in loaders:
                for x, y in loader:
                    {line}
                    scores.append((out.argmax(1) == y.to(self.device)).float().mean().item())
"""


def test_a_base_class_method_sees_the_overrides_its_subclasses_define_in_other_modules(tmp_path):
    graph, nograd = "out = self.model(x.to(self.device))", \
        "with torch.no_grad():\n                        out = self.model(x.to(self.device))"
    paths = write(tmp_path / "src", {"base.py": BASE_TRAINER, "task.py": TASK_TRAINER.format(line=graph)})
    base_py, task_py = paths
    serial, parallel = lint(paths), lint(paths, jobs=2)
    assert codes(serial) == codes(parallel) == {"base.py": ["TL203:12"], "task.py": ["TL203:8"]}
    msg = serial["base.py"][0][2]
    assert "`self.evaluate()`" in msg and "TaskTrainer.evaluate" in msg and "line 10" in msg
    # the index answers which subclasses override a method, and only those that define it
    from torchlint.project import Workspace

    ws = Workspace(paths)
    run(paths, OPTS, workspace=ws)
    assert ws.index.overrides("base.Trainer", "evaluate") == ["task.TaskTrainer.evaluate"]
    assert ws.index.overrides("base.Trainer", "test") == []
    # the subclass's loop gets no_grad: base.py is unchanged (a cache hit) and linted again
    cache = Cache(str(tmp_path / "cache"))
    run(paths, OPTS, cache=cache)
    open(task_py, "w").write(textwrap.dedent(TASK_TRAINER.format(line=nograd)).lstrip("\n"))
    cache2 = Cache(str(tmp_path / "cache"))
    after = run(paths, OPTS, cache=cache2)
    assert cache2.hits == 1 and after[0].findings == [] and after[1].findings == []

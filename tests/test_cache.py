"""The result cache: a warm run parses nothing and reads no unchanged file, an edited module
re-lints itself and the modules whose cross-module answers changed (and nothing else),
corrupt entries and a corrupt index are ignored, the directory is tagged and git-ignored."""
import json
import os
import textwrap

import libcst
import pytest

from torchlint.cache import Cache
from torchlint.engine import LintOptions, run
from torchlint.selection import enabled_codes, preview_codes
from sample_projects import ENGINE as HELPERS  # written as helpers.py here
import cachefiles

OPTS = LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))  # preview rules too


MAIN = """
    import torch
    import torch.nn as nn

    from helpers import evaluate, train_one_epoch


    def main(loader):
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            train_one_epoch(model, loader, optimizer)
            print(evaluate(model, loader))
"""

# a module with a bug of its own and no tie to the others
LONELY = """
    import torch


    def fit(model, loader, optimizer, criterion):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
"""

PLAIN = """
    def add(a, b):
        return a + b
"""


@pytest.fixture
def parses(monkeypatch):
    """Count libcst parses (the engine runs in-process with jobs=1)."""
    seen = []
    real = libcst.parse_module

    def counting(source, *a, **kw):
        seen.append(source)
        return real(source, *a, **kw)

    monkeypatch.setattr(libcst, "parse_module", counting)
    return seen


def _write(path, text):
    path.write_text(textwrap.dedent(text).lstrip("\n"))


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write(src / "helpers.py", HELPERS.format(train_line="pass"))
    _write(src / "main.py", MAIN)
    _write(src / "lonely.py", LONELY)
    _write(src / "plain.py", PLAIN)
    # an old mtime: the stat index trusts it (a fresh mtime is "racy" and re-hashed)
    for p in src.iterdir():
        os.utime(p, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return src, sorted(str(p) for p in src.iterdir())


def _found(results):
    return {os.path.basename(r.path): [f"{f.code}:{f.line}" for f in r.findings] for r in results if r.findings}


def test_warm_run_parses_and_reads_nothing(tmp_path, tree, parses):
    src, paths = tree
    cold = run(paths, OPTS, cache=Cache(str(tmp_path / "c")))
    assert len(parses) >= 3  # plain.py has no trigger words: prefiltered, not parsed
    expected = _found(cold)
    assert expected == {"main.py": ["TL202:11"], "lonely.py": ["TL103:8"]}
    del parses[:]
    c = Cache(str(tmp_path / "c"))
    warm = run(paths, OPTS, cache=c)
    assert parses == []
    assert c.hits == len(paths) and c.misses == 0
    assert c.hashed == 0  # unchanged stat: not even read
    assert _found(warm) == expected
    assert [f.to_dict() for r in warm for f in r.findings] == [f.to_dict() for r in cold for f in r.findings]


# facts per item of a returned tuple (the summary's ``returns_items``, the class's ``forward_items``)
TWO_HEADS = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 16)
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            h = torch.relu(self.body(x))
            return F.softmax(self.head(h), dim=1), h


    def train_step(model, x, y, optimizer):
        optimizer.zero_grad()
        probs, _ = model(x)
        loss = F.nll_loss(torch.log(probs), y)
        loss.backward()
        optimizer.step()
        return probs.detach(), loss.item()
"""


def test_the_stored_result_of_a_module_whose_functions_return_tuples_matches_the_schema(tmp_path):
    """Its exports hold a list of facts per returned item (``returns_items``, a list of lists):
    the schema check once took such entries for damaged files, so every run that read them
    rebuilt them (and reported them under ``-v``): on diffusers' examples, 117 of 304 entries."""
    from torchlint import integrity

    _write(tmp_path / "heads.py", TWO_HEADS + '''

    def predict(model, x, with_hidden=False):
        probs, h = model(x)
        if with_hidden:
            return probs, h
        return probs, None
''')
    (res,) = run([str(tmp_path / "heads.py")], OPTS)
    stored = res.to_json()
    items = [v.get("returns_items") for v in stored["summaries"].values() if v.get("returns_items")]
    assert items  # facts per returned item
    assert integrity.result(stored)


def test_every_result_a_lint_of_the_fixtures_stores_matches_the_schema():
    """What a lint stores is what the cache accepts back: a field the schema misreads makes
    each entry that holds it a "damaged" file, rebuilt on every run (``returns_items``,
    ``backward_if``, ``mode_free_if`` and notebooks' findings once were)."""
    from torchlint import integrity

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fixtures = os.path.join(root, "fixtures")
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(fixtures) for f in fs
                   if f.endswith((".py", ".ipynb")))
    paths = paths[::2] + [p for p in paths[1::2] if p.endswith(".ipynb")]
    results = [r for r in run(paths, OPTS) if r.error is None and not r.internal_error]
    assert len(results) > 300
    stored = [r.to_json() for r in results]
    fields = {k for d in stored for v in (d.get("summaries") or {}).values() for k, x in v.items() if x}
    fields |= {k for d in stored for v in (d.get("classes") or {}).values() for k, x in v.items() if x}
    assert {"returns_items", "backward_if", "mode_free_if"} <= fields  # the sample holds them
    assert any(f.get("cell") for d in stored for f in d["findings"])  # and notebooks' findings
    bad = [d["path"] for d in stored if not integrity.result(d)]
    assert not bad


def test_touch_without_change_rehashes_but_does_not_parse(tmp_path, tree, parses):
    src, paths = tree
    run(paths, OPTS, cache=Cache(str(tmp_path / "c")))
    os.utime(src / "lonely.py")  # new mtime, same bytes
    del parses[:]
    c = Cache(str(tmp_path / "c"))
    run(paths, OPTS, cache=c)
    assert parses == [] and c.hits == len(paths) and c.hashed == 1


def test_edit_relints_only_the_file_when_nothing_depends_on_it(tmp_path, tree, parses):
    src, paths = tree
    first = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    with open(src / "lonely.py", "a") as fh:
        fh.write("\n\ndef unused():\n    return 1\n")
    del parses[:]
    c = Cache(str(tmp_path / "c"))
    again = _found(run(paths, OPTS, cache=c))
    assert len(parses) == 1 and "def unused" in parses[0]
    assert c.hits == len(paths) - 1
    assert again == first


def test_change_in_imported_module_relints_its_dependents(tmp_path, tree, parses):
    src, paths = tree
    first = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    assert "main.py" in first
    # the helper now restores training mode itself: main.py's finding must go away
    _write(src / "helpers.py", HELPERS.format(train_line="model.train()"))
    del parses[:]
    c = Cache(str(tmp_path / "c"))
    fixed = _found(run(paths, OPTS, cache=c))
    assert "main.py" not in fixed and fixed.get("lonely.py") == first["lonely.py"]
    reparsed = sorted("from helpers import" in s for s in parses)
    assert reparsed == [False, True]  # helpers.py and its dependent main.py; lonely.py not
    assert c.hits == len(paths) - 1  # main.py was a hit, then re-linted because its answers changed
    # and a warm run after that parses nothing again
    del parses[:]
    assert _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c")))) == fixed
    assert parses == []


class _Phases:
    """What a progress bar hears: the first pass's ticks, then each later phase and its ticks."""

    def __init__(self):
        self.phases = [["files", None, 0]]

    def phase(self, label, total):
        self.phases.append([label, total, 0])

    def __call__(self, n):
        self.phases[-1][2] += n


def test_progress_reports_the_phases_after_the_first_pass(tmp_path, tree):
    """The bar does not sit at 100% while files are linted again or the cache written."""
    src, paths = tree
    p = _Phases()
    run(paths, OPTS, cache=Cache(str(tmp_path / "c")), progress=p)
    assert p.phases[0] == ["files", None, len(paths)]
    assert p.phases[-1] == ["results cached", len(paths), len(paths)]
    _write(src / "helpers.py", HELPERS.format(train_line="model.train()"))
    p = _Phases()
    run(paths, OPTS, cache=Cache(str(tmp_path / "c")), progress=p)
    assert p.phases == [["files", None, len(paths)],
                        ["files linted again (their imports changed)", 1, 1],  # main.py
                        ["results cached", 2, 2]]  # helpers.py and main.py


def test_edit_that_keeps_the_exports_checks_no_other_file(tmp_path, tree, parses, monkeypatch):
    """An edit that changes nothing a dependent sees (a comment that moves no function: the
    helpers' summaries cite their lines) stops there: main.py imports helpers.py, but its
    questions are not even asked again."""
    from torchlint.project import ProjectIndex

    src, paths = tree
    first = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    asked = []
    real = ProjectIndex.answers
    monkeypatch.setattr(ProjectIndex, "answers", lambda project, queries, memo=None: asked.append(
        [str(q) for q in queries]) or real(project, queries, memo))
    text = (src / "helpers.py").read_text()
    (src / "helpers.py").write_text(text.replace("):\n", "):  # reviewed\n", 1) + "# end of the helpers\n")
    del parses[:]
    assert _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c")))) == first
    assert len(parses) == 1 and "# reviewed" in parses[0]
    # (not helpers.py's own: it asks only what other modules pass to its functions' parameters)
    main_queries = [q for q in asked if any("helpers." in x and not x.startswith("args:") for x in q)]
    assert main_queries == []  # main.py was not rechecked
    # an edit that does change what helpers.py exports is still seen by main.py
    asked.clear()
    _write(src / "helpers.py", HELPERS.format(train_line="model.train()"))
    fixed = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    assert "main.py" not in fixed and any(any("helpers" in x for x in q) for q in asked)


def test_edit_reads_only_the_exports_it_needs_and_keeps_the_others(tmp_path, tree, parses, monkeypatch):
    from torchlint import cache as cache_mod

    src, paths = tree
    first = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    loads, qloads = [], []
    real, realq = cache_mod._Snapshot.load, cache_mod._Snapshot.load_queries
    monkeypatch.setattr(cache_mod._Snapshot, "load", lambda self, key: loads.append(key) or real(self, key))
    monkeypatch.setattr(cache_mod._Snapshot, "load_queries",
                        lambda self, key: qloads.append(key) or realq(self, key))
    # an edit that leaves what lonely.py exports as it was: no other file's questions are read
    with open(src / "lonely.py", "a") as fh:
        fh.write("# reviewed\n")
    assert _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c")))) == first
    assert qloads == []
    with open(src / "lonely.py", "a") as fh:
        fh.write("\n\ndef unused():\n    return 1\n")
    del loads[:]
    results = run(paths, OPTS, cache=Cache(str(tmp_path / "c")))
    assert _found(results) == first
    # lonely.py asks nothing of the others: their exports are never parsed (only lonely.py's
    # old entry, to take its calls out of the totals and to compare its exports)
    assert len(set(loads)) <= 1
    assert sum(r.is_lazy() for r in results) == len(paths) - 1
    # the snapshot written by that run copied the unread exports and questions as they were:
    # a change in the helpers still reaches main.py through them
    del qloads[:]
    _write(src / "helpers.py", HELPERS.format(train_line="model.train()"))
    del parses[:]
    fixed = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    assert "main.py" not in fixed and fixed.get("lonely.py") == first["lonely.py"]
    assert sorted("from helpers import" in s for s in parses) == [False, True]
    assert qloads  # main.py's questions, read from the snapshot, to find its answers changed


def test_corrupt_entries_and_index_are_ignored(tmp_path, tree, parses):
    src, paths = tree
    cdir = tmp_path / "c"
    expected = _found(run(paths, OPTS, cache=Cache(str(cdir))))
    entries = [os.path.join(d, f) for d, _, fs in os.walk(cdir) for f in fs if f.endswith(".json")]
    assert len(entries) >= len(paths)
    for i, e in enumerate(entries):  # truncated JSON, wrong shapes, plain garbage (sealed or not)
        cachefiles.dump(e, [b"{\"version\": ", b"[]", b"{\"version\": \"0\", \"result\": 1}", b"\x00garbage"][i % 4],
                        seal=i % 2 == 0)
    c = Cache(str(cdir))
    assert _found(run(paths, OPTS, cache=c)) == expected
    assert c.hits == 0
    # the entries were rewritten: the next run is warm again
    del parses[:]
    c2 = Cache(str(cdir))
    assert _found(run(paths, OPTS, cache=c2)) == expected
    assert parses == [] and c2.hits == len(paths)


@pytest.mark.parametrize("damage", ["spans", "qspans", "called", "blob", "token"])
def test_damaged_run_snapshot_is_ignored_not_fatal(tmp_path, tree, damage):
    src, paths = tree
    cdir = tmp_path / "c"
    expected = _found(run(paths, OPTS, cache=Cache(str(cdir))))
    vdir = next(os.path.join(d) for d, _, fs in os.walk(cdir) if any(f.endswith("-index.json") for f in fs))
    index = next(os.path.join(vdir, f) for f in os.listdir(vdir) if f.endswith("-index.json"))
    blob = index.replace("-index.json", "-exports.bin")
    d = cachefiles.load(index)
    if damage == "spans":  # right keys, values out of shape
        d["spans"] = {k: ["0", None] for k in d["spans"]}
    elif damage == "qspans":  # the questions past the end of the blob
        d["qspans"] = {k: [off, n + 10 ** 9] for k, (off, n) in d["qspans"].items()}
    elif damage == "called":
        d["called"] = {"helpers.train_one_epoch": 3}
    elif damage == "token":  # an index paired with another run's blob
        d["token"] = "0" * 32
    cachefiles.dump(index, d)  # sealed again: the schema (or the blob's hash) must catch it
    if damage == "blob":  # same token, exports cut short
        with open(blob, "rb") as fh:
            data = fh.read()
        with open(blob, "wb") as fh:
            fh.write(data[: len(d["token"]) + 10])
    with open(src / "lonely.py", "a") as fh:  # not the unchanged-run path: the snapshot is read
        fh.write("\n\ndef unused():\n    return 1\n")
    assert _found(run(paths, OPTS, cache=Cache(str(cdir)))) == expected


def test_stale_index_entry_does_not_hide_an_edit(tmp_path, tree):
    src, paths = tree
    cdir = tmp_path / "c"
    run(paths, OPTS, cache=Cache(str(cdir)))
    # the bug in lonely.py is fixed: the edit changes size and mtime
    _write(src / "lonely.py", LONELY.replace("            optimizer.step()", "            optimizer.step()\n"
                                            "            optimizer.zero_grad()"))
    res = _found(run(paths, OPTS, cache=Cache(str(cdir))))
    assert "lonely.py" not in res


def test_cache_directory_is_tagged_and_ignored_by_git(tmp_path, tree):
    src, paths = tree
    cdir = tmp_path / "c"
    run(paths, OPTS, cache=Cache(str(cdir)))
    tag = (cdir / "CACHEDIR.TAG").read_text()
    assert tag.startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert "*" in (cdir / ".gitignore").read_text().split()
    idx = [os.path.join(d, f) for d, _, fs in os.walk(cdir) for f in fs if f == "index.json"]
    assert len(idx) == 1
    files = cachefiles.load(idx[0])["files"]
    assert set(files) == {os.path.abspath(p) for p in paths}


def test_selection_is_not_part_of_the_key(tmp_path, tree, parses):
    """--select / --ignore / --extend-select change what is reported, not what a lint
    computes: on a warm cache they parse nothing and report what --no-cache reports."""
    src, paths = tree
    # a directive that suppresses a finding of TL103, and one whose code never fires
    text = (src / "lonely.py").read_text().replace("optimizer.step()", "optimizer.step()  # noqa: TL103")
    (src / "lonely.py").write_text(text.replace("loss.backward()", "loss.backward()  # noqa: TL801"))
    os.utime(src / "lonely.py", (1_000_000_000, 1_000_000_000))
    default = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
    run(paths, default, cache=Cache(str(tmp_path / "c")))
    selections = [
        (["TL2"], [], [c for c in preview_codes() if c.startswith("TL2")]),
        (["TL"], ["TL103"], []),
        (["TL"], [], ["TL002"]),  # unused noqa: TL801 reported; TL103 used
        (["TL2", "TL002"], [], []),  # TL103 not selected: its directive is unused too
        (["TL"], [], sorted(preview_codes())),
    ]
    seen = []
    for select, ignore, extend in selections:
        opts = LintOptions(frozenset(enabled_codes(select, ignore, extend)))
        del parses[:]
        c = Cache(str(tmp_path / "c"))
        got = _found(run(paths, opts, cache=c))
        assert not parses and c.hits == len(paths), (select, ignore, extend)
        assert got == _found(run(paths, opts)), (select, ignore, extend)  # --no-cache
        seen.append(got)
    only_tl2, no_tl103, with_tl002, tl2_tl002, _ = seen
    assert all(code.startswith("TL2") for v in only_tl2.values() for code in v)
    assert "lonely.py" not in no_tl103 and "lonely.py" not in only_tl2
    assert [f for f in with_tl002["lonely.py"] if f.startswith("TL0")] == ["TL002:7"]
    assert [f for f in tl2_tl002["lonely.py"] if f.startswith("TL0")] == ["TL002:7", "TL002:8"]


def test_settings_and_per_file_ignores_are_part_of_the_key(tmp_path, tree, parses):
    src, paths = tree
    run(paths, OPTS, cache=Cache(str(tmp_path / "c")))
    for opts in (LintOptions(OPTS.enabled, settings={"allow-grad-data": False}),
                 LintOptions(OPTS.enabled, per_file_ignores={"lonely.py": ["TL1"]}, root=str(src))):
        del parses[:]
        c = Cache(str(tmp_path / "c"))
        got = _found(run(paths, opts, cache=c))
        assert c.hits == 0 and parses  # other options, other entries
        assert got == _found(run(paths, opts))
    assert "lonely.py" not in got


def test_cli_no_cache_and_cache_dir(tmp_path, tree):
    from click.testing import CliRunner

    from torchlint.cli import main

    src, paths = tree
    cdir = tmp_path / "elsewhere"
    r = CliRunner().invoke(main, ["check", str(src), "--cache-dir", str(cdir), "-j", "1", "--no-progress"])
    assert r.exit_code == 1, r.output
    assert (cdir / "CACHEDIR.TAG").exists()
    nodir = tmp_path / "never"
    r2 = CliRunner().invoke(main, ["check", str(src), "--no-cache", "--cache-dir", str(nodir), "-j", "1",
                                   "--no-progress"])
    assert r2.exit_code == 1 and r2.output == r.output
    assert not nodir.exists()


MODELS = """
    import torch.nn as nn
    import torch.nn.functional as F


    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 10)
            {layer}

        def forward(self, x):
            return {output}
"""

TRAIN = """
    import torch
    import torch.nn as nn

    from models import Classifier


    def fit(loader, val_loader, epochs=5):
        model = Classifier()
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for epoch in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(dim=1) == y).sum().item()
        return correct
"""


@pytest.mark.parametrize("edit, appears", [
    # what the model's forward returns: softmax outputs reach CrossEntropyLoss in train.py
    ({"output": "F.softmax(self.fc(x), dim=1)"}, "TL401"),
    # whether the model depends on the mode: with dropout, evaluating it without eval() is a bug
    ({"layer": "self.drop = nn.Dropout(0.5)", "output": "self.fc(self.drop(x))"}, "TL201"),
])
def test_change_of_one_class_fact_relints_the_importer(tmp_path, edit, appears):
    src = tmp_path / "src"
    src.mkdir()
    plain = {"layer": "", "output": "self.fc(x)"}
    _write(src / "models.py", MODELS.format(**plain))
    _write(src / "train.py", TRAIN)
    paths = sorted(str(p) for p in src.iterdir())
    before = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    assert not any(c.startswith(appears) for c in before.get("train.py", []))
    _write(src / "models.py", MODELS.format(**{**plain, **edit}))
    after = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    assert any(c.startswith(appears) for c in after.get("train.py", [])), after
    assert after == _found(run(paths, OPTS))  # what a run without the cache finds
    # and back: the finding goes away again
    _write(src / "models.py", MODELS.format(**plain))
    assert _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c")))) == before


def test_a_helper_that_creates_its_tensor_on_the_device_relints_the_forward_that_calls_it(tmp_path):
    """TL602 in models.py depends on what utils.py's helper returns (a tensor it creates on the
    CPU): an edit of the helper alone adds or removes the findings of its caller's forward."""
    import shutil

    case = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "crossfn")
    src = tmp_path / "src"
    shutil.copytree(os.path.join(case, "cvae_onehot_helper_other_module"), src)
    cpu = (src / "utils.py").read_text()
    on_device = cpu.replace("torch.zeros(idx.size(0), n)", "torch.zeros(idx.size(0), n, device=idx.device)")
    assert on_device != cpu
    paths = sorted(str(p) for p in src.iterdir() if p.suffix == ".py")
    before = _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c"))))
    assert before == {"models.py": ["TL602:40", "TL602:61"]}
    (src / "utils.py").write_text(on_device)
    assert _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c")))) == {} == _found(run(paths, OPTS))
    (src / "utils.py").write_text(cpu)
    assert _found(run(paths, OPTS, cache=Cache(str(tmp_path / "c")))) == before


def _entries(cache_dir):
    v = next(p for p in (cache_dir).iterdir() if p.name.startswith("v"))
    return sorted(str(e) for d in v.iterdir() if d.is_dir() and len(d.name) == 2 for e in d.iterdir())


def test_edits_do_not_grow_the_cache(tmp_path, tree):
    """An edited file's new entry replaces the one of its old content."""
    src, paths = tree
    cdir = tmp_path / "c"
    run(paths, OPTS, cache=Cache(str(cdir)))
    first = _entries(cdir)
    assert first
    for n in range(4):
        with open(src / "lonely.py", "a") as fh:
            fh.write(f"\n\ndef unused_{n}():\n    return {n}\n")
        found = _found(run(paths, OPTS, cache=Cache(str(cdir))))
        assert found["lonely.py"] == ["TL103:8"]
        assert len(_entries(cdir)) == len(first)


def _with_preview(sel):
    """The rules ``sel`` selects, preview rules of those prefixes included."""
    return LintOptions(frozenset(enabled_codes(sel, [], [c for c in preview_codes() if any(c.startswith(x) for x in sel)])))


def test_prune_removes_old_entries_and_least_recently_used_snapshots(tmp_path, tree):
    import time

    from torchlint import cache as cache_mod

    src, paths = tree
    cdir = tmp_path / "c"
    selections = [["TL"], ["TL1"], ["TL2"], ["TL3"], ["TL4"], ["TL5"], ["TL6"], ["TL7"], ["TL8"], ["TL1", "TL2"]]

    def options(n):  # the selection is not in the key: per-file-ignores (of no file here) are
        return LintOptions(_with_preview(selections[n]).enabled, per_file_ignores={f"none{n}.py": ["TL1"]})

    for n in range(len(selections)):  # one snapshot set per option set, the first one used longest ago
        run(paths, options(n), cache=Cache(str(cdir)))
    v = next(p for p in cdir.iterdir() if p.name.startswith("v"))
    snaps = lambda: {p.name.split(".")[0].split("-")[1] for p in v.iterdir() if p.name.startswith("run-")}
    assert len(snaps()) == len(selections)
    # no prune yet: the first run of the day did it
    assert Cache(str(cdir)).prune() == 0
    # a day later: stamp every file with its order of use, one old entry
    now = time.time()
    files = sorted((p for p in v.rglob("*") if p.is_file() and p.name != "pruned"), key=lambda p: p.stat().st_mtime_ns)
    for n, p in enumerate(files):
        os.utime(p, (now - 3600 + n, now - 3600 + n))
    stale = _entries(cdir)[0]
    os.utime(stale, (now - cache_mod.MAX_AGE_S - 60,) * 2)
    os.utime(v / "pruned", (now - cache_mod.PRUNE_EVERY_S - 60,) * 2)
    before = snaps()
    c = Cache(str(cdir))
    assert c.prune(now) > 0
    kept = snaps()
    assert len(kept) == cache_mod.KEEP_SNAPSHOTS
    first_two = {Cache(str(cdir))._fingerprint(options(n)) for n in range(2)}
    assert kept == before - first_two  # the two used longest ago went
    assert not os.path.exists(stale)
    # what is left still works: a warm run of the last options, same findings
    warm = Cache(str(cdir))
    last = options(len(selections) - 1)
    assert _found(run(paths, last, cache=warm)) == {"main.py": ["TL202:11"], "lonely.py": ["TL103:8"]}

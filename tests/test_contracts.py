"""The engine's contracts: one answer whatever the cache, the jobs, the working directory or
the command (``check``, ``--fix``, the language server). Each test is a reproduction of issue
21 that failed before the engine was consolidated."""
import os
import re
import textwrap

import pytest
from click.testing import CliRunner

from torchlint.cli import main


def _write(root, files: dict) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def tl(*args, cwd) -> tuple:
    """``torchlint check ARGS`` in process, from ``cwd``: (exit code, stdout)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(main, ["check", *args], catch_exceptions=False)
    finally:
        os.chdir(old)
    return r.exit_code, r.stdout


EVAL_HELPER = {
    "helpers.py": """
        def grab(model, x):
            out = model(x)
            out.data.clamp_(0, 1)
            return out
    """,
    "main.py": """
        import torch
        from helpers import grab


        def evaluate(model, loader):
            model.eval()
            outs = []
            with torch.no_grad():
                for x, y in loader:
                    outs.append(grab(model, x))
            return outs
    """,
}


def test_a_rule_reading_callers_under_no_grad_is_linted_again_when_they_change(tmp_path):
    """Reproduction 1 (with a write through ``.data``, which TL302 reports now that reads for
    logging are not): TL302 asks whether every caller in another module runs ``grab`` under
    ``no_grad``; the question is recorded, so the answer is the same cold, cached, after an
    edit of either file, and whatever the jobs."""
    _write(tmp_path, EVAL_HELPER)
    cold = tl("--no-cache", "-j1", ".", cwd=tmp_path)
    assert cold == tl("--no-cache", "-j2", ".", cwd=tmp_path)
    assert "TL302" not in cold[1]  # its only caller runs it under no_grad
    assert tl(".", cwd=tmp_path) == cold
    with open(tmp_path / "helpers.py", "a") as fh:
        fh.write("# a comment\n")
    assert tl(".", cwd=tmp_path) == cold == tl("--no-cache", ".", cwd=tmp_path)
    # the caller leaves no_grad: now writing through .data changes a tensor of the graph
    main_py = (tmp_path / "main.py").read_text()
    (tmp_path / "main.py").write_text(main_py.replace("with torch.no_grad():", "if True:"))
    fresh = tl("--no-cache", ".", cwd=tmp_path)
    assert "helpers.py:3:5: TL302" in fresh[1]
    assert tl(".", cwd=tmp_path) == fresh


def test_reproduction_1_as_filed_gets_one_answer(tmp_path):
    """Reproduction 1 with the helper as the issue filed it (``return out.data``): whatever
    TL302 concludes of it, ``--no-cache``, ``-j2`` and a cached run after a comment is
    appended to ``helpers.py`` say the same."""
    files = dict(EVAL_HELPER)
    files["helpers.py"] = """
        def grab(model, x):
            out = model(x)
            return out.data
    """
    _write(tmp_path, files)
    cold = tl("--no-cache", "-j1", ".", cwd=tmp_path)
    assert tl("--no-cache", "-j2", ".", cwd=tmp_path) == cold
    assert tl(".", cwd=tmp_path) == cold
    with open(tmp_path / "helpers.py", "a") as fh:
        fh.write("# a comment\n")
    assert tl(".", cwd=tmp_path) == cold == tl("--no-cache", ".", cwd=tmp_path)


def test_the_model_sees_the_project_only_through_a_recording_view(tmp_path):
    """What a module's model and rules can reach of the project is a ``ProjectView``: no
    attribute of the model holds the index itself, and each accessor records a question."""
    import libcst as cst

    from torchlint.engine import LintOptions, run
    from torchlint.model import ModuleModel
    from torchlint.project import Aspect, ProjectIndex, ProjectView, Question, Workspace
    from torchlint.selection import enabled_codes, preview_codes

    _write(tmp_path, EVAL_HELPER)
    files = [str(tmp_path / "helpers.py"), str(tmp_path / "main.py")]
    ws = Workspace(files)
    run(files, LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes())))), workspace=ws)
    text = (tmp_path / "helpers.py").read_text()
    mm = ModuleModel(files[0], files[0], text, cst.parse_module(text), "helpers", False, ws.index)
    assert isinstance(mm.project, ProjectView)
    assert not hasattr(mm.project, "__dict__")  # nothing can be hung on it or read around it
    assert not [k for k, v in vars(mm).items() if isinstance(v, ProjectIndex)]
    public = {n for n in dir(ProjectView) if not n.startswith("_")}
    assert public == {"asked", "key_for", "root_of", "has_module", "module_key", "locate", "resolve",
                      "summary", "class_facts", "method", "is_called", "only_called_under_no_grad",
                      "param_sites", "star_binding", "overrides"}
    before = set(mm.project.asked)
    assert mm.project.only_called_under_no_grad("helpers.grab")
    assert Question(Aspect.NO_GRAD_CALLERS, "helpers.grab") in mm.project.asked - before
    assert mm.project.star_binding("helpers.grab") == "helpers.grab"  # what ``from helpers import *`` binds
    assert Question(Aspect.STAR, "helpers.grab") in mm.project.asked
    assert mm.project.overrides("helpers.Missing", "evaluate") == []  # no class, no subclass
    assert Question(Aspect.OVERRIDES, "helpers.Missing.evaluate") in mm.project.asked
    # the rules and the model never name the index, nor reach into the view
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in ("rules", os.path.join("torchlint", "model")):
        for name in os.listdir(os.path.join(here, folder)):
            if name.endswith(".py"):
                src = open(os.path.join(here, folder, name)).read()
                assert not re.search(r"\._index\b", src), name
                if name != "__init__.py":  # (where ModuleModel wraps the index it is given)
                    assert not re.search(r"\bProjectIndex\b", src), name


REPLICATED = {
    "helpers.py": """
        def reset(optimizer):
            optimizer.zero_grad()
    """,
    "main.py": """
        import torch
        from helpers import reset


        def train(model, loader, optimizer, loss_fn):
            model.train()
            for x, y in loader:
                reset(optimizer)
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
    """,
}


def test_fix_acts_on_what_check_reports_with_the_same_module_roots(tmp_path):
    """Reproduction 2: two example folders each with their own ``helpers.py``; the fixer
    resolves ``from helpers import reset`` as ``check`` does (each folder's own helpers) and
    so proposes no ``zero_grad()`` that ``check`` does not ask for."""
    for d in ("ex1", "ex2"):
        _write(tmp_path / d, REPLICATED)
    code, out = tl("--no-cache", "ex1", "ex2", cwd=tmp_path)
    assert code == 0 and "TL103" not in out
    code, out = tl("--no-cache", "--diff", "--unsafe-fixes", "ex1", "ex2", cwd=tmp_path)
    assert code == 0 and out == ""


def test_a_cached_result_of_a_smaller_tree_is_not_served_for_a_larger_one(tmp_path):
    """A file linted alone (its import resolves to nothing) and then with the module it
    imports: how the import resolves is a recorded question, so the cached result is not
    reused when a module appears."""
    _write(tmp_path / "ex1", REPLICATED)
    code, out = tl(os.path.join("ex1", "main.py"), cwd=tmp_path)
    assert "TL103" in out  # alone, ``reset`` is unknown
    assert tl("ex1", cwd=tmp_path) == tl("--no-cache", "ex1", cwd=tmp_path) == (0, "All checks passed!\n")


def test_paths_are_relative_to_where_torchlint_runs_even_from_the_cache(tmp_path):
    """Reproduction 3: a result cached by a run at the root is shown relative to a
    subdirectory when torchlint runs there (and so are paths inside messages)."""
    import shutil

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # TL102 is a preview rule: the project selects it
    _write(tmp_path, {"pyproject.toml": "[tool.torchlint]\nextend-select = [\"TL102\"]\n"})
    # a helper of another module cited in the message (``micro_step()`` (steps.py:5))
    shutil.copytree(os.path.join(here, "fixtures", "crossfn", "accum_helper_clears_every_microbatch"),
                    tmp_path / "ex1")
    names = sorted(os.listdir(tmp_path / "ex1"))
    at_root = tl(*[os.path.join("ex1", n) for n in names], cwd=tmp_path)
    assert "ex1/train_lm.py:41:24: TL102 `micro_step()` (ex1/steps.py:5) clears" in at_root[1]
    inside = tl(*names, cwd=tmp_path / "ex1")
    assert inside == tl("--no-cache", *names, cwd=tmp_path / "ex1")
    assert "ex1/" not in inside[1] and "train_lm.py:41:24: TL102 `micro_step()` (steps.py:5)" in inside[1]
    assert inside[1] == at_root[1].replace("ex1/", "")


def test_the_cache_key_includes_torchlints_own_code(tmp_path, monkeypatch):
    """Reproduction 4: a change of torchlint's code (a rule edited, a build with the same
    version) changes the key of every cached result."""
    from torchlint import engine

    opts = engine.LintOptions(frozenset({"TL103"}))
    before = opts.fingerprint()
    monkeypatch.setattr(engine, "_CODE_DIGEST", "another build")
    assert opts.fingerprint() != before


def test_the_code_digest_covers_the_rules_and_the_engine():
    from torchlint.engine import code_digest, code_files

    files = code_files()
    assert any(f.endswith(os.path.join("torchlint", "engine.py")) for f in files)
    assert any(f.endswith("mode.py") and os.path.exists(os.path.join(os.path.dirname(f), "autograd.py"))
               for f in files)  # the rules' modules
    assert code_digest() == code_digest()


class _MemoryStore:
    """A result store in memory: the engine needs nothing of a cache but ``cache.Store``."""

    def __init__(self):
        self.results, self.hits = {}, 0

    def _key(self, path, opts):
        with open(path, "rb") as fh:
            return os.path.abspath(path), fh.read(), opts.fingerprint()

    def get(self, path, opts):
        import copy

        r = self.results.get(self._key(path, opts))
        self.hits += r is not None
        return copy.deepcopy(r)

    def put(self, path, opts, result):
        import copy

        self.results[self._key(path, opts)] = copy.deepcopy(result)

    def get_run(self, files, opts):
        return None

    def put_run(self, files, opts, results):
        pass

    def last_exports(self, path, opts):
        return None

    def files_gone_since_last_run(self, files, opts):
        return True

    def flush(self):
        pass


def test_a_cache_is_a_store_behind_a_small_protocol(tmp_path, monkeypatch):
    import libcst

    from torchlint.cache import Cache, Store
    from torchlint.engine import LintOptions, run
    from torchlint.selection import enabled_codes

    methods = {n for n in vars(Store) if not n.startswith("_")}
    assert methods == {"get", "put", "get_run", "put_run", "last_exports", "files_gone_since_last_run", "flush"}
    assert all(callable(getattr(Cache, n)) for n in methods)
    _write(tmp_path, EVAL_HELPER)
    main_py = (tmp_path / "main.py").read_text()
    (tmp_path / "main.py").write_text(main_py.replace("with torch.no_grad():", "if True:"))
    files = [str(tmp_path / "helpers.py"), str(tmp_path / "main.py")]
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
    shown = lambda results: [(f.path, f.code, f.line) for r in results for f in r.findings]  # noqa: E731
    cold = shown(run(files, opts))
    assert ("helpers.py", "TL302", 3) in [(os.path.basename(p), c, n) for p, c, n in cold]
    store = _MemoryStore()
    assert shown(run(files, opts, cache=store)) == cold
    parses = []
    real = libcst.parse_module
    monkeypatch.setattr(libcst, "parse_module", lambda *a, **k: parses.append(1) or real(*a, **k))
    assert shown(run(files, opts, cache=store)) == cold
    assert store.hits == 2 and not parses


def test_a_package_linted_without_the_module_it_re_exports_is_linted_once(tmp_path, monkeypatch):
    """``pkg/__init__.py`` alone (pre-commit passes only the changed files) re-exports a
    function named like its module (``from .spawn import spawn, ProcessContext``): the names
    resolve to ``pkg.spawn.X``, not one ``spawn`` longer at every answer check (which linted
    the file again in every round and exported ``pkg.spawn.spawn.spawn.spawn.X``)."""
    from torchlint import engine
    from torchlint.selection import enabled_codes

    _write(tmp_path, {"pkg/__init__.py": '''
        """Process helpers."""
        from .spawn import ProcessContext, spawn, start_processes

        __all__ = ["ProcessContext", "spawn", "start_processes"]
    '''})
    lints = []
    real = engine._lint_module
    monkeypatch.setattr(engine, "_lint_module", lambda *a, **k: lints.append(1) or real(*a, **k))
    opts = engine.LintOptions(frozenset(enabled_codes(["TL"], [], [])), prefilter=False)
    (res,) = engine.run([str(tmp_path / "pkg" / "__init__.py")], opts)
    assert len(lints) == 1
    assert res.reexports == {"pkg.ProcessContext": "pkg.spawn.ProcessContext", "pkg.spawn": "pkg.spawn.spawn",
                             "pkg.start_processes": "pkg.spawn.start_processes"}

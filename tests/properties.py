"""Small multi-module training projects and random edit sequences, for the property that a
tree gets one answer whatever the cache, the jobs or the command: a cached run, ``--no-cache
-j1``, ``-j2``, the language server's lint and what ``--fix --diff`` acts on all agree.

Used by ``tests/test_properties.py`` (a few hundred edit steps) and
``benchmarks/properties.py`` (thousands).
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

# What a helper can do; each is one realistic line (or wrapper) of training code.
HELPER_BODIES = {
    "eval": "    model.eval()\n",
    "train": "    model.train()\n",
    "zero_grad": "    optimizer.zero_grad()\n",
    "step": "    optimizer.step()\n",
    "data": "    out = model(x)\n    return out.data\n",
    # a write through .data: TL302 unless every caller (another module) runs it under no_grad
    "data_write": "    out = model(x)\n    out.data.clamp_(0, 1)\n    return out\n",
    "forward": "    return model(x)\n",
}
PARAMS = {"eval": "model", "train": "model", "zero_grad": "optimizer", "step": "optimizer",
          "data": "model, x", "data_write": "model, x", "forward": "model, x"}


@dataclass
class Helper:
    name: str
    kind: str
    module: str  # helpers or utils
    comment: str = ""
    no_grad: bool = False  # its body runs under torch.no_grad()

    def source(self) -> str:
        head = f"def {self.name}({PARAMS[self.kind]}):{self.comment}\n"
        body = HELPER_BODIES[self.kind]
        if self.no_grad:
            body = "    with torch.no_grad():\n" + "".join("    " + ln + "\n" for ln in body.splitlines())
        return head + body


@dataclass
class Project:
    helpers: list = field(default_factory=list)
    # calls in train.py's loop and in its evaluation function: helper names
    loop_calls: list = field(default_factory=list)
    eval_calls: list = field(default_factory=list)
    eval_no_grad: bool = True
    loop_zero_grad: bool = False
    header_comment: str = ""

    def files(self) -> dict:
        out = {}
        for mod in ("helpers", "utils"):
            hs = [h for h in self.helpers if h.module == mod]
            out[f"{mod}.py"] = "import torch\n\n\n" + "\n\n".join(h.source() for h in hs)
        by_mod: dict = {}
        for h in self.helpers:
            by_mod.setdefault(h.module, []).append(h.name)
        imports = "".join(f"from {m} import {', '.join(sorted(ns))}\n" for m, ns in sorted(by_mod.items()))
        args = {h.name: PARAMS[h.kind] for h in self.helpers}
        loop = "".join(f"            {c}({args[c]})\n" for c in self.loop_calls if c in args)
        ev = "".join(f"{'        ' if self.eval_no_grad else '    '}    {c}({args[c]})\n"
                     for c in self.eval_calls if c in args)
        out["train.py"] = (
            f"{self.header_comment}import torch\nimport torch.nn as nn\n{imports}\n\n"
            "def evaluate(model, loader):\n"
            + ("    with torch.no_grad():\n        for x, y in loader:\n" if self.eval_no_grad
               else "    for x, y in loader:\n")
            + (ev or ("            model(x)\n" if self.eval_no_grad else "        model(x)\n"))
            + "\n\ndef fit(model, loader, optimizer, loss_fn, epochs):\n"
            "    for epoch in range(epochs):\n"
            "        model.train()\n"
            "        for x, y in loader:\n"
            + ("            optimizer.zero_grad()\n" if self.loop_zero_grad else "")
            + loop
            + "            loss = loss_fn(model(x), y)\n"
            "            loss.backward()\n"
            "            optimizer.step()\n"
            "        evaluate(model, loader)\n"
            "\n\ndef main(loader):\n"
            "    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1))\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    fit(model, loader, optimizer, nn.CrossEntropyLoss(), 3)\n"
        )
        # a fourth module that only imports, so that -j2 runs a pool (4 files or more)
        out["run.py"] = "from train import main\n\n\nif __name__ == '__main__':\n    main([])\n"
        return out


def random_project(rng: random.Random) -> Project:
    p = Project()
    for i in range(rng.randint(1, 4)):
        p.helpers.append(Helper(f"h{i}", rng.choice(sorted(HELPER_BODIES)), rng.choice(("helpers", "utils"))))
    names = [h.name for h in p.helpers]
    p.loop_calls = rng.sample(names, rng.randint(0, len(names)))
    p.eval_calls = rng.sample(names, rng.randint(0, len(names)))
    p.eval_no_grad = rng.random() < 0.7
    p.loop_zero_grad = rng.random() < 0.5
    return p


def edit(p: Project, rng: random.Random) -> str:
    """One random edit of ``p``, in place; returns what it was."""
    what = rng.choice(("comment", "header", "kind", "rename", "move", "no_grad", "eval_no_grad",
                       "zero_grad", "call", "add"))
    h = rng.choice(p.helpers) if p.helpers else None
    if what == "comment" and h:
        h.comment = "" if h.comment else f"  # reviewed {rng.randint(0, 99)}"
    elif what == "header":
        p.header_comment = "" if p.header_comment else "# training entry point\n"
    elif what == "kind" and h:
        h.kind = rng.choice(sorted(HELPER_BODIES))
    elif what == "rename" and h:
        new = f"{h.name}x" if len(h.name) < 6 else h.name[:2]
        if all(o.name != new for o in p.helpers):
            p.loop_calls = [new if c == h.name else c for c in p.loop_calls]
            p.eval_calls = [new if c == h.name else c for c in p.eval_calls]
            h.name = new
    elif what == "move" and h:
        h.module = "utils" if h.module == "helpers" else "helpers"
    elif what == "no_grad" and h:
        h.no_grad = not h.no_grad
    elif what == "eval_no_grad":
        p.eval_no_grad = not p.eval_no_grad
    elif what == "zero_grad":
        p.loop_zero_grad = not p.loop_zero_grad
    elif what == "call" and h:
        calls = rng.choice((p.loop_calls, p.eval_calls))
        if h.name in calls:
            calls.remove(h.name)
        else:
            calls.append(h.name)
    elif what == "add" and len(p.helpers) < 5:
        taken = {o.name for o in p.helpers}
        name = next(f"h{i}" for i in range(10) if f"h{i}" not in taken)
        p.helpers.append(Helper(name, rng.choice(sorted(HELPER_BODIES)), rng.choice(("helpers", "utils"))))
    return what


def write(root: str, p: Project) -> list:
    paths = []
    for name, text in sorted(p.files().items()):
        path = os.path.join(root, name)
        old = None
        if os.path.exists(path):
            with open(path) as fh:
                old = fh.read()
        if old != text:
            with open(path, "w") as fh:  # (the cache re-hashes a file written seconds ago)
                fh.write(text)
        paths.append(path)
    return paths


def findings(results) -> list:
    """What a report shows of ``results`` (FileResults), each finding by its path as shown."""
    return shown([f for r in results for f in r.findings])


def shown(found) -> list:
    return sorted((f.path, f.code, f.line, f.column, f.message) for f in found)


class Checker:
    """Lints one project folder every way there is and says where they disagree. Every rule
    runs, preview rules included (a selection only filters results), so the cross-module mode
    rules (TL201/TL202) are compared too. ``compared`` counts the comparisons made, by way."""

    def __init__(self, root: str, cache_dir: str):
        from collections import Counter

        from torchlint.engine import LintOptions
        from torchlint.selection import enabled_codes, preview_codes

        self.root, self.cache_dir = root, cache_dir
        self.extend = sorted(preview_codes())
        # the project's configuration selects them, for the language server (which reads it)
        with open(os.path.join(root, "pyproject.toml"), "w") as fh:
            fh.write("[tool.torchlint]\nextend-select = [%s]\n" % ", ".join(f'"{c}"' for c in self.extend))
        self.opts = LintOptions(frozenset(enabled_codes(["TL"], [], self.extend)), root=root)
        self.server = None  # the language server, started at the first step that compares it
        self.texts: dict = {}  # path -> the text the server's editor last saved
        self.compared = Counter()
        self.codes = Counter()  # the findings seen (cold), by code: what the steps exercised

    def check(self, paths, jobs2: bool = False, lsp: bool = True, fix: bool = True) -> list:
        """The disagreements (empty: all agree) of the ways of linting ``paths``."""
        from torchlint.cache import Cache
        from torchlint.engine import run

        bad = []
        cold = self.last_cold = findings(run(paths, self.opts, jobs=1))
        self.codes.update(c for _, c, *_ in cold)
        cached = findings(run(paths, self.opts, jobs=1, cache=Cache(self.cache_dir)))
        self.compared["cached"] += 1
        if cached != cold:
            bad.append(("cached", cached, cold))
        if jobs2:
            two = findings(run(paths, self.opts, jobs=2))
            self.compared["-j2"] += 1
            if two != cold:
                bad.append(("-j2", two, cold))
        if lsp:
            got = shown(self._lsp(paths))
            self.compared["lsp"] += 1
            if got != cold:
                bad.append(("lsp", got, cold))
        if fix:
            self.compared["fix"] += 1
            bad.extend(self._fix_disagreements(paths, cold))
        return bad

    def _lsp(self, paths) -> list:
        """The diagnostics of a language server (``torchlint.lsp.TorchlintServer``) that has
        every file open, as an editor leaves them after saving this step's edits one file at a
        time: the server's save path (``refresh_saved``: the saved file linted and its exports
        swapped in the workspace index) and then the other open documents linted again, as
        ``did_save`` does. The server indexes the workspace once (``index_workspace``, through
        the CLI's cache), when it starts; the files it has not been told about since then are
        opened with the text they have now."""
        from lsprotocol import types
        from pygls.workspace import Workspace as LspWorkspace

        from torchlint.lsp import DocState, TorchlintServer

        texts = {}
        for path in paths:
            with open(path) as fh:
                texts[path] = fh.read()
        uri = {path: "file://" + path for path in paths}
        srv = self.server
        if srv is None:
            srv = self.server = TorchlintServer()
            srv.protocol._workspace = LspWorkspace("file://" + self.root)
            srv.index_workspace()
            for n, path in enumerate(paths):
                srv.workspace.put_text_document(types.TextDocumentItem(uri[path], "python", 0, texts[path]))
                srv.docs[uri[path]] = DocState()
            self.texts = dict(texts)
        published = {}  # uri -> the findings its save published
        saved = [p for p in paths if self.texts.get(p) != texts[p]]
        for path in saved:  # the editor saves the edited files one by one
            srv.workspace.remove_text_document(uri[path])
            srv.workspace.put_text_document(types.TextDocumentItem(uri[path], "python", 1, texts[path]))
            done = srv.refresh_saved(uri[path])
            assert done is not None and done[0] == texts[path]
            published = {uri[path]: done[1]}
            self.texts[path] = texts[path]
        # the documents not published by their own save: linted again (``did_save``), or,
        # at a step without a save, linted as they are (``did_open``)
        out = []
        for path in paths:
            u = uri[path]
            out.extend(published[u] if u in published else srv.lint(u, texts[path]))
        return out

    def _fix_disagreements(self, paths, cold) -> list:
        """The fixes ``--fix --diff --unsafe-fixes`` applies, in every pass, must be those of
        findings that ``check`` reports: at most as many of each code as it reports in each
        file, each of a finding it reports (a later pass lints the fixed text, where a fix may
        uncover another finding, e.g. a loop wrapped in ``no_grad`` becomes evaluation code)."""
        import io
        from collections import Counter
        from contextlib import redirect_stderr, redirect_stdout

        from torchlint import fixer
        from torchlint.config import Config
        from torchlint.runner import Runner

        runner = Runner(Config(root=self.root), ["TL"], [], self.extend, jobs=1, cache=None, progress=False)
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            report = fixer.fix_files(runner, paths, unsafe=True, diff=True)
        reported = {(os.path.abspath(p), code, line) for p, code, line, _, _ in cold}
        per_code = Counter((os.path.abspath(p), code) for p, code, _, _, _ in cold)
        out = []
        for ff in report.files:
            path = os.path.abspath(ff.path)
            for a in ff.applied:
                if (path, a.code, a.reported_line) not in reported:
                    out.append(("fix", ff.path, a.code, a.line, a.reported_line))
            for code, n in Counter(a.code for a in ff.applied).items():
                if n > per_code[(path, code)]:
                    out.append(("fixes", ff.path, code, n, per_code[(path, code)]))
        return out

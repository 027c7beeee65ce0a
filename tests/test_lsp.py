"""The language server, end to end over stdio (pytest-lsp drives `torchlint lsp` as an editor would)."""
import asyncio
import os
import sys
import time

import pytest

pytest.importorskip("pygls")
pytest_lsp = pytest.importorskip("pytest_lsp")
pytest.importorskip("pytest_asyncio")

from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities  # noqa: E402

TRAIN = '''\
"""Train a small classifier on synthetic features and report validation accuracy."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, d_in=8, n_classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, n_classes))

    def forward(self, x):
        return self.net(x)


def train_epoch(model, loader, optimizer, criterion):
    model.train()
    history = {}
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        history["perte (entraînement) 📉"] = loss.item(); optimizer.step()
    return history


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += (model(x).argmax(dim=1) == y).sum().item()
        total += y.numel()
    return correct / total


def main():
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(2):
        train_epoch(model, loader, optimizer, criterion)
        print(epoch, evaluate(model, loader))


if __name__ == "__main__":
    main()
'''


def _line_of(text, needle):
    for i, line in enumerate(text.splitlines()):
        if needle in line:
            return i
    raise AssertionError(needle)


def _apply(text, edits):
    """Apply LSP TextEdits (UTF-16 columns) to ``text`` like an editor would."""
    lines = text.splitlines(True)

    def offset(pos):
        before = sum(len(ln) for ln in lines[: pos.line])
        if pos.line >= len(lines):
            return len(text)
        line = lines[pos.line]
        units = 0
        for i, ch in enumerate(line):
            if units >= pos.character:
                return before + i
            units += len(ch.encode("utf-16-le")) // 2
        return before + len(line.rstrip("\r\n"))

    spans = sorted(((offset(e.range.start), offset(e.range.end), e.new_text) for e in edits), reverse=True)
    for a, b, new in spans:
        text = text[:a] + new + text[b:]
    return text


async def _wait(client, uri, pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        diags = client.diagnostics.get(uri)
        if diags is not None and pred(diags):
            return diags
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out; last diagnostics: {client.diagnostics.get(uri)}")


def _codes(diags):
    return sorted(d.code for d in diags)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One workspace (and one server) for the module; each test opens its own files."""
    root = tmp_path_factory.mktemp("ws")
    for name in ("train.py", "train_fix.py", "train_all.py"):
        (root / name).write_text(TRAIN, encoding="utf-8")
    (root / "cfgproj").mkdir()
    (root / "cfgproj" / "train.py").write_text(TRAIN, encoding="utf-8")
    (root / "badcfg").mkdir()
    (root / "badcfg" / "pyproject.toml").write_text('[tool.torchlint]\nselect = "TL1"\n')
    (root / "badcfg" / "train.py").write_text(TRAIN, encoding="utf-8")
    (root / "xmod").mkdir()
    (root / "xmod" / "helpers.py").write_text(HELPERS)
    (root / "xmod" / "main.py").write_text(MAIN)
    # TL202 is a preview rule: the project selects it
    (root / "xmod" / "pyproject.toml").write_text('[tool.torchlint]\nextend-select = ["TL202"]\n')
    # a folder whose name needs percent-encoding in a URI; its project selects TL201 (preview)
    (root / "my project #2").mkdir()
    (root / "my project #2" / "pyproject.toml").write_text('[tool.torchlint]\nextend-select = ["TL201"]\n')
    return root


@pytest_lsp.fixture(scope="module",
                    config=ClientServerConfig(server_command=[sys.executable, "-m", "torchlint", "lsp"]))
async def client(lsp_client: LanguageClient, workspace):
    registrations = []

    @lsp_client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register(params: types.RegistrationParams):  # the editor accepts the config-file watcher
        registrations.extend(params.registrations)

    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        root_uri=workspace.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
    ))
    yield
    await lsp_client.shutdown_session()


class Doc:
    def __init__(self, client, path, text):
        self.client, self.uri, self.text, self.version = client, path.as_uri(), text, 1

    def open(self):
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=self.uri, language_id="python", version=self.version, text=self.text)))

    def replace(self, text):
        self.version += 1
        self.text = text
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version),
            [types.TextDocumentContentChangeWholeDocument(text=text)]))

    async def actions(self, rng, diags=(), only=None):
        return await self.client.text_document_code_action_async(types.CodeActionParams(
            types.TextDocumentIdentifier(self.uri), rng,
            types.CodeActionContext(diagnostics=list(diags), only=only)))


@pytest.mark.asyncio(loop_scope="module")
async def test_diagnostics_open_change_close(client: LanguageClient, workspace):
    doc = Doc(client, workspace / "train.py", TRAIN)
    doc.open()
    diags = await _wait(client, doc.uri, lambda d: "TL103" in _codes(d) and "TL203" in _codes(d))
    d = next(x for x in diags if x.code == "TL103")
    assert d.source == "torchlint"
    assert d.severity == types.DiagnosticSeverity.Error
    assert d.code_description.href.endswith("/TL103.md")
    # the line has non-ASCII text (an emoji: two UTF-16 units) before the finding
    line_no = _line_of(TRAIN, "optimizer.step()")
    line = TRAIN.splitlines()[line_no]
    prefix = line[: line.index("optimizer.step()")]
    assert d.range.start.line == line_no
    assert d.range.start.character == len(prefix.encode("utf-16-le")) // 2
    assert d.range.start.character == len(prefix) + 1  # 📉 is one code point, two UTF-16 units
    assert d.range.end.character == d.range.start.character + len("optimizer.step()")
    ev = next(x for x in diags if x.code == "TL203")
    assert ev.range.start.line == TRAIN[: TRAIN.index("    for x, y in loader:\n        correct")].count("\n")
    assert ev.range.start.character == 4
    # edit: clear the gradients -> the TL103 diagnostic goes away, the others stay
    fixed = TRAIN.replace("    for x, y in loader:\n        loss", "    for x, y in loader:\n"
                          "        optimizer.zero_grad()\n        loss")
    assert fixed != TRAIN
    doc.replace(fixed)
    diags = await _wait(client, doc.uri, lambda d: "TL103" not in _codes(d))
    assert "TL203" in _codes(diags)
    # close -> cleared
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(doc.uri)))
    await _wait(client, doc.uri, lambda d: len(d) == 0)


@pytest.mark.asyncio(loop_scope="module")
async def test_quick_fix_removes_the_diagnostic(client: LanguageClient, workspace):
    doc = Doc(client, workspace / "train_fix.py", TRAIN)
    doc.open()
    diags = await _wait(client, doc.uri, lambda d: "TL203" in _codes(d))
    ev = next(x for x in diags if x.code == "TL203")
    actions = await doc.actions(ev.range, [ev])
    titles = [a.title for a in actions]
    fix = next(a for a in actions if "no_grad" in a.title)
    assert "(unsafe)" not in fix.title and fix.kind == types.CodeActionKind.QuickFix
    assert "Disable TL203 for this line" in titles
    new = _apply(doc.text, fix.edit.changes[doc.uri])
    assert "    with torch.no_grad():\n        for x, y in loader:\n            correct +=" in new
    doc.replace(new)
    diags = await _wait(client, doc.uri, lambda d: "TL203" not in _codes(d))
    assert "TL103" in _codes(diags)
    # TL103's fix is unsafe: offered, labelled so
    d103 = next(x for x in diags if x.code == "TL103")
    actions = await doc.actions(d103.range, [d103])
    unsafe = [a for a in actions if "zero_grad" in a.title]
    assert unsafe and all(a.title.endswith("(unsafe)") for a in unsafe)
    # "Disable TL103 for this line" adds a noqa comment; the diagnostic disappears
    disable = next(a for a in actions if a.title == "Disable TL103 for this line")
    new = _apply(doc.text, disable.edit.changes[doc.uri])
    assert "optimizer.step()  # noqa: TL103\n" in new
    doc.replace(new)
    await _wait(client, doc.uri, lambda d: "TL103" not in _codes(d))


@pytest.mark.asyncio(loop_scope="module")
async def test_fix_all_and_hover(client: LanguageClient, workspace):
    doc = Doc(client, workspace / "train_all.py", TRAIN)
    doc.open()
    diags = await _wait(client, doc.uri, lambda d: "TL203" in _codes(d) and "TL103" in _codes(d))
    whole = types.Range(types.Position(0, 0), types.Position(len(TRAIN.splitlines()), 0))
    actions = await doc.actions(whole, only=["source.fixAll.torchlint"])
    assert [a.kind for a in actions] == ["source.fixAll.torchlint"]
    new = _apply(doc.text, actions[0].edit.changes[doc.uri])
    assert "with torch.no_grad():" in new and "zero_grad" not in new  # safe fixes only
    # hover on the diagnostic shows the rule's documentation
    d103 = next(x for x in diags if x.code == "TL103")
    hov = await client.text_document_hover_async(types.HoverParams(
        types.TextDocumentIdentifier(doc.uri), d103.range.start))
    assert "missing-zero-grad (TL103)" in hov.contents.value and "## Why is this bad?" in hov.contents.value
    # hover on a code inside a noqa comment
    doc.replace(TRAIN.replace("optimizer.step()\n", "optimizer.step()  # noqa: TL103\n"))
    await _wait(client, doc.uri, lambda d: "TL103" not in _codes(d))
    line_no = _line_of(doc.text, "# noqa: TL103")
    line = doc.text.splitlines()[line_no]
    col = len(line[: line.index("TL103") + 2].encode("utf-16-le")) // 2
    hov = await client.text_document_hover_async(types.HoverParams(
        types.TextDocumentIdentifier(doc.uri), types.Position(line_no, col)))
    assert hov is not None and "missing-zero-grad (TL103)" in hov.contents.value
    # hovering elsewhere on a clean line shows nothing
    hov = await client.text_document_hover_async(types.HoverParams(
        types.TextDocumentIdentifier(doc.uri), types.Position(1, 3)))
    assert hov is None


@pytest.mark.asyncio(loop_scope="module")
async def test_configuration_is_reloaded(client: LanguageClient, workspace):
    doc = Doc(client, workspace / "cfgproj" / "train.py", TRAIN)
    doc.open()
    await _wait(client, doc.uri, lambda d: "TL103" in _codes(d))
    cfg = workspace / "cfgproj" / "pyproject.toml"
    cfg.write_text('[project]\nname = "demo"\n\n[tool.torchlint]\nignore = ["TL103"]\n')
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
        [types.FileEvent(uri=cfg.as_uri(), type=types.FileChangeType.Created)]))
    diags = await _wait(client, doc.uri, lambda d: "TL103" not in _codes(d))
    assert "TL203" in _codes(diags)
    # without a notification, an edit of the file is noticed by its modification time
    time.sleep(0.02)
    cfg.write_text('[project]\nname = "demo"\n\n[tool.torchlint]\nignore = ["TL203"]\n')
    os.utime(cfg, None)
    doc.replace(doc.text + "\n")
    diags = await _wait(client, doc.uri, lambda d: "TL103" in _codes(d) and "TL203" not in _codes(d))


HELPERS = '''\
"""Evaluation helpers shared by the training scripts."""
import torch


@torch.no_grad()
def accuracy(model, loader):
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += (model(x).argmax(dim=1) == y).sum().item()
        total += y.numel()
    return correct / total
'''

MAIN = '''\
"""Fine-tune a small classifier and validate after every epoch."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import accuracy


def main():
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    model.train()
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        print(epoch, accuracy(model, loader))


if __name__ == "__main__":
    main()
'''


@pytest.mark.asyncio(loop_scope="module")
async def test_cross_module_summaries_from_the_workspace(client: LanguageClient, workspace):
    # xmod/helpers.py was indexed when the server started; main.py is opened, helpers.py is not
    doc = Doc(client, workspace / "xmod" / "main.py", MAIN)
    doc.open()
    # accuracy() (another module) leaves the model in eval mode; the next epoch trains it so
    line = _line_of(MAIN, "loss = criterion(model(x), y)")
    await _wait(client, doc.uri, lambda d: any(x.code == "TL202" and x.range.start.line == line for x in d))
    # the helper is fixed to restore the mode and saved: main.py's diagnostics follow
    fixed = HELPERS.replace("    return correct / total", "    model.train()\n    return correct / total")
    h = Doc(client, workspace / "xmod" / "helpers.py", HELPERS)
    h.open()
    h.replace(fixed)
    (workspace / "xmod" / "helpers.py").write_text(fixed)
    client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(h.uri)))
    await _wait(client, doc.uri, lambda d: not any(x.code == "TL202" for x in d))


@pytest.mark.asyncio(loop_scope="module")
async def test_a_bad_configuration_is_reported_and_defaults_are_used(client: LanguageClient, workspace):
    doc = Doc(client, workspace / "badcfg" / "train.py", TRAIN)
    doc.open()
    await _wait(client, doc.uri, lambda d: "TL103" in _codes(d) and "TL203" in _codes(d))
    deadline = time.monotonic() + 10
    while not any("must be a list of strings" in m.message for m in client.messages):
        assert time.monotonic() < deadline, client.messages
        await asyncio.sleep(0.05)
    msg = next(m for m in client.messages if "must be a list of strings" in m.message)
    assert msg.type == types.MessageType.Error and "pyproject.toml" in msg.message


def test_a_saved_file_swaps_its_own_exports_in_the_index(tmp_path):
    """On save the server replaces the file's exports in the index (a renamed helper's old
    name is gone) instead of rebuilding the index of the whole workspace."""
    from torchlint.engine import LintOptions, lint_text, run
    from torchlint.project import Workspace
    from torchlint.selection import enabled_codes, preview_codes

    (tmp_path / "helpers.py").write_text(HELPERS)
    (tmp_path / "main.py").write_text(MAIN)
    files = [str(tmp_path / "helpers.py"), str(tmp_path / "main.py")]
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))
    workspace = Workspace(files)
    results = run(files, opts, workspace=workspace)
    project = workspace.index
    assert "helpers.accuracy" in project.summaries
    assert "helpers.accuracy" in project.called  # main.py calls it
    renamed = HELPERS.replace("def accuracy(", "def top1_accuracy(")
    new = lint_text(files[0], renamed, opts, project)
    workspace.replace(results[0], new, [new, results[1]])
    assert "helpers.accuracy" not in project.summaries
    assert "helpers.top1_accuracy" in project.summaries
    assert "helpers.accuracy" in project.called  # main.py (not saved again) still calls the old name


@pytest.mark.asyncio(loop_scope="module")
async def test_a_too_deep_document_is_a_diagnostic_and_the_server_stays_up(client: LanguageClient, workspace):
    # 1,300 nested brackets crashed the native parser (a segfault took the server down)
    deep_text = TRAIN + "x = " + "(" * 1300 + "1" + ")" * 1300 + "\n"
    deep = Doc(client, workspace / "deep.py", deep_text)
    deep.open()
    diags = await _wait(client, deep.uri, lambda d: len(d) > 0)
    assert _codes(diags) == ["TL003"]
    assert diags[0].range.start.line == TRAIN.count("\n")
    assert "nest too deeply" in diags[0].message
    deep.replace(TRAIN + "x = a" + ".b" * 20000 + "\n")
    diags = await _wait(client, deep.uri, lambda d: len(d) > 0 and deep.text.endswith(".b\n"))
    assert _codes(diags) == ["TL003"]
    # the server still answers: the same document, made ordinary, gets its real findings
    deep.replace(TRAIN)
    await _wait(client, deep.uri, lambda d: "TL103" in _codes(d))



@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's memory from /proc")
def test_memory_stays_flat_over_hundreds_of_edits():
    """pygls kept every notification's future (and the text of every change): ~2.3 KB per
    didChange, for ever. benchmarks/lsp_memory.py runs 10,000 edits."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from lsp_memory import session

    out = asyncio.run(session(edits=600, lines=60, wait_every=60, debounce_ms=300, report=lambda *a: None))
    assert out["per_edit_bytes"] < 800, out["samples"]


NB_SETUP = """import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 2))
loader = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(3)]"""
NB_EVAL = """%matplotlib inline
def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
    return correct"""


@pytest.mark.asyncio(loop_scope="module")
async def test_notebook_cells_are_one_program_with_diagnostics_per_cell(client: LanguageClient, workspace):
    """LSP 3.17 notebook documents: the code cells are linted as one program, as the CLI
    lints an .ipynb (IPython's magics neutralised, markdown skipped), and each cell gets its
    own diagnostics, in its own lines; quick fixes edit the cell; closing clears them."""
    nb_uri = (workspace / "analysis.ipynb").as_uri()
    cells = [f"vscode-notebook-cell:{nb_uri[len('file:'):]}#W{i}sZmlsZQ%3D%3D" for i in range(3)]
    kinds = [types.NotebookCellKind.Code, types.NotebookCellKind.Markup, types.NotebookCellKind.Code]
    texts = [NB_SETUP, "## Evaluation", NB_EVAL]
    client.notebook_document_did_open(types.DidOpenNotebookDocumentParams(
        types.NotebookDocument(uri=nb_uri, notebook_type="jupyter-notebook", version=1,
                               cells=[types.NotebookCell(kind=k, document=u) for k, u in zip(kinds, cells)]),
        [types.TextDocumentItem(uri=u, language_id="python" if k == types.NotebookCellKind.Code else "markdown",
                                version=1, text=t) for u, k, t in zip(cells, kinds, texts)]))
    diags = await _wait(client, cells[2], lambda d: "TL203" in _codes(d))
    ev = next(x for x in diags if x.code == "TL203")
    assert ev.range.start.line == _line_of(NB_EVAL, "for x, y in loader:")  # a line of the cell
    assert ev.range.start.character == 4
    assert len(client.diagnostics[cells[0]]) == 0  # the setup cell: published, clean
    assert cells[1] not in client.diagnostics  # markdown is not linted
    # the quick fix edits the cell's text
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        types.TextDocumentIdentifier(cells[2]), ev.range, types.CodeActionContext(diagnostics=[ev])))
    fix = next(a for a in actions if "no_grad" in a.title)
    assert all(a.kind != "source.fixAll.torchlint" for a in actions)  # only asked for, never by default
    fixed = _apply(NB_EVAL, fix.edit.changes[cells[2]])
    assert "    with torch.no_grad():\n        for x, y in loader:\n" in fixed
    client.notebook_document_did_change(types.DidChangeNotebookDocumentParams(
        types.VersionedNotebookDocumentIdentifier(version=2, uri=nb_uri),
        types.NotebookDocumentChangeEvent(cells=types.NotebookDocumentCellChanges(text_content=[
            types.NotebookDocumentCellContentChanges(
                types.VersionedTextDocumentIdentifier(uri=cells[2], version=2),
                [types.TextDocumentContentChangeWholeDocument(text=fixed)])]))))
    await _wait(client, cells[2], lambda d: "TL203" not in _codes(d))
    # the evaluation cell as it was: its diagnostic is back
    client.notebook_document_did_change(types.DidChangeNotebookDocumentParams(
        types.VersionedNotebookDocumentIdentifier(version=3, uri=nb_uri),
        types.NotebookDocumentChangeEvent(cells=types.NotebookDocumentCellChanges(text_content=[
            types.NotebookDocumentCellContentChanges(
                types.VersionedTextDocumentIdentifier(uri=cells[2], version=3),
                [types.TextDocumentContentChangeWholeDocument(text=NB_EVAL)])]))))
    await _wait(client, cells[2], lambda d: "TL203" in _codes(d))
    client.notebook_document_did_close(types.DidCloseNotebookDocumentParams(
        types.NotebookDocumentIdentifier(nb_uri), [types.TextDocumentIdentifier(u) for u in cells]))
    await _wait(client, cells[2], lambda d: len(d) == 0)


EPOCH_LOOP = '''\
"""Fine-tune a classifier, validating inline after every epoch."""
import torch
import torch.nn as nn


def fit(model, train_loader, val_loader, epochs=3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        correct = seen = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(dim=1) == y).sum().item()
                seen += y.numel()
        print(f"epoch {epoch}: val acc {correct / seen:.3f}")
'''


@pytest.mark.asyncio(loop_scope="module")
async def test_eval_mode_quick_fix_lands_inside_the_epoch_loop_and_clears_the_diagnostic(client, workspace):
    """Issue 24, item 3: the TL201 fix once put `model.eval()` above the epoch loop, where the
    loop's `model.train()` undid it, and the diagnostic stayed after applying it. Also item 8:
    a document whose path needs percent-encoding gets its diagnostics under its URI."""
    from torchlint.lsp import uri_to_path

    path = workspace / "my project #2" / "val loop.py"
    path.write_text(EPOCH_LOOP)
    doc = Doc(client, path, EPOCH_LOOP)
    assert "%20" in doc.uri and "%232" in doc.uri and uri_to_path(doc.uri) == str(path)
    doc.open()
    line = _line_of(EPOCH_LOOP, "correct += (model(x)")
    diags = await _wait(client, doc.uri, lambda d: "TL201" in _codes(d))
    d201 = next(x for x in diags if x.code == "TL201")
    assert d201.range.start.line == line
    for rel in d201.related_information or []:
        assert " " not in rel.location.uri and "#" not in rel.location.uri
        assert os.path.isfile(uri_to_path(rel.location.uri))
    actions = await doc.actions(d201.range, [d201])
    fix = next(a for a in actions if "eval()" in a.title)
    assert fix.title.endswith("(unsafe)") and fix.kind == types.CodeActionKind.QuickFix
    new = _apply(doc.text, fix.edit.changes[doc.uri])
    lines = new.splitlines()
    # inside the epoch loop, after its model.train() and before the validation loop
    at = lines.index(next(ln for ln in lines if ln.strip() == "model.eval()"))
    assert lines.index("        model.train()") < at < _line_of(new, "for x, y in val_loader")
    assert lines[at].startswith("        ") and new.count("model.eval()") == 1
    doc.replace(new)
    await _wait(client, doc.uri, lambda d: "TL201" not in _codes(d))

"""The torchlint language server (`torchlint lsp`, stdio; needs the `lsp` extra: `pip install '.[lsp]'` in a checkout).

- Diagnostics on open, on change (debounced, from the editor's in-memory text) and on save;
  cleared on close.  Ranges are 0-based, columns in the negotiated position encoding (UTF-16
  code units unless the client asked for another one).
- Code actions: a finding's fix (unsafe ones labelled "(unsafe)"), "Disable TLxxx for this
  line" (adds ``# noqa: TLxxx``) and ``source.fixAll.torchlint`` (every safe fix).
- Hover on a diagnostic, or on a code in a ``# noqa`` comment, shows the rule's documentation.
- Notebook documents (LSP 3.17 ``notebookDocument/*``): the code cells are linted as one
  program, as ``torchlint check`` lints an ``.ipynb`` (``torchlint/notebook.py``), and each
  cell gets its own diagnostics, quick fixes and hover.
- The configuration is the document's project's (``pyproject.toml`` / ``torchlint.toml`` found
  from the document's folder), reloaded when that file changes.
- Cross-module summaries come from one background lint of the workspace's files at startup,
  refreshed for a file when it is saved.

The server never executes user code: there is no dynamic mode here.
"""
from __future__ import annotations

import asyncio
import bisect
import gc
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from . import __version__
from .config import ConfigError, find_config_file, load_config
from .docs import rule_markdown
from .cache import Cache
from .engine import DocumentMemo, LintOptions, lint_text, run, select_result
from .gcpolicy import WORKER_THRESHOLD
from .findings import UNSAFE, Finding
from .fixer import fix_text, fixable_codes, noqa_line, noqa_line_facts
from .fixes import split_lines
from .output import file_uri, lsp_diagnostic
from .parse import piece_starts
from .project import ProjectIndex, Workspace
from .rule import all_rules
from .selection import enabled_codes
from .suppress import _CODE, _NOQA

log = logging.getLogger("torchlint.lsp")

DEBOUNCE_S = float(os.environ.get("TORCHLINT_LSP_DEBOUNCE_MS", "300")) / 1000.0
FIX_ALL_KIND = "source.fixAll.torchlint"
MAX_WORKSPACE_FILES = 5000
CONFIG_NAMES = ("pyproject.toml", "torchlint.toml", ".torchlint.toml")


# ------------------------------------------------------------------ positions
def _units(text: str, encoding) -> int:
    if encoding == types.PositionEncodingKind.Utf8:
        return len(text.encode("utf-8", "surrogatepass"))
    if encoding == types.PositionEncodingKind.Utf32:
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _to_units(line_text: str, col: int, encoding) -> int:
    """A code-point column on ``line_text`` -> the client's column."""
    return _units(line_text[:col], encoding)


def _from_units(line_text: str, units: int, encoding) -> int:
    """The client's column on ``line_text`` -> a code-point column."""
    n = 0
    for i, ch in enumerate(line_text):
        if n >= units:
            return i
        n += _units(ch, encoding)
    return len(line_text)


def _lines(text: str) -> list:
    return [ln.rstrip("\r\n") for ln in split_lines(text)]


def uri_to_path(uri: str) -> Optional[str]:
    p = urlparse(uri)
    if p.scheme != "file":
        return None
    path = unquote(p.path, errors="surrogateescape")  # os.fsdecode's way with undecodable bytes
    if os.name == "nt" and path.startswith("/") and len(path) > 2 and path[2] == ":":  # pragma: no cover
        path = path[1:]
    return path


# ------------------------------------------------------------------ state
@dataclass
class DocState:
    version: Optional[int] = None
    text: str = ""
    findings: list = field(default_factory=list)
    pending: Optional[asyncio.TimerHandle] = None
    task: Optional[asyncio.Task] = None
    # what the last lint of the document left for the next (parsed pieces, positions): an
    # edit re-parses only the top-level statements it touched (``engine.DocumentMemo``)
    memo: DocumentMemo = field(default_factory=DocumentMemo)
    noqa_facts: Optional[tuple] = None  # (text, its pieces, their noqa facts): see ``_noqa_facts``


@dataclass
class NotebookState:
    """An open notebook: the lint of its code cells as one program, per cell."""
    version: Optional[int] = None
    texts: dict = field(default_factory=dict)  # cell uri -> the text this lint saw
    findings: dict = field(default_factory=dict)  # cell uri -> findings, in cell positions
    task: Optional[asyncio.Task] = None
    # the program of its code cells is linted with a memo too: a cell edit re-parses only the
    # top-level statements of the program it touched
    memo: DocumentMemo = field(default_factory=DocumentMemo)


@dataclass
class _Settings:
    opts: LintOptions
    allowed: Optional[frozenset]
    stamp: tuple


class TorchlintServer(LanguageServer):
    def __init__(self):
        super().__init__("torchlint", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         notebook_document_sync=types.NotebookDocumentSyncOptions(notebook_selector=[
                             types.NotebookDocumentFilterWithNotebook(
                                 notebook="jupyter-notebook", cells=[types.NotebookCellLanguage("python")])]))
        self.docs: dict = {}
        self.notebooks: dict = {}  # notebook uri -> NotebookState
        self.project: Optional[ProjectIndex] = None
        self.project_workspace: Optional[Workspace] = None  # owns ``project``
        self.project_results: dict = {}  # path -> FileResult of the background workspace lint
        self.project_ready = threading.Event()
        self._settings: dict = {}  # config path (or "") -> _Settings
        self._lock = threading.Lock()

    # -------------------------------------------------------------- configuration
    def settings_for(self, path: Optional[str]) -> _Settings:
        start = os.path.dirname(path) if path else (self._root() or os.getcwd())
        cfg_path = find_config_file(start) if os.path.isdir(start) else None
        stamp: tuple = ("",)
        if cfg_path:
            try:
                st = os.stat(cfg_path)
                stamp = (cfg_path, st.st_mtime_ns, st.st_size)
            except OSError:
                stamp = (cfg_path,)
        key = cfg_path or ""
        cached = self._settings.get(key)
        if cached is not None and cached.stamp == stamp:
            return cached
        try:
            cfg = load_config(cfg_path, start=start)
            enabled = frozenset(enabled_codes(cfg.select, cfg.ignore, cfg.extend_select))
        except ConfigError as exc:
            self.notify_error(f"torchlint: {exc}")
            from .config import Config

            cfg = Config(root=start)
            enabled = frozenset(enabled_codes(cfg.select, cfg.ignore, cfg.extend_select))
        opts = LintOptions(enabled, cfg.rule_settings(), cfg.per_file_ignores, cfg.root)
        s = _Settings(opts, fixable_codes(cfg), stamp)
        self._settings[key] = s
        return s

    def notify_error(self, message: str) -> None:
        """Show an error in the editor (safe to call from a worker thread)."""
        params = types.ShowMessageParams(types.MessageType.Error, message)
        loop = getattr(self, "main_loop", None)
        if loop is not None and threading.current_thread() is not threading.main_thread():
            loop.call_soon_threadsafe(self.window_show_message, params)
        else:
            self.window_show_message(params)

    def _root(self) -> Optional[str]:
        try:
            root = self.workspace.root_path
        except Exception:
            return None
        return root if root and os.path.isdir(root) else None

    # -------------------------------------------------------------- linting
    def lint(self, uri: str, text: str) -> list:
        """The findings of the document's text (an unsaved buffer: no exports are computed;
        the parse reuses what the document's last lint parsed of the same text)."""
        state = self.docs.get(uri)
        return self.lint_result(uri, text, state.memo if state is not None else None, exports=False).findings

    def lint_result(self, uri: str, text: str, memo: Optional[DocumentMemo] = None, exports: bool = True):
        path = uri_to_path(uri)
        settings = self.settings_for(path)
        shown = None if path else uri  # a file: its paths are rendered in the lint
        lint_path = path or os.path.join(self._root() or os.getcwd(), "untitled.py")
        return lint_text(lint_path, text, settings.opts, self.project, shown=shown, memo=memo, exports=exports)

    def diagnostics(self, findings, text: str, lines: Optional[list] = None, cells: Optional[list] = None) -> list:
        """``findings`` of ``text`` as LSP diagnostics; for a notebook cell, ``findings`` are in
        the cell's positions (``cell`` unset) and ``cells`` are the notebook's cell uris."""
        if lines is None:
            lines = _lines(text)
        enc = self.workspace.position_encoding
        out = []
        for f in findings:
            d = lsp_diagnostic(f, lines)
            r = d["range"]
            if enc not in (None, types.PositionEncodingKind.Utf16):
                r["start"]["character"] = self._col(lines, f.line, f.column)
                r["end"]["character"] = self._col(lines, f.span.end.line, f.span.end.column)
            diag = types.Diagnostic(
                range=types.Range(types.Position(max(r["start"]["line"], 0), r["start"]["character"]),
                                  types.Position(max(r["end"]["line"], 0), r["end"]["character"])),
                message=d["message"],
                severity=types.DiagnosticSeverity(d["severity"]),
                code=d["code"],
                code_description=types.CodeDescription(href=d["codeDescription"]["href"])
                if d["codeDescription"]["href"] else None,
                source="torchlint",
                data={"fix": d["data"]["fix"] is not None, "name": f.name},
                related_information=self._related(f, cells),
            )
            out.append(diag)
        return out

    def _related(self, f: Finding, cells: Optional[list] = None):
        out = []
        for r in f.related:
            if r.cell is not None and cells is not None and 0 < r.cell <= len(cells):
                uri = cells[r.cell - 1]  # a cell of the same notebook
            else:
                uri = file_uri(r.path if os.path.isabs(r.path) else os.path.abspath(r.path))
            line = max(r.line - 1, 0)
            out.append(types.DiagnosticRelatedInformation(
                types.Location(uri, types.Range(types.Position(line, 0), types.Position(line, 0))), r.message))
        return out or None

    def _col(self, lines, line: int, col: int) -> int:
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return _to_units(text, col, self.workspace.position_encoding)

    def position(self, lines, line: int, col: int) -> types.Position:
        """A 1-based line / code-point column -> an LSP position."""
        if line - 1 >= len(lines):
            return types.Position(len(lines), 0)
        return types.Position(line - 1, self._col(lines, line, col))

    def text_edit(self, lines, e) -> types.TextEdit:
        return types.TextEdit(types.Range(self.position(lines, e.start.line, e.start.column),
                                          self.position(lines, e.end.line, e.end.column)), e.content)

    async def relint(self, uri: str, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        doc = self.workspace.get_text_document(uri)
        text, version = doc.source, doc.version
        state = self.docs.get(uri)
        if state is None:
            return
        loop = asyncio.get_running_loop()
        try:
            findings = await loop.run_in_executor(None, self._lint_locked, uri, text)
        except Exception as exc:  # never crash the server over one document: the failure is a diagnostic
            log.exception("lint failed")
            self.window_log_message(types.LogMessageParams(types.MessageType.Error, f"torchlint: {exc}"))
            findings = [crash_finding(uri_to_path(uri) or uri, exc)]
        if self.docs.get(uri) is not state:
            return  # closed meanwhile
        if self.workspace.get_text_document(uri).source != text:
            return  # an edit arrived meanwhile; its own (debounced) lint will publish
        self.publish(uri, state, text, version, findings)

    def publish(self, uri: str, state, text: str, version, findings) -> None:
        """The document's diagnostics are those of this lint of ``text``."""
        state.text, state.version, state.findings = text, version, findings
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=uri, diagnostics=self.diagnostics(findings, text), version=version))

    def _lint_locked(self, uri, text):
        with self._lock:
            return self.lint(uri, text)

    def schedule(self, uri: str, delay: float) -> None:
        state = self.docs.get(uri)
        if state is None:
            return
        if state.task is not None and not state.task.done():
            state.task.cancel()
        state.task = asyncio.ensure_future(self.relint(uri, delay))

    def current(self, uri: str) -> tuple:
        """(text, findings) for the document as the editor has it now (for a notebook cell:
        the cell's text and the findings in it of the notebook's lint)."""
        nb = self.workspace.get_notebook_document(cell_uri=uri)
        if nb is not None and nb.uri in self.notebooks:
            doc = self.workspace.get_text_document(uri)
            state = self.notebooks[nb.uri]
            if state.texts.get(uri) != doc.source:
                with self._lock:
                    cells, texts, by_cell = self.lint_notebook(nb.uri)
                state.texts, state.findings = dict(zip(cells, texts)), by_cell
            return doc.source, state.findings.get(uri, [])
        doc = self.workspace.get_text_document(uri)
        state = self.docs.get(uri)
        if state is not None and state.text == doc.source and state.version is not None:
            return state.text, state.findings
        with self._lock:
            findings = self.lint(uri, doc.source)
        return doc.source, findings

    # -------------------------------------------------------------- notebooks
    def lint_notebook(self, nb_uri: str) -> tuple:
        """(cell uris, their texts, {cell uri: findings in cell positions}) of the notebook's
        Python code cells linted as one program, as ``torchlint check`` lints an ``.ipynb``."""
        from dataclasses import replace

        from . import notebook
        from .findings import path_token

        nb = self.workspace.get_notebook_document(notebook_uri=nb_uri)
        cells, texts = [], []
        for cell in nb.cells if nb is not None else ():
            if cell.kind != types.NotebookCellKind.Code:
                continue
            doc = self.workspace.get_text_document(cell.document)
            if (doc.language_id or "python") != "python":
                continue
            cells.append(cell.document)
            texts.append(doc.source)
        path = uri_to_path(nb_uri)
        if path is None or not path.endswith(".ipynb"):
            path = os.path.join(self._root() or os.getcwd(), "untitled.ipynb")
        settings = self.settings_for(path)
        doc = {"cells": [{"cell_type": "code", "source": t} for t in texts]}
        program = notebook.build(path, doc, list(range(len(texts))), texts)
        state = self.notebooks.get(nb_uri)
        res = select_result(notebook.lint_cells(program, settings.opts, self.project, path_token(path),
                                                memo=state.memo if state is not None else None, exports=False),
                            settings.opts)
        by_cell: dict = {}
        for f in res.findings:
            if f.cell is not None and 0 < f.cell <= len(cells):
                by_cell.setdefault(cells[f.cell - 1], []).append(replace(f, cell=None))
        return cells, texts, by_cell

    async def relint_notebook(self, nb_uri: str, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        state = self.notebooks.get(nb_uri)
        nb = self.workspace.get_notebook_document(notebook_uri=nb_uri)
        if state is None or nb is None:
            return
        version = nb.version
        loop = asyncio.get_running_loop()
        try:
            cells, texts, by_cell = await loop.run_in_executor(None, self._lint_notebook_locked, nb_uri)
        except Exception as exc:  # one notebook must not take the server down
            log.exception("notebook lint failed")
            self.window_log_message(types.LogMessageParams(types.MessageType.Error, f"torchlint: {exc}"))
            return
        if self.notebooks.get(nb_uri) is not state:
            return  # closed meanwhile
        nb = self.workspace.get_notebook_document(notebook_uri=nb_uri)
        if nb is None or nb.version != version:
            return  # changed meanwhile: that change's lint publishes
        self.publish_notebook(state, cells, texts, by_cell)

    def _lint_notebook_locked(self, nb_uri: str) -> tuple:
        with self._lock:
            return self.lint_notebook(nb_uri)

    def publish_notebook(self, state: NotebookState, cells: list, texts: list, by_cell: dict) -> None:
        gone = [u for u in state.texts if u not in by_cell]  # cells whose diagnostics are cleared
        state.texts, state.findings = dict(zip(cells, texts)), by_cell
        for uri, text in zip(cells, texts):
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
                uri=uri, diagnostics=self.diagnostics(by_cell.get(uri, []), text, cells=cells)))
        for uri in gone:
            if uri not in state.texts:  # a cell deleted, or no longer Python
                self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    def schedule_notebook(self, nb_uri: str, delay: float) -> None:
        state = self.notebooks.get(nb_uri)
        if state is None:
            return
        if state.task is not None and not state.task.done():
            state.task.cancel()
        state.task = asyncio.ensure_future(self.relint_notebook(nb_uri, delay))

    # -------------------------------------------------------------- workspace index
    def index_workspace(self) -> None:
        root = self._root()
        try:
            if root is None:
                return
            from .discover import discover

            settings = self.settings_for(os.path.join(root, "__init__.py"))
            cfg = load_config(None, start=root)
            d = discover([root], exclude=list(cfg.exclude) + list(cfg.extend_exclude),
                         respect_gitignore=cfg.respect_gitignore, follow_symlinks=False)
            files = [f for f in d.files if f.endswith((".py", ".pyi"))][:MAX_WORKSPACE_FILES]
            # the CLI's cache: a workspace `torchlint check` has seen is indexed without parsing
            cache = Cache(cfg.cache_dir or os.path.join(cfg.root, ".torchlint_cache"))
            workspace = Workspace(files)
            results = run(files, settings.opts, jobs=1, cache=cache, workspace=workspace)
            with self._lock:
                self.project_results = dict(zip(files, results))
                self.project_workspace = workspace
                self.project = workspace.index
        except Exception:
            log.exception("indexing the workspace failed")
        finally:
            self.project_ready.set()

    def _merged(self) -> ProjectIndex:
        """The index of the workspace's files as they are now (a file joined it)."""
        files = list(self.project_results)
        self.project_workspace = Workspace(files)
        self.project_workspace.merge([self.project_results[f] for f in files])
        return self.project_workspace.index

    def refresh_saved(self, uri: str):
        """After a save: the file's summaries in the index are the saved text's. Returns
        (text, findings) of that lint (against the index as it was: what a lint of the
        document would say now), or None."""
        path = uri_to_path(uri)
        if path is None or self.project is None or not path.endswith((".py", ".pyi")):
            return None
        try:
            text = self.workspace.get_text_document(uri).source
            state = self.docs.get(uri)
            with self._lock:
                res = self.lint_result(uri, text, state.memo if state is not None else None)
                res.answers = self.project.answers(res.queries)
                old = self.project_results.get(path)
                self.project_results[path] = res
                if old is not None:  # a file of the index: swap its exports
                    self.project_workspace.replace(old, res, self.project_results.values())
                else:  # a new file of the workspace: its module joins the table
                    self.project = self._merged()
                self._settle({res.module} if res.module else set())
                if self.project_results[path] is not res:  # what it asked changed meanwhile
                    res = self.lint_result(uri, text, state.memo if state is not None else None, exports=False)
            return text, res.findings
        except Exception:
            log.exception("refreshing the index failed")
            return None


    def _settle(self, changed: set) -> None:
        """After a save swapped a file's exports (of the modules ``changed``): the files of
        the index whose questions now get other answers (a helper's summary, the call sites of
        a function) are linted again and their exports swapped, round after round as
        ``engine.run`` does, so the index stays what a fresh lint of the saved files builds."""
        from .engine import lint_path
        from .project import may_depend

        for _ in range(3):
            memo: dict = {}
            stale = [p for p, r in self.project_results.items()
                     if r.queries and may_depend(r.queries, changed) and self.project.answers(r.queries, memo) != r.answers]
            if not stale:
                return
            changed = set()
            for p in stale:
                # (the saved text: an open document's unsaved edits are not the workspace's)
                new = lint_path(p, self.settings_for(p).opts, self.project, raw=True)
                new.answers = self.project.answers(new.queries)
                old = self.project_results[p]
                self.project_results[p] = new
                self.project_workspace.replace(old, new, self.project_results.values())
                if new.module:
                    changed.add(new.module)


def crash_finding(shown: str, exc: BaseException) -> Finding:
    """What the editor shows for a document whose lint raised: a TL000 on its first line."""
    from .findings import Span
    from .rule import InternalErrorRule

    return Finding("TL000", InternalErrorRule.name, f"internal error: {type(exc).__name__}: {exc}", shown,
                   Span.of(1, 0, 1, 0))


server = TorchlintServer()


# ------------------------------------------------------------------ lifecycle
@server.feature(types.INITIALIZED)
async def initialized(ls: TorchlintServer, params: types.InitializedParams):
    ls.main_loop = asyncio.get_running_loop()
    caps = ls.client_capabilities
    dyn = caps.workspace and caps.workspace.did_change_watched_files and \
        caps.workspace.did_change_watched_files.dynamic_registration
    if dyn:
        watchers = [types.FileSystemWatcher(glob_pattern=f"**/{n}") for n in CONFIG_NAMES]

        async def register():
            try:
                await ls.client_register_capability_async(types.RegistrationParams([types.Registration(
                    "torchlint-config-watch", types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                    types.DidChangeWatchedFilesRegistrationOptions(watchers))]))
            except Exception as exc:  # a client that refuses: config files are still re-checked by mtime
                log.info("could not register the config file watcher: %s", exc)

        ls.watch_task = asyncio.ensure_future(register())
    if os.environ.get("TORCHLINT_LSP_NO_INDEX"):
        ls.project_ready.set()
        return
    threading.Thread(target=_index_then_refresh, args=(ls,), daemon=True, name="torchlint-index").start()


def _index_then_refresh(ls: TorchlintServer) -> None:
    import time

    t0 = time.perf_counter()
    ls.index_workspace()
    # the index lives as long as the server: out of the collector's sight (a full collection
    # would walk all of it again after a few saves: 0.2-0.3 s each on the torch tree)
    gc.collect()
    gc.freeze()
    loop = getattr(ls, "main_loop", None)
    if loop is None:
        return
    msg = types.LogMessageParams(types.MessageType.Info, f"torchlint: indexed {len(ls.project_results)} files "
                                 f"of the workspace in {time.perf_counter() - t0:.2f} s")
    try:
        loop.call_soon_threadsafe(ls.window_log_message, msg)
    except RuntimeError:  # loop closed
        return
    for uri in list(ls.docs):
        try:
            loop.call_soon_threadsafe(ls.schedule, uri, 0.0)
        except RuntimeError:  # loop closed
            return
    for uri in list(ls.notebooks):
        try:
            loop.call_soon_threadsafe(ls.schedule_notebook, uri, 0.0)
        except RuntimeError:  # loop closed
            return


def _forget_finished(ls: TorchlintServer) -> None:
    """pygls (2.0) files the future of every notification it handles (its own text
    synchronisation and our handler, each with its params: the text of every change) in its
    table of requests and never takes it out: about 2 KB per ``didChange`` for the server's
    lifetime. The finished ones are dropped here, on every notification about a document (a
    request's future is dropped by pygls itself when it answers, so dropping it first is
    harmless)."""
    futures = getattr(getattr(ls, "protocol", None), "_request_futures", None)
    if isinstance(futures, dict):
        for key in [k for k, f in futures.items() if f.done()]:
            del futures[key]


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: TorchlintServer, params: types.DidOpenTextDocumentParams):
    _forget_finished(ls)
    uri = params.text_document.uri
    ls.docs[uri] = DocState()
    ls.schedule(uri, 0.0)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: TorchlintServer, params: types.DidChangeTextDocumentParams):
    _forget_finished(ls)
    uri = params.text_document.uri
    if uri not in ls.docs:
        ls.docs[uri] = DocState()
    ls.schedule(uri, DEBOUNCE_S)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
async def did_save(ls: TorchlintServer, params: types.DidSaveTextDocumentParams):
    _forget_finished(ls)
    uri = params.text_document.uri
    state = ls.docs.get(uri)
    if state is None:
        return
    if state.task is not None and not state.task.done():
        state.task.cancel()  # the edit's debounced lint: the save's lint below replaces it
    loop = asyncio.get_running_loop()
    done = await loop.run_in_executor(None, ls.refresh_saved, uri)
    state = ls.docs.get(uri)
    doc = ls.workspace.get_text_document(uri)
    if done is not None and state is not None and doc.source == done[0]:
        # the index's lint of the saved text is the document's lint: publish it, once
        if state.task is not None and not state.task.done():
            state.task.cancel()
        ls.publish(uri, state, done[0], doc.version, done[1])
    else:
        ls.schedule(uri, 0.0)
    # its summaries may change what the other open documents' rules conclude
    for other in list(ls.docs):
        if other != uri:
            ls.schedule(other, 0.0)
    for nb in list(ls.notebooks):
        ls.schedule_notebook(nb, 0.0)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
async def did_close(ls: TorchlintServer, params: types.DidCloseTextDocumentParams):
    _forget_finished(ls)
    uri = params.text_document.uri
    state = ls.docs.pop(uri, None)
    if state is not None and state.task is not None and not state.task.done():
        state.task.cancel()
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
async def notebook_did_open(ls: TorchlintServer, params: types.DidOpenNotebookDocumentParams):
    _forget_finished(ls)
    ls.notebooks[params.notebook_document.uri] = NotebookState()
    ls.schedule_notebook(params.notebook_document.uri, 0.0)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
async def notebook_did_change(ls: TorchlintServer, params: types.DidChangeNotebookDocumentParams):
    _forget_finished(ls)
    uri = params.notebook_document.uri
    if uri not in ls.notebooks:
        ls.notebooks[uri] = NotebookState()
    ls.schedule_notebook(uri, DEBOUNCE_S)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
async def notebook_did_save(ls: TorchlintServer, params: types.DidSaveNotebookDocumentParams):
    _forget_finished(ls)
    ls.schedule_notebook(params.notebook_document.uri, 0.0)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
async def notebook_did_close(ls: TorchlintServer, params: types.DidCloseNotebookDocumentParams):
    _forget_finished(ls)
    state = ls.notebooks.pop(params.notebook_document.uri, None)
    if state is not None and state.task is not None and not state.task.done():
        state.task.cancel()
    cells = {c.uri for c in params.cell_text_documents} | set(state.texts if state is not None else ())
    for uri in sorted(cells):
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
async def did_change_watched(ls: TorchlintServer, params: types.DidChangeWatchedFilesParams):
    if any(os.path.basename(uri_to_path(c.uri) or "") in CONFIG_NAMES for c in params.changes):
        ls._settings.clear()
        for uri in list(ls.docs):
            ls.schedule(uri, 0.0)
        for uri in list(ls.notebooks):
            ls.schedule_notebook(uri, 0.0)


# ------------------------------------------------------------------ code actions
def _overlaps(f: Finding, rng: types.Range) -> bool:
    fs, fe = f.line - 1, f.span.end.line - 1
    return not (fe < rng.start.line or fs > rng.end.line)


def _diag_for(ls, f: Finding, lines, context_diags) -> list:
    start = ls.position(lines, f.line, f.column)
    for d in context_diags or ():
        if d.source == "torchlint" and d.code == f.code and d.range.start.line == start.line:
            return [d]
    return ls.diagnostics([f], "", lines)


def _noqa_facts(ls, uri: str, text: str, line: int) -> tuple:
    """``fixer.noqa_line_facts`` for ``line`` of the document's text: of the run of top-level
    statements around it only (where the parse's pieces begin: ``parse.piece_starts``; tokenizing a
    whole 2,000-line file takes longer than the answer may), the whole text's if that run
    does not tokenize on its own; remembered for the document's text."""
    state = ls.docs.get(uri)
    memo = state.noqa_facts if state is not None and state.noqa_facts is not None \
        and state.noqa_facts[0] == text else (text, None, {})
    if memo[1] is None:
        cuts = piece_starts(text)
        starts, ln, pos = [], 1, 0
        for c in cuts:
            ln += text.count("\n", pos, c)
            pos = c
            starts.append(ln)
        memo = (text, (cuts + [len(text)], starts), {})
        if state is not None:
            state.noqa_facts = memo
    (offsets, starts), done = memo[1], memo[2]
    k = max(bisect.bisect_right(starts, line) - 1, 0)
    facts = done.get(k)
    if facts is None:
        ends, comments = noqa_line_facts(text[offsets[k]:offsets[k + 1]])
        if ends is None:
            facts = noqa_line_facts(text)
        else:
            shift = starts[k] - 1
            facts = ({e + shift for e in ends}, {n + shift: c for n, c in comments.items()})
        done[k] = facts
    return facts


def _full_range(lines) -> types.Range:
    return types.Range(types.Position(0, 0), types.Position(len(lines), 0))


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND],
                            resolve_provider=False),
)
def code_action(ls: TorchlintServer, params: types.CodeActionParams):
    uri = params.text_document.uri
    text, findings = ls.current(uri)
    lines = _lines(text)
    only = params.context.only
    want_quick = only is None or any(types.CodeActionKind.QuickFix.value.startswith(k) for k in only)
    # the whole file's fixes re-lint the file (once per pass): computed only when the editor
    # asks for source actions (``source``, ``source.fixAll``...), not for every cursor move
    want_all = only is not None and any(FIX_ALL_KIND.startswith(k) for k in only)
    actions = []
    if want_quick:  # the findings of the requested range only
        noqa_seen = set()
        raw_lines = None
        for f in findings:
            if not _overlaps(f, params.range) or f.code in ("TL000", "TL001"):
                continue
            diags = _diag_for(ls, f, lines, params.context.diagnostics)
            if f.fix is not None and f.fix.edits:
                unsafe = f.fix.applicability == UNSAFE
                title = f"{f.fix.message} ({f.code})" + (" (unsafe)" if unsafe else "")
                actions.append(types.CodeAction(
                    title=title, kind=types.CodeActionKind.QuickFix, diagnostics=diags,
                    is_preferred=not unsafe,
                    edit=types.WorkspaceEdit(changes={uri: [ls.text_edit(lines, e) for e in f.fix.edits]})))
            if (f.line, f.code) in noqa_seen or not 0 < f.line <= len(lines):
                continue
            noqa_seen.add((f.line, f.code))
            if raw_lines is None:
                raw_lines = split_lines(text)
            new_line, n = noqa_line(raw_lines[f.line - 1], f.line, {f.code}, _noqa_facts(ls, uri, text, f.line))
            if n:
                old_line = lines[f.line - 1]
                rng = types.Range(types.Position(f.line - 1, 0),
                                  types.Position(f.line - 1, _to_units(old_line, len(old_line),
                                                                       ls.workspace.position_encoding)))
                actions.append(types.CodeAction(
                    title=f"Disable {f.code} for this line", kind=types.CodeActionKind.QuickFix,
                    diagnostics=diags,
                    edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(rng, new_line.rstrip("\r\n"))]})))
    if want_all and ls.workspace.get_notebook_document(cell_uri=uri) is None:
        path = uri_to_path(uri)
        settings = ls.settings_for(path)
        if any(f.fix is not None and f.fix.applicability != UNSAFE and f.code not in ("TL000", "TL001")
               and (settings.allowed is None or f.code in settings.allowed) for f in findings):
            with ls._lock:
                ff = fix_text(path or "untitled.py", text, settings.opts, unsafe=False, project=ls.project,
                              shown=None if path else uri, first=findings, allowed=settings.allowed)
            if ff.changed:
                actions.append(types.CodeAction(
                    title="torchlint: fix all safely fixable problems", kind=FIX_ALL_KIND,
                    edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(_full_range(lines), ff.fixed)]})))
    return actions


# ------------------------------------------------------------------ hover
@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: TorchlintServer, params: types.HoverParams):
    uri = params.text_document.uri
    text, findings = ls.current(uri)
    lines = _lines(text)
    ln = params.position.line
    if ln >= len(lines):
        return None
    line_text = lines[ln]
    col = _from_units(line_text, params.position.character, ls.workspace.position_encoding)
    rules = all_rules()
    # a code in a `# noqa` comment
    m = _NOQA.search(line_text)
    if m is not None and m.group("codes"):
        base = m.start("codes")
        for cm in _CODE.finditer(m.group("codes")):
            a, b = base + cm.start(), base + cm.end()
            code = cm.group(0).upper()
            if a <= col <= b and code in rules:
                return types.Hover(
                    contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=rule_markdown(rules[code])),
                    range=types.Range(ls.position(lines, ln + 1, a), ls.position(lines, ln + 1, b)))
    # a diagnostic under the cursor
    for f in findings:
        if f.code not in rules or not (f.line - 1 <= ln <= f.span.end.line - 1):
            continue
        if f.line == f.span.end.line and not (f.column <= col <= f.span.end.column):
            continue
        md = f"**{f.code}** {f.message}\n\n---\n\n" + rule_markdown(rules[f.code])
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=md),
                           range=types.Range(ls.position(lines, f.line, f.column),
                                             ls.position(lines, f.span.end.line, f.span.end.column)))
    return None


def serve() -> None:
    """Run the server on stdin/stdout until the client says exit."""
    logging.basicConfig(level=logging.WARNING)
    gc.set_threshold(*WORKER_THRESHOLD)  # as a CLI run: a parse allocates millions of nodes
    server.start_io()

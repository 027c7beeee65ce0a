"""The pipeline: discover -> parse once -> semantic model -> rules -> findings -> suppression.

``lint_text`` lints one module; ``run`` lints a tree: a first pass over every file (in a
process pool, from the cache where possible) yields findings and the function summaries
each module exports; files whose rules asked about functions of other modules are linted
again with the project's summaries until nothing changes (at most a few rounds).
"""
from __future__ import annotations

import hashlib
import json
import os
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from . import __version__
from .findings import Finding, Span, display_path, path_token, render_result  # noqa: F401 (display_path)
from .parse import parse_module
from .project import ProjectIndex, ProjectView, Workspace, may_depend, questions_of
from .rule import InternalErrorRule, NotAnalysedRule, SyntaxErrorRule, UnusedNoqaRule, all_rules
from .source import SourceError, read_source
from .suppress import Directive, is_suppressed, parse_noqa

if TYPE_CHECKING:
    from .cache import Store

# Prefilter: a file containing none of these cannot produce a finding or a useful summary.
_SUMMARY_TRIGGERS = (b".train(", b".eval(", b"zero_grad", b"backward", b".step(", b".to(",
                     b".cuda(", b"no_grad", b"inference_mode", b"nn.Module", b"Module)")


@dataclass
class FileResult:
    path: str
    findings: list = field(default_factory=list)
    summaries: dict = field(default_factory=dict)
    classes: dict = field(default_factory=dict)
    queries: list = field(default_factory=list)
    called: list = field(default_factory=list)  # [qualname, under_no_grad]
    reexports: dict = field(default_factory=dict)  # key.name -> qualified target
    stars: list = field(default_factory=list)  # keys of star-imported tree modules
    module: str = ""  # the module key the exports are under
    error: Optional[str] = None  # a message for stderr (unreadable, undecodable, ...)
    internal_error: bool = False
    answers: str = ""  # hash of the project answers the findings depended on
    parsed: bool = False
    # the file's ``# noqa`` directives (``noqa_record``), applied when the result is reported;
    # None where none apply (a file that did not parse, was not analysed or was prefiltered)
    noqa: Optional[dict] = None
    # a result of the last run's snapshot (``Cache.get``): consistent with the others of that run
    from_last_run: bool = False

    def to_json(self) -> dict:
        return {
            "path": self.path, "findings": [f.to_dict() for f in self.findings],
            "summaries": self.summaries, "classes": self.classes, "queries": self.query_texts(),
            "called": self.called, "error": self.error, "internal_error": self.internal_error,
            "answers": self.answers, "reexports": self.reexports, "stars": self.stars,
            "module": self.module, "parsed": self.parsed, "noqa": self.noqa,
        }

    def to_lite_json(self, queries: bool = True) -> dict:
        """``to_json`` without the exports (and without reading them); without the questions
        too unless ``queries``."""
        d = {"path": self.path, "findings": [f.to_dict() for f in self.findings],
             "error": self.error, "internal_error": self.internal_error, "answers": self.answers,
             "module": self.module, "parsed": self.parsed, "noqa": self.noqa}
        if queries:
            d["queries"] = self.query_texts()
        return d

    def query_texts(self) -> list:
        """The questions as stored (``str`` of each :class:`Question`)."""
        return [str(q) for q in self.queries]

    # What a file exports to the project. A result of the last run's snapshot reads them only
    # when something looks at them (``lazy``): a run where one file changed parses the exports
    # of the modules it asks about, not those of the whole tree. Its questions, most of the
    # snapshot's bytes, are read apart from them, when its answers have to be checked.
    EXPORTS = ("summaries", "classes", "called", "reexports", "stars")

    def exports(self) -> dict:
        return {k: getattr(self, k) for k in self.EXPORTS}

    @classmethod
    def lazy(cls, d: dict, source) -> "FileResult":
        """A result whose exports ``source.load()`` and questions ``source.load_queries()`` give
        on first access (``d``: ``to_lite_json(queries=False)``)."""
        r = cls.__new__(cls)
        findings = d["findings"]
        r.__dict__.update(
            path=d["path"], findings=[Finding.from_dict(x) for x in findings] if findings else [],
            error=d["error"], internal_error=d["internal_error"], answers=d.get("answers", ""),
            module=d.get("module", ""), parsed=bool(d.get("parsed", True)), noqa=d.get("noqa"),
            from_last_run=False, _lazy=source)
        return r

    def is_lazy(self) -> bool:
        """Its exports have not been read yet."""
        return "summaries" not in self.__dict__

    def __getattr__(self, name):  # only for attributes not set: what a lazy result has not read
        source = self.__dict__.get("_lazy")
        if source is None:
            raise AttributeError(name)
        if name == "queries":
            got = self.__dict__["queries"] = questions_of(source.load_queries())
            return got
        if name not in FileResult.EXPORTS:
            raise AttributeError(name)
        d = source.load()
        for k in FileResult.EXPORTS:
            self.__dict__[k] = d.get(k) or ([] if k in ("called", "stars") else {})
        return self.__dict__[name]

    def __getstate__(self):
        self.exports()  # read what is pending (exports, questions); the source stays in this process
        _ = self.queries
        return {k: v for k, v in self.__dict__.items() if k != "_lazy"}

    @classmethod
    def from_json(cls, d: dict) -> "FileResult":
        r = cls(d["path"])
        r.findings = [Finding.from_dict(x) for x in d["findings"]]
        r.summaries, r.classes, r.queries = d["summaries"], d["classes"], questions_of(d["queries"])
        r.called, r.error, r.internal_error = d["called"], d["error"], d["internal_error"]
        r.answers = d.get("answers", "")
        r.reexports, r.stars = d.get("reexports", {}), d.get("stars", [])
        r.module = d.get("module", "")
        r.parsed = bool(d.get("parsed", True))
        r.noqa = d.get("noqa")
        return r


@dataclass
class LintOptions:
    enabled: frozenset
    settings: dict = field(default_factory=dict)
    per_file_ignores: dict = field(default_factory=dict)
    root: str = "."
    prefilter: bool = True
    noqa: bool = True  # `# noqa` comments suppress (flake8's --disable-noqa turns it off)

    def fingerprint(self) -> str:
        """What a cached result's key depends on besides the file: the options a lint reads,
        and torchlint's own code (a rule edited, a build with the same version). Not the
        selection (``enabled``) nor ``noqa``: a lint runs every rule and keeps the file's
        ``# noqa`` directives, and ``select_result`` filters and suppresses when the result
        is reported, so changing ``--select`` re-parses nothing."""
        d = [sorted(self.settings.items()), sorted(
            (k, sorted(v)) for k, v in self.per_file_ignores.items()), self.prefilter, __version__,
            code_digest()]
        return hashlib.sha256(json.dumps(d, default=str).encode()).hexdigest()[:16]


_CODE_DIGEST: Optional[str] = None


def code_files() -> list:
    """The ``.py`` files of the installed torchlint, its rules included (``torchlint.rules``
    may live elsewhere: found without importing it)."""
    import importlib.util

    dirs = [os.path.dirname(os.path.abspath(__file__))]
    spec = importlib.util.find_spec("torchlint.rules")
    for d in (spec.submodule_search_locations or ()) if spec is not None else ():
        d = os.path.abspath(d)
        if not d.startswith(dirs[0] + os.sep):
            dirs.append(d)
    out = []
    for top in dirs:
        for folder, subdirs, names in os.walk(top):
            subdirs[:] = sorted(x for x in subdirs if x != "__pycache__")
            out.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
    return out


def code_digest() -> str:
    """A digest of torchlint's own code (``code_files``), computed once per process."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        h = hashlib.sha256()
        for f in code_files():
            try:
                with open(f, "rb") as fh:
                    data = fh.read()
            except OSError:
                data = b""
            h.update(f"{os.path.basename(f)}\0{len(data)}\0".encode())
            h.update(data)
        _CODE_DIGEST = h.hexdigest()[:16]
    return _CODE_DIGEST


_RULE_CACHE: dict = {}


def _rules_for(settings):
    """Every rule (preview rules included), configured with ``settings``: a lint runs them
    all, whatever is selected (``select_result`` keeps the selected ones' findings)."""
    key = tuple(sorted(settings.items()))
    r = _RULE_CACHE.get(key)
    if r is None:
        r = [cls(settings) for code, cls in all_rules().items() if code not in ("TL000", "TL001", "TL002")]
        _RULE_CACHE[key] = r
    return r


class DocumentMemo:
    """What one lint of a document leaves for the next lint of an edit of it (the language
    server keeps one per open document): the parsed pieces of its text (``parse_module``'s
    memo), the innermost function of every node of each top-level statement, and the
    positions of the nodes of each function that had a finding. Every entry is keyed on a
    node of the tree (held here, so its id stays its own) and a tree node is taken from the
    pieces only where its text is unchanged, so what a lint reads from here is what it would
    compute: the findings are those of a lint without memo (``tests/test_lsp.py``)."""

    def __init__(self):
        self.pieces: dict = {}  # piece text -> its libcst Module
        self.owners: dict = {}  # id(top-level statement) -> (statement, {id(node): innermost FunctionDef})
        self.positions: dict = {}  # id(FunctionDef) -> (FunctionDef, indentation, positions, generated lines)


def lint_text(path: str, text: str, opts: LintOptions, project: Optional[ProjectIndex] = None,
              module_name: Optional[str] = None, is_package: bool = False, data: Optional[bytes] = None,
              shown: Optional[str] = None, keep: Optional[dict] = None, raw: bool = False,
              memo: Optional[DocumentMemo] = None, exports: bool = True) -> FileResult:
    """Lint one file's text. Its result is what is reported (``select_result``: the selected
    rules' findings, ``# noqa`` applied; paths rendered relative to the current folder) unless
    ``raw``: a raw result has every rule's findings, its directives unapplied, and names files
    by ``findings.path_token`` (what the cache stores and the engine passes around).

    The cyclic garbage collector is off meanwhile: the file's libcst tree (millions of nodes
    for a big file, no cycles among them) would otherwise be scanned by every collection its
    allocations trigger; the model's own cycles are broken at the end (``_release_model``), so
    refcounting frees the tree as soon as the file is done.

    ``keep``, if given, receives what ``relint_kept`` needs to lint the file again without
    parsing it (its tree), when it parsed. ``memo`` (a ``DocumentMemo`` kept from the lint of
    an earlier text of the same document) lets the parse and the positions reuse what an edit
    left unchanged; ``exports=False`` leaves out the module's exports for other modules (the
    editor's lint of an unsaved buffer does not need them)."""
    import gc

    was_on = gc.isenabled()
    gc.disable()
    try:
        res = _lint_text(path, text, opts, project, module_name, is_package, data, shown, keep, memo, exports)
    finally:
        if was_on:
            gc.enable()
    return res if raw else render_result(select_result(res, opts))


def relint_kept(kept: dict, opts: LintOptions, project: Optional[ProjectIndex] = None) -> FileResult:
    """Lint again, against the project as it is now, a file whose tree ``lint_text`` kept."""
    import gc

    was_on = gc.isenabled()
    gc.disable()
    try:
        return _lint_module(kept["path"], kept["shown"], kept["text"], kept["tree"], kept["module_name"],
                            kept["is_package"], opts, project)
    finally:
        if was_on:
            gc.enable()


def _active_rules(path: str, opts: LintOptions) -> list:
    """The rules that run on ``path``: every rule not ignored for it by ``per-file-ignores``
    (the selection is applied when the result is reported: ``select_result``; test code is
    decided in ``_lint_module``, once the module is known)."""
    from .selection import per_file_ignored

    rules = _rules_for(opts.settings)
    ignored = per_file_ignored(path, opts.root, opts.per_file_ignores) if opts.per_file_ignores else set()
    return [r for r in rules if not any(r.code.startswith(i) for i in ignored)]


def _not_analysed(res: FileResult, exc, path: str, opts: LintOptions) -> FileResult:
    res.parsed = True
    if not _per_file_ignored("TL003", path, opts):
        res.findings.append(Finding("TL003", NotAnalysedRule.name, f"not analysed: {exc}", res.path,
                                    Span.of(exc.line, 0, exc.line, 0), NotAnalysedRule.severity))
    return res


def _per_file_ignored(code: str, path: str, opts: LintOptions) -> bool:
    from .selection import per_file_ignored

    return bool(opts.per_file_ignores) and any(
        code.startswith(i) for i in per_file_ignored(path, opts.root, opts.per_file_ignores))


def _lint_text(path: str, text: str, opts: LintOptions, project: Optional[ProjectIndex] = None,
               module_name: Optional[str] = None, is_package: bool = False, data: Optional[bytes] = None,
               shown: Optional[str] = None, keep: Optional[dict] = None, memo: Optional[DocumentMemo] = None,
               exports: bool = True) -> FileResult:
    from .discover import module_name_for

    shown = shown or path_token(path)
    res = FileResult(shown)
    active = _active_rules(path, opts)
    raw = data if data is not None else text.encode("utf-8", "surrogatepass")
    from .limits import MAX_BYTES, TooComplex, check_text

    if len(raw) > MAX_BYTES:  # before any parser, the stdlib's included
        return _not_analysed(res, TooComplex(f"the file is larger than {MAX_BYTES // 1_000_000} MB"), path, opts)
    if opts.prefilter:
        trig = set(_SUMMARY_TRIGGERS)
        for r in active:
            trig.update(r.triggers)
        if not any(t in raw for t in trig):
            # Nothing a rule could find: skip libcst, but still report a file that does not
            # parse. The stdlib parser is an order of magnitude cheaper; libcst confirms
            # (it knows newer syntax than the running interpreter may).
            if _compiles(text, path):
                return res
    if module_name is None:
        module_name, is_package = module_name_for(path)
    try:
        check_text(text)  # before the native parser sees the text: it overflows its stack
    except TooComplex as exc:
        return _not_analysed(res, exc, path, opts)
    import libcst as cst  # here, not at the top: a run answered from the cache never parses

    try:
        module = parse_module(text) if memo is None else parse_module(text, memo.pieces)
    except cst.ParserSyntaxError as exc:
        res.parsed = True
        msg = str(exc.message if hasattr(exc, "message") else exc).strip().splitlines()[0]
        line, col = exc.raw_line, max(exc.raw_column, 0)
        # CPython's parser usually pinpoints the error better; use it when it agrees
        # that the file is invalid.
        precise = _stdlib_syntax_error(text, path)
        if precise is not None:
            line, col, msg = precise
        res.findings.append(Finding("TL001", SyntaxErrorRule.name, f"syntax error: {msg}", shown,
                                    Span.of(line, col, line, col)))
        return res
    except RecursionError:
        res.parsed = True
        res.findings.append(Finding("TL001", SyntaxErrorRule.name,
                                    "syntax error: the file nests too deeply to parse", shown, Span.of(1, 0, 1, 0)))
        return res
    if keep is not None:
        keep.update(path=path, shown=shown, text=text, tree=module, module_name=module_name,
                    is_package=is_package)
    return _lint_module(path, shown, text, module, module_name, is_package, opts, project, active, memo, exports)


def _lint_module(path: str, shown: str, text: str, module, module_name: str, is_package: bool,
                 opts: LintOptions, project: Optional[ProjectIndex], active: Optional[list] = None,
                 memo: Optional[DocumentMemo] = None, exports: bool = True) -> FileResult:
    """The model and the rules over a parsed module."""
    from .model import ModuleModel

    if active is None:
        active = _active_rules(path, opts)
    res = FileResult(shown)
    res.parsed = True
    try:
        mm = ModuleModel(path, shown, text, module, module_name, is_package, project)
    except RecursionError:
        res.findings.append(Finding("TL000", InternalErrorRule.name,
                                    "internal error while building the semantic model: expressions nest too deeply",
                                    shown, Span.of(1, 0, 1, 0)))
        res.internal_error = True
        return res
    except Exception as exc:  # a bug in the model: report it, keep going
        res.findings.append(Finding("TL000", InternalErrorRule.name,
                                    f"internal error while building the semantic model: {type(exc).__name__}: {exc}",
                                    shown, Span.of(1, 0, 1, 0)))
        res.internal_error = True
        if os.environ.get("TORCHLINT_DEBUG"):
            traceback.print_exc()
        return res
    mm.memo = memo
    # test code, the one place it is decided: the rules exempt in tests (``Rule.exempt_in_tests``)
    # do not run on a test module and drop their findings inside ``unittest.TestCase`` classes
    if any(r.exempt_in_tests for r in active):
        from .selection import is_test_path

        if is_test_path(path, opts.root) and mm.has_tests():
            active = [r for r in active if not r.exempt_in_tests]
    findings = []
    tests = mm.test_class_lines() if any(r.exempt_in_tests for r in active) else ()
    for rule in active:
        try:
            for rep in rule.check(mm):
                f = _finding(mm, rule, rep)
                if tests and rule.exempt_in_tests and any(a <= f.line <= b for a, b in tests):
                    continue  # inside a unittest.TestCase class
                findings.append(f)
        except Exception as exc:
            res.internal_error = True
            if os.environ.get("TORCHLINT_DEBUG"):
                traceback.print_exc()
            findings.append(Finding("TL000", InternalErrorRule.name,
                                    f"internal error in rule {rule.code} ({rule.name}): {type(exc).__name__}: {exc}",
                                    shown, Span.of(1, 0, 1, 0)))
    # exports for the project (cross-module summaries)
    try:
        if exports:
            res.summaries = mm.export_summaries()
            res.classes = mm.export_classes()
            res.called = mm.export_calls()
            res.reexports, res.stars = mm.export_reexports()
            res.module = mm.module_name
    except Exception:  # exports only sharpen other modules' results; never fail the file
        if os.environ.get("TORCHLINT_DEBUG"):
            traceback.print_exc()
    res.queries = sorted(mm.external_queries)
    _release_model(mm)
    res.findings = sorted(findings, key=Finding.sort_key)
    res.noqa = noqa_record(text)
    bad = _unknown_noqa_codes(text)
    if bad:
        res.error = "; ".join(f"{shown}:{line}: unknown rule code `{code}` in `# noqa` (expected a code "
                              "listed by `torchlint rules`)" for line, code in bad)
    return res


def _release_model(mm) -> None:
    """Break the semantic model's reference cycles (functions <-> classes, nested functions
    <-> their parents, ops <-> their loops and branches, the model <-> its resolvers and
    caches), which would keep the module's libcst tree alive until the cyclic collector,
    switched off during a lint, walked millions of nodes to find them. Clearing the
    attributes of the functions, classes, ops and the model itself lets refcounting free
    the tree at once. Only objects of ``torchlint.model`` are cleared, never the shared
    project, the rules or the tree."""
    from .model.ir import walk

    owners = [v for v in vars(mm).values() if hasattr(v, "__dict__") and type(v).__module__.startswith("torchlint.model")]
    for fn in mm.all_functions:
        owners.append(fn)
        owners.extend(walk(fn.body))
        if fn.cls is not None:
            owners.append(fn.cls)
    owners.extend(mm.classes.values())
    for o in owners:
        o.__dict__.clear()
    mm.__dict__.clear()


def _stdlib_syntax_error(text: str, path: str):
    import ast
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text, path)
    except SyntaxError as exc:
        if not exc.lineno:
            return None
        line_text = text.splitlines()[exc.lineno - 1] if exc.lineno <= len(text.splitlines()) else ""
        col = max((exc.offset or 1) - 1, 0)
        col = min(col, len(line_text))
        return exc.lineno, col, exc.msg
    except (ValueError, RecursionError, MemoryError):
        return None
    return None


def _compiles(text: str, path: str) -> bool:
    import ast
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text, path)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def _finding(mm, rule, rep) -> Finding:
    sl, sc, el, ec = mm.span_of(rep.node)
    fix = None
    if rep.fix is not None and rule.fix_safety:
        try:
            fix = rep.fix(mm)
        except Exception:
            fix = None
    lines = getattr(mm, "_text_lines", None)
    if lines is None:  # once per module, not once per finding
        lines = mm._text_lines = mm.text.splitlines()
    line_text = lines[sl - 1].strip() if sl - 1 < len(lines) else ""
    fp = hashlib.sha1(f"{rule.code}|{rep.scope}|{line_text}".encode()).hexdigest()[:16]
    return Finding(rule.code, rule.name, rep.message, mm.display_path, Span.of(sl, sc, el, ec),
                   rule.severity, fix, tuple(rep.related), fingerprint=fp, scope=rep.scope)


def _unknown_noqa_codes(text: str) -> list:
    if "TL" not in text:
        return []
    known = all_rules()
    _, directives = parse_noqa(text)
    return [(d.line, c) for d in directives.values() for c in d.codes if c.startswith("TL") and c not in known]


def noqa_record(text: str) -> Optional[dict]:
    """The ``# noqa`` directives of ``text`` as a result keeps them (JSON): ``exempt`` (a
    ``# torchlint: noqa`` file) and, per directive, ``[line, start, end, codes, cell,
    keep_start, drop_start, fix_end]``: where the comment is, its codes, and the columns of
    the edit that removes some of its codes (``keep_start``: some stay) or all of them
    (``drop_start``: the spaces before it go too); ``fix_end`` None where no edit can be
    offered (a notebook line IPython syntax was replaced on). ``cell`` is a notebook's code
    cell (``notebook.lint_cells`` maps the record), else None. None when there is nothing."""
    exempt, directives = parse_noqa(text)
    if not exempt and not directives:
        return None
    lines = text.splitlines() if directives else []
    out = []
    for d in directives.values():
        line = lines[d.line - 1]
        drop = d.start
        while drop > 0 and line[drop - 1] in " \t":
            drop -= 1
        out.append([d.line, d.start, d.end, list(d.codes), None, d.start, drop, d.end])
    return {"exempt": exempt, "d": out}


def select_result(res: FileResult, opts: LintOptions) -> FileResult:
    """What is reported of a lint's result (in place): the findings of the selected rules
    (``opts.enabled``; an internal error always), less those its ``# noqa`` directives
    suppress, plus ``TL002`` for the directive codes that suppressed nothing. A lint runs
    every rule and keeps the directives (``noqa_record``), so the cache's results do not
    depend on the selection."""
    enabled = opts.enabled
    findings = [f for f in res.findings if f.code in enabled or f.code == "TL000"]
    if res.noqa is not None and opts.noqa:
        findings = _suppress(findings, res.noqa, enabled, res.path)
    res.findings = findings
    return res


def _suppress(findings, record: dict, enabled, shown: str) -> list:
    """``findings`` less those the directives of ``record`` suppress (never a syntax error:
    a notebook's broken cell is reported whatever its neighbours say), plus ``TL002``."""
    if record["exempt"]:
        return [f for f in findings if f.code == "TL001"]
    directives = {}
    for line, start, end, codes, cell, keep_start, drop_start, fix_end in record["d"]:
        directives[(cell, line)] = Directive(line, tuple(codes), start, end)
    kept = [f for f in findings if f.code == "TL001" or not is_suppressed(directives, (f.cell, f.line), f.code)]
    if "TL002" in enabled:
        from .findings import Edit, Fix, Position

        for line, start, end, codes, cell, keep_start, drop_start, fix_end in record["d"]:
            d = directives[(cell, line)]
            if not d.codes:
                continue
            unused = [c for c in d.codes if c not in d.used and c.startswith("TL")]
            if not unused:
                continue
            keep = [c for c in d.codes if c not in unused]
            new = f"# noqa: {', '.join(keep)}" if keep else ""
            fix = None
            if fix_end is not None:
                fix = Fix("Remove unused `noqa` codes", (Edit(Position(line, keep_start if keep else drop_start),
                                                              Position(line, fix_end), new),), cell=cell)
            f = Finding("TL002", UnusedNoqaRule.name, f"unused `noqa` directive (non-matching: {', '.join(unused)})",
                        shown, Span.of(line, start, line, end), "warning", fix)
            f.cell = cell
            kept.append(f)
    return sorted(kept, key=Finding.sort_key)


# ---------------------------------------------------------------- files and trees
def lint_path(path: str, opts: LintOptions, project: Optional[ProjectIndex] = None,
              keep: Optional[dict] = None, raw: bool = False) -> FileResult:
    """Lint the file ``path``; its result is what is reported unless ``raw`` (see
    ``lint_text``)."""
    shown = path_token(path)
    if path.endswith(".ipynb"):
        try:
            from .notebook import lint_notebook
        except ImportError:
            return FileResult(shown)
        res = lint_notebook(path, opts, project, shown)
    else:
        try:
            src = read_source(path)
        except SourceError as exc:
            res = FileResult(shown, error=str(exc))
        else:
            res = lint_text(path, src.text, opts, project, data=src.data, shown=shown, keep=keep, raw=True)
    return res if raw else render_result(select_result(res, opts))


def lint_job(args, keep: Optional[dict] = None):
    """Lint a file, or lint again the file ``keep`` holds the tree of (``keep["tree"]``);
    an exception becomes a TL000 finding."""
    from . import limits

    path, opts, project = args
    try:
        with limits.file_budget():
            if keep is None:
                return lint_path(path, opts, project, raw=True)
            if "tree" in keep:
                return relint_kept(keep, opts, project)
            return lint_path(path, opts, project, keep, raw=True)
    except (limits.OverBudget, MemoryError) as exc:  # abandon the file; the run goes on
        if keep is not None:
            keep.clear()
        import gc

        gc.collect()  # the abandoned model's cycles (a pool worker freezes what survives a file)
        reason = str(exc) if isinstance(exc, limits.OverBudget) else "it needs more memory than there is"
        r = FileResult(path_token(path))
        r.internal_error = True  # not cached: another machine may finish it
        r.findings.append(Finding("TL003", NotAnalysedRule.name, f"not analysed: {reason}", r.path,
                                  Span.of(1, 0, 1, 0), NotAnalysedRule.severity))
        return r
    except Exception as exc:  # never let one file stop the run
        r = FileResult(path_token(path))
        r.internal_error = True
        r.findings.append(Finding("TL000", InternalErrorRule.name,
                                  f"internal error: {type(exc).__name__}: {exc}", r.path, Span.of(1, 0, 1, 0)))
        return r


def _queried_unparsed(project: ProjectIndex, files, results, fresh=None) -> list:
    """Indices of files not parsed (prefiltered) whose module another file asked about (a
    question of a ``fresh`` file, or any question about a fresh file; the others were
    answered in the run they come from)."""
    unparsed = {project.key_of_path.get(os.path.abspath(files[i])): i for i, r in enumerate(results)
                if r is not None and not r.parsed and not r.error and files[i].endswith((".py", ".pyi"))}
    unparsed.pop(None, None)
    if not unparsed:
        return []
    askers = results
    if fresh is not None and not any(i in fresh for i in unparsed.values()):
        askers = [results[i] for i in sorted(fresh)]
    out = set()
    seen: set = set()  # many files ask the same questions
    for r in askers:
        for _, q in r.queries if r is not None else ():
            if q in seen:
                continue
            seen.add(q)
            parts = project.resolve(q).split(".")
            for n in range(len(parts) - 1, 0, -1):
                head = ".".join(parts[:n])
                if head in project.modules:  # the module that holds it (not its packages)
                    i = unparsed.get(head)
                    if i is not None:
                        out.add(i)
                    break
    return sorted(out)


def _exports_since_last_run(cache, path: str, result, opts) -> str:
    """``"same"`` when ``result`` exports what its file exported in the last run (then no
    other file's answers can differ from that run's because of it: an early cutoff),
    ``"new"`` when its module was not in the last run (as far as the cache knows: it may
    change how imports resolve), else ``"changed"``."""
    if result.is_lazy():  # a result of the last run's snapshot, unread
        return "same" if result.from_last_run else "changed"
    last = cache.last_exports(path, opts) if cache is not None else None
    if last is None or last[0] != result.module:
        return "new"
    try:
        same = json.dumps(last[1], sort_keys=True) == json.dumps(result.exports(), sort_keys=True)
    except (TypeError, ValueError):
        same = False
    return "same" if same else "changed"


def _call_sites_changed(cache, path: str, result, opts) -> Optional[set]:
    """The functions whose call sites in ``result``'s module (with what they pass: see
    ``model.callsites``) differ from the last run's, or ``None`` when that is not known."""
    from .project import split_args_entry

    if result.is_lazy() or cache is None:
        return None
    last = cache.last_exports(path, opts)
    if last is None or last[0] != result.module:
        return None
    try:
        old = {x[0] for x in last[1].get("called", ()) if x[0].endswith(")")}
        new = {x[0] for x in result.called if x[0].endswith(")")}
    except (TypeError, IndexError, AttributeError):
        return None
    return {split_args_entry(e)[0] for e in old ^ new if split_args_entry(e)}


def _read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def run(files, opts: LintOptions, jobs: int = 1, cache: Optional["Store"] = None, progress=None,
        workspace: Optional[Workspace] = None) -> list:
    """Lint ``files``; returns FileResults in the order of ``files``.

    Files are linted imported-first (``schedule``), each against the exports of the files
    finished before it; then the files whose cross-module answers changed are linted again
    until nothing changes (at most a few rounds). ``progress``, if given, is called with 1
    for each file of the first pass. ``workspace`` (of ``files``), if given, holds the
    project index of the results when it returns. ``cache`` is a ``cache.Store``."""
    import gc

    from .discover import forget_packages

    forget_packages()  # folders may have gained or lost an __init__.py since the last run
    was_on = gc.isenabled()
    gc.disable()
    try:
        # the paths are rendered now, relative to where this run is (the cache holds tokens)
        return [render_result(select_result(r, opts)) for r in _run(files, opts, jobs, cache, progress, workspace)]
    finally:
        if was_on:
            gc.enable()




def _phase(progress, label: str, total: int):
    """Tell a progress display that a new phase of ``total`` steps begins (after the first
    pass: a bar at 100% while the files are checked again or the cache written looks stuck);
    the callable to tick it, or None."""
    if progress is None or total <= 0:
        return None
    phase = getattr(progress, "phase", None)
    if phase is None:
        return None
    phase(label, total)
    return progress


def _run(files, opts: LintOptions, jobs: int, cache, progress, workspace) -> list:
    from dataclasses import replace

    from .schedule import InlinePool, OrderedPool, dependency_order, import_graph

    if workspace is not None and workspace.files != list(files):
        raise ValueError("the workspace is not of the files linted")
    if cache is not None and workspace is None:
        # nothing changed since the last run: its findings (without the exports a workspace
        # needs: it reads them from the cache's entries below)
        same = cache.get_run(files, opts)
        if same is not None:
            if progress is not None:
                progress(len(files))
            return same
    if workspace is None:
        workspace = Workspace(files)
    project = workspace.index
    results: list = [None] * len(files)
    todo = []
    for i, f in enumerate(files):
        hit = cache.get(f, opts) if cache is not None else None
        if hit is not None:
            results[i] = hit
        else:
            todo.append(i)
    if progress is not None and len(todo) < len(files):
        progress(len(files) - len(todo))
    full_opts = replace(opts, prefilter=False)
    deps = import_graph(files, project, _read_bytes) if len(todo) > 1 else [[] for _ in files]
    imported = {d for ds in deps for d in ds}
    todo_set = set(todo)
    order = [i for i in dependency_order([[d for d in ds if d in todo_set] for ds in deps]) if i in todo_set]

    def opts_for(i):
        # a package __init__ that other files import re-exports names: lint it for its
        # exports even when no rule could fire in it
        if i in imported and os.path.basename(files[i]) == "__init__.py":
            return full_opts
        return opts

    pool = None
    if jobs > 1 and len(todo) >= 4:
        try:
            pool = OrderedPool(files, jobs, workspace.blank())
        except (OSError, RuntimeError, ImportError):  # no processes here: lint in this one
            pool = None
    if pool is None:
        pool = InlinePool(files, workspace.blank())
    relinted: set = set()
    try:
        pool.publish_cached([r for r in results if r is not None])
        # the pool waits only for imports placed before a file (the rest are import cycles)
        pos = {i: n for n, i in enumerate(order)}
        before = [[d for d in ds if d in pos and pos[d] < pos.get(i, -1)] for i, ds in enumerate(deps)]
        for i, r in pool.run(order, opts_for, before, progress).items():
            results[i] = r
        # results that may disagree with the others: linted now, or cached entries of
        # different runs (those of the last run's snapshot agree with each other)
        gone = cache is None or cache.files_gone_since_last_run(files, opts)
        fresh = set(order) | {i for i, r in enumerate(results)
                              if i not in todo_set and not r.from_last_run}
        # later passes: re-lint the files whose cross-module answers changed
        for _ in range(3):
            workspace.merge(results)
            # a module other modules ask about but the prefilter skipped (a helper with no
            # trigger words, e.g. one that only unpacks batches) is linted in full for its exports
            skipped = _queried_unparsed(project, files, results, fresh)
            if skipped:
                tick = _phase(progress, "imported helpers linted for their exports", len(skipped))
                for i, r in pool.run(skipped, lambda i: full_opts, None, tick).items():
                    r.parsed = True  # do not ask again, even if it still exports nothing
                    results[i] = r
                    fresh.add(i)
                workspace.merge(results)
            memo: dict = {}  # many files ask the same questions
            # only files linted now can have changed what other modules see, and only those
            # whose exports differ from the last run's (an edit inside a function body, a
            # comment: nothing else is checked); a cached file is checked when its questions
            # concern one of their modules (all of them, cold)
            state = {i: _exports_since_last_run(cache, files[i], results[i], opts) for i in fresh}
            stale = [i for i in fresh if state[i] != "same"]
            changed = {results[i].module for i in stale if results[i].module}
            added = {results[i].module for i in stale if results[i].module and state[i] == "new"}
            check_all = len(changed) * 4 > len(files) or gone
            sites: Optional[set] = set()  # functions whose call sites changed (None: unknown)
            for i in stale:
                got = _call_sites_changed(cache, files[i], results[i], opts) if state[i] == "changed" else None
                if got is None:
                    sites = None
                    break
                sites |= got
            # (a cached result reads its questions only when they have to be checked)
            again = [i for i, r in enumerate(results)
                     if (check_all or i in fresh or stale and r.queries and may_depend(r.queries, changed, added, sites))
                     and r.queries and project.answers(r.queries, memo) != r.answers]
            if not again:
                break
            tick = _phase(progress, "files linted again (their imports changed)", len(again))
            for i, r in pool.run(again, lambda i: opts, None, tick).items():
                results[i] = r
                relinted.add(i)
                fresh.add(i)
        workspace.merge(results)
    finally:
        pool.close()
    if cache is not None:
        fresh = set(todo) | relinted
        tick = _phase(progress, "results cached", len(fresh))
        for i, f in enumerate(files):
            if i in fresh:
                cache.put(f, opts, results[i])
                if tick is not None:
                    tick(1)
        cache.put_run(files, opts, results)
        cache.flush()
    return results

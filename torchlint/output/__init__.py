"""One writer per output format. Each takes the findings (sorted) and returns text."""
from __future__ import annotations

import json
import os
from collections import Counter

from ..findings import Finding
from ..codes import CODES, DOCS_URL
from ..rule import all_rules

FORMATS = ("text", "concise", "json", "json-lines", "github", "sarif", "lsp")


_NB_CACHE: dict = {}


def _notebook(path: str):
    nb = _NB_CACHE.get(path)
    if nb is None:
        try:
            from ..notebook import load

            nb = load(path)
        except Exception:
            return None
        _NB_CACHE[path] = nb
    return nb


def notebook_raw_position(path: str, cell, line: int, column: int = 0) -> tuple:
    """For a position in a notebook cell, (line 1-based, column 0-based) in the .ipynb file
    (what editors, SARIF viewers and GitHub open); outside notebooks, the position itself."""
    if cell is None:
        return line, column
    nb = _notebook(path)
    pos = nb.raw_position(cell, line, column) if nb is not None else None
    return pos if pos is not None else (line, column)


def _raw_span(f: Finding) -> tuple:
    """(start line, start column, end line, end column) of a finding in its file's text."""
    sl, sc = notebook_raw_position(f.path, f.cell, f.line, f.column)
    el, ec = notebook_raw_position(f.path, f.cell, f.span.end.line, f.span.end.column)
    return sl, sc, el, ec


def shown(path: str) -> str:
    """A path as displayed: the bytes of an undecodable file name (kept by ``os.fsdecode`` as
    lone surrogates) escaped as ``\\xNN``, so that every output format stays valid UTF-8."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        try:
            return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return path.encode("utf-8", "backslashreplace").decode("utf-8")


def valid_utf8(text: str, fmt: str) -> str:
    """``text`` with any lone surrogate left (a path a writer did not pass through ``shown``)
    escaped: ``\\udcXX`` inside the JSON formats' strings, ``\\xNN`` elsewhere."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        if fmt in ("json", "json-lines", "sarif", "lsp"):
            return "".join(f"\\u{ord(c):04x}" if "\ud800" <= c <= "\udfff" else c for c in text)
        return shown(text)


def _utf16_col(line_text: str, col: int) -> int:
    return len(line_text[:col].encode("utf-16-le")) // 2


def _dyn_line(f: Finding) -> str:
    if not f.dynamic:
        return ""
    return f"\n    dynamic: {f.dynamic.get('verdict')} — {f.dynamic.get('evidence', '')}"


def _loc(f: Finding) -> str:
    if f.cell is not None:
        return f"{shown(f.path)}:cell {f.cell}:{f.line}:{f.column + 1}"
    return f"{shown(f.path)}:{f.line}:{f.column + 1}"


def write_text(findings, fixable_marker=True, show_fixes=False, statistics=False, color=False, fixed=0, **_) -> str:
    """ruff's text report; ``fixed``: how many findings ``--fix`` fixed (``findings`` remain)."""
    out = []
    for f in findings:
        mark = " [*]" if fixable_marker and f.fix is not None and f.fix.applicability == "safe" else ""
        if fixable_marker and f.fix is not None and f.fix.applicability == "unsafe":
            mark = ""
        code = f.code
        if color:
            code = f"\x1b[1;31m{code}\x1b[0m"
            loc = f"\x1b[1m{_loc(f)}\x1b[0m"
        else:
            loc = _loc(f)
        out.append(f"{loc}: {code}{mark} {f.message}{_dyn_line(f)}")
        for r in f.related:
            where = f"{shown(r.path)}:cell {r.cell}:{r.line}" if r.cell is not None else f"{shown(r.path)}:{r.line}"
            out.append(f"    note: {where}: {r.message}")
    n = len(findings)
    if n or fixed:
        safe = sum(1 for f in findings if f.fix is not None and f.fix.applicability == "safe")
        unsafe = sum(1 for f in findings if f.fix is not None and f.fix.applicability == "unsafe")
        total = n + fixed
        counts = f" ({fixed} fixed, {n} remaining)" if fixed else ""
        out.append(f"Found {total} error{'s' if total != 1 else ''}{counts}.")
        if safe:
            out.append(f"[*] {safe} fixable with the `--fix` option.")
        if unsafe:
            out.append(f"{unsafe} more fix{'es' if unsafe != 1 else ''} available with `--unsafe-fixes`.")
    else:
        out.append("All checks passed!")
    return "\n".join(out) + "\n"


def write_statistics(findings) -> str:
    c = Counter((f.code, f.name) for f in findings)
    fixable = Counter(f.code for f in findings if f.fix is not None and f.fix.applicability == "safe")
    lines = []
    for (code, name), n in sorted(c.items(), key=lambda x: (-x[1], x[0])):
        lines.append(f"{n:5d}\t{code}\t{'[*] ' if fixable[code] else ''}{name}")
    return "\n".join(lines) + ("\n" if lines else "")


def _json_obj(f: Finding) -> dict:
    d = {
        "code": f.code,
        "name": f.name,
        "message": f.message,
        "severity": f.severity,
        "filename": shown(os.path.abspath(f.path)),
        "location": {"row": f.line, "column": f.column + 1},
        "end_location": {"row": f.span.end.line, "column": f.span.end.column + 1},
        "fix": f.fix.to_dict() if f.fix else None,
        "url": DOCS_URL.format(code=f.code) if f.code in CODES else None,
        "noqa_row": f.line,
        "cell": f.cell,  # as ruff: the notebook cell, null outside notebooks
    }
    if f.related:
        d["related"] = [{"filename": shown(r.path), "row": r.line, "message": r.message,
                         **({"cell": r.cell} if r.cell is not None else {})} for r in f.related]
    if f.dynamic is not None:
        d["dynamic"] = f.dynamic
    return d


def write_json(findings, **_) -> str:
    return json.dumps([_json_obj(f) for f in findings], indent=2, ensure_ascii=False) + "\n"


def write_json_lines(findings, **_) -> str:
    return "".join(json.dumps(_json_obj(f), ensure_ascii=False) + "\n" for f in findings)


def _gh_escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_escape_prop(s: str) -> str:
    return _gh_escape_data(s).replace(":", "%3A").replace(",", "%2C")


def write_github(findings, **_) -> str:
    out = []
    for f in findings:
        level = "error" if f.severity == "error" else "warning"
        msg = f.message + (f" [dynamic: {f.dynamic.get('verdict')}: {f.dynamic.get('evidence','')}]" if f.dynamic else "")
        if f.cell is not None:
            msg += f" (cell {f.cell}, line {f.line})"
        sl, sc, el, ec = _raw_span(f)  # a notebook's annotation goes on the .ipynb file's line
        out.append(
            f"::{level} file={_gh_escape_prop(shown(f.path))},line={sl},col={sc + 1},"
            f"endLine={el},endColumn={ec + 1},"
            f"title={_gh_escape_prop(f'torchlint ({f.code})')}::{_gh_escape_data(f'{f.code} {msg}')}"
        )
    return "\n".join(out) + ("\n" if out else "")


def file_uri(path: str) -> str:
    """A ``file:`` URI (RFC 8089) for ``path``: absolute, its bytes percent-encoded (spaces,
    ``#``, ``%``, non-ASCII and undecodable names), as editors and SARIF consumers expect."""
    from pathlib import Path

    return Path(os.path.abspath(path)).as_uri()


def _uri(path: str, root: str) -> str:
    """A URI reference relative to ``root`` (SARIF's ``%SRCROOT%``), percent-encoded."""
    from urllib.parse import quote_from_bytes

    rel = os.path.relpath(os.path.abspath(path), root)
    if rel.startswith(".."):
        return file_uri(path)
    return quote_from_bytes(os.fsencode(rel.replace(os.sep, "/")), safe="/")


def write_sarif(findings, root=".", **_) -> str:
    from .. import __version__

    rules = all_rules()
    used = sorted({f.code for f in findings} | set(rules))
    index = {c: i for i, c in enumerate(used)}
    driver_rules = []
    for c in used:
        r = rules[c]
        driver_rules.append({
            "id": c,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": r.why or r.summary},
            "helpUri": r.url(),
            "help": {"text": r.why or r.summary, "markdown": f"**{r.summary}**\n\n{r.why}"},
            "defaultConfiguration": {"level": "error" if r.severity == "error" else "warning"},
            "properties": {"tags": ["pytorch", "correctness"]},
        })
    results = []
    for f in findings:
        sl, sc, el, ec = _raw_span(f)
        region = {"startLine": sl, "startColumn": sc + 1, "endLine": el, "endColumn": ec + 1}
        res = {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": "error" if f.severity == "error" else "warning",
            "message": {"text": f.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": _uri(f.path, root), "uriBaseId": "%SRCROOT%"},
                "region": region}}],
            "partialFingerprints": {"torchlint/v1": f.fingerprint or f"{f.code}:{f.line}"},
        }
        if f.cell is not None:
            res["properties"] = {"cell": f.cell, "cellLine": f.line}
        if f.related:
            res["relatedLocations"] = [
                {"id": i, "message": {"text": r.message}, "physicalLocation": {
                    "artifactLocation": {"uri": _uri(r.path, root), "uriBaseId": "%SRCROOT%"},
                    "region": {"startLine": max(notebook_raw_position(r.path, r.cell, r.line)[0], 1)}}}
                for i, r in enumerate(f.related)]
        if f.dynamic:
            res.setdefault("properties", {})["dynamic"] = f.dynamic
        results.append(res)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "torchlint", "version": __version__,
                                "informationUri": "https://github.com/torchlint/torchlint",
                                "rules": driver_rules}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": file_uri(root).rstrip("/") + "/"}},
            "results": results,
        }],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def lsp_diagnostic(f: Finding, text_lines=None) -> dict:
    """An LSP Diagnostic: 0-based lines, UTF-16 columns."""
    def col(line, c):
        if text_lines is not None and 0 < line <= len(text_lines):
            return _utf16_col(text_lines[line - 1], c)
        return c

    rules = all_rules()
    if f.cell is not None:  # a position in the .ipynb file's text
        sl, sc, el, ec = _raw_span(f)
        nb = _notebook(f.path)
        text_lines = nb.raw.split("\n") if nb is not None else None
    else:
        sl, sc, el, ec = f.line, f.column, f.span.end.line, f.span.end.column
    d = {
        "range": {
            "start": {"line": sl - 1, "character": col(sl, sc)},
            "end": {"line": el - 1, "character": col(el, ec)},
        },
        "severity": 1 if f.severity == "error" else 2,
        "code": f.code,
        "codeDescription": {"href": rules[f.code].url() if f.code in rules else ""},
        "source": "torchlint",
        "message": f.message,
        "data": {"fix": f.fix.to_dict() if f.fix else None, "name": f.name},
    }
    if f.dynamic:
        d["data"]["dynamic"] = f.dynamic
    if f.cell is not None:
        d["data"]["cell"] = f.cell
    return d


def write_lsp(findings, texts=None, **_) -> str:
    out: dict = {}
    for f in findings:
        lines = None
        if f.cell is not None:
            out.setdefault(file_uri(f.path), []).append(lsp_diagnostic(f, None))
            continue
        if texts is not None:
            lines = texts.get(f.path)
        if lines is None:
            try:
                with open(f.path, encoding="utf-8", errors="replace") as fh:
                    lines = fh.read().splitlines()
            except OSError:
                lines = None
            if texts is not None:
                texts[f.path] = lines
        uri = file_uri(f.path)
        out.setdefault(uri, []).append(lsp_diagnostic(f, lines))
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


WRITERS = {
    "text": write_text,
    "concise": write_text,
    "json": write_json,
    "json-lines": write_json_lines,
    "github": write_github,
    "sarif": write_sarif,
    "lsp": write_lsp,
}

"""What a lint run produces: findings, their locations and their fixes.

Positions are stored the way libcst reports them: 1-based lines and 0-based
columns counted in Unicode code points.  Each output writer converts to its
own convention (1-based columns for text/JSON/SARIF, UTF-16 code units for LSP).
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

SAFE = "safe"
UNSAFE = "unsafe"


@dataclass(frozen=True, order=True)
class Position:
    line: int  # 1-based
    column: int  # 0-based, code points


@dataclass(frozen=True)
class Span:
    start: Position
    end: Position

    @classmethod
    def of(cls, sl: int, sc: int, el: int, ec: int) -> "Span":
        return cls(Position(sl, sc), Position(el, ec))


@dataclass(frozen=True)
class Edit:
    """Replace the text between ``start`` and ``end`` with ``content``."""

    start: Position
    end: Position
    content: str


@dataclass(frozen=True)
class Fix:
    message: str
    edits: tuple[Edit, ...]
    applicability: str = SAFE  # SAFE or UNSAFE
    # notebooks: the code cell (1-based) the edits' cell-relative positions refer to
    cell: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"cell": self.cell} if self.cell is not None else {}),
            "applicability": self.applicability,
            "message": self.message,
            "edits": [
                {
                    "content": e.content,
                    "location": {"row": e.start.line, "column": e.start.column + 1},
                    "end_location": {"row": e.end.line, "column": e.end.column + 1},
                }
                for e in self.edits
            ],
        }


@dataclass(frozen=True)
class Related:
    """Another place that made the difference (a helper that switched modes, ...)."""

    path: str
    line: int
    message: str
    cell: Optional[int] = None  # in a notebook: the code cell ``line`` counts in


@dataclass
class Finding:
    code: str
    name: str
    message: str
    path: str
    span: Span
    severity: str = "error"  # "error" | "warning"
    fix: Optional[Fix] = None
    related: tuple[Related, ...] = ()
    # Filled by the dynamic mode: {"verdict": "confirmed"|"refuted"|"not-reached", "evidence": str}
    dynamic: Optional[dict[str, Any]] = None
    # For notebooks: the 1-based cell number and the line inside it.
    cell: Optional[int] = None
    # A stable fingerprint of the flagged code and its enclosing function (baselines).
    fingerprint: str = ""
    # The function that contains the finding, dotted (for the dynamic harness), "" at module level.
    scope: str = ""

    @property
    def line(self) -> int:
        return self.span.start.line

    @property
    def column(self) -> int:
        return self.span.start.column

    def sort_key(self) -> tuple:
        return (self.path, self.cell or 0, self.span.start.line, self.span.start.column, self.code, self.message)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["span"] = {
            "start": [self.span.start.line, self.span.start.column],
            "end": [self.span.end.line, self.span.end.column],
        }
        d["fix"] = self.fix.to_dict() if self.fix else None
        d["related"] = [{k: v for k, v in asdict(r).items() if k != "cell" or v is not None} for r in self.related]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        s = d["span"]
        fix = None
        if d.get("fix"):
            f = d["fix"]
            fix = Fix(
                f["message"],
                tuple(
                    Edit(
                        Position(e["location"]["row"], e["location"]["column"] - 1),
                        Position(e["end_location"]["row"], e["end_location"]["column"] - 1),
                        e["content"],
                    )
                    for e in f["edits"]
                ),
                f["applicability"],
                f.get("cell"),
            )
        return cls(
            code=d["code"],
            name=d["name"],
            message=d["message"],
            path=d["path"],
            span=Span.of(s["start"][0], s["start"][1], s["end"][0], s["end"][1]),
            severity=d.get("severity", "error"),
            fix=fix,
            related=tuple(Related(**r) for r in d.get("related", ())),
            dynamic=d.get("dynamic"),
            cell=d.get("cell"),
            fingerprint=d.get("fingerprint", ""),
            scope=d.get("scope", ""),
        )


# ------------------------------------------------------------------ paths
# A lint names files (the finding's, and others' inside messages and related locations) by a
# token holding the absolute path; the paths are rendered when the results are reported,
# relative to where torchlint runs then. A cached result thus reads the same from any folder.
_MARK = "\x1d"
_TOKEN = re.compile(_MARK + "([^" + _MARK + "]*)" + _MARK)


def path_token(path: str) -> str:
    """How a lint names the file ``path`` (rendered by :func:`render_text`)."""
    return f"{_MARK}{os.path.abspath(path)}{_MARK}"


def display_path(path: str) -> str:
    """``path`` relative to the current folder (absolute when it lies outside it)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") and os.path.isabs(path) else rel


def render_text(text):
    """``text`` with each path token replaced by the path relative to the current folder."""
    if not text or _MARK not in text:
        return text
    return _TOKEN.sub(lambda m: display_path(m.group(1)), text)


def render_finding(f: "Finding") -> "Finding":
    if _MARK not in f.path and _MARK not in f.message and not f.related and (f.fix is None or _MARK not in f.fix.message):
        return f
    related = tuple(Related(render_text(r.path), r.line, render_text(r.message)) for r in f.related)
    fix = f.fix if f.fix is None or _MARK not in f.fix.message else replace(f.fix, message=render_text(f.fix.message))
    return replace(f, path=render_text(f.path), message=render_text(f.message), related=related, fix=fix)


def render_result(r):
    """Render the paths of a ``FileResult``'s path, error and findings, in place (the
    exports keep their tokens: they are for other lints, not for reports)."""
    r.path = render_text(r.path)
    if r.error:
        r.error = render_text(r.error)
    if r.findings:
        r.findings = [render_finding(f) for f in r.findings]
    return r

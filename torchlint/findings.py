"""What a lint run produces: findings, their locations and their fixes.

Positions are stored the way libcst reports them: 1-based lines and 0-based
columns counted in Unicode code points.  Each output writer converts to its
own convention (1-based columns for text/JSON/SARIF, UTF-16 code units for LSP).
"""
from __future__ import annotations

from dataclasses import dataclass, asdict
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
        return (self.path, self.span.start.line, self.span.start.column, self.code, self.message)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["span"] = {
            "start": [self.span.start.line, self.span.start.column],
            "end": [self.span.end.line, self.span.end.column],
        }
        d["fix"] = self.fix.to_dict() if self.fix else None
        d["related"] = [asdict(r) for r in self.related]
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

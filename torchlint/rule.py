"""The rule base class, the registry, and what a rule reports.

A rule is metadata (its public docs page is built from it) plus a short ``check`` that
queries the module's semantic model and yields :class:`Report` objects.  The engine turns
reports into findings, computing positions only for the reported nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable, Optional

from .codes import DOCS_URL

if TYPE_CHECKING:  # the engine imports libcst only when a file has to be parsed
    import libcst as cst


@dataclass
class Report:
    node: cst.CSTNode
    message: str
    # a function (ModuleModel) -> Fix, called only when the finding is kept
    fix: Optional[Callable] = None
    related: tuple = ()  # of Related
    scope: str = ""


class Rule:
    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    why: ClassVar[str] = ""
    example: ClassVar[str] = ""
    use_instead: ClassVar[str] = ""
    known_problems: ClassVar[str] = ""
    fix_safety: ClassVar[Optional[str]] = None  # None, "safe" or "unsafe"
    fix_doc: ClassVar[str] = ""
    options: ClassVar[str] = ""
    references: ClassVar[tuple] = ()
    severity: ClassVar[str] = "error"
    # on by default; ``False`` makes it a preview rule, run only when selected by its full code
    # (it misses the precision targets on real code: see docs/evaluation.md)
    default: ClassVar[bool] = True
    # why a preview rule is off by default (its measured precision), for its docs page
    preview_reason: ClassVar[str] = ""
    # not run on test code (``torchlint.selection.is_test_path``, ``unittest.TestCase`` classes),
    # where its findings are harmless: tests call ``forward`` directly, skip ``eval()``, use tiny
    # unshuffled loaders, build graphs on purpose and check that autograd raises
    exempt_in_tests: ClassVar[bool] = True
    # byte strings one of which must occur in a file for the rule to possibly fire
    triggers: ClassVar[tuple] = ()

    def __init__(self, settings: Optional[dict] = None):
        self.settings = settings or {}

    def check(self, mm) -> Iterable[Report]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def url(cls) -> str:
        return DOCS_URL.format(code=cls.code)


class _Meta(Rule):
    """Findings the engine itself makes (they have docs pages like every rule)."""

    exempt_in_tests = False

    def check(self, mm):
        return ()


class SyntaxErrorRule(_Meta):
    code = "TL001"
    name = "syntax-error"
    summary = "The file could not be parsed."
    why = ("torchlint can only analyse code it can parse. A file with a syntax error is "
           "reported once, at the error, and the other files are still linted.")
    example = "def train(:\n    pass\n"
    use_instead = "def train():\n    pass\n"


class InternalErrorRule(_Meta):
    code = "TL000"
    name = "internal-error"
    summary = "A rule failed on this file (a bug in torchlint)."
    why = ("An exception inside one rule must not stop the run or hide the other rules' "
           "findings, so it is reported as a finding naming the rule, and the run exits with "
           "status 2. Please report it with the file that triggers it.")
    example = ""
    use_instead = ""


class NotAnalysedRule(_Meta):
    code = "TL003"
    name = "not-analysed"
    summary = "The file was not analysed: it is beyond one of torchlint's limits."
    why = ("Some files cannot be analysed safely: expressions nested hundreds of levels deep or "
           "chains of hundreds of operators (`a.b.b.b…`, `1 + 1 + …`) would overflow the parser's "
           "stack or take minutes, and a file larger than 5 MB, or one that needs more time or "
           "memory than a file's budget, would hold up the whole run. Such a file is reported once, "
           "with the reason, and the other files are still linted. `docs/limits.md` lists the limits.")
    example = "x = " + "(" * 150 + "1" + ")" * 150 + "\n"
    use_instead = "x = 1\n"
    severity = "warning"


class UnusedNoqaRule(_Meta):
    code = "TL002"
    name = "unused-noqa"
    summary = "A `# noqa: TLxxx` comment suppresses nothing."
    why = ("Suppression comments that no longer match a finding hide future findings on the "
           "same line and mislead readers. Remove them.")
    example = "loss.backward()  # noqa: TL104\n"
    use_instead = "loss.backward()\n"
    fix_safety = "safe"
    fix_doc = "Removes the unused code from the comment (the whole comment when none is left)."


def all_rules() -> dict:
    """code -> Rule class, for every rule shipped (engine meta rules included)."""
    from . import rules as _rules  # noqa: F401  (importing registers the families)

    out = {}
    for cls in (InternalErrorRule, SyntaxErrorRule, UnusedNoqaRule, NotAnalysedRule):
        out[cls.code] = cls
    for cls in _rules.RULES:
        out[cls.code] = cls
    return dict(sorted(out.items()))

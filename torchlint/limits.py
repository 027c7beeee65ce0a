"""What a file may be before torchlint analyses it (see ``docs/limits.md``).

libcst's native parser recurses once per nesting level of an expression and overflows the C
stack (a segfault, not an exception) a little above a thousand levels; the semantic model
and the rules recurse over the tree in Python and hit the interpreter's recursion limit
much earlier, after spending seconds (tens of seconds for long chains). Python itself
refuses more than 200 nested brackets and 100 nested blocks. So the nesting a file needs
is estimated here, by a cheap scan of its text, *before* the parser sees it, and a file
over the limit is reported as not analysed (``TL003``) instead.

The estimate, per point of the text: 2 per open bracket and per enclosing block, plus 1
per operator (``.``, ``+``, ``and``, ``not``, ``if``/``else``, ``lambda``, a comparison, an
adjacent string, a call or a subscript…) since the last separator (``,``, ``;``, ``=``, the end of a logical
line) at each enclosing bracket level: ``a.b.b.b`` and ``1 + 1 + 1`` are trees as deep as
they are long. Strings and comments are skipped.
"""
from __future__ import annotations

import re
from typing import Optional

MAX_DEPTH = 200  # the estimated nesting (above) a file may reach
MAX_BYTES = 5_000_000  # a source file larger than this is not analysed (the largest in torch: 1.4 MB)

_STRING = (
    r'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
    r"|'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
    r"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'"
)
_KEYWORD = r"(?:and|or|not|if|else|lambda|await|in|is)(?!\w)"
# One alternative per kind of token the estimate counts; the group that matched says which.
# Each match first passes over blanks and names other than those keywords (possessively:
# what it passed is never a token), so the scan does not try the alternatives at every
# character of every name; the alternatives are mutually exclusive but for the ``skip``
# forms of ``.`` (``...``, ``.5``), which come before the operator ``.``.
_TOKEN = re.compile(
    r"(?:[ \t]+|(?!" + _KEYWORD + r")[^\W\d]\w*)*+"
    r"(?:(?P<nl>\r?\n[ \t\f]*)"
    r"|(?P<open>[(\[{])|(?P<close>[)\]}])"
    r"|(?P<sep>[,;]|(?<![=<>!:+\-*/%&|^@])=(?!=))"
    r"|(?P<skip>#[^\n]*|\\\r?\n|\.\.\.|\b\d[\w.]*|\.\d\w*)"  # comments, continuations, `...`, numbers
    r"|(?P<op>\*\*|//|<<|>>|[=!<>]=|->|:=|[-+*/%@&|^~<>.])"
    r"|(?P<str>" + _STRING + r")"
    r"|(?P<kw>(?<!\w)" + _KEYWORD + r"))",
    re.S,
)


class TooComplex(Exception):
    """A file over one of the limits; the message says which, for the ``TL003`` finding."""

    def __init__(self, message: str, line: int = 1):
        super().__init__(message)
        self.line = line


def check_text(text: str) -> None:
    """Raise ``TooComplex`` if ``text`` needs more nesting than ``MAX_DEPTH`` to analyse."""
    depth = _deepest(text)
    if depth is not None:
        need, line = depth
        raise TooComplex(f"expressions nest too deeply (an estimated depth of {need}, over the limit "
                         f"of {MAX_DEPTH})", line)


def _deepest(text: str) -> Optional[tuple]:
    """(estimated depth, line) where the estimate first exceeds MAX_DEPTH, or None."""
    runs = [0]  # operators since the last separator, per open bracket level (0: the statement)
    indents = [0]
    base = 0  # 2 per enclosing block
    need = 0  # base + 2 per open bracket + sum(runs)
    prev_str = False
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup  # (the branches in the order of how often they come)
        if kind == "nl":
            prev_str = False
            if len(runs) > 1:
                continue  # inside brackets: not the end of the statement
            need -= runs[0]
            runs[0] = 0
            rest = text[m.end():m.end() + 1]
            if rest in ("", "\n", "\r", "#"):
                continue  # a blank or comment line does not indent
            width = len(m.group(kind).lstrip("\r\n").expandtabs(8))
            while width < indents[-1]:
                indents.pop()
            if width > indents[-1]:
                indents.append(width)
            need += 2 * (len(indents) - 1) - base
            base = 2 * (len(indents) - 1)
        elif kind == "sep":
            need -= runs[-1]
            runs[-1] = 0
            prev_str = False
        elif kind == "open":
            at = m.start(kind)
            if at and (text[at - 1].isalnum() or text[at - 1] in "_)]}'\""):  # a call or a subscript
                runs[-1] += 1  # is a link of a chain: ``a.b().b()``
                need += 1
            runs.append(0)
            need += 2
            prev_str = False
            if need > MAX_DEPTH:
                return need, _line_of(text, at)
        elif kind == "close":
            if len(runs) > 1:
                need -= 2 + runs.pop()
            prev_str = False
        elif kind == "op" or kind == "kw":
            runs[-1] += 1
            need += 1
            prev_str = False
            if need > MAX_DEPTH:
                return need, _line_of(text, m.start(kind))
        elif kind == "str":
            if prev_str:
                runs[-1] += 1
                need += 1
            prev_str = True
        else:
            prev_str = False
    return None


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# ---------------------------------------------------------------- a file's time budget
MAX_SECONDS = 120.0  # a file whose lint takes longer is abandoned (TL003) and the run goes on


class OverBudget(BaseException):
    """Raised in a lint that ran past ``MAX_SECONDS`` (a BaseException, so that no rule's
    ``except Exception`` swallows it)."""


class file_budget:
    """``with file_budget(): lint(...)`` raises ``OverBudget`` in the lint once it has run for
    ``seconds``. A timer signal (``SIGALRM``) interrupts the lint between two Python
    instructions, so a budget is only kept in the main thread of a POSIX process (the
    command line and its pool workers; the language server lints in a thread, without one)."""

    def __init__(self, seconds: Optional[float] = None):
        self.seconds = MAX_SECONDS if seconds is None else seconds
        self.armed = False

    def __enter__(self):
        import signal
        import threading

        if (self.seconds > 0 and hasattr(signal, "setitimer")
                and threading.current_thread() is threading.main_thread()):
            self._old = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self.armed = True
        return self

    def _expire(self, signum, frame):
        raise OverBudget(f"its analysis took longer than {self.seconds:g} s")

    def __exit__(self, *exc):
        if self.armed:
            import signal

            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
            self.armed = False
        return False

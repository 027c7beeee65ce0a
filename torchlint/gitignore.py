"""git's ignore rules: ``.gitignore`` files, ``.git/info/exclude``, matched as git matches them.

A port of the semantics of git's ``dir.c`` (pattern parsing, basename and path matching,
precedence) and ``wildmatch.c`` (the glob language) to Python regular expressions:

* a line is a pattern unless it is blank or starts with ``#``; trailing spaces are dropped
  unless escaped (``\\ ``); ``\\#`` and ``\\!`` start a pattern with a literal ``#`` or ``!``;
* ``!`` negates; one trailing ``/`` makes the pattern match directories only;
* a pattern without a ``/`` (after that trailing one) matches the name of a file or folder at
  any depth below its ``.gitignore``; with a ``/`` anywhere it matches the path relative to
  the ``.gitignore``'s folder (a leading ``/`` only anchors);
* ``*`` and ``?`` never match ``/``, ``[...]`` is a set (``!``/``^`` negate, ranges,
  ``[:alpha:]`` classes, never ``/``); ``**`` between slashes (or at either end) matches any
  number of folders: ``a/**/b`` matches ``a/b``; elsewhere ``**`` is ``*``; a malformed set
  makes the pattern match nothing;
* precedence: patterns of ``.git/info/exclude``, then of each ``.gitignore`` from the
  repository's root down to the path's folder; the last pattern that matches decides;
* nothing below an ignored folder can be re-included (the walk never enters it).

git applies the literal prefix of a path pattern (up to its first ``*?[\\``) before the glob,
so a ``**`` right after that prefix counts as one at the start (``foo**/bar`` matches
``foobar``); this port does the same, and ``tests/test_gitignore.py`` checks it all against
``git check-ignore``. ``core.excludesFile`` (per-user) is not read: results never depend on
the user's configuration.
"""
from __future__ import annotations

import os
import re

_SPECIAL = "*?[\\"
_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}
_NEVER = "(?!)"


class _Malformed(Exception):
    """A set git aborts on: the pattern matches nothing."""


def _bracket(p: str, i: int):
    """The set starting at ``p[i] == '['``: (regex, index after its ``]``)."""
    i += 1
    negated = i < len(p) and p[i] in "!^"
    if negated:
        i += 1
    items = []
    prev = None  # the previous single character, a range's start
    first = True
    while True:
        if i >= len(p):
            raise _Malformed
        c = p[i]
        if c == "]" and not first:
            i += 1
            break
        first = False
        if c == "\\":
            i += 1
            if i >= len(p):
                raise _Malformed
            c = p[i]
            items.append(re.escape(c))
            prev = c
        elif c == "-" and prev is not None and i + 1 < len(p) and p[i + 1] != "]":
            i += 1
            hi = p[i]
            if hi == "\\":
                i += 1
                if i >= len(p):
                    raise _Malformed
                hi = p[i]
            if prev <= hi:  # (the start was already a member on its own: ``[z-a]`` matches ``z``)
                items.append(f"{re.escape(prev)}-{re.escape(hi)}")
            prev = None
        elif c == "[" and i + 1 < len(p) and p[i + 1] == ":":
            end = p.find("]", i + 2)
            if end < 0:
                raise _Malformed
            if end - 1 < i + 2 or p[end - 1] != ":":  # no ``:]``: a plain ``[``
                items.append(re.escape("["))
                prev = "["
            else:
                name = p[i + 2:end - 1]
                if name not in _CLASSES:
                    raise _Malformed
                items.append(_CLASSES[name])
                prev = None
                i = end
        else:
            items.append(re.escape(c))
            prev = c
        i += 1
    body = "".join(items)
    if negated:
        return (f"[^/{body}]" if body else "[^/]"), i
    return (f"(?!/)[{body}]" if body else _NEVER), i


def _glob(p: str) -> str:
    """wildmatch with WM_PATHNAME as a regex; ``p`` starts where git's wildmatch starts."""
    out = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "*":
            j = i
            while j < n and p[j] == "*":
                j += 1
            double = j - i >= 2
            at_edge_before = i == 0 or p[i - 1] == "/"
            after = p[j:j + 1]
            slash_after = after == "/" or p[j:j + 2] == "\\/"
            if double and at_edge_before and (j == n or slash_after):
                if after == "/":
                    out.append("(?:.*/)?")  # zero or more folders
                    j += 1
                else:
                    out.append(".*")
            else:
                out.append("[^/]*")
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            rx, i = _bracket(p, i)
            out.append(rx)
        elif c == "\\":
            if i + 1 >= n:
                return _NEVER  # a trailing backslash matches nothing
            out.append(re.escape(p[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _literal_len(p: str) -> int:
    for i, c in enumerate(p):
        if c in _SPECIAL:
            return i
    return len(p)


def _trim_trailing_spaces(line: str) -> str:
    last_space = None
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == " ":
            if last_space is None:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= n:
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


class Pattern:
    __slots__ = ("text", "negative", "dir_only", "basename", "literal", "suffix", "regex")

    def __init__(self, line: str):
        self.text = line
        p = line
        self.negative = p.startswith("!")
        if self.negative:
            p = p[1:]
        self.dir_only = p.endswith("/")
        if self.dir_only:
            p = p[:-1]
        self.basename = "/" not in p
        if not self.basename and p.startswith("/"):
            p = p[1:]
        self.literal = self.suffix = self.regex = None
        prefix = _literal_len(p)
        if prefix == len(p):
            self.literal = p
        elif self.basename and p[0] == "*" and _literal_len(p[1:]) == len(p) - 1:
            self.suffix = p[1:]  # ``*.py``: git's "ends with" shortcut
        else:
            try:
                rx = re.escape(p[:prefix]) + _glob(p[prefix:])
            except _Malformed:
                rx = _NEVER
            self.regex = re.compile(rx, re.DOTALL)

    def matches(self, name: str, rel: str) -> bool:
        """``rel``: the path relative to the pattern's folder; ``name``: its last part."""
        s = name if self.basename else rel
        if self.literal is not None:
            return s == self.literal
        if self.suffix is not None:
            return s.endswith(self.suffix)
        return self.regex.fullmatch(s) is not None


def parse(text: str) -> list:
    """The patterns of one ignore file's text, in order."""
    if text.startswith("\ufeff"):
        text = text[1:]
    out = []
    for line in text.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if not line or line.startswith("#"):
            continue
        line = _trim_trailing_spaces(line)
        if line and line not in ("!", "/", "!/"):
            out.append(Pattern(line))
    return out


class IgnoreFile:
    """The patterns of one ignore file; ``base``: its folder relative to the walk's top folder
    (``""`` or ``"sub/dir/"``)."""

    __slots__ = ("base", "patterns")

    def __init__(self, base: str, patterns):
        self.base = base
        self.patterns = patterns

    def match(self, rel: str, name: str, is_dir: bool):
        """True (ignored), False (re-included) or None (no pattern matches)."""
        sub = rel[len(self.base):]
        for pat in reversed(self.patterns):
            if pat.dir_only and not is_dir:
                continue
            if pat.matches(name, sub):
                return not pat.negative
        return None


def read(path: str, base: str):
    """The ignore file at ``path`` (``None`` if it is missing, unreadable or empty)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            patterns = parse(fh.read())
    except (OSError, ValueError):
        return None
    return IgnoreFile(base, patterns) if patterns else None


def ignored(stack, rel: str, is_dir: bool) -> bool:
    """Whether ``rel`` (relative to the top folder, ``/``-separated) is ignored by ``stack``
    (ignore files, lowest precedence first), its folders not being ignored."""
    name = rel.rsplit("/", 1)[-1]
    for f in reversed(stack):
        r = f.match(rel, name, is_dir)
        if r is not None:
            return r
    return False


def git_dir(folder: str):
    """The git directory of the repository whose work tree's top is ``folder`` (``.git`` a
    folder, or a file ``gitdir: ...`` as in worktrees and submodules), or None."""
    dot = os.path.join(folder, ".git")
    if os.path.isdir(dot):
        return dot
    try:
        with open(dot, encoding="utf-8") as fh:
            first = fh.readline().strip()
    except (OSError, ValueError):
        return None
    if not first.startswith("gitdir:"):
        return None
    gd = os.path.join(folder, first[len("gitdir:"):].strip())
    return gd if os.path.isdir(gd) else None


def info_exclude(folder: str):
    """``info/exclude`` of the repository whose top is ``folder`` (a worktree's is its main
    repository's), as an ignore file with base ``""``; None without one."""
    gd = git_dir(folder)
    if gd is None:
        return None
    try:
        with open(os.path.join(gd, "commondir"), encoding="utf-8") as fh:
            gd = os.path.join(gd, fh.read().strip())
    except (OSError, ValueError):
        pass
    return read(os.path.join(gd, "info", "exclude"), "")


def check(top: str, rel: str, is_dir: bool) -> bool:
    """``git check-ignore`` for one path of the work tree whose top is ``top``: ``rel`` is
    ignored, or one of its folders is."""
    stack = []
    ex = info_exclude(top)
    if ex is not None:
        stack.append(ex)
    parts = rel.split("/")
    d, prefix = top, ""
    for i, part in enumerate(parts):
        gi_path = os.path.join(d, ".gitignore")
        if not os.path.islink(gi_path):
            gi = read(gi_path, prefix)
            if gi is not None:
                stack.append(gi)
        if ignored(stack, prefix + part, is_dir or i < len(parts) - 1):
            return True
        d, prefix = os.path.join(d, part), prefix + part + "/"
    return False

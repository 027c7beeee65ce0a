"""`# noqa` handling: per line (`# noqa`, `# noqa: TL101,TL102`) and per file (`# torchlint: noqa`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.I)
_FILE = re.compile(r"^\s*#\s*torchlint\s*:\s*noqa\s*$", re.I | re.M)
_CODE = re.compile(r"[A-Z]+[0-9]+")


@dataclass
class Directive:
    line: int
    codes: tuple  # () means every code
    start: int  # column where the comment starts
    end: int
    used: set = field(default_factory=set)


def parse_noqa(text: str) -> tuple[bool, dict]:
    """(file is exempt, {line: Directive})."""
    exempt = bool(_FILE.search(text)) if "torchlint" in text else False
    out = {}
    if "noqa" not in text and "NOQA" not in text:
        return exempt, out
    for i, line in enumerate(text.splitlines(), 1):
        if "#" not in line:
            continue
        m = _NOQA.search(line)
        if not m:
            continue
        # must be in a comment: a '#' not inside a string; good enough: the match's '#'
        codes = tuple(_CODE.findall(m.group("codes") or "")) if m.group("codes") else ()
        out[i] = Directive(i, tuple(c.upper() for c in codes), m.start(), m.end())
    return exempt, out


def is_suppressed(directives: dict, line: int, code: str) -> bool:
    d = directives.get(line)
    if d is None:
        return False
    if not d.codes:
        d.used.add(code)
        return True
    if code in d.codes:
        d.used.add(code)
        return True
    return False

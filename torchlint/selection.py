"""Which rules run: select / ignore / extend-select with prefix matching (`TL1` = TL1xx)."""
from __future__ import annotations

import fnmatch
import os

# Rules that only run when selected by their full code or a prefix more specific than "TL".
OPT_IN = {"TL002"}


class UnknownCodeError(Exception):
    pass


def known_codes() -> list:
    from .codes import CODES

    return list(CODES)


def validate_codes(codes, where: str) -> None:
    from .config import ConfigError

    known = known_codes()
    for c in codes:
        if c.upper() == "ALL":
            continue
        if not any(k.startswith(c) for k in known):
            raise ConfigError(f"{where}: unknown rule code or prefix `{c}` (expected one of "
                              f"TL, TL1, ..., or a full code such as {known[-1]})")


def _matches(code: str, selectors) -> int:
    """Length of the longest selector matching ``code`` (-1 if none)."""
    best = -1
    for s in selectors:
        if s.upper() == "ALL" or code.startswith(s):
            best = max(best, 0 if s.upper() == "ALL" else len(s))
    return best


def enabled_codes(select, ignore, extend_select=()) -> set:
    out = set()
    for code in known_codes():
        sel = max(_matches(code, select), _matches(code, extend_select))
        if sel < 0:
            continue
        if code in OPT_IN and sel < len(code) and sel <= len("TL0"):
            if not any(s == code or (s.startswith("TL0") and code.startswith(s)) for s in list(select) + list(extend_select)):
                continue
        ign = _matches(code, ignore)
        if ign >= 0 and ign >= sel:
            continue
        out.add(code)
    return out


def per_file_ignored(path: str, root: str, table: dict) -> set:
    rel = os.path.relpath(os.path.abspath(path), root) if root else path
    rel = rel.replace(os.sep, "/")
    out = set()
    for glob, codes in table.items():
        g = glob.rstrip("/")
        if fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(os.path.basename(rel), g) or \
                fnmatch.fnmatch(rel, g + "/*") or rel.startswith(g + "/"):
            out.update(codes)
    return out

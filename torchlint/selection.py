"""Which rules run: select / ignore / extend-select with prefix matching (`TL1` = TL1xx);
preview rules (off by default); which files are test code."""
from __future__ import annotations

import fnmatch
import os
import re

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


def preview_codes() -> frozenset:
    """Rules off by default (``Rule.default = False``): they run only when selected by their
    full code (``--select TL201``, ``extend-select = ["TL201"]``)."""
    from .codes import PREVIEW

    return PREVIEW


def enabled_codes(select, ignore, extend_select=()) -> set:
    out = set()
    preview = preview_codes()
    for code in known_codes():
        sel = max(_matches(code, select), _matches(code, extend_select))
        if sel < 0:
            continue
        if code in preview and sel < len(code):
            continue  # a preview rule: only its full code selects it
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


# test code: a ``tests``/``test`` folder, ``test_*.py``, ``*_test.py``, ``*_tests.py``, ``conftest.py``
_TEST_PATH = re.compile(r"(^|/)(test_[^/]*|[^/]*_tests?|conftest)\.(py|ipynb)$|(^|/)tests?/")


def is_test_path(path: str, root: str = "") -> bool:
    """Whether ``path`` is test code by its place in the tree: the path is read relative to
    ``root`` (the project root) when it lies inside it, so a checkout under some ``/tmp/tests/``
    is not all test code."""
    p = os.path.abspath(path)
    if root:
        r = os.path.abspath(root)
        if p == r or p.startswith(r.rstrip(os.sep) + os.sep):
            p = os.path.relpath(p, r)
    return bool(_TEST_PATH.search(p.replace(os.sep, "/").replace("\\", "/")))

"""Baselines for gradual adoption: record today's findings, report only new ones later.

Entries are keyed on path, code and a fingerprint of the flagged line and its enclosing
function (``Finding.fingerprint``), never on line numbers, so moving or editing unrelated
code does not resurface old findings.  Identical entries are counted, so a second copy of
the same bug in the same function is still reported.
"""
from __future__ import annotations

import json
import os
from collections import Counter

from . import __version__
from .reportfile import write_report

FORMAT = "torchlint-baseline/1"


class BaselineError(Exception):
    pass


def _key(f) -> tuple:
    return (f.path.replace(os.sep, "/"), f.code, f.fingerprint)


def write(path: str, findings) -> None:
    counts = Counter(_key(f) for f in findings)
    entries = [{"path": p, "code": c, "fingerprint": fp, "count": n} for (p, c, fp), n in sorted(counts.items())]
    doc = {"format": FORMAT, "version": __version__, "entries": entries}
    write_report(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def load(path: str) -> Counter:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise BaselineError(f"{path}: baseline file not found (create it with --write-baseline)") from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{path}: not a torchlint baseline: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        raise BaselineError(f"{path}: not a torchlint baseline (expected format {FORMAT!r})")
    out = Counter()
    try:
        for e in doc["entries"]:
            out[(e["path"], e["code"], e["fingerprint"])] += int(e.get("count", 1))
    except (KeyError, TypeError, ValueError) as exc:
        raise BaselineError(f"{path}: malformed entry: {exc}") from None
    return out


def filter_new(path: str, findings) -> list:
    budget = load(path)
    out = []
    for f in findings:
        k = _key(f)
        if budget[k] > 0:
            budget[k] -= 1
            continue
        out.append(f)
    return out

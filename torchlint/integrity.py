"""What makes a cache file trusted: who wrote it, and what is in it.

Every JSON file of the cache is *sealed*: a header line ``TLC1 <hmac>`` before its bytes, the
HMAC-SHA256 of the file's name in the cache (``v0.1.0/ab/abcd….json``) and its bytes under a
key of this user's that lives outside every project (:func:`key_file`).  A repository can
commit a ``.torchlint_cache`` and a checkout can land at the path the records name, but no
record of it carries a valid seal, and a record copied under another record's name does not
either.  A file whose seal does not check is a cache miss (and is rewritten by the run).

A file that checks is then decoded (a nesting too deep for the decoder is a miss, not an
error) and validated against its schema (:func:`result`, :func:`index`, ...): types, value
ranges and nesting depth, before anything of it is used.  The validators return ``False`` or
``None`` for anything unexpected; they never raise.

Notes for ``--verbose`` (which files were ignored, and why) collect in :data:`NOTES`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import tempfile
from typing import Optional

MAGIC = b"TLC1 "
_HEADER = len(MAGIC) + 64 + 1  # "TLC1 " + hex digest + "\n"
KEY_BYTES = 32
MAX_RECORD = 512 << 20  # a cache file larger than this is not read
MAX_DEPTH = 12  # the deepest free-form value (a summary's field) a record may hold
NOTES: list = []  # (kind, name) of the cache files ignored in this process
ENV_KEY_FILE = "TORCHLINT_KEY_FILE"


# ------------------------------------------------------------------ the key
def key_file() -> str:
    """Where this user's key is: ``$TORCHLINT_KEY_FILE``, else ``torchlint/key`` in the user's
    cache directory (``$XDG_CACHE_HOME``, ``~/.cache``; ``%LOCALAPPDATA%`` on Windows)."""
    p = os.environ.get(ENV_KEY_FILE)
    if p:
        return os.path.abspath(p)
    base = None
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA")
    else:
        x = os.environ.get("XDG_CACHE_HOME")
        if x and os.path.isabs(x):  # the XDG spec: a relative value is ignored
            base = x
    if not base:
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchlint", "key")


def _usable(st) -> bool:
    """Our own key: a regular file of this user that no one else can read or write."""
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_size != KEY_BYTES:
        return False
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o077):
        return False
    return True


def load_key_file(path: str) -> Optional[bytes]:
    """The key in ``path`` if it is a usable one (never creates it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not _usable(os.fstat(fd)):
            return None
        data = os.read(fd, KEY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


def load_key(create: bool = True) -> Optional[bytes]:
    """This user's key, created on first use (mode 0600, atomically: a complete key file
    appears at once, and of two processes creating it both end up with the same one).
    A key file that is not a private 32-byte file of this user's is replaced. ``None`` when
    there is no key and none can be made (the cache is then neither read nor written)."""
    path = key_file()
    key = load_key_file(path)
    if key is not None or not create:
        return key
    d = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".key-")  # created 0600
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # only if there is none: a key made meanwhile by another run wins
        except FileExistsError:
            if load_key_file(path) is None:  # there is one, but not a usable one: replace it
                os.replace(tmp, path)
                tmp = None
        except OSError:  # no hard links here
            if load_key_file(path) is None:
                os.replace(tmp, path)
                tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    key = load_key_file(path)
    if key is None:
        note("no-key", path)
    return key


# ------------------------------------------------------------------ seals
def seal(key: bytes, name: str, payload: bytes) -> bytes:
    """``payload`` with its header: the file's bytes as written to the cache."""
    mac = hmac.new(key, name.encode(), hashlib.sha256)
    mac.update(b"\0")
    mac.update(payload)
    return MAGIC + mac.hexdigest().encode() + b"\n" + payload


def unseal(key: Optional[bytes], name: str, data) -> Optional[memoryview]:
    """The payload of a cache file's bytes ``data`` if its seal is this user's for ``name``;
    ``None`` (and a note) otherwise."""
    if data is None or key is None:
        return None
    if len(data) < _HEADER or data[:len(MAGIC)] != MAGIC or data[_HEADER - 1:_HEADER] != b"\n":
        note("unsealed", name)
        return None
    view = memoryview(data)
    mac = hmac.new(key, name.encode(), hashlib.sha256)
    mac.update(b"\0")
    mac.update(view[_HEADER:])
    if not hmac.compare_digest(mac.hexdigest().encode(), bytes(view[len(MAGIC):_HEADER - 1])):
        note("forged", name)
        return None
    return view[_HEADER:]


def payload_head(data, n: int = 200) -> bytes:
    """The first ``n`` bytes of a sealed file's payload (unchecked: for a cheap look before
    checking the seal)."""
    return bytes(data[_HEADER:_HEADER + n]) if data is not None else b""


def loads(payload) -> object:
    """The JSON value of a checked payload; ``None`` when it does not decode (malformed, or
    nested deeper than the decoder goes: its recursion guard raises, and that is a miss)."""
    if payload is None:
        return None
    try:
        return json.loads(bytes(payload) if isinstance(payload, memoryview) else payload)
    except (ValueError, RecursionError, MemoryError):
        return None


def note(kind: str, name: str) -> None:
    if len(NOTES) < 1000:
        NOTES.append((kind, name))


_WHY = {
    "unsealed": "has no seal (not written by this version of torchlint)",
    "forged": "has a seal that is not this user's (written elsewhere, copied, or damaged)",
    "invalid": "does not match its schema (damaged)",
    "no-key": "cannot be read or created: the cache is off",
}


def take_notes() -> list:
    """The ``--verbose`` lines for the cache files ignored so far (and forget them)."""
    out, seen = [], set()
    for kind, name in NOTES:
        if (kind, name) in seen:
            continue
        seen.add((kind, name))
        what = "the cache key" if kind == "no-key" else "cache file"
        out.append(f"torchlint: {what} {name} {_WHY.get(kind, kind)}; ignored"
                   + ("" if kind == "no-key" else " and rebuilt"))
    NOTES.clear()
    if len(out) > 20:
        out = out[:20] + [f"torchlint: ... and {len(out) - 20} more cache files ignored"]
    return out


# ------------------------------------------------------------------ schemas
# Each validator answers whether a decoded value has exactly the shape the cache writes.
# ``type(x) is T`` throughout: ``True`` is not an int here, nor an int a bool.
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_CODE = re.compile(r"[A-Z]{1,8}[0-9]{1,6}\Z")
_MAXINT = 1 << 62
_SEVERITIES = ("error", "warning")
_MODES = ("train", "eval", "loaded")
_FINDING_KEYS = frozenset(("code", "name", "message", "path", "span", "severity", "fix", "related", "dynamic",
                           "cell", "fingerprint", "scope"))
_APPLICABILITY = ("safe", "unsafe")
# the typed fields of a function summary and of a class's facts (others: any small JSON)
_SUMMARY_TYPES = {"name": str, "qualname": str, "path": str, "line": int, "params": list, "free": list,
                  "exit_modes": dict, "return_modes": dict, "trains_in_entry": list, "evals_in_entry": list,
                  "backward": bool, "backward_if": list, "autograd": bool,
                  "backward_inherits_grad": bool, "step": bool, "clear": bool, "sched_step": bool,
                  "returns": list, "returns_items": list, "forward": bool, "moves": bool, "trains_on": list, "evaluates_on": list, "reshuffles": list,
                  "grad": str, "eval_loop": bool, "called_without_grad": bool}
# lists of lists of strings: a summary's facts per item of the tuple a function returns, a
# class's per item of its forward's tuple
_NESTED_LISTS = frozenset({"returns_items", "forward_items"})
# plain JSON of their own shape: the condition a backward runs under (a parameter's name, the
# value it needs, ...), the constructor arguments that make a class free of mode layers, the
# loaders a function reshuffles and how
_JSON_FIELDS = frozenset({"backward_if", "mode_free_if", "reshuffles"})
_CLASS_TYPES = {"is_module": bool, "bases": list, "methods": list, "mode_sensitive": bool, "mode_layers": bool, "forward": list,
                "iterable_dataset": bool, "plain": bool, "mode_free_if": dict, "shuffles": list,
                "on_device": bool, "loss_input": str, "forward_items": list}


def _is_notebook(path: str) -> bool:
    """Whether a result's path (a path token, ``findings.path_token``: the absolute path
    between two ``\\x1d`` marks) names a notebook."""
    return path.strip("\x1d").endswith(".ipynb")


def _nat(x) -> bool:
    return type(x) is int and 0 <= x < _MAXINT


def _strs(x) -> bool:
    return type(x) is list and all(type(s) is str for s in x)


def json_value(x, depth: int = MAX_DEPTH) -> bool:
    """Plain JSON of at most ``depth`` levels (iterative: no recursion on what it checks)."""
    stack = [(x, depth)]
    while stack:
        v, d = stack.pop()
        t = type(v)
        if t is dict:
            if d <= 0:
                return False
            for k, w in v.items():
                if type(k) is not str:
                    return False
                stack.append((w, d - 1))
        elif t is list:
            if d <= 0:
                return False
            stack.extend((w, d - 1) for w in v)
        elif t is int:
            if not -_MAXINT < v < _MAXINT:
                return False
        elif not (v is None or t is str or t is bool or t is float):
            return False
    return True


def _fields(d, types: dict) -> bool:
    if type(d) is not dict:
        return False
    for k, v in d.items():
        t = types.get(k)
        if t is None:
            if not json_value(v, 4):
                return False
        elif type(v) is not t:
            return False
        elif k in _JSON_FIELDS:  # a condition's or a constructor's facts: plain JSON
            if not json_value(v, 4):
                return False
        elif t is list:
            if k in _NESTED_LISTS:  # one list of facts per item of a returned tuple
                if not all(type(i) is list and all(type(s) is str for s in i) for i in v):
                    return False
            elif not all(type(s) is str for s in v):
                return False
        elif t is dict:  # exit_modes, return_modes: {key: [mode, function, path, line]} (where it is set)
            for m in v.values():
                if type(m) is not list or len(m) != 4 or m[0] not in _MODES or type(m[1]) is not str \
                        or type(m[2]) is not str or not _nat(m[3]):
                    return False
        elif t is int and not _nat(v):
            return False
    return True


def _pos(p) -> bool:
    return type(p) is dict and len(p) == 2 and _nat(p.get("row")) and type(p.get("column")) is int \
        and 1 <= p["column"] < _MAXINT


def fix(d, notebook: bool) -> bool:
    if type(d) is not dict or d.keys() - {"cell"} != {"applicability", "message", "edits"}:
        return False
    if d.get("applicability") not in _APPLICABILITY or type(d.get("message")) is not str:
        return False
    cell = d.get("cell")
    if notebook != (cell is not None) or (cell is not None and not (_nat(cell) and cell >= 1)):
        return False
    edits = d.get("edits")
    if type(edits) is not list or not edits:
        return False
    for e in edits:
        if type(e) is not dict or len(e) != 3 or type(e.get("content")) is not str \
                or not _pos(e.get("location")) or not _pos(e.get("end_location")):
            return False
    return True


def finding(d, path: str) -> bool:
    """A finding as ``Finding.to_dict`` writes it, of the result for ``path`` (its shown path)."""
    if type(d) is not dict or d.keys() != _FINDING_KEYS:  # to_dict writes every field
        return False
    code, name, message, fpath, span = d["code"], d["name"], d["message"], d["path"], d["span"]
    if type(code) is not str or not _CODE.match(code) or type(name) is not str or type(message) is not str \
            or fpath != path or type(span) is not dict or len(span) != 2:
        return False
    for k in ("start", "end"):
        p = span.get(k)
        if type(p) is not list or len(p) != 2 or not _nat(p[0]) or not _nat(p[1]):
            return False
    if d["severity"] not in _SEVERITIES:
        return False
    notebook = _is_notebook(path)
    cell = d.get("cell")
    if notebook != (cell is not None) or (cell is not None and not (_nat(cell) and cell >= 1)):
        return False
    f = d.get("fix")
    if f is not None and not fix(f, notebook):
        return False
    related = d["related"]
    if type(related) is not list:
        return False
    for r in related:
        if type(r) is not dict or len(r) != 3 + ("cell" in r) or type(r.get("path")) is not str \
                or not _nat(r.get("line")) or type(r.get("message")) is not str \
                or ("cell" in r and not _nat(r["cell"])):  # a notebook's: the cell its line counts in
            return False
    # the dynamic mode's verdicts are never a lint's: a cached finding has none
    return d["dynamic"] is None and type(d["fingerprint"]) is str and type(d["scope"]) is str


def exports(d) -> bool:
    """A result's exports: function summaries, class facts, calls, re-exports, star imports."""
    if type(d) is not dict:
        return False
    s, c, called, rx, stars = d.get("summaries"), d.get("classes"), d.get("called"), d.get("reexports"), \
        d.get("stars")
    if type(s) is not dict or type(c) is not dict or type(called) is not list or type(rx) is not dict \
            or not _strs(stars):
        return False
    if not (s or c or called or rx):
        return True
    for q, v in s.items():
        if not _fields(v, _SUMMARY_TYPES):
            return False
    for q, v in c.items():
        if not _fields(v, _CLASS_TYPES):
            return False
    for x in called:
        if type(x) is not list or len(x) != 2 or type(x[0]) is not str or type(x[1]) is not bool:
            return False
    return all(type(v) is str for v in rx.values())


def result(d, lite: bool = False) -> bool:
    """A cached ``FileResult`` (``to_json``, or ``to_lite_json`` with ``lite``): only results
    without an error are stored, so ``error`` is null and ``internal_error`` false."""
    if type(d) is not dict:
        return False
    try:  # (the run snapshot checks one per file of the tree: no generator here)
        path, findings = d["path"], d["findings"]
        if d["error"] is not None or d["internal_error"] is not False or type(d["answers"]) is not str \
                or type(d["module"]) is not str or type(d["parsed"]) is not bool:
            return False
    except KeyError:
        return False
    if type(path) is not str or type(findings) is not list:
        return False
    for f in findings:
        if not finding(f, path):
            return False
    if "queries" in d and not _strs(d["queries"]):
        return False
    if not noqa(d.get("noqa"), _is_notebook(path)):
        return False
    return lite or (exports(d) and "queries" in d)


def noqa(d, notebook: bool) -> bool:
    """A result's ``# noqa`` directives (``engine.noqa_record``), or None."""
    if d is None:
        return True
    if type(d) is not dict or d.keys() != {"exempt", "d"} or type(d["exempt"]) is not bool \
            or type(d["d"]) is not list:
        return False
    for e in d["d"]:
        if type(e) is not list or len(e) != 8:
            return False
        line, start, end, codes, cell, keep_start, drop_start, fix_end = e
        if not (_nat(line) and line >= 1 and _nat(start) and _nat(end)) or type(codes) is not list \
                or not all(type(c) is str and c.isalnum() for c in codes):
            return False
        if notebook != (cell is not None) or (cell is not None and not (_nat(cell) and cell >= 1)):
            return False
        fix = (keep_start, drop_start, fix_end)
        if not (all(x is None for x in fix) or all(_nat(x) for x in fix)):
            return False
    return True


def index(d, version: str) -> Optional[dict]:
    """The stat index's files: ``{abspath: [mtime_ns, size, sha256, racy]}``."""
    if type(d) is not dict or d.get("version") != version or type(d.get("files")) is not dict:
        return None
    for p, e in d["files"].items():
        if type(e) is not list or len(e) != 4 or not _nat(e[0]) or not _nat(e[1]) \
                or type(e[2]) is not str or not _HEX64.match(e[2]) or type(e[3]) is not bool:
            return None
    return d["files"]


def spans(d, limit: int, n: int = 2) -> bool:
    """``{key: [offset, length]}`` inside ``limit`` bytes (``n`` = 2) / counts (no limit)."""
    if type(d) is not dict:
        return False
    for v in d.values():
        if type(v) is not list or len(v) != n or not all(_nat(x) for x in v):
            return False
        if limit >= 0 and v[0] + v[1] > limit:
            return False
    return True


def snapshot_index(d, version: str, blob_len: int) -> bool:
    """The last run's index (results, where their exports and questions are in the blob)."""
    if type(d) is not dict or d.get("version") != version:
        return False
    res, paths, keys = d.get("results"), d.get("paths"), d.get("keys")
    if type(res) is not dict or not all(result(r, lite=True) for r in res.values()):
        return False
    if not spans(d.get("spans"), blob_len) or not spans(d.get("qspans"), blob_len) \
            or not spans(d.get("called"), -1):
        return False
    if type(d.get("token")) is not str or type(d.get("blob")) is not str or not _HEX64.match(d["blob"]):
        return False
    return _strs(paths) and type(keys) is list and len(keys) == len(paths) \
        and all(k is None or type(k) is str for k in keys)


def run_snapshot(d, version: str, digest: str, n: int) -> bool:
    """The last run's results for ``get_run``: ``n`` results (exports left empty)."""
    if type(d) is not dict or d.get("version") != version or d.get("digest") != digest:
        return False
    res = d.get("results")
    return type(res) is list and len(res) == n and all(result(r) for r in res)

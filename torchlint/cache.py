"""The result cache in `.torchlint_cache/`.

An entry is keyed on the file's path and content hash, the torchlint version and the
effective options; it stores the findings, the summaries the module exports and the
cross-module questions its rules asked (with a hash of the answers they got).  The engine
re-lints a cached file when the answers to those questions changed (an imported module was
edited), so a change in one module re-lints its dependents and nothing else.  Entries that
are corrupt, truncated, from another version or owned by another user are ignored.

Finding an entry must not cost reading every file of the tree: ``index.json`` maps each
path to ``(mtime_ns, size, content hash)``.  When a file's ``stat`` matches, its stored hash
is used without opening it; otherwise the file is read and hashed again.  A file modified
within a couple of seconds of being indexed ("racy": a later edit may keep the same mtime
and size) is always re-hashed.

Nothing is trusted for being in the cache directory: every file is sealed with this user's
key and validated against its schema when read (:mod:`torchlint.integrity`, ``docs/cache.md``).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import tempfile
import time
from typing import Optional, Protocol

from . import __version__, integrity
from .discover import abspath

_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
        "# This file is a cache directory tag created by torchlint.\n"
        "# For information about cache directory tags see https://bford.info/cachedir/\n")
_RACY_NS = 2_000_000_000  # an mtime this close to "now" may not change on the next edit
# Bounds on the cache's size: an entry superseded by a newer one of its file (an edit) is
# removed when the new one is written; once a day, a run removes the entries not written or
# read for MAX_AGE_S and the run snapshots of all but the KEEP_SNAPSHOTS option sets used last.
MAX_AGE_S = 30 * 24 * 3600
KEEP_SNAPSHOTS = 8
PRUNE_EVERY_S = 24 * 3600

class Store(Protocol):
    """What ``engine.run`` asks of a store of results (``Cache`` is the one torchlint has):
    results by file and options, the last run's results, and what a file exported then."""

    def get(self, path: str, opts):
        """The result of ``path`` as it is now, linted with ``opts``, or None."""

    def put(self, path: str, opts, result) -> None:
        """Store ``result``, of ``path`` as it is now."""

    def get_run(self, files, opts) -> Optional[list]:
        """The results of the last run if it linted exactly ``files``, unchanged."""

    def put_run(self, files, opts, results) -> None:
        """Remember this run's results (for ``get_run``, ``last_exports``)."""

    def last_exports(self, path: str, opts) -> Optional[tuple]:
        """What ``path`` exported in the last run: (module key, exports), or None."""

    def files_gone_since_last_run(self, files, opts) -> bool:
        """Whether a file of the last run is not among ``files`` (True when unknown)."""

    def flush(self) -> None:
        """Write what is pending (the end of a run)."""


class Cache:
    """The result store in a cache directory (a :class:`Store`)."""

    def __init__(self, directory: str):
        self.dir = directory
        self._ready = False
        self.hits = 0
        self.misses = 0
        self.hashed = 0  # files read and hashed (their stat did not match the index)
        self._index: Optional[dict] = None
        self._dirty = False
        self._seen: dict = {}  # abspath -> (mtime_ns, size, hash) as found by get()
        self._fps: dict = {}  # id(opts) -> (opts, fingerprint)
        self._full: Optional[dict] = None  # entry key -> result, from the last run's snapshot
        self._full_paths = None  # the files of that run
        self._last_keys: dict = {}  # abspath -> its entry key in that run
        self._store: Optional["_Snapshot"] = None  # their exports
        self._secret: Optional[bytes] = None  # this user's key (integrity.load_key), once per run

    # ------------------------------------------------------------ directory
    @property
    def _vdir(self) -> str:
        return os.path.join(self.dir, "v" + __version__)

    def _ensure(self) -> bool:
        if self._ready:
            return True
        try:
            os.makedirs(self._vdir, exist_ok=True)
            tag = os.path.join(self.dir, "CACHEDIR.TAG")
            if not os.path.exists(tag):
                with open(tag, "w") as fh:
                    fh.write(_TAG)
            gi = os.path.join(self.dir, ".gitignore")
            if not os.path.exists(gi):
                with open(gi, "w") as fh:
                    fh.write("# Automatically created by torchlint.\n*\n")
            self._ready = True
        except OSError:
            return False
        return True

    # ------------------------------------------------------------ files of the cache
    @staticmethod
    def _read_bytes(f: str) -> Optional[bytes]:
        """A cache file's bytes, if it is ours (owned by this user); ``None`` otherwise."""
        try:
            if hasattr(os, "getuid") and os.stat(f).st_uid != os.getuid():
                return None
            with open(f, "rb") as fh:
                return fh.read()
        except OSError:
            return None

    @staticmethod
    def _map(f: str):
        """A cache file mapped read-only (the snapshot's blob of exports: 20 MB for the torch
        tree, of which a run where a few files changed reads a few pages), if it is ours;
        ``None`` otherwise. The cache replaces files (``os.replace``), never rewrites them,
        so a mapping stays valid until it is let go. (Not on Windows, where a mapped file
        cannot be replaced: the file is read.)"""
        if os.name != "posix":
            return Cache._read_bytes(f)
        try:
            fd = os.open(f, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                return None
            if st.st_size == 0:
                return b""
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    @property
    def _userkey(self) -> Optional[bytes]:
        if self._secret is None:
            self._secret = integrity.load_key() or b""
        return self._secret or None

    def _name(self, f: str) -> str:
        """A cache file's name in the cache (what its seal binds it to)."""
        return f[len(self.dir) + 1:].replace(os.sep, "/")

    def _open(self, f: str, data=None):
        """The payload of a cache file (or of its bytes ``data``) if it carries this user's seal
        for its name; ``None`` otherwise."""
        if data is None:
            data = self._read_bytes(f)
        return integrity.unseal(self._userkey, self._name(f), data) if data is not None else None

    def _read_json(self, f: str, valid=None) -> Optional[dict]:
        """A cache file's content, if it is ours (owner, seal), well-formed, of this version
        and, with ``valid``, of its schema."""
        d = integrity.loads(self._open(f))
        if not isinstance(d, dict) or d.get("version") != __version__:
            return None
        if valid is not None and not valid(d):
            integrity.note("invalid", self._name(f))
            return None
        return d

    def _write_json(self, f: str, obj) -> bool:
        key = self._userkey
        if key is None:
            return False
        try:
            data = json.dumps(obj).encode()  # json.dump streams through the pure-Python encoder
        except (TypeError, ValueError):
            return False
        return self._write_bytes(f, integrity.seal(key, self._name(f), data))

    def _write_bytes(self, f: str, data: bytes) -> bool:
        """Write through a temporary file and ``os.replace``: readers never see half a file."""
        tmp = None
        try:
            os.makedirs(os.path.dirname(f), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(f), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, f)
            return True
        except OSError:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return False

    def _fingerprint(self, opts) -> str:
        fp = self._fps.get(id(opts))
        if fp is None or fp[0] is not opts:
            fp = self._fps[id(opts)] = (opts, opts.fingerprint())  # once per run, not per file
        return fp[1]

    # ------------------------------------------------------------ stat index
    def _load_index(self) -> dict:
        if self._index is None:
            f = os.path.join(self._vdir, "index.json")
            d = self._read_json(f)
            self._index = integrity.index(d, __version__) if d is not None else None
            if self._index is None:
                if d is not None:
                    integrity.note("invalid", self._name(f))
                self._index = {}
        return self._index

    def run_hash(self, path: str) -> Optional[str]:
        """``content_hash``, once per path for one run (the run digest, the entries and the
        snapshot all ask; ``put`` checks the file again before writing)."""
        memo = self.__dict__.setdefault("_run_hashes", {})
        h = memo.get(path)
        if h is None:
            h = memo[path] = self.content_hash(path)
        return h

    def content_hash(self, path: str) -> Optional[str]:
        """The sha256 of ``path``'s bytes, from the index when its stat is unchanged."""
        ap = abspath(path)
        try:
            st = os.stat(ap)
        except OSError:
            return None
        idx = self._load_index()
        e = idx.get(ap)
        if isinstance(e, list) and len(e) == 4 and e[0] == st.st_mtime_ns and e[1] == st.st_size \
                and not e[3] and isinstance(e[2], str):
            self._seen[ap] = (st.st_mtime_ns, st.st_size, e[2])
            return e[2]
        try:
            with open(ap, "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        self.hashed += 1
        h = hashlib.sha256(data).hexdigest()
        racy = time.time_ns() - st.st_mtime_ns < _RACY_NS
        idx[ap] = [st.st_mtime_ns, st.st_size, h, racy]
        self._dirty = True
        self._seen[ap] = (st.st_mtime_ns, st.st_size, h)
        return h

    def flush(self) -> None:
        """Write the index (when it changed); the engine calls this at the end of a run."""
        self._flush()

    def _flush(self) -> None:
        self.prune()
        if not self._dirty or self._index is None or not self._ensure():
            return
        # forget files that no longer exist, so the index does not grow without bound
        idx = {p: e for p, e in self._index.items() if os.path.exists(p)}
        if self._write_json(os.path.join(self._vdir, "index.json"), {"version": __version__, "files": idx}):
            self._dirty = False

    def prune(self, now: Optional[float] = None) -> int:
        """At most once per PRUNE_EVERY_S: remove the entries not used for MAX_AGE_S and the
        least recently used run snapshots beyond KEEP_SNAPSHOTS option sets (each snapshot's
        files count as used when a run reads them). Returns how many files were removed."""
        if not self._ready and not os.path.isdir(self._vdir):
            return 0
        now = time.time() if now is None else now
        marker = os.path.join(self._vdir, "pruned")
        try:
            if now - os.stat(marker).st_mtime < PRUNE_EVERY_S:
                return 0
        except FileNotFoundError:
            pass
        except OSError:
            return 0
        try:
            with open(marker, "w"):
                pass
            os.utime(marker, (now, now))
            top = list(os.scandir(self._vdir))
        except OSError:
            return 0
        cutoff = now - MAX_AGE_S
        removed = 0
        snapshots: dict = {}  # option fingerprint -> [(path, mtime)]
        for d in top:
            try:
                if d.is_dir(follow_symlinks=False) and len(d.name) == 2:
                    for e in os.scandir(d.path):
                        if e.name.endswith(".json") and e.stat(follow_symlinks=False).st_mtime < cutoff:
                            removed += _unlink(e.path)
                elif d.name.startswith("run-") and d.is_file(follow_symlinks=False):
                    fp = d.name[4:].split("-", 1)[0].split(".", 1)[0]
                    snapshots.setdefault(fp, []).append((d.path, d.stat(follow_symlinks=False).st_mtime))
            except OSError:
                continue
        by_use = sorted(snapshots.values(), key=lambda files: -max(m for _, m in files))
        for rank, files in enumerate(by_use):
            if rank >= KEEP_SNAPSHOTS or max(m for _, m in files) < cutoff:
                for path, _ in files:
                    removed += _unlink(path)
        return removed

    @staticmethod
    def _used(path: str) -> None:
        """Mark a cache file as used now (the prune keeps what was used last)."""
        try:
            os.utime(path)
        except OSError:
            pass

    # ------------------------------------------------------------ entries
    def _key(self, path: str, digest: str, opts) -> str:
        memo = self.__dict__.setdefault("_keys", {})
        k = (path, digest, id(opts))
        got = memo.get(k)
        if got is None:
            got = memo[k] = self._make_key(path, digest, opts)
        return got

    def _make_key(self, path: str, digest: str, opts) -> str:
        fp = self._fingerprint(opts)
        memo = self.__dict__.setdefault("_key_heads", {})
        head = memo.get(fp)
        if head is None:  # the version and the options: hashed once per run
            head = memo[fp] = hashlib.sha256(__version__.encode() + fp.encode())
        h = head.copy()
        h.update((abspath(path) + digest).encode("utf-8", "surrogateescape"))  # undecodable names too
        return h.hexdigest()

    def _file(self, key: str) -> str:
        return os.path.join(self._vdir, key[:2], key + ".json")

    def get(self, path: str, opts):
        from .engine import FileResult

        digest = self.run_hash(path)
        if digest is None:
            return None
        key = self._key(path, digest, opts)
        snap = self._full_snapshot(opts)
        if key in snap:  # unchanged since the last run: no entry file to open
            try:
                r = FileResult.lazy(snap[key], _Pending(self._store, key))
                r.from_last_run = True  # consistent with the other results of that run
                self.hits += 1
                return r
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        d = self._read_json(self._file(key), lambda d: integrity.result(d.get("result")))
        try:
            r = FileResult.from_json(d["result"]) if d is not None else None
        except (ValueError, KeyError, TypeError, AttributeError):
            r = None
        if r is None:
            self.misses += 1
            return None
        self._used(self._file(key))
        self.hits += 1
        return r

    def put(self, path: str, opts, result) -> None:
        if result is None or result.error or result.internal_error or not self._ensure():
            return
        ap = abspath(path)
        seen = self._seen.get(ap)
        try:
            st = os.stat(ap)
        except OSError:
            return
        if seen is not None and seen[0] == st.st_mtime_ns and seen[1] == st.st_size:
            digest = seen[2]
        else:  # not looked up before, or changed since: hash what is there now
            self._seen.pop(ap, None)
            self._load_index().pop(ap, None)
            digest = self.content_hash(ap)
            if digest is None:
                return
        key = self._key(path, digest, opts)
        if self._write_json(self._file(key), {"version": __version__, "result": result.to_json()}):
            # the entry of the file's content in the last run is superseded (the file changed)
            self._full_snapshot(opts)
            old = self._last_keys.get(ap) if self.__dict__.get("_full_fp") == self._fingerprint(opts) else None
            if old is not None and old != key:
                _unlink(self._file(old))

    # ------------------------------------------------------------ snapshot of a whole run
    # A run where nothing changed (every file's entry key is the one of the last run, same
    # files, same order, same options) gets the last run's findings from one small file:
    # no entry is opened and no cross-module answer is checked, since that run ended with
    # every answer consistent.
    def _snapshot_file(self, opts, part: str = "") -> str:
        return os.path.join(self._vdir, f"run-{self._fingerprint(opts)}{part}")

    def _full_snapshot(self, opts) -> dict:
        """The last run's results by entry key (one file read instead of one per entry); their
        exports stay in one blob until something looks at them."""
        if self._full is None:
            self._full, self._full_paths, self._store, self._last_keys = {}, None, None, {}
            self._full_fp = self._fingerprint(opts)
            f = self._snapshot_file(opts, "-index.json")
            d = self._read_json(f)
            blob = self._map(self._snapshot_file(opts, "-exports.bin")) if d is not None else None
            token = d.get("token") if d is not None else None
            # the index is sealed and holds the blob's sha256: the blob is the one written with it
            if blob is not None and isinstance(token, str) and blob[:len(token)] == token.encode() \
                    and integrity.snapshot_index(d, __version__, len(blob) - len(token)) \
                    and hashlib.sha256(blob).hexdigest() == d["blob"]:
                self._store = _Snapshot(memoryview(blob)[len(token):], d["spans"], d["called"], d["qspans"])
                self._full = d["results"]
                self._full_paths = d.get("paths")
                keys = d.get("keys")
                if isinstance(self._full_paths, list) and isinstance(keys, list) \
                        and len(keys) == len(self._full_paths):
                    self._last_keys = dict(zip(self._full_paths, keys))
            else:
                if blob is not None:
                    integrity.note("invalid", self._name(f))
                if isinstance(blob, mmap.mmap):
                    blob.close()
            if self._store is not None:
                self._used(f)
        return self._full

    def last_exports(self, path: str, opts) -> Optional[tuple]:
        """What ``path`` exported in the last run: its module key and its exports (as
        ``FileResult.exports`` gives them); ``None`` when that run did not lint it."""
        self._full_snapshot(opts)
        key = self._last_keys.get(abspath(path))
        if key is None or self._store is None or key not in self._full or key not in self._store.spans:
            return None
        d = self._store.load(key)
        return (self._full[key].get("module", ""), d) if d else None

    def files_gone_since_last_run(self, files, opts) -> bool:
        """Whether a file of the last run is no longer linted (its importers' answers change
        although no file linted now is that module); ``True`` when unknown."""
        self._full_snapshot(opts)
        if not isinstance(self._full_paths, list):
            return True
        return bool(set(self._full_paths) - {abspath(f) for f in files})

    def _run_digest(self, files, opts) -> Optional[str]:
        h = hashlib.sha256()
        for f in files:
            digest = self.run_hash(f)
            if digest is None:
                return None
            h.update(self._key(f, digest, opts).encode())
            h.update(b"\0")
        return h.hexdigest()

    def get_run(self, files, opts) -> Optional[list]:
        """The results of the last run if it linted exactly these files, unchanged."""
        from .engine import FileResult

        digest = self._run_digest(files, opts)
        f = self._snapshot_file(opts, ".json")
        data = self._read_bytes(f) if digest is not None else None
        if data is None or digest.encode() not in integrity.payload_head(data):
            return None  # another run's: not worth checking
        d = integrity.loads(self._open(f, data))
        if d is None:
            return None
        if not integrity.run_snapshot(d, __version__, digest, len(files)):
            integrity.note("invalid", self._name(f))
            return None
        try:
            out = [FileResult.from_json(r) for r in d["results"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        self._used(self._snapshot_file(opts, ".json"))
        self.hits += len(out)
        return out

    def put_run(self, files, opts, results) -> None:
        """Remember this run's findings for :meth:`get_run` (only when every result is
        cacheable: an unreadable file or an internal error is retried next time), and its
        results for the next run where something changed: an index (findings, questions,
        where each result's exports are) and one blob of exports, copied as they are for the
        results that were not read."""
        self._put_run(files, opts, results)

    def _put_run(self, files, opts, results) -> None:
        from .project import called_counts

        if any(r is None or r.error or r.internal_error for r in results) or not self._ensure():
            return
        digest = self._run_digest(files, opts)
        if digest is None:
            return
        token = os.urandom(16).hex()
        blob = bytearray(token.encode())
        lite, full, spans, qspans, keys = [], {}, {}, {}, []
        for f, r in zip(files, results):
            d = r.to_lite_json(queries=False)
            h = self.run_hash(f)
            if h is not None:
                key = self._key(f, h, opts)
                keys.append(key)
                full[key] = d
                # read or not, a result of the last run's snapshot has its exports and its
                # questions there: copied as they are
                src = r.__dict__.get("_lazy")
                try:
                    raw = bytes(src.store.raw(src.key)) if src is not None else json.dumps(r.exports()).encode()
                    rawq = bytes(src.store.raw_queries(src.key)) if src is not None \
                        and "queries" not in r.__dict__ else json.dumps(r.query_texts()).encode()
                except (TypeError, ValueError, KeyError):
                    return  # not serialisable: no snapshot (each file's entry is still written)
                spans[key] = [len(blob) - len(token), len(raw)]
                blob += raw
                qspans[key] = [len(blob) - len(token), len(rawq)]
                blob += rawq
            else:
                keys.append(None)
            lite.append(dict(d, summaries={}, classes={}, reexports={}, called=[], stars=[], queries=[]))
        called = called_counts(results)
        # the blob first: an index is never paired with another run's blob (the token)
        if self._userkey is not None and self._write_bytes(self._snapshot_file(opts, "-exports.bin"), bytes(blob)):
            self._write_json(self._snapshot_file(opts, "-index.json"), {
                "version": __version__, "results": full, "spans": spans, "qspans": qspans, "called": called,
                "token": token, "blob": hashlib.sha256(blob).hexdigest(),
                "paths": [abspath(p) for p in files], "keys": keys})
        self._write_json(self._snapshot_file(opts, ".json"),
                         {"version": __version__, "digest": digest, "results": lite})


def _unlink(path: str) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


class _Snapshot:
    """The exports and the questions of the last run's results: one blob, each result's part
    parsed when read."""

    def __init__(self, blob, spans: dict, called: dict, qspans: dict):
        self.blob, self.spans, self.called, self.qspans = blob, spans, called, qspans

    def raw(self, key: str):
        off, n = self.spans[key]
        return self.blob[off:off + n]

    def raw_queries(self, key: str):
        off, n = self.qspans[key]
        return self.blob[off:off + n]

    def load(self, key: str) -> dict:
        try:
            d = integrity.loads(self.raw(key))
        except (KeyError, ValueError, TypeError):
            d = None
        return d if integrity.exports(d) else {}

    def load_queries(self, key: str) -> list:
        try:
            q = integrity.loads(self.raw_queries(key))
        except (KeyError, ValueError, TypeError):
            q = None
        return q if isinstance(q, list) and all(type(x) is str for x in q) else []

    def called_counts(self, keys) -> dict:
        """The calls-from-other-modules counts of the results ``keys`` (the snapshot's totals
        less those of its results that are not among them)."""
        keys = frozenset(keys)
        memo = self.__dict__.setdefault("_memo", {})
        if keys in memo:
            return memo[keys]
        total = {q: list(c) for q, c in self.called.items()}
        for k in self.spans:
            if k not in keys:
                for q, off in self.load(k).get("called", ()):
                    c = total.get(q)
                    if c:
                        c[0] -= 1
                        c[1] -= bool(off)
        memo.clear()
        got = memo[keys] = {q: c for q, c in total.items() if c[0] > 0}
        return got  # shared: callers copy the counts

    def called_sets(self, keys) -> tuple:
        """The qualnames :meth:`called_counts` counts, and those called only under
        ``no_grad`` (shared: callers copy them)."""
        counts = self.called_counts(keys)
        memo = self.__dict__.setdefault("_sets", {})
        got = memo.get(id(counts))
        if got is None or got[0] is not counts:
            memo.clear()
            got = memo[id(counts)] = (counts, frozenset(counts), frozenset(
                q for q, (n, under) in counts.items() if n and under == n))
        return got[1], got[2]


class _Pending:
    """Where a lazy result's exports are."""

    __slots__ = ("store", "key")

    def __init__(self, store: _Snapshot, key: str):
        self.store, self.key = store, key

    def load(self) -> dict:
        return self.store.load(self.key)

    def load_queries(self) -> list:
        return self.store.load_queries(self.key)

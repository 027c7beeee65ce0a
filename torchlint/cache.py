"""The result cache in `.torchlint_cache/`.

An entry is keyed on the file's path and content hash, the torchlint version and the
effective options; it stores the findings, the summaries the module exports and the
cross-module questions its rules asked.  The engine re-lints a cached file when the
answers to those questions changed (an imported module was edited).  Entries that are
corrupt, truncated, from another version or owned by another user are ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Optional

from . import __version__

_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
        "# This file is a cache directory tag created by torchlint.\n"
        "# For information about cache directory tags see https://bford.info/cachedir/\n")


class Cache:
    def __init__(self, directory: str):
        self.dir = directory
        self._ready = False
        self.hits = 0
        self.misses = 0

    def _ensure(self) -> bool:
        if self._ready:
            return True
        try:
            os.makedirs(os.path.join(self.dir, "v" + __version__), exist_ok=True)
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

    def _key(self, path: str, data: bytes, opts) -> str:
        h = hashlib.sha256()
        h.update(__version__.encode())
        h.update(opts.fingerprint().encode())
        h.update(os.path.abspath(path).encode())
        h.update(hashlib.sha256(data).digest())
        return h.hexdigest()

    def _file(self, key: str) -> str:
        return os.path.join(self.dir, "v" + __version__, key[:2], key + ".json")

    def get(self, path: str, opts):
        from .engine import FileResult

        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        f = self._file(self._key(path, data, opts))
        try:
            st = os.stat(f)
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                return None
            with open(f, encoding="utf-8") as fh:
                d = json.load(fh)
            if d.get("version") != __version__:
                return None
            r = FileResult.from_json(d["result"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.misses += 1
            return None
        self.hits += 1
        return r

    def put(self, path: str, opts, result) -> None:
        if result is None or result.error or result.internal_error or not self._ensure():
            return
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return
        f = self._file(self._key(path, data, opts))
        try:
            os.makedirs(os.path.dirname(f), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(f), suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": __version__, "result": result.to_json()}, fh)
            os.replace(tmp, f)
        except (OSError, TypeError, ValueError):
            try:
                os.unlink(tmp)
            except Exception:
                pass

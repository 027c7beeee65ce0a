"""Reading source files: bytes -> text, remembering encoding, BOM and line endings."""
from __future__ import annotations

import codecs
import io
import re
import tokenize
from dataclasses import dataclass


class SourceError(Exception):
    """A file that cannot be read or decoded (reported on stderr, exit 2)."""


@dataclass
class SourceFile:
    path: str
    text: str
    encoding: str = "utf-8"
    bom: bool = False
    data: bytes = b""


# source codecs that read UTF-8 and only rewrite newer syntax for older interpreters (the
# ``future-fstrings`` package turns f-strings into ``.format`` calls on Python < 3.6): on the
# interpreters torchlint supports the file is plain UTF-8 Python
_UTF8_TRANSFORM_CODECS = frozenset({"future_fstrings", "future-fstrings"})
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _transform_codec(data: bytes) -> bool:
    for line in data.splitlines()[:2]:
        m = _CODING.match(line)
        if m:
            return m.group(1).decode("ascii", "replace").lower() in _UTF8_TRANSFORM_CODECS
    return False


def decode(data: bytes, path: str = "<string>") -> SourceFile:
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if _transform_codec(data):
            try:
                return SourceFile(path, data.decode("utf-8-sig"), "utf-8", bom, data)
            except UnicodeDecodeError as err:
                raise SourceError(f"{path}: not valid UTF-8: {err.reason} at byte {err.start}") from None
        if "encoding" in str(exc) and b"coding" not in data[:400]:
            raise SourceError(f"{path}: not valid UTF-8 (and no encoding declaration)") from None
        raise SourceError(f"{path}: cannot determine the encoding: {exc}") from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        name = "UTF-8" if encoding.lower().replace("_", "-") in ("utf-8", "utf8", "utf-8-sig") else encoding
        raise SourceError(f"{path}: not valid {name}: {exc.reason} at byte {exc.start}"
                          if isinstance(exc, UnicodeDecodeError) else f"{path}: unknown encoding {encoding!r}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    return SourceFile(path, text, encoding, bom, data)


def read_source(path: str) -> SourceFile:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except IsADirectoryError:
        raise SourceError(f"{path}: is a directory") from None
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return decode(data, path)


def encode(src: SourceFile, text: str) -> bytes:
    out = text.encode(src.encoding)
    if src.bom:
        out = codecs.BOM_UTF8 + out
    return out

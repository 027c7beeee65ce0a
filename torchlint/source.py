"""Reading source files: bytes -> text, remembering encoding, BOM and line endings."""
from __future__ import annotations

import codecs
import io
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


def decode(data: bytes, path: str = "<string>") -> SourceFile:
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
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

"""Configuration: `[tool.torchlint]` in pyproject.toml or a torchlint.toml, plus the command line."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(Exception):
    """Bad configuration: names the file, the key and what was expected (exit 2)."""


DEFAULT_EXCLUDE = [
    ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", ".eggs", "__pycache__", "build",
    "dist", "node_modules", "site-packages", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    ".torchlint_cache", "_build", "buck-out", ".ipynb_checkpoints",
]

_LIST_KEYS = ("select", "ignore", "extend-select", "extend-ignore", "exclude", "extend-exclude",
              "fixable", "unfixable")
_KNOWN = set(_LIST_KEYS) | {"per-file-ignores", "allow-grad-data", "respect-gitignore",
                            "cache-dir", "follow-symlinks", "dynamic"}


@dataclass
class Config:
    select: list = field(default_factory=lambda: ["TL"])
    ignore: list = field(default_factory=list)
    extend_select: list = field(default_factory=list)
    per_file_ignores: dict = field(default_factory=dict)
    exclude: list = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    extend_exclude: list = field(default_factory=list)
    respect_gitignore: bool = True
    follow_symlinks: bool = False
    allow_grad_data: bool = True
    cache_dir: Optional[str] = None
    path: Optional[str] = None  # the file it came from
    root: str = "."  # the directory of that file (or cwd)
    fixable: list = field(default_factory=lambda: ["TL"])
    unfixable: list = field(default_factory=list)

    def rule_settings(self) -> dict:
        return {"allow-grad-data": self.allow_grad_data}

    def fingerprint(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if k not in ("path", "root", "cache_dir")}
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_config_file(start: str) -> Optional[str]:
    d = os.path.abspath(start)
    if os.path.isfile(d):
        d = os.path.dirname(d)
    while True:
        for name in ("torchlint.toml", ".torchlint.toml"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                return p
        p = os.path.join(d, "pyproject.toml")
        if os.path.isfile(p):
            try:
                with open(p, "rb") as fh:
                    if _configures_torchlint(fh.read()):
                        return p
            except OSError:
                pass
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _configures_torchlint(data: bytes) -> bool:
    """Whether a pyproject.toml has a ``tool.torchlint`` table, in whatever TOML spelling
    (``[tool.torchlint]``, ``[tool]`` + ``torchlint.ignore = …``, ``tool.torchlint.select = …``).
    One that does not parse is ours if it seems to be (its error is then reported)."""
    if b"torchlint" not in data:
        return False
    try:
        table = tomllib.loads(data.decode("utf-8")).get("tool", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return b"[tool.torchlint" in data or b"torchlint." in data
    return isinstance(table, dict) and "torchlint" in table


def check_cache_dir(cache_dir: str, root: str, where: str, shown: Optional[str] = None) -> None:
    """Refuse a cache folder that is not torchlint's own: torchlint writes a ``CACHEDIR.TAG``
    (backup tools skip the folder) and a ``.gitignore`` of ``*`` (git ignores everything in
    it) into its cache folder, so the project's folder, a folder above it, or a folder that
    already holds other files must never be one."""
    real, top = os.path.realpath(cache_dir), os.path.realpath(root)
    shown = shown or cache_dir
    if real == top or top.startswith(real.rstrip(os.sep) + os.sep):
        raise ConfigError(f"{where}: `{shown}` is the project's folder or a folder above it; the cache needs "
                          "a folder of its own (torchlint writes a CACHEDIR.TAG and a .gitignore of `*` there), "
                          "such as `.torchlint_cache`")
    try:
        entries = os.listdir(real)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise ConfigError(f"{where}: `{shown}` is not a folder") from None
    except OSError:
        return  # unreadable: the cache then stays off (see Cache)
    if entries and "CACHEDIR.TAG" not in entries:
        raise ConfigError(f"{where}: `{shown}` already holds other files; the cache needs a folder of its own "
                          "(torchlint writes a CACHEDIR.TAG and a .gitignore of `*` there)")


def load_config(path: Optional[str] = None, start: str = ".") -> Config:
    if path is None:
        path = find_config_file(start)
    if path is None:
        return Config(root=os.path.abspath(start if os.path.isdir(start) else os.path.dirname(start) or "."))
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (TOML files are UTF-8): {exc.reason} at byte {exc.start}") from None
    if os.path.basename(path) == "pyproject.toml":
        table = data.get("tool", {}).get("torchlint", {})
        prefix = "tool.torchlint"
    else:
        table = data
        prefix = ""
    return from_table(table, path, prefix)


def _key(prefix: str, k: str) -> str:
    return f"{prefix}.{k}" if prefix else k


def from_table(table: dict, path: str, prefix: str = "tool.torchlint") -> Config:
    from .selection import validate_codes

    if not isinstance(table, dict):
        raise ConfigError(f"{path}: `{prefix}` must be a table")
    cfg = Config(path=path, root=os.path.dirname(os.path.abspath(path)))
    for k, v in table.items():
        if k not in _KNOWN:
            raise ConfigError(f"{path}: unknown key `{_key(prefix, k)}` (expected one of: "
                              f"{', '.join(sorted(_KNOWN))})")
        if k in _LIST_KEYS:
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigError(f"{path}: `{_key(prefix, k)}` must be a list of strings, got {v!r}")
            if k in ("select", "ignore", "extend-select", "extend-ignore", "fixable", "unfixable"):
                validate_codes(v, f"{path}: `{_key(prefix, k)}`")
        if k == "per-file-ignores":
            if not isinstance(v, dict) or not all(
                    isinstance(a, str) and isinstance(b, list) and all(isinstance(c, str) for c in b)
                    for a, b in v.items()):
                raise ConfigError(f"{path}: `{_key(prefix, k)}` must be a table of glob = [codes]")
            for glob, codes in v.items():
                validate_codes(codes, f"{path}: `{_key(prefix, k)}.\"{glob}\"`")
        if k in ("allow-grad-data", "respect-gitignore", "follow-symlinks") and not isinstance(v, bool):
            raise ConfigError(f"{path}: `{_key(prefix, k)}` must be true or false, got {v!r}")
        if k == "cache-dir" and not isinstance(v, str):
            raise ConfigError(f"{path}: `{_key(prefix, k)}` must be a string, got {v!r}")
    cfg.select = table.get("select", cfg.select)
    cfg.ignore = table.get("ignore", []) + table.get("extend-ignore", [])
    cfg.extend_select = table.get("extend-select", [])
    cfg.per_file_ignores = table.get("per-file-ignores", {})
    cfg.exclude = table.get("exclude", cfg.exclude)
    cfg.extend_exclude = table.get("extend-exclude", [])
    cfg.respect_gitignore = table.get("respect-gitignore", True)
    cfg.follow_symlinks = table.get("follow-symlinks", False)
    cfg.allow_grad_data = table.get("allow-grad-data", True)
    cfg.fixable = table.get("fixable", cfg.fixable)
    cfg.unfixable = table.get("unfixable", [])
    if "cache-dir" in table:
        cfg.cache_dir = os.path.join(cfg.root, table["cache-dir"])
        check_cache_dir(cfg.cache_dir, cfg.root, f"{path}: `{_key(prefix, 'cache-dir')}`", table["cache-dir"])
    # `dynamic` is accepted but never acts on its own: the dynamic mode needs the command line.
    return cfg

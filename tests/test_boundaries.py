"""The engine's boundaries, as docs/architecture.md draws them: ``engine`` and ``schedule``
use each other's public names only, and the project index is built in one place
(``project.Workspace``), which the CLI, the fixer and the language server all go through."""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "torchlint")


def _tree(name):
    with open(os.path.join(PKG, name), encoding="utf-8") as fh:
        return ast.parse(fh.read())


def _names_used_of(tree, module: str) -> set:
    """Names imported from ``torchlint.<module>`` (``from .module import x``) or read as
    ``module.x`` after ``import``/``from . import module``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in (module, f"torchlint.{module}"):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == module:
            out.add(node.attr)
    return out


def test_engine_and_schedule_use_each_others_public_names_only():
    from_schedule = _names_used_of(_tree("engine.py"), "schedule")
    from_engine = _names_used_of(_tree("schedule.py"), "engine")
    assert from_schedule and from_engine  # (they do use each other)
    assert not [n for n in from_schedule | from_engine if n.startswith("_")], (from_schedule, from_engine)


def test_the_project_index_is_built_only_by_the_workspace():
    """Outside ``project.py`` no module constructs a ``ProjectIndex`` or its module table;
    the CLI (``engine.run``), the fixer and the language server make a ``Workspace``."""
    for folder in (PKG, os.path.join(ROOT, "rules")):
        for dirpath, _, names in os.walk(folder):
            for n in names:
                path = os.path.join(dirpath, n)
                if not n.endswith(".py") or path == os.path.join(PKG, "project.py"):
                    continue
                with open(path, encoding="utf-8") as fh:
                    src = fh.read()
                assert not re.search(r"\bProjectIndex(\(|\.for_files\b)", src), path
    for n in ("engine.py", "fixer.py", "lsp.py"):
        with open(os.path.join(PKG, n), encoding="utf-8") as fh:
            assert "Workspace(" in fh.read(), n

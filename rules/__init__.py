"""torchlint's rules, one module per family. Importing this package registers them all."""
from __future__ import annotations

RULES: list = []


def register(cls):
    """Class decorator: add a rule to the catalogue."""
    RULES.append(cls)
    return cls


from . import loop_order, mode  # noqa: E402,F401

# the families in the order their rules run (then any other module of this package: a new
# family is registered by its file alone)
for _name in ("amp", "autograd", "loss", "memory", "device", "data", "debug", "state"):
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # a family not written yet
        if exc.name != f"{__name__}.{_name}":
            raise


def _import_the_other_families() -> None:
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    for fname in sorted(os.listdir(here)):
        mod = fname[:-3]
        if fname.endswith(".py") and mod.isidentifier() and not mod.startswith("_"):
            __import__(f"{__name__}.{mod}")  # (a module imported already is not run again)


_import_the_other_families()

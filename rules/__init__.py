"""torchlint's rules, one module per family. Importing this package registers them all."""
from __future__ import annotations

RULES: list = []


def register(cls):
    """Class decorator: add a rule to the catalogue."""
    RULES.append(cls)
    return cls


from . import loop_order, mode  # noqa: E402,F401

for _name in ("amp", "autograd", "loss", "memory", "device", "data", "debug", "state"):
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # a family not written yet
        if exc.name != f"{__name__}.{_name}":
            raise

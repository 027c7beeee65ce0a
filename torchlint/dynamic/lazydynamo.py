"""Defer ``import torch._dynamo`` in the child until something really uses it.

An eager training program pays for torch's compiler without using it: every optimizer imports
``torch._dynamo`` on its first ``add_param_group()`` (through ``torch._disable_dynamo``) and
again in every ``step()``, only to call ``torch._dynamo.graph_break()``. That import costs
2 s on a laptop CPU and about 7 s on the GPU machines we measured (``import torch`` itself
takes 5.5 s there), the largest part of confirming one finding.

Nothing can be compiling while ``torch._dynamo`` has never been imported (``torch.compile``
imports it), so until then ``graph_break()`` does nothing and ``disable(fn)`` is ``fn``. The
placeholder installed by :func:`install` answers those two names, and only while the real
module is not loaded; any other use (``torch.compile``, ``torch._dynamo.config``, a submodule
import, setting an attribute) imports the real module first and forwards to it, so a program
that compiles runs exactly as without the placeholder. A function wrapped by the placeholder's
``disable`` checks at every call whether the real module has arrived since, and then goes
through the real ``disable``.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types

NAME = "torch._dynamo"


def _real():
    """The real module if it has been imported, else None."""
    mod = sys.modules.get(NAME)
    return None if mod is None or isinstance(mod, Placeholder) else mod


def _graph_break() -> None:
    real = _real()
    if real is not None:
        real.graph_break()


def _disable(fn=None, recursive=True, **kwargs):
    if fn is None:
        return functools.partial(_disable, recursive=recursive, **kwargs)
    done = []

    def call(*args, **kw):
        real = _real()
        if real is None:
            return fn(*args, **kw)
        if not done:
            done.append(real.disable(fn, recursive, **kwargs))
        return done[0](*args, **kw)

    if kwargs.get("wrapping", True):
        functools.update_wrapper(call, fn)
    return call


_LAZY = {"graph_break": _graph_break, "disable": _disable}


class Placeholder(types.ModuleType):
    """Stands in ``sys.modules["torch._dynamo"]`` until the real module is needed."""

    def _load(self):
        real = _real()
        if real is None:
            import torch

            if sys.modules.get(NAME) is self:
                del sys.modules[NAME]
            if torch.__dict__.get("_dynamo") is self:
                del torch.__dict__["_dynamo"]
            real = importlib.import_module(NAME)
        return real

    def __getattr__(self, name):  # only for names the placeholder does not hold itself
        if name in _LAZY and _real() is None:
            return _LAZY[name]
        return getattr(self._load(), name)

    def __setattr__(self, name, value):
        setattr(self._load(), name, value)

    def __dir__(self):
        return dir(self._load())


def install() -> bool:
    """Put the placeholder in place if torch is imported and ``torch._dynamo`` is not yet.
    Returns whether it did."""
    torch = sys.modules.get("torch")
    if torch is None or NAME in sys.modules or "_dynamo" in torch.__dict__:
        return False
    spec = importlib.util.find_spec(NAME)  # locates the package without running it
    if spec is None:
        return False
    ph = Placeholder(NAME)
    object.__setattr__(ph, "__spec__", spec)
    object.__setattr__(ph, "__file__", spec.origin)
    object.__setattr__(ph, "__loader__", spec.loader)
    object.__setattr__(ph, "__package__", NAME)
    sys.modules[NAME] = ph
    torch.__dict__["_dynamo"] = ph
    return True

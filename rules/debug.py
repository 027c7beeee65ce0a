"""Debugging aids left switched on in training code."""
from __future__ import annotations

import libcst as cst

from torchlint.model import resources
from torchlint.model.binder import dotted
from torchlint.model.ir import CallOp, all_ops
from torchlint.model.queries import trains
from torchlint.rule import Report, Rule

from . import register


def _is_main_guard(test) -> bool:
    """``if __name__ == "__main__":``"""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = [test.left, test.comparisons[0].comparator]
    return any(isinstance(s, cst.Name) and s.value == "__name__" for s in sides)


def _unconditional(op) -> bool:
    return all(br.test is not None and _is_main_guard(br.test) for br, _ in op.guards) and \
        not resources.conditional_in_statement(op)


def _enables(op) -> bool:
    q = op.qual
    if q in resources.ANOMALY_CTX:
        return True
    a = op.arg(0, "mode")
    return a is not None and isinstance(a.value, cst.Name) and a.value.value == "True"


@register
class DetectAnomalyLeftOn(Rule):
    code = "TL801"
    name = "detect-anomaly-left-on"
    summary = "Autograd anomaly detection is switched on unconditionally for training."
    why = (
        "`torch.autograd.set_detect_anomaly(True)` / `detect_anomaly()` record a stack trace "
        "for every operation of the forward pass and check every backward result for NaNs. "
        "It is a debugging tool: left on, it slows training several times over (and adds "
        "synchronisations on the GPU) while looking like ordinary setup code."
    )
    example = """\
torch.autograd.set_detect_anomaly(True)

def main():
    for epoch in range(args.epochs):
        train(model, loader, optimizer)
"""
    use_instead = """\
if args.detect_anomaly:  # only while debugging
    torch.autograd.set_detect_anomaly(True)
"""
    known_problems = ("Calls guarded by any condition (a debug flag, an environment variable, a "
                      "command-line option) are trusted, as are calls in functions that neither "
                      "train nor are called by code that trains.")
    fix_safety = "unsafe"
    fix_doc = ("Removes the `set_detect_anomaly(True)` statement, or runs the body of "
               "`with detect_anomaly():` without it. Unsafe: whoever left it on may still be "
               "hunting a NaN; guard it with a debug flag instead if so.")
    references = ("https://pytorch.org/docs/stable/autograd.html#anomaly-detection",)
    triggers = (b"anomaly",)

    def check(self, mm):
        for fn in mm.all_functions:
            for op in all_ops(fn):
                if not isinstance(op, CallOp) or op.qual not in resources.ANOMALY_SET | resources.ANOMALY_CTX:
                    continue
                if not _enables(op) or not _unconditional(op):
                    continue
                where = None
                if fn.is_module_level:
                    where = "at import"
                elif trains(mm, fn.body):
                    where = f"in `{fn.name}()`, which trains"
                else:
                    for caller, cop in mm.callers(fn):
                        if _unconditional(cop) and (caller.is_module_level or trains(mm, caller.body)):
                            where = f"in `{fn.name}()`, called unconditionally before training"
                            break
                if where is None:
                    continue
                name = dotted(op.node.func) or "detect_anomaly"
                yield Report(op.node, f"`{name}(...)` switches autograd anomaly detection on {where}; "
                             "it slows every step several times over: guard it with a debug flag",
                             fix=_switch_off(fn, op), scope=fn.qualname)


def _switch_off(fn, op):
    """Fix (TL801): delete the ``set_detect_anomaly(True)`` statement, or run the body of
    ``with detect_anomaly():`` without it."""
    def make(mm):
        from torchlint.fixes import delete_statement, simple_statement, unwrap_with

        stmt = op.stmt
        if isinstance(stmt, cst.With):
            if len(stmt.items) != 1 or stmt.items[0].item is not op.node:
                return None
            return unwrap_with(mm, stmt, "Run the block without anomaly detection", "unsafe")
        stmt = simple_statement(op)
        if stmt is None:
            return None
        return delete_statement(mm, fn.node, stmt, "Remove the call (anomaly detection is for debugging)",
                                "unsafe")
    return make

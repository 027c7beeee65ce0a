"""The engine's use of the parser."""
import libcst as cst
import pytest

from torchlint.engine import parse_module


def test_parse_skips_node_validation_only_while_parsing():
    src = "def f(x):\n    return (x + 1)  # one\n\n\nclass A(nn.Module):\n    pass\n"
    module = parse_module(src)
    assert module.code == src
    assert module.deep_equals(cst.parse_module(src))
    # nodes built after the parse are validated again (a name with a space is rejected)
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not valid")


def test_a_linted_file_leaves_no_cycle_that_holds_its_tree_or_model():
    """The cyclic collector is off during a lint; the model's cycles are broken at the end so
    that refcounting frees the libcst tree at once (nothing of it left for the collector)."""
    import gc
    import glob
    import os

    from torchlint.engine import LintOptions, lint_text
    from torchlint.selection import enabled_codes

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # every third fixture (a fixed stride over the sorted list: every family, the same sample on
    # every run); the property holds file by file
    files = sorted(glob.glob(os.path.join(root, "fixtures", "**", "*.py"), recursive=True))[::3]
    assert len(files) > 40
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
    texts = [(p, open(p, encoding="utf-8").read()) for p in files]
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        findings = sum(len(lint_text(p, t, opts).findings) for p, t in texts)
        gc.collect()
        leaked = [o for o in gc.garbage
                  if isinstance(o, cst.CSTNode) or type(o).__module__.startswith("torchlint.model")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_on:
            gc.enable()
    assert findings > 40  # the files were really linted (the bad fixtures have findings)
    assert leaked == []

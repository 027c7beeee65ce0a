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

"""The default rule set: preview rules (off unless selected by their code) and the test-code
exemption (decided once, in the engine, for the rules whose findings are harmless in tests)."""
import json
import subprocess
import sys
import textwrap

from torchlint.engine import LintOptions, lint_text
from torchlint.rule import all_rules
from torchlint.selection import enabled_codes, is_test_path, preview_codes


def tl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_preview_rules_run_only_when_selected_by_code():
    preview = preview_codes()
    assert preview == {c for c, r in all_rules().items() if not r.default}
    assert "TL202" in preview
    assert "TL202" not in enabled_codes(["TL"], [], [])
    assert "TL202" not in enabled_codes(["TL2"], [], [])
    assert "TL202" not in enabled_codes(["ALL"], [], [])
    assert "TL202" in enabled_codes(["TL202"], [], [])
    assert "TL202" in enabled_codes(["TL"], [], ["TL202"])
    assert "TL202" not in enabled_codes(["TL"], ["TL202"], ["TL202"])
    assert "TL203" in enabled_codes(["TL2"], [], [])
    # TL201 was a default rule for one session and is preview again: precise on the tuned part,
    # not on the held-out batches (its preview_reason gives the numbers)
    assert "TL201" in preview and "TL201" not in enabled_codes(["TL2"], [], [])
    # TL601 and TL204 found no real bug on the held-out batches as first scored: preview since the
    # sixteenth session, still run when selected by code
    for code in ("TL601", "TL204"):
        assert code in preview and code not in enabled_codes(["TL"], [], [])
        assert code in enabled_codes(["TL"], [], [code])


def test_rules_listing_and_rule_page_mark_preview_rules():
    r = tl("rules")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("TL202"))
    assert "[preview]" in line
    assert "[preview]" not in next(ln for ln in r.stdout.splitlines() if ln.startswith("TL203"))
    rows = {x["code"]: x for x in json.loads(tl("rules", "--output-format", "json").stdout)}
    assert rows["TL202"]["preview"] is True and rows["TL203"]["preview"] is False
    assert rows["TL401"]["exempt_in_tests"] is False and rows["TL303"]["exempt_in_tests"] is True
    page = tl("rule", "TL202").stdout
    assert "Preview: off by default" in page and "--select TL202" in page


EVAL_SCRIPT = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 2))

        def forward(self, x):
            return self.body(x)


    def test(model, x):
        with torch.no_grad():
            return model.forward(x).argmax(dim=1)


    if __name__ == "__main__":
        print(test(Net(), torch.randn(4, 8)))
''')


def _codes(tmp_path, name, text, select=("TL",), ext=("TL201", "TL303")):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    opts = LintOptions(frozenset(enabled_codes(list(select), [], list(ext))), root=str(tmp_path))
    return sorted(f.code for f in lint_text(str(p), text, opts, module_name=p.stem).findings)


def test_test_modules_are_exempt_on_evidence_not_name(tmp_path):
    # an evaluation script named like a test is still linted: no test functions, no pytest
    assert _codes(tmp_path, "test_checkpoint.py", EVAL_SCRIPT) == ["TL303"]
    # a pytest module in tests/: the same code is a smoke test
    pytest_mod = "import pytest\n" + EVAL_SCRIPT.replace("def test(model, x)", "def test_predicts(model, x)")
    assert _codes(tmp_path, "tests/test_net.py", pytest_mod) == []
    assert _codes(tmp_path, "net_test.py", pytest_mod) == []
    # the same pytest module outside any test path is not test code: its test_predicts() calls
    # model.forward() (TL303); TL201 needs evidence that `model` has dropout or batch norm, and
    # no call site says what it is
    assert _codes(tmp_path, "net.py", pytest_mod) == ["TL303"]


def test_testcase_classes_are_exempt_wherever_they_are(tmp_path):
    src = EVAL_SCRIPT + textwrap.dedent('''\


        import unittest


        class NetTest(unittest.TestCase):
            def test_shape(self):
                net = Net()
                self.assertEqual(net.forward(torch.randn(2, 8)).shape, (2, 2))
    ''')
    # the script's own test() is evaluation code; only the TestCase is exempt
    assert _codes(tmp_path, "net.py", src) == ["TL303"]


def test_rules_not_exempt_in_tests_still_report_there(tmp_path):
    src = textwrap.dedent('''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        def test_loss_decreases():
            model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1))
            loss = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
            loss.backward()
    ''')
    assert _codes(tmp_path, "tests/test_head.py", src) == ["TL401"]


def test_test_paths_are_read_inside_the_project_root(tmp_path):
    root = tmp_path / "tests" / "checkout"
    assert is_test_path(str(root / "tests" / "test_a.py"), str(root))
    assert is_test_path(str(root / "pkg" / "conftest.py"), str(root))
    assert is_test_path(str(root / "pkg" / "model_tests.py"), str(root))
    assert not is_test_path(str(root / "train.py"), str(root))  # /tmp/.../tests/ is above the root
    assert not is_test_path(str(root / "contest.py"), str(root))
    assert not is_test_path(str(root / "latest_model.py"), str(root))

"""Property-based tests over generated training programs (a few hundred examples in CI;
benchmarks/fuzz.py runs 10,000)."""
import os

import libcst as cst
from collections import Counter

from hypothesis import HealthCheck, example, given, settings

from fuzz_programs import programs
from torchlint.engine import LintOptions, lint_text, run
from torchlint.selection import enabled_codes

OPTS = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
N = int(os.environ.get("TORCHLINT_FUZZ_EXAMPLES", "150"))


def _key(findings):
    return [(f.code, f.line, f.column, f.message) for f in findings]


@settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_no_internal_error_and_deterministic(src):
    a = lint_text("fuzz.py", src, OPTS, module_name="fuzz")
    assert not [f for f in a.findings if f.code in ("TL000", "TL001")], (src, a.findings)
    b = lint_text("fuzz.py", src, OPTS, module_name="fuzz")
    assert _key(a.findings) == _key(b.findings)


@settings(max_examples=max(N // 3, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
# a `no_grad` block removed (TL204's unsafe fix) around a second `total += loss`: that one is
# brought to light by the fix, the reported one after the block is fixed in the first run
@example(src='import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\nmodel = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\ncriterion = nn.CrossEntropyLoss()\ndata = TensorDataset(torch.randn(32, 8), torch.randint(0, 4, (32,)))\nloader = DataLoader(data, batch_size=4, shuffle=True)\n\n\ndef fit(args, epochs):\n    total, history = 0.0, []\n    for epoch in range(epochs):\n        for i, (x, y) in enumerate(loader):\n            with torch.no_grad():\n                loss.backward()\n                total += loss\n            total += loss\n')
def test_fixes_parse_and_converge(src):
    from torchlint.fixer import fix_text

    once = fix_text("fuzz.py", src, OPTS, unsafe=True)
    cst.parse_module(once.fixed)
    twice = fix_text("fuzz.py", once.fixed, OPTS, unsafe=True)
    if twice.fixed != once.fixed:
        # `--fix` edits only what `check` reported on the text it was given (the contract of
        # issue 21): a second run may fix a finding that the first run's fixes brought to light,
        # never one that check reported before, and a third run must change nothing
        def found(text):
            return Counter((f.code, f.fingerprint) for f in lint_text("fuzz.py", text, OPTS, module_name="fuzz").findings)
        before, after = found(src), found(once.fixed)
        applied = Counter((a.code, a.fingerprint) for a in once.applied)
        # more findings like it than the first run left of the reported ones: brought to light
        assert [k for k in after if after[k] > before[k] - applied[k]], (src, once.fixed)
        assert fix_text("fuzz.py", twice.fixed, OPTS, unsafe=True).fixed == twice.fixed


@settings(max_examples=max(N // 15, 5), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                               HealthCheck.function_scoped_fixture])
@given(programs())
def test_cache_and_processes_do_not_change_results(tmp_path_factory, src):
    from torchlint.cache import Cache

    d = tmp_path_factory.mktemp("fuzz")
    files = []
    for i in range(4):
        p = d / f"prog{i}.py"
        p.write_text(src)
        files.append(str(p))
    base = [_key(r.findings) for r in run(files, OPTS, jobs=1)]
    cache = Cache(str(d / ".cache"))
    cold = [_key(r.findings) for r in run(files, OPTS, jobs=2, cache=cache)]
    warm = [_key(r.findings) for r in run(files, OPTS, jobs=1, cache=cache)]
    assert base == cold == warm

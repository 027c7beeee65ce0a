"""benchmarks/planted.py: bugs planted into a correct training script are found where they were
planted, and the script itself (the unmutated text) gives no finding there."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

pytest.importorskip("libcst")
import planted  # noqa: E402

from torchlint.engine import LintOptions  # noqa: E402
from torchlint.project import Workspace  # noqa: E402
from torchlint.selection import enabled_codes, known_codes  # noqa: E402

GOOD = os.path.join(ROOT, "fixtures", "loop_order", "good", "grad_accum_step_every_k.py")


def _text(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_each_mutant_changes_one_place_and_still_compiles():
    text = _text(GOOD)
    ms = {m.op: m for m in planted.mutants(text)}
    # the script has an accumulation loop (backward, then step/zero_grad under the condition),
    # a CrossEntropyLoss, a shuffled loader, an evaluation under @no_grad and loss.item()
    assert {"drop-shuffle", "softmax-into-ce", "float-targets", "loss-item-dropped", "drop-zero-grad"} <= set(ms)
    for m in ms.values():
        compile(m.text, "<mutant>", "exec")
        assert m.text != text
    assert "shuffle=True" not in ms["drop-shuffle"].text.splitlines()[ms["drop-shuffle"].lo - 1]
    assert "running += loss\n" in ms["loss-item-dropped"].text
    assert "criterion(torch.softmax(model(batch_tokens), dim=1), batch_labels)" in ms["softmax-into-ce"].text
    assert "optimizer.zero_grad()" not in "".join(ms["drop-zero-grad"].text.splitlines(True)[
        ms["drop-zero-grad"].lo - 1:ms["drop-zero-grad"].hi])


def test_planted_bugs_are_found_where_planted(tmp_path):
    path = tmp_path / "train_topics.py"
    path.write_text(_text(GOOD), encoding="utf-8")
    ws = Workspace([str(path)])
    opts = LintOptions(enabled=frozenset(enabled_codes(("TL",), (), extend_select=tuple(known_codes()))))
    rows = planted.score_file(str(path), path.read_text(), opts, ws.index, "train_topics", False, 1)
    verdicts = {r["op"]: r["verdict"] for r in rows}
    # the correct script has none of these findings, so nothing is "already reported"
    assert "already" not in verdicts.values()
    for op in ("drop-shuffle", "softmax-into-ce", "float-targets", "drop-zero-grad"):
        assert verdicts[op] == "found", (op, rows)


def test_a_block_that_backwards_is_not_an_evaluation_to_strip_no_grad_from():
    text = (
        "import torch\n\n\ndef update(model, opt, loader):\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            loss = model(x).sum()\n"
        "            loss.backward()\n"
        "            opt.step()\n"
    )
    assert not [m for m in planted.mutants(text) if m.op == "drop-no-grad"]
    text2 = text.replace("            loss.backward()\n            opt.step()\n", "            print(loss)\n")
    (m,) = [m for m in planted.mutants(text2) if m.op == "drop-no-grad"]
    assert "with torch.no_grad()" not in m.text and "    for x, y in loader:\n        loss" in m.text

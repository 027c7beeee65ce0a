"""Notebooks as IPython runs them: every IPython form is code or skipped, a broken cell is one
TL001 and the other cells are still linted, messages cite cells, every output format points at
the right place, and `--diff`/`--fix` work on cells. The fixture notebooks' exact findings are
in fixtures/notebooks/expected.toml (tests/test_fixtures.py)."""
import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from torchlint.notebook import load, transform_cell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NB_DIR = os.path.join(ROOT, "fixtures", "notebooks")


def tl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _python(src: str) -> str:
    lines, _, _, _ = transform_cell(src.split("\n"))
    return "\n".join(lines)


# (a cell as typed in Jupyter, the Python torchlint lints in its place: same number of lines)
FORMS = [
    ("files = !ls data/*.csv\nprint(files)", "files = ...\nprint(files)"),
    ("a, b = !echo 1 2", "a, b = ..."),
    ("env = %env HOME", "env = ..."),
    ("x: int = %env X", "x: int = ..."),
    ("listing = !!ls", "listing = ..."),
    ("for i in range(2):\n    %time f(i)\n    !echo {i}\nprint('done')",
     "for i in range(2):\n    f(i)\n    pass\nprint('done')"),
    ("!pip install torch \\\n    torchvision \\\n    tqdm\nimport torch", "pass\n\n\nimport torch"),
    ("if x:\n    z = !ls \\\n      -la\n    y = 1", "if x:\n    z = ...\n\n    y = 1"),
    ("    import torch\n    x = torch.zeros(3)\n    if x.sum() == 0:\n        print(x)",
     "import torch\nx = torch.zeros(3)\nif x.sum() == 0:\n    print(x)"),
    ("\tmodel.eval()\n\n\tevaluate(model)", "model.eval()\n\nevaluate(model)"),
    ("torch.nn.Linear?\nnp.array??\n?len\n??len\nobj.attr[0]?\n%time?\n*int*?",
     "pass\npass\npass\npass\npass\npass\npass"),
    ("if 1:\n    model?", "if 1:\n    pass"),
    ("%%time\nfor i in range(3):\n    train(i)", "pass\nfor i in range(3):\n    train(i)"),
    ("%%timeit -n 1 -r 1\nvalidate(model, loader)", "pass\nvalidate(model, loader)"),
    ("%%capture log\n%time f()\nx = 1", "pass\nf()\nx = 1"),
    ("%%time\n  x = 1\n  y = 2", "pass\nx = 1\ny = 2"),
    ("%timeit -n 3 f(x)\n%time x = 3\n%prun -s cumulative train()\nprint(x)", "pass\nx = 3\npass\nprint(x)"),
    ("%load_ext autoreload\n%autoreload 2\n%matplotlib inline\n%cd ..", "pass\npass\npass\npass"),
    ("/print 1 2\n,f a b\n;f a b", "pass\npass\npass"),
    # automagic: a line magic without its % (on by default in IPython) when the line is not Python
    ("pip install -q diffusers \\\n    accelerate\nconda install -y ffmpeg\ncd ..\nimport torch",
     "pass\n\npass\npass\nimport torch"),
    ("for i in range(2):\n    time train(i)\nload_ext tensorboard", "for i in range(2):\n    train(i)\npass"),
    # ... and Python when it parses: a name that happens to be a magic's
    ("pip = 3\nls -la\ncd /content\ntime.sleep(1)\nrun (a,\n     b)\ncd = {'a': 1}",
     "pip = 3\nls -la\ncd /content\ntime.sleep(1)\nrun (a,\n     b)\ncd = {'a': 1}"),
    # not at the start of a logical line: Python, left alone
    ("s = '''\n!not a command\n%notmagic\n'''\nprint(s)", "s = '''\n!not a command\n%notmagic\n'''\nprint(s)"),
    ("total = (a\n         / b)\nrest = a \\\n    % b\nw = 5 % 3", "total = (a\n         / b)\nrest = a \\\n    % b\nw = 5 % 3"),
    ("x = 1  # why?\nd = {'%a': 1,\n     '!b': 2}", "x = 1  # why?\nd = {'%a': 1,\n     '!b': 2}"),
    # a cell saved with Windows line endings: Jupyter's editor splits lines on CRLF, so a `\`
    # before the `\r` continues the command
    ("!pip install -q torch \\\r\n    pandas\r\nimport torch\r\n", "pass\n\nimport torch\n"),
    # tabs and spaces mixed in a way CPython accepts (columns agree at tab sizes 8 and 1): the
    # tabs become spaces at size 8, which libcst's tokenizer reads as CPython does
    ("with open(p, 'w') as f:\t\n\t  f.write('id\\n')\n\t  for i in ids:\n        # a row\n\t\t    f.write(i)\nprint(p)",
     "with open(p, 'w') as f:\t\n          f.write('id\\n')\n          for i in ids:\n        # a row\n"
     "                    f.write(i)\nprint(p)"),
]


@pytest.mark.parametrize("cell, python", FORMS, ids=[f"form{i}" for i in range(len(FORMS))])
def test_ipython_forms_are_code_or_skipped(cell, python):
    got = _python(cell)
    assert got == python
    assert got.count("\n") == cell.count("\n")  # positions never move to another line
    ast.parse(got)


def test_a_tab_mix_cpython_rejects_is_still_a_syntax_error(tmp_path):
    # `\t` then 8 spaces: the same column at tab size 8, not at tab size 1 (TabError)
    cell = "for i in range(3):\n\tprint(i)\n        print(i * 2)"
    lines, off, _, _ = transform_cell(cell.split("\n"))
    assert lines == cell.split("\n") and off == [0, 0, 0]
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": cell},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "source": "x = 1"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "tabs.ipynb"
    path.write_text(json.dumps(nb))
    out = tl("check", "--select", "TL001", "--output-format", "concise", str(path)).stdout
    assert f"{path}:cell 1:" in out and "TL001" in out and "cell 2" not in out


def test_columns_in_a_line_whose_tabs_were_expanded_point_into_the_cell():
    lines, off, _, _ = transform_cell(["if x:", "\t  y = loss.data[0]", "\t  z = 1", "w = 2"])
    assert lines[1] == "          y = loss.data[0]" and off[1] == -7
    assert lines[1].index("loss") + off[1] == "\t  y = loss.data[0]".index("loss")


@pytest.mark.parametrize("magic", ["writefile train.py", "bash", "html", "javascript", "sh", "script python",
                                   "latex", "markdown", "sql"])
def test_cell_magics_without_python_are_skipped(magic):
    lines, _, _, skipped = transform_cell(f"%%{magic}\nprint(\nls -la".split("\n"))
    assert skipped == magic.split()[0] and lines == ["", "", ""]


def test_columns_map_back_into_shifted_lines():
    lines, offsets, synthetic, _ = transform_cell(["    for x in loader:", "        %time out = model(x)"])
    assert lines == ["for x in loader:", "    out = model(x)"]
    # column 4 of the program's second line ("out") is column 14 of the cell's line
    assert 4 + offsets[1] == "        %time out = model(x)".index("out")
    assert synthetic == set()


def _notebook(cells, path):
    doc = {"cells": [{"cell_type": k, "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                      "source": [ln + "\n" for ln in src.split("\n")[:-1]] + [src.split("\n")[-1]]}
                     if k == "code" else {"cell_type": k, "id": f"c{i}", "metadata": {}, "source": src}
                     for i, (k, src) in enumerate(cells)],
           "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(doc, indent=1))
    return path


SETUP = ("import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
         "loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8, "
         "shuffle=True)\nmodel = nn.Linear(8, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         "criterion = nn.CrossEntropyLoss()")
NO_ZERO_GRAD = "for x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n    optimizer.step()"


def test_broken_cell_is_reported_and_the_other_cells_are_linted(tmp_path):
    shutil.copy(os.path.join(NB_DIR, "finetune_head_broken_cell.ipynb"), tmp_path / "nb.ipynb")
    r = tl("nb.ipynb", "--no-cache", "--extend-select", "TL202", cwd=tmp_path)  # TL202 is a preview rule
    lines = r.stdout.splitlines()
    assert "nb.ipynb:cell 5:2:13: TL001 syntax error: '(' was never closed" in lines
    # the cells before and after the broken one are linted, and the output is in cell order
    codes = [ln.split(": ")[1].split()[0] for ln in lines if ":cell " in ln]
    cells = [int(ln.split(":cell ")[1].split(":")[0]) for ln in lines if ":cell " in ln]
    assert codes == ["TL701", "TL001", "TL202", "TL105"] and cells == sorted(cells)


def test_messages_cite_cell_and_line(tmp_path):
    shutil.copy(os.path.join(NB_DIR, "finetune_head_broken_cell.ipynb"), tmp_path / "nb.ipynb")
    data = json.loads(tl("nb.ipynb", "--no-cache", "--extend-select", "TL202", "--output-format", "json",
                         cwd=tmp_path).stdout)
    msgs = {d["code"]: d["message"] for d in data}
    assert "`evaluate()` at cell 3, line 1 switches it to eval mode" in msgs["TL202"]
    assert "before `optimizer.step()` (cell 6, line 8)" in msgs["TL105"]
    assert all("\n" not in m for m in msgs.values())
    assert [d["cell"] for d in data] == [2, 5, 6, 6]


def test_citations_of_a_function_of_the_notebook():
    from torchlint.notebook import _cite

    nb = load(os.path.join(NB_DIR, "gru_sentiment_validate_helper.ipynb"))
    first_of_cell_4 = nb.line_map.index((4, 1)) + 1
    msg = _cite(nb, f"`validate()` (nb.ipynb:{first_of_cell_4}) evaluates `model`", {"nb.ipynb"})
    assert msg == "`validate()` (cell 4, line 1) evaluates `model`"


def _flagged(raw_text: str, line: int, col: int) -> str:
    return raw_text.split("\n")[line - 1][col:]


def test_every_output_format_points_at_the_right_place(tmp_path):
    # a uniformly indented cell and a `%time` line inside a loop: columns shift
    nb = _notebook([("markdown", "# Exercise"), ("code", SETUP),
                    ("code", "    " + NO_ZERO_GRAD.replace("\n", "\n    ")),
                    ("code", "model.eval()\nfor x, y in loader:\n    %time preds = model(x).argmax(1)")],
                   tmp_path / "lab.ipynb")
    raw = nb.read_text()
    text = tl("lab.ipynb", "--no-cache", cwd=tmp_path).stdout.splitlines()
    assert text[:2] == [
        "lab.ipynb:cell 2:4:9: TL103 `optimizer.step()` runs in a loop that never clears gradients, so they "
        "accumulate across iterations",
        "lab.ipynb:cell 3:2:1: TL203 this evaluation loop runs the model without `torch.no_grad()` or "
        "`torch.inference_mode()`, so every forward pass builds an autograd graph"]
    data = json.loads(tl("lab.ipynb", "--no-cache", "--output-format", "json", cwd=tmp_path).stdout)
    assert [(d["cell"], d["location"]) for d in data] == [(2, {"row": 4, "column": 9}), (3, {"row": 2, "column": 1})]
    # no fix on lines IPython syntax changed (the cell would be broken)
    assert [d["fix"] for d in data] == [None, None]
    gh = tl("lab.ipynb", "--no-cache", "--output-format", "github", cwd=tmp_path).stdout.splitlines()
    for ann, want in zip(gh, ("optimizer.step()", "for x, y in loader:")):
        props = dict(kv.split("=") for kv in ann.split(" ", 1)[1].split("::")[0].split(","))
        assert _flagged(raw, int(props["line"]), int(props["col"]) - 1).startswith(want), ann
    assert "(cell 2, line 4)" in gh[0]
    sarif = json.loads(tl("lab.ipynb", "--no-cache", "--output-format", "sarif", cwd=tmp_path).stdout)
    for res, want in zip(sarif["runs"][0]["results"], ("optimizer.step()", "for x, y in loader:")):
        region = res["locations"][0]["physicalLocation"]["region"]
        assert _flagged(raw, region["startLine"], region["startColumn"] - 1).startswith(want)
    assert sarif["runs"][0]["results"][0]["properties"] == {"cell": 2, "cellLine": 4}
    lsp = json.loads(tl("lab.ipynb", "--no-cache", "--output-format", "lsp", cwd=tmp_path).stdout)
    (diags,) = lsp.values()
    for d, want in zip(diags, ("optimizer.step()", "for x, y in loader:")):
        start = d["range"]["start"]
        assert _flagged(raw, start["line"] + 1, start["character"]).startswith(want)


def test_raw_positions_whatever_the_json_layout(tmp_path):
    """Sources saved as one string, with non-ASCII escaped (json.dumps defaults)."""
    src = "# entraînement rapide\n" + SETUP + "\n" + NO_ZERO_GRAD
    doc = {"cells": [{"cell_type": "code", "metadata": {"source": "not this one"}, "outputs": [], "source": src}],
           "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "one.ipynb"
    path.write_text(json.dumps(doc))
    nb = load(str(path))
    line = src.split("\n").index("    optimizer.step()") + 1
    raw_line, raw_col = nb.raw_position(1, line, 4)
    assert _flagged(nb.raw, raw_line, raw_col).startswith("optimizer.step()")
    (raw_line, raw_col) = nb.raw_position(1, 1, 8)  # after "entraî": an escaped character before it
    assert _flagged(nb.raw, raw_line, raw_col).startswith("nement")


def test_diff_shows_notebook_changes_and_writes_nothing(tmp_path):
    nb = tmp_path / "nb.ipynb"
    shutil.copy(os.path.join(NB_DIR, "fashion_cnn.ipynb"), nb)
    before = nb.read_bytes()
    r = tl("nb.ipynb", "--no-cache", "--diff", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.startswith("--- nb.ipynb:cell 6\n+++ nb.ipynb:cell 6\n@@ -1,7 +1,8 @@\n")
    assert "+with torch.no_grad():\n" in r.stdout and "-for images, labels in val_loader:\n" in r.stdout
    assert "Would fix 1 error." in r.stderr
    assert nb.read_bytes() == before
    r = tl("nb.ipynb", "--no-cache", "--fix", cwd=tmp_path)
    assert nb.read_bytes() != before
    assert tl("nb.ipynb", "--no-cache", "--diff", cwd=tmp_path).stdout == ""


def test_a_notebook_of_only_skipped_or_broken_cells(tmp_path):
    _notebook([("code", "%%bash\nls"), ("code", "def f(:\n    pass"), ("code", "x = 1\n  y = 2")], tmp_path / "nb.ipynb")
    r = tl("nb.ipynb", "--no-cache", cwd=tmp_path)
    assert r.returncode == 1
    assert [ln.split(": TL")[0] for ln in r.stdout.splitlines() if "TL001" in ln] == [
        "nb.ipynb:cell 2:1:7", "nb.ipynb:cell 3:2:2"]


@pytest.mark.parametrize("with_tl001", [True, False])
def test_a_cell_only_libcst_rejects_is_left_out_too(tmp_path, monkeypatch, with_tl001):
    """Where the running Python accepts a cell that libcst cannot parse, the program's parse
    error is mapped to its cell, that cell is left out, and the others are linted."""
    from torchlint import engine
    from torchlint.engine import LintOptions, lint_path
    from torchlint.selection import enabled_codes

    monkeypatch.setattr(engine, "_stdlib_syntax_error", lambda text, path: None)
    nb = _notebook([("code", SETUP), ("code", "def plot(h):\n    plt.plot(h[\"acc\"]\n"), ("code", NO_ZERO_GRAD)],
                   tmp_path / "nb.ipynb")
    enabled = frozenset(enabled_codes(["TL"], [], []))
    res = lint_path(str(nb), LintOptions(enabled if with_tl001 else enabled - {"TL001"}))
    got = [(f.code, f.cell, f.line) for f in res.findings]
    assert got == ([("TL001", 2, 3)] if with_tl001 else []) + [("TL103", 3, 4)]


def test_noqa_in_cells_whatever_the_selection_and_the_cache(tmp_path):
    """A notebook's `# noqa` directives (in shifted and magic lines too) are kept with its
    cached result and applied when it is reported: a selection changed on a warm cache
    reports what --no-cache does, unused codes (TL002) at their place in the cell."""
    _notebook([("code", SETUP), ("markdown", "# train"),
               ("code", "    for x, y in loader:\n        loss = criterion(model(x), y)\n        loss.backward()\n"
                        "        optimizer.step()  # noqa: TL103, TL801"),
               ("code", "%time total = 1  # noqa: TL701\nprint(total)")], tmp_path / "nb.ipynb")
    cache = ["--cache-dir", str(tmp_path / "c")]
    tl("nb.ipynb", *cache, "--output-format", "json", cwd=tmp_path)
    got = {}
    for select in ("TL", "TL,TL002", "TL2,TL002"):
        args = ("nb.ipynb", "--select", select, "--output-format", "json")
        warm = json.loads(tl(*args, *cache, cwd=tmp_path).stdout)
        assert warm == json.loads(tl(*args, "--no-cache", cwd=tmp_path).stdout), select
        got[select] = [(d["code"], d["cell"], d["location"]["row"], d["location"]["column"],
                        d["fix"]["edits"][0]["location"]["column"] if d["fix"] else None) for d in warm]
    assert got["TL"] == []  # TL103 suppressed in the shifted cell
    assert got["TL,TL002"] == [("TL002", 2, 4, 27, 27), ("TL002", 3, 1, 18, 16)]
    # TL103 not selected: its code suppresses nothing either
    assert [g[:3] for g in got["TL2,TL002"]] == [("TL002", 2, 4), ("TL002", 3, 1)]

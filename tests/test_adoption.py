"""Meeting users where their code lives: notebooks, baselines, noqa tooling, flake8, CI habits."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "fixtures", "notebooks", "fashion_cnn.ipynb")

TRAIN = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    def fit(model, loader, optimizer, epochs):
        criterion = nn.CrossEntropyLoss()
        for epoch in range(epochs):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
''')


def tl(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


# ------------------------------------------------------------------ notebooks
def test_notebook_findings_report_cell_and_line(tmp_path):
    nb = tmp_path / "nb.ipynb"
    shutil.copy(NOTEBOOK, nb)
    r = tl("nb.ipynb", "--no-cache", cwd=tmp_path)
    assert r.returncode == 1
    assert "nb.ipynb:cell 6:3:1: TL203" in r.stdout
    data = json.loads(tl("nb.ipynb", "--no-cache", "--output-format", "json", cwd=tmp_path).stdout)
    assert data[0]["cell"] == 6 and data[0]["location"] == {"row": 3, "column": 1}


def test_notebook_sarif_and_lsp_point_into_the_ipynb_file(tmp_path):
    nb = tmp_path / "nb.ipynb"
    shutil.copy(NOTEBOOK, nb)
    raw = nb.read_text().splitlines()
    sarif = json.loads(tl("nb.ipynb", "--no-cache", "--output-format", "sarif", cwd=tmp_path).stdout)
    res = sarif["runs"][0]["results"][0]
    line = res["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert "for images, labels in val_loader" in raw[line - 1]
    assert res["properties"] == {"cell": 6, "cellLine": 3}
    lsp = json.loads(tl("nb.ipynb", "--no-cache", "--output-format", "lsp", cwd=tmp_path).stdout)
    (diag,) = next(iter(lsp.values()))
    assert "for images, labels in val_loader" in raw[diag["range"]["start"]["line"]]


def test_notebook_magics_do_not_shift_positions_and_noqa_works(tmp_path):
    doc = json.load(open(NOTEBOOK))
    cell = doc["cells"][7]
    cell["source"][2] = cell["source"][2].rstrip("\n") + "  # noqa: TL203\n"
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps(doc))
    r = tl("nb.ipynb", "--no-cache", cwd=tmp_path)
    assert r.returncode == 0, r.stdout


def test_notebook_fix_keeps_outputs_and_metadata(tmp_path):
    from torchlint.engine import LintOptions, lint_path
    from torchlint.notebook import apply_fixes, load
    from torchlint.selection import enabled_codes

    doc = json.load(open(NOTEBOOK))
    doc["cells"][5]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["CPU times: 1 s\n"]}]
    doc["metadata"]["custom"] = {"keep": True}
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps(doc, indent=1))
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
    res = lint_path(str(nb), opts)
    assert [f.code for f in res.findings] == ["TL203"]
    assert apply_fixes(str(nb), [f.fix for f in res.findings]) == 1
    after = json.load(open(nb))
    assert after["cells"][5]["outputs"] == doc["cells"][5]["outputs"]
    assert after["metadata"] == doc["metadata"]
    assert after["cells"][7]["source"][2] == "with torch.no_grad():\n"
    assert "".join(after["cells"][1]["source"]).startswith("!pip install")  # magics untouched
    assert lint_path(str(nb), opts).findings == []
    load(str(nb))  # still a valid notebook


# ------------------------------------------------------------------ baseline
def test_baseline_survives_an_edit_that_shifts_lines(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    r = tl("train.py", "--no-cache", "--write-baseline", "tl-baseline.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert tl("train.py", "--no-cache", "--baseline", "tl-baseline.json", cwd=tmp_path).returncode == 0
    # unrelated edit above the finding: everything shifts by three lines
    shifted = TRAIN.replace("import torch.nn as nn\n", "import torch.nn as nn\n\nSEED = 0\n# data lives in ./data\n")
    (tmp_path / "train.py").write_text(shifted)
    r = tl("train.py", "--no-cache", "--baseline", "tl-baseline.json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    # a new bug is still reported
    shifted += textwrap.dedent('''

        def fit_again(model, loader, optimizer):
            for x, y in loader:
                optimizer.step()
                model(x).sum().backward()
    ''')
    (tmp_path / "train.py").write_text(shifted)
    r = tl("train.py", "--no-cache", "--baseline", "tl-baseline.json", cwd=tmp_path)
    assert r.returncode == 1
    assert "TL101" in r.stdout and "TL103" not in r.stdout.split("TL101")[0]


def test_bad_baseline_is_a_clear_error(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "b.json").write_text("{not json")
    r = tl("train.py", "--baseline", "b.json", cwd=tmp_path)
    assert r.returncode == 2 and "not a torchlint baseline" in r.stderr


# ------------------------------------------------------------------ noqa tooling
def test_unused_noqa_is_reported_when_selected(tmp_path):
    src = TRAIN.replace("loss.backward()\n", "loss.backward()  # noqa: TL104\n")
    (tmp_path / "train.py").write_text(src)
    r = tl("train.py", "--no-cache", "--extend-select", "TL002", cwd=tmp_path)
    assert "TL002" in r.stdout and "TL104" in r.stdout
    r = tl("train.py", "--no-cache", cwd=tmp_path)
    assert "TL002" not in r.stdout  # opt-in


# ------------------------------------------------------------------ changed-since
@pytest.mark.skipif(shutil.which("git") is None, reason="git not available")
def test_changed_since_lints_changed_files_and_dependents(tmp_path):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e")
    (tmp_path / "engine.py").write_text("def step_all(optimizer):\n    optimizer.step()\n")
    (tmp_path / "train.py").write_text("from engine import step_all\n" + TRAIN)
    (tmp_path / "other.py").write_text(TRAIN)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, env=env)
    (tmp_path / "engine.py").write_text("def step_all(optimizer):\n    optimizer.step()  # edited\n")
    r = tl(".", "--no-cache", "--changed-since", "HEAD", cwd=tmp_path)
    assert "train.py" in r.stdout and "other.py" not in r.stdout
    r = tl(".", "--no-cache", "--changed-since", "no-such-rev", cwd=tmp_path)
    assert r.returncode == 2 and "no-such-rev" in r.stderr


# ------------------------------------------------------------------ flake8, -m, output file, progress
def test_flake8_plugin_runs_through_flake8(tmp_path):
    pytest.importorskip("flake8")
    (tmp_path / "train.py").write_text(TRAIN)
    r = subprocess.run([sys.executable, "-m", "flake8", "--select", "TL", "train.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("train.py:11:13: TL103 "), r.stdout + r.stderr


def _flake8_in_process(args, cwd):
    """flake8 in a fresh interpreter; its output, and whether torchlint's engine and libcst
    were imported (the analysis ran)."""
    code = ("import sys\n"
            "from flake8.main.application import Application\n"
            "app = Application()\n"
            f"app.run({list(args)!r})\n"
            "print('ANALYSED' if 'torchlint.engine' in sys.modules or 'libcst' in sys.modules else 'SKIPPED')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout


def test_flake8_plugin_costs_nothing_when_its_codes_are_not_selected(tmp_path):
    pytest.importorskip("flake8")
    (tmp_path / "train.py").write_text(TRAIN)
    out = _flake8_in_process(["--select", "E9", "train.py"], tmp_path)
    assert out == "SKIPPED\n"
    out = _flake8_in_process(["--select", "E9,TL1", "train.py"], tmp_path)
    assert out.startswith("train.py:11:13: TL103 ") and out.endswith("ANALYSED\n")
    # flake8's configuration file counts like the command line
    (tmp_path / ".flake8").write_text("[flake8]\nselect = E9,F\n")
    out = _flake8_in_process(["train.py"], tmp_path)
    assert out.endswith("SKIPPED\n")
    (tmp_path / ".flake8").write_text("[flake8]\nextend-ignore = TL\n")
    assert _flake8_in_process(["train.py"], tmp_path).endswith("SKIPPED\n")
    # a rule it does not select is not run (nor reported by flake8's filter)
    (tmp_path / ".flake8").write_text("[flake8]\nextend-ignore = TL103\n")
    out = _flake8_in_process(["train.py"], tmp_path)
    assert "TL103" not in out
    # a preview rule runs only when named by its full code, as with `torchlint`
    (tmp_path / ".flake8").unlink()
    (tmp_path / "train_epochs.py").write_text(TRAIN_AFTER_EVAL)
    assert "TL202" not in _flake8_in_process(["--select", "TL", "train_epochs.py"], tmp_path)
    out = _flake8_in_process(["--select", "TL202", "train_epochs.py"], tmp_path)
    assert out.startswith("train_epochs.py:19:30: TL202 "), out


TRAIN_AFTER_EVAL = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    def evaluate(model, loader):
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x).argmax(dim=1) == y).sum().item()
        return correct / len(loader.dataset)


    def fit(model, train_loader, val_loader, optimizer, criterion, num_epochs):
        model.train()
        for epoch in range(num_epochs):
            for x, y in train_loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            print(evaluate(model, val_loader))
''')


def test_flake8_disable_noqa_reaches_the_plugin(tmp_path):
    pytest.importorskip("flake8")
    (tmp_path / "train.py").write_text(TRAIN.replace("optimizer.step()\n", "optimizer.step()  # noqa: TL103\n"))
    r = subprocess.run([sys.executable, "-m", "flake8", "--select", "TL", "train.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "flake8", "--select", "TL", "--disable-noqa", "train.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("train.py:11:13: TL103 "), r.stdout + r.stderr
    # and the file-level exemption of torchlint too
    (tmp_path / "train.py").write_text("# torchlint: noqa\n" + TRAIN)
    r = subprocess.run([sys.executable, "-m", "flake8", "--select", "TL", "--disable-noqa", "train.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("train.py:12:13: TL103 "), r.stdout + r.stderr


def test_output_file_and_python_m(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    r = tl("train.py", "--no-cache", "--output-format", "json", "--output-file", "out.json", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert json.load(open(tmp_path / "out.json"))[0]["code"] == "TL103"


def test_no_color_is_honoured(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    env = dict(os.environ, NO_COLOR="1")
    r = tl("train.py", "--no-cache", "--color", cwd=tmp_path, env=env)
    assert "\x1b[" not in r.stdout
    r = tl("train.py", "--no-cache", "--color", cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "NO_COLOR"})
    assert "\x1b[" in r.stdout


def _many_files(tmp_path, n=25):
    for i in range(n):
        (tmp_path / f"m{i}.py").write_text(TRAIN)


def test_progress_bar_only_on_a_terminal(tmp_path):
    pty = pytest.importorskip("pty")
    _many_files(tmp_path)
    # piped stderr: no progress bar
    r = tl(".", "--no-cache", cwd=tmp_path)
    assert "files" not in r.stderr
    # a pseudo-terminal on stderr: the bar appears
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "torchlint", ".", "--no-cache", "-j", "1"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ, TERM="xterm"))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=120)
    os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace")
    assert "25/25 files" in err
    assert "results cached" not in err  # --no-cache
    # with the cache, the bar goes on through writing it
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "torchlint", ".", "-j", "1"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ, TERM="xterm"))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=120)
    os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace")
    assert "25/25 files" in err and "25/25 results cached" in err
    # machine-readable formats never show it
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "torchlint", ".", "--no-cache", "--output-format", "json"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ, TERM="xterm"))
    os.close(slave)
    out = p.communicate(timeout=120)[0]
    try:
        err = os.read(master, 4096).decode()
    except OSError:
        err = ""
    os.close(master)
    assert "files" not in err and json.loads(out)


def test_fix_command_writes_into_notebook_cells(tmp_path):
    nb = tmp_path / "nb.ipynb"
    shutil.copy(NOTEBOOK, nb)
    before = json.load(open(nb))
    r = tl("nb.ipynb", "--no-cache", "--fix", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Found 1 error (1 fixed, 0 remaining)." in r.stdout
    after = json.load(open(nb))
    assert after["metadata"] == before["metadata"]
    assert [c["cell_type"] for c in after["cells"]] == [c["cell_type"] for c in before["cells"]]
    assert after["cells"][7]["source"][2] == "with torch.no_grad():\n"
    assert tl("nb.ipynb", "--no-cache", cwd=tmp_path).returncode == 0

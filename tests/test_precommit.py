"""The pre-commit hook, exercised with `pre-commit try-repo` against a temporary repository."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BUGGY = """import torch


def fit(model, loader, optimizer, criterion):
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""

# a course notebook: shell escapes, a line magic, a `%%time` training cell without zero_grad
NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "execution_count": 1, "id": "a1", "metadata": {}, "outputs": [],
         "source": ["!pip install -q torch\n", "%matplotlib inline\n", "import torch\n",
                    "files = !ls data/"]},
        {"cell_type": "code", "execution_count": 2, "id": "a2", "metadata": {}, "outputs": [],
         "source": ["%%time\n", "for x, y in loader:\n", "    loss = criterion(model(x), y)\n",
                    "    loss.backward()\n", "    optimizer.step()"]},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                 "language_info": {"name": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def test_hook_definition():
    import yaml  # pre-commit depends on pyyaml

    with open(os.path.join(ROOT, ".pre-commit-hooks.yaml")) as fh:
        hooks = yaml.safe_load(fh)
    (hook,) = hooks
    assert hook["id"] == "torchlint" and hook["language"] == "python"
    assert hook["types_or"] == ["python", "pyi", "jupyter"] and hook["require_serial"] is True


@pytest.mark.skipif(shutil.which("git") is None, reason="git not available")
def test_pre_commit_try_repo(tmp_path):
    pytest.importorskip("pre_commit")
    # try-repo needs the hook repository to be a git repo with the hook files committed
    src = tmp_path / "hookrepo"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__",
                                                           ".torchlint_cache", "fixtures", "benchmarks", "tests"))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", PRE_COMMIT_HOME=str(tmp_path / "pc-home"))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "hook"]):
        subprocess.run(cmd, cwd=src, check=True, env=env)
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(BUGGY)
    (work / "ok.py").write_text("print('hello')\n")
    (work / "lab.ipynb").write_text(json.dumps(NOTEBOOK, indent=1))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(cmd, cwd=work, check=True, env=env)
    r = subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(src), "torchlint", "--all-files"],
                       cwd=work, capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "train.py:8:9: TL103" in out
    assert "lab.ipynb:cell 2:5:5: TL103" in out, out  # notebooks are checked too (types_or: jupyter)

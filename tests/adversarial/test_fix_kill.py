"""`--fix` killed at any moment leaves every file either as it was or fully fixed."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SRC = textwrap.dedent('''\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(dim=1) == y).sum().item()
        return correct


    def fit(model, loader, optimizer, criterion, epochs):
        for epoch in range(epochs):
            model.train()
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            evaluate(model, loader)
''')


def _populate(d, n=60):
    d.mkdir()
    for i in range(n):
        (d / f"train_{i:03d}.py").write_text(SRC.replace("def fit", f"# variant {i}\ndef fit"))


def test_killed_fix_run_leaves_files_whole(tmp_path):
    ref = tmp_path / "ref"
    _populate(ref)
    subprocess.run([sys.executable, "-m", "torchlint", ".", "--fix", "--unsafe-fixes", "--no-cache", "-j", "1"],
                   cwd=ref, capture_output=True, timeout=600)
    fixed = {p: (ref / p).read_text() for p in os.listdir(ref)}
    assert all(fixed[p] != SRC for p in fixed)
    for trial, delay in enumerate([0.5, 1.0, 1.5, 2.0, 3.0]):
        work = tmp_path / f"work{trial}"
        _populate(work)
        original = {p: (work / p).read_text() for p in os.listdir(work)}
        proc = subprocess.Popen([sys.executable, "-m", "torchlint", ".", "--fix", "--unsafe-fixes", "--no-cache",
                                 "-j", "1"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for p in os.listdir(work):
            if p not in original:
                assert p.startswith("."), p  # only a hidden temporary file may be left behind
                continue
            text = (work / p).read_text()
            assert text in (original[p], fixed[p]), f"{p} is neither original nor fully fixed"

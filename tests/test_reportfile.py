"""`--output-file` and `--baseline` write where the user points, and never put a regular file
in place of a device, a pipe or a symlink."""
import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from test_cli import BUGGY


def tl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    return tmp_path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_output_file_that_is_a_pipe_gets_the_report_and_stays_a_pipe(project):
    fifo = project / "report.pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, encoding="utf-8").read()), daemon=True)
    reader.start()
    r = tl("check", "train.py", "--output-format", "json", "--output-file", str(fifo), cwd=project)
    reader.join(timeout=60)
    assert r.returncode == 1, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # not replaced by a regular file
    assert got, "the report never reached the pipe"
    assert [f["code"] for f in json.loads(got[0])] == ["TL103"]
    assert not [p for p in os.listdir(project) if p.startswith(".torchlint-")]


def test_output_file_through_a_symlink_writes_the_target_and_keeps_the_link(project):
    (project / "reports").mkdir()
    target = project / "reports" / "lint.json"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    link = project / "lint.json"
    link.symlink_to(target)
    r = tl("check", "train.py", "--output-format", "json", "--output-file", "lint.json", cwd=project)
    assert r.returncode == 1, r.stderr
    assert link.is_symlink()
    assert [f["code"] for f in json.loads(target.read_text())] == ["TL103"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_a_new_output_file_and_baseline_get_the_umask_mode_not_a_private_temporary_files(project):
    r = tl("check", "train.py", "--output-file", "out.txt", cwd=project)
    assert r.returncode == 1 and "TL103" in (project / "out.txt").read_text()
    r = tl("check", "train.py", "--write-baseline", "base.json", cwd=project)
    assert (project / "base.json").exists(), r.stderr
    mask = os.umask(0)
    os.umask(mask)
    for name in ("out.txt", "base.json"):
        assert stat.S_IMODE(os.stat(project / name).st_mode) == 0o666 & ~mask

"""Inputs a linter meets unattended in CI. Each one gets a finding or a clear message, the exit
code ruff would give, no traceback, and every other file is still linted."""
import os
import subprocess
import sys
import textwrap

import pytest

BUGGY = textwrap.dedent('''\
    import torch


    def fit(model, loader, optimizer, criterion):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
''')
BUG_LINE = "train.py:8:9: TL103"


def tl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "torchlint", *args, "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def check(tmp_path, name, content, exit_code, stdout_has=(), stderr_has=(), mode="wb"):
    (tmp_path / "train.py").write_text(BUGGY)
    p = tmp_path / name
    if content is not None:
        with open(p, mode) as fh:
            fh.write(content)
    r = tl(".", cwd=tmp_path)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert BUG_LINE in r.stdout, (r.stdout, r.stderr)
    assert r.returncode == exit_code, (r.returncode, r.stdout, r.stderr)
    for s in stdout_has:
        assert s in r.stdout, r.stdout
    for s in stderr_has:
        assert s in r.stderr, r.stderr
    return r


def test_empty_file(tmp_path):
    check(tmp_path, "empty.py", b"", 1)


def test_only_comments(tmp_path):
    check(tmp_path, "comments.py", b"# just a comment\n# and another\n", 1)


def test_bom(tmp_path):
    r = check(tmp_path, "bom.py", b"\xef\xbb\xbf" + BUGGY.encode(), 1)
    assert "bom.py:8:9: TL103" in r.stdout  # positions ignore the BOM


def test_crlf_and_mixed_line_endings(tmp_path):
    r = check(tmp_path, "crlf.py", BUGGY.replace("\n", "\r\n").encode(), 1)
    assert "crlf.py:8:9: TL103" in r.stdout
    mixed = BUGGY.replace("\n", "\r\n", 3).encode()
    r = check(tmp_path, "mixed.py", mixed, 1)
    assert "mixed.py:8:9: TL103" in r.stdout


def test_latin1_declared_encoding(tmp_path):
    src = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + BUGGY
    r = check(tmp_path, "latin.py", src.encode("latin-1"), 1)
    assert "latin.py:10:9: TL103" in r.stdout


def test_invalid_utf8(tmp_path):
    check(tmp_path, "bad_utf8.py", b"x = '\xff\xfe'\n" + BUGGY.encode(), 2, stderr_has=("bad_utf8.py", "not valid UTF-8"))


def test_nul_bytes(tmp_path):
    r = check(tmp_path, "nul.py", b"x = 1\x00\n" + BUGGY.encode(), 1)
    assert "nul.py:1" in r.stdout and "TL001" in r.stdout


def test_large_generated_file(tmp_path):
    lines = [f"WEIGHT_{i} = [{', '.join(str(j) for j in range(20))}]" for i in range(60000)]
    content = ("\n".join(lines) + "\n").encode()
    assert len(content) > 5_000_000
    check(tmp_path, "generated.py", content, 1)


def test_deeply_nested_expression(tmp_path):
    content = ("x = " + "(" * 1000 + "1" + ")" * 1000 + "\nloss = x.backward()\n").encode()
    r = check(tmp_path, "deep.py", content, 1)
    assert "TL000" not in r.stdout  # analysed (or reported as too deep), never a crash


def test_very_long_line(tmp_path):
    content = ("values = [" + ", ".join(["1.0"] * 200000) + "]\nloss.backward()\n").encode()
    check(tmp_path, "long.py", content, 1)


def test_python2_syntax(tmp_path):
    r = check(tmp_path, "py2.py", b"print 'hello'\nexec 'x = 1'\n", 1)
    assert "py2.py:" in r.stdout and "TL001 syntax error" in r.stdout


def test_newer_syntax(tmp_path):
    src = textwrap.dedent('''\
        type Pair[T] = tuple[T, T]

        def first[T](p: Pair[T]) -> T:
            return p[0]

        def describe(cmd):
            match cmd:
                case {"step": n}:
                    return f"step {f'{n:>{4}}'}"
                case _:
                    return "?"
    ''')
    r = check(tmp_path, "modern.py", src.encode(), 1)
    assert "modern.py" not in r.stdout


def test_stub_file(tmp_path):
    r = check(tmp_path, "model.pyi", b"import torch\ndef fit(model: torch.nn.Module) -> None: ...\n", 1)
    assert "model.pyi" not in r.stdout


def test_directory_named_like_a_module(tmp_path):
    (tmp_path / "x.py").mkdir()
    (tmp_path / "x.py" / "inner.py").write_text("print(1)\n")
    check(tmp_path, "ok.py", b"print(2)\n", 1)
    r = tl("x.py", "train.py", cwd=tmp_path)
    assert r.returncode == 1 and BUG_LINE in r.stdout and "Traceback" not in r.stderr


def test_symlink_loop(tmp_path):
    d = tmp_path / "pkg"
    d.mkdir()
    os.symlink("..", d / "loop")
    os.symlink("self_a", tmp_path / "self_b")
    os.symlink("self_b", tmp_path / "self_a")
    check(tmp_path, "ok.py", b"print(2)\n", 1)


def test_path_that_does_not_exist(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    r = tl("train.py", "missing.py", cwd=tmp_path)
    assert r.returncode == 2 and BUG_LINE in r.stdout
    assert "missing.py: no such file or directory" in r.stderr and "Traceback" not in r.stderr


def test_unreadable_file(tmp_path, monkeypatch, capsys):
    """Root reads anything, so the failure is injected into the reader."""
    from torchlint import source
    from torchlint.cli import main

    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "secret.py").write_text("x = 1\n")
    real_open = open

    def fake_open(path, *a, **k):
        if str(path).endswith("secret.py"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(source, "open", fake_open, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["check", ".", "--no-cache", "-j", "1"])
    out = capsys.readouterr()
    assert exc.value.code == 2
    assert "secret.py: cannot read: Permission denied" in out.err
    assert BUG_LINE in out.out


def test_file_deleted_or_rewritten_during_the_run(tmp_path, capsys):
    from torchlint.config import Config
    from torchlint.runner import Runner

    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "gone.py").write_text("x = 1\n")
    (tmp_path / "changed.py").write_text("x = 1\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        runner = Runner(Config(root=str(tmp_path)), ["TL"], [], [], jobs=1, cache=None, progress=False)
        files = runner.files(["."])
        os.unlink("gone.py")  # deleted after discovery
        with open("changed.py", "w") as fh:  # rewritten into a syntax error
            fh.write("def broken(:\n")
        findings = runner.lint(files)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert "gone.py: cannot read" in err
    assert runner.had_error
    codes = {(os.path.basename(f.path), f.code) for f in findings}
    assert ("train.py", "TL103") in codes and ("changed.py", "TL001") in codes


def test_verbose_may_show_a_traceback_but_plain_never_does(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    r = tl("train.py", "--config", "nope.toml", cwd=tmp_path)
    assert r.returncode == 2 and "nope.toml" in r.stderr and "Traceback" not in r.stderr


def test_unknown_code_in_noqa_is_a_clear_error(tmp_path):
    src = BUGGY.replace("optimizer.step()\n", "optimizer.step()  # noqa: TL999, E501\n")
    (tmp_path / "train.py").write_text(src)
    r = tl("train.py", cwd=tmp_path)
    assert r.returncode == 2
    assert "train.py:8: unknown rule code `TL999` in `# noqa`" in r.stderr
    assert "TL103" in r.stdout  # TL999 suppresses nothing; E501 belongs to another tool


def test_config_wrong_type_names_file_key_and_expectation(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "torchlint.toml").write_text("allow-grad-data = 'yes'\n")
    r = tl("train.py", cwd=tmp_path)
    assert r.returncode == 2
    assert "torchlint.toml" in r.stderr and "`allow-grad-data` must be true or false" in r.stderr

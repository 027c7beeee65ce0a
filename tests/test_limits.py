"""Hostile inputs: one odd file never takes down the run (docs/limits.md)."""
import glob
import os
import subprocess
import sys
import time

import pytest

from test_cli import BUGGY, CLEAN

from torchlint.limits import MAX_DEPTH, TooComplex, check_text

# a realistic head, so that the prefilter lets the file through to the parser
HEAD = BUGGY.split("def main")[0]


def tl(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


DEEP = {
    "parens": "x = " + "(" * 1300 + "1" + ")" * 1300 + "\n",
    "nested calls": "x = " + "f(" * 1000 + "1" + ")" * 1000 + "\n",
    "nested lists": "x = " + "[" * 1300 + "1" + "]" * 1300 + "\n",
    "attribute chain": "x = a" + ".b" * 4000 + "\n",
    "long attribute chain": "x = a" + ".b" * 20000 + "\n",
    "sum chain": "x = 1" + "+1" * 4000 + "\n",
    "long sum chain": "x = 1" + " + 1" * 20000 + "\n",
    "method chain": "x = a" + ".b()" * 2000 + "\n",
    "boolean chain": "ok = a" + " and a" * 4000 + "\n",
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_deep_or_long_expressions_are_refused_before_parsing(name):
    with pytest.raises(TooComplex) as exc:
        check_text(HEAD + DEEP[name])
    assert "nest too deeply" in str(exc.value)
    assert exc.value.line == HEAD.count("\n") + 1


ACCEPTED = {  # as deep as the limit lets through: the pipeline analyses them (checked in the next test)
    "nested calls": "x = " + "f(" * 60 + "1" + ")" * 60,
    "attribute chain": "x = a" + ".b" * 190,
    "sum chain": "x = 1" + " + 1" * 190,
    "calls inside blocks": "".join(" " * i + "if a:\n" for i in range(30)) + " " * 30 + "x = " + "f(" * 40 + "1" + ")" * 40,
    "string concatenation": 'msg = "a"' + ' "b"' * 190,
}


def test_code_as_deep_as_the_limit_allows_is_analysed(lint_source):
    for name, body in ACCEPTED.items():
        text = HEAD + body + "\n"
        check_text(text)  # not refused
        found = lint_source(text)
        assert ("TL103", 11) in found and not any(c in ("TL000", "TL003") for c, _ in found), (name, found)


def test_strings_comments_and_real_code_are_not_counted():
    # brackets and operators inside strings, comments and continuation lines are not nesting
    text = HEAD + 'DOC = """' + "(" * 500 + '\\\n"""\n# ' + "[" * 500 + "\nx = '" + "+" * 300 + "'\n"
    check_text(text)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = glob.glob(os.path.join(here, "torchlint", "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(here, "fixtures", "**", "*.py"), recursive=True)
    assert len(files) > 50
    for path in files:
        with open(path, encoding="utf-8") as fh:
            check_text(fh.read())


def test_a_deep_file_is_reported_and_the_others_still_linted(tmp_path):
    (tmp_path / "deep.py").write_text(HEAD + DEEP["parens"])
    (tmp_path / "chain.py").write_text(HEAD + DEEP["long sum chain"])
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    start = time.monotonic()
    r = tl("--no-cache", "-j1", ".", cwd=tmp_path)
    assert time.monotonic() - start < 60
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)  # a segfault was -11
    line = HEAD.count("\n") + 1
    assert f"deep.py:{line}:1: TL003 not analysed: expressions nest too deeply" in r.stdout
    assert f"chain.py:{line}:1: TL003 not analysed: expressions nest too deeply" in r.stdout
    assert "train.py:11:13: TL103 " in r.stdout
    assert "clean.py" not in r.stdout
    assert "Traceback" not in r.stderr


def test_ignoring_tl003_silences_the_skipped_file(tmp_path):
    (tmp_path / "deep.py").write_text(HEAD + DEEP["attribute chain"])
    r = tl("--no-cache", "--ignore", "TL003", "deep.py", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_the_limit_is_documented():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "docs", "limits.md"), encoding="utf-8") as fh:
        doc = fh.read()
    assert str(MAX_DEPTH) in doc and "TL003" in doc
    with open(os.path.join(here, "README.md"), encoding="utf-8") as fh:
        assert "docs/limits.md" in fh.read()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_like_a_module_is_not_discovered(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(BUGGY)
    os.mkfifo(tmp_path / "pkg" / "x.py")  # reading it would block forever: nobody writes
    os.symlink("x.py", tmp_path / "pkg" / "y.py")
    r = tl("--no-cache", "-j1", ".", cwd=tmp_path, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "train.py:11:13: TL103 " in r.stdout
    assert "x.py" not in r.stdout + r.stderr and "y.py" not in r.stdout + r.stderr
    # named on the command line, it is an error, not a hang
    r = tl("--no-cache", "pkg/x.py", "pkg/train.py", cwd=tmp_path, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pkg/x.py: not a file or directory" in r.stderr
    assert "train.py:11:13: TL103 " in r.stdout


def _children(pid: int) -> set:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry))
    return out


def _alive(pids) -> set:
    alive = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat", encoding="utf-8", errors="replace") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(p)
        except OSError:
            pass
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_run_leaves_no_worker_behind(tmp_path, sig):
    import signal

    # enough work that both workers are busy when the run is killed
    body = BUGGY.replace("def train(", "def train_{i}(").replace("def main(", "def main_{i}(")
    for k in range(40):
        (tmp_path / f"mod{k}.py").write_text("\n".join(body.replace("{i}", str(i)) for i in range(30)))
    proc = subprocess.Popen([sys.executable, "-m", "torchlint", "--no-cache", "-j", "2", "."], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        workers: set = set()
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            workers = _children(proc.pid)
        assert len(workers) == 2 and proc.poll() is None, "the run ended before its workers were seen"
        time.sleep(0.5)
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(workers) == set()
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _alive(_children(proc.pid)):
            os.kill(p, signal.SIGKILL)


@pytest.fixture
def undecodable(tmp_path):
    """A tree with a file whose name is not UTF-8 (``caf\\xe9.py``, Latin-1), next to an ordinary one."""
    name = os.fsdecode(b"caf\xe9.py")
    try:
        (tmp_path / name).write_text(BUGGY)
    except (OSError, UnicodeError):
        pytest.skip("this filesystem refuses names that are not UTF-8")
    if os.fsencode(name) not in os.listdir(os.fsencode(tmp_path)):
        pytest.skip("this filesystem re-encodes names")
    (tmp_path / "ok.py").write_text(BUGGY)
    return tmp_path


def _run_bytes(args, cwd):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True, timeout=120)


@pytest.mark.parametrize("fmt", ["text", "concise", "json", "json-lines", "github", "sarif", "lsp"])
def test_an_undecodable_file_name_never_breaks_an_output_format(undecodable, fmt):
    import json

    # json: cold, then a cache write and a cache read (the cache key hashed the name's text)
    for cache in (["--no-cache"], [], []) if fmt == "json" else (["--no-cache"],):
        r = _run_bytes(["-j1", "--output-format", fmt, *cache, "."], undecodable)
        assert r.returncode == 1, (r.stdout, r.stderr)
        out = r.stdout.decode("utf-8")  # valid UTF-8, whatever the name
        r.stderr.decode("utf-8")
        if fmt in ("json", "sarif", "lsp"):
            doc = json.loads(out)
        elif fmt == "json-lines":
            doc = [json.loads(line) for line in out.splitlines()]
        if fmt in ("json", "json-lines"):
            names = sorted(os.path.basename(d["filename"]) for d in doc)
            assert names == ["caf\\xe9.py", "ok.py"]  # the byte, escaped
        elif fmt == "sarif":
            uris = [res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for res in doc["runs"][0]["results"]]
            assert len(uris) == 2 and "ok.py" in uris
        elif fmt == "lsp":
            assert len(doc) == 2
        else:
            assert "caf\\xe9.py:" in out or "file=caf\\xe9.py," in out
            assert "ok.py" in out


def test_an_undecodable_file_name_in_an_output_file(undecodable):
    import json

    r = _run_bytes(["--no-cache", "--output-format", "sarif", "-o", "out.sarif", "."], undecodable)
    assert r.returncode == 1, r.stderr
    with open(undecodable / "out.sarif", encoding="utf-8") as fh:
        assert len(json.load(fh)["runs"][0]["results"]) == 2
    assert sorted(n for n in os.listdir(undecodable) if n.startswith(".torchlint-")) == []


def test_an_undecodable_file_name_round_trips_through_a_file_uri(undecodable):
    pytest.importorskip("pygls")
    from pathlib import Path

    from torchlint.lsp import uri_to_path

    path = str(undecodable / os.fsdecode(b"caf\xe9.py"))
    assert uri_to_path(Path(path).as_uri()) == path


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("toml", [
    '[tool]\ntorchlint.ignore = ["TL103"]\n',
    'tool.torchlint.ignore = ["TL103"]\n',
    '[tool.torchlint]\nignore = ["TL103"]\n',
])
def test_dotted_toml_keys_configure_torchlint_as_toml_says(tmp_path, toml):
    (tmp_path / "pyproject.toml").write_text(toml + '\n[project]\nname = "trainer"\n')
    (tmp_path / "train.py").write_text(BUGGY)
    r = tl("--no-cache", "train.py", cwd=tmp_path)
    assert r.returncode == 0, (toml, r.stdout, r.stderr)
    (tmp_path / "pyproject.toml").write_text(toml.replace("ignore", "ignroe"))
    r = tl("--no-cache", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and "unknown key `tool.torchlint.ignroe`" in r.stderr, r.stderr


@pytest.mark.parametrize("command", [["check"], ["confirm"]])
def test_invalid_utf8_in_pyproject_is_a_clear_error(tmp_path, command):
    (tmp_path / "pyproject.toml").write_bytes(b'[tool.torchlint]\n# entra\xeenement\nselect = ["TL"]\n')
    (tmp_path / "train.py").write_text(BUGGY)
    r = tl(*command, "train.py", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pyproject.toml: not valid UTF-8" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("cache_dir", [".", "..", "src", "./src/../"])
def test_a_cache_dir_that_is_not_a_folder_of_its_own_is_refused(tmp_path, cache_dir):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "train.py").write_text(BUGGY)
    (project / "pyproject.toml").write_text(f'[tool.torchlint]\ncache-dir = "{cache_dir}"\n')
    r = tl("src", cwd=project)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "cache-dir`: `" + cache_dir + "`" in r.stderr and "a folder of its own" in r.stderr
    for d in (tmp_path, project, project / "src"):
        assert not (d / "CACHEDIR.TAG").exists() and not (d / ".gitignore").exists()
    (project / "pyproject.toml").write_text("[tool.torchlint]\n")
    r = tl("--cache-dir", cache_dir, "src", cwd=project)
    assert r.returncode == 2 and "--cache-dir: `" in r.stderr, r.stderr


def test_a_dedicated_cache_dir_inside_the_project_is_used(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "pyproject.toml").write_text('[tool.torchlint]\ncache-dir = ".cache/torchlint"\n')
    for _ in range(2):  # created, then found holding its own tag
        r = tl("train.py", cwd=tmp_path)
        assert r.returncode == 1 and "TL103" in r.stdout, r.stderr
    assert (tmp_path / ".cache" / "torchlint" / "CACHEDIR.TAG").exists()


def test_a_projects_own_torchlint_py_does_not_shadow_the_console_entry_point(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "torchlint")
    if not os.path.exists(exe):
        pytest.skip("no console script next to this interpreter")
    (tmp_path / "torchlint.py").write_text('print("SHADOWED")\nraise SystemExit(7)\n')
    (tmp_path / "train.py").write_text(BUGGY)
    r = subprocess.run([exe, "--no-cache", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "SHADOWED" not in r.stdout, (r.stdout, r.stderr)
    assert "train.py:11:13: TL103" in r.stdout


# ---------------------------------------------------------------- --fix and the file system
def test_fix_keeps_setuid_and_setgid_bits(tmp_path):
    import stat

    p = tmp_path / "train.py"
    p.write_text(BUGGY)
    os.chmod(p, 0o6754)
    if stat.S_IMODE(os.stat(p).st_mode) != 0o6754:
        pytest.skip("this filesystem does not keep setuid/setgid bits")
    r = tl("--no-cache", "--fix", "--unsafe-fixes", "train.py", cwd=tmp_path)
    assert "optimizer.zero_grad()" in p.read_text(), r.stderr
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o6754


def test_fix_refuses_a_hard_linked_file_and_says_why(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(BUGGY)
    os.link(p, tmp_path / "train_copy.py")
    r = tl("--no-cache", "--fix", "--unsafe-fixes", "train.py", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "train.py: not fixed: it has 2 hard links" in r.stderr
    assert p.read_text() == BUGGY and os.stat(p).st_nlink == 2  # untouched, still linked
    assert [n for n in os.listdir(tmp_path) if "torchlint-tmp" in n] == []


# ---------------------------------------------------------------- a file's budget
def test_a_file_over_its_time_budget_is_skipped_and_the_next_one_linted(tmp_path, monkeypatch):
    from torchlint import limits
    from torchlint.engine import LintOptions
    from torchlint.engine import lint_job as _worker
    from torchlint.selection import enabled_codes

    body = BUGGY.replace("def train(", "def train_{i}(").replace("def main(", "def main_{i}(")
    slow = tmp_path / "slow.py"
    slow.write_text("\n".join(body.replace("{i}", str(i)) for i in range(60)))
    fast = tmp_path / "train.py"
    fast.write_text(BUGGY)
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
    monkeypatch.setattr(limits, "MAX_SECONDS", 0.05)
    r = _worker((str(slow), opts, None))
    assert [(f.code, f.line) for f in r.findings] == [("TL003", 1)]
    assert "not analysed: its analysis took longer than 0.05 s" in r.findings[0].message
    assert r.internal_error  # (not cached: a faster machine may finish it)
    monkeypatch.setattr(limits, "MAX_SECONDS", 60.0)
    assert [(f.code, f.line) for f in _worker((str(fast), opts, None)).findings] == [("TL103", 11)]
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # disarmed


def test_a_50_mb_data_literal_is_skipped_quickly(tmp_path):
    row = "    [" + ", ".join("0.123456" for _ in range(12)) + "],\n"
    with open(tmp_path / "table.py", "w") as fh:
        fh.write("DATA = [\n")
        fh.write(row * (50_000_000 // len(row)))
        fh.write("]\n")
    (tmp_path / "train.py").write_text(BUGGY)
    start = time.monotonic()
    r = tl("--no-cache", "-j1", ".", cwd=tmp_path)
    assert time.monotonic() - start < 60
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "table.py:1:1: TL003 not analysed: the file is larger than 5 MB" in r.stdout
    assert "train.py:11:13: TL103" in r.stdout

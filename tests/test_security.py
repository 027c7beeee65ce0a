"""Nothing runs user code unless the command line asks; the cache is never trusted blindly;
symlinks do not lead the linter out of the tree."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import cachefiles

EVIL = textwrap.dedent('''\
    import pathlib
    pathlib.Path(__file__).with_name("EXECUTED").write_text("user code ran")
    import torch


    def fit(model, loader, optimizer, criterion):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

    fit(None, [], None, None)
''')


def tl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def hostile_repo(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.torchlint]\ndynamic = true\n')
    (tmp_path / "train.py").write_text(EVIL)
    (tmp_path / "conftest.py").write_text(EVIL.replace("train", "conftest"))
    return tmp_path


def test_configuration_cannot_make_a_plain_lint_execute_code(hostile_repo):
    r = tl(".", "--no-cache", cwd=hostile_repo)
    assert r.returncode == 1 and "TL103" in r.stdout
    assert not (hostile_repo / "EXECUTED").exists()
    # every output format, fix and diff paths too
    for extra in (["--output-format", "json"], ["--diff"], ["--fix", "--unsafe-fixes"], ["--statistics"]):
        tl(".", "--no-cache", *extra, cwd=hostile_repo)
        assert not (hostile_repo / "EXECUTED").exists(), extra


def test_flake8_plugin_does_not_execute_code(hostile_repo):
    pytest.importorskip("flake8")
    subprocess.run([sys.executable, "-m", "flake8", "--select", "TL", "train.py"], cwd=hostile_repo,
                   capture_output=True, text=True, timeout=120)
    assert not (hostile_repo / "EXECUTED").exists()


def test_language_server_does_not_execute_code(hostile_repo):
    """The server module never imports the dynamic mode."""
    import importlib

    pytest.importorskip("pygls")
    before = set(sys.modules)
    importlib.import_module("torchlint.lsp")
    loaded = set(sys.modules) - before
    assert not any(m.startswith("torchlint.dynamic") for m in loaded)
    src = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "torchlint", "lsp.py")).read()
    assert "confirm_findings" not in src and "torchlint.dynamic" not in src and ".dynamic import" not in src


def _cache_files(root, runs=False):
    """The per-file entries (``runs``: the whole-run snapshots instead)."""
    for d, _, files in os.walk(root / ".torchlint_cache"):
        for f in files:
            if f.endswith(".json") and f != "index.json" and f.startswith("run-") == runs:
                yield os.path.join(d, f)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other-version", "other-user"])
def test_damaged_cache_entries_are_ignored_and_rebuilt(tmp_path, damage):
    (tmp_path / "train.py").write_text(EVIL.split("import torch\n", 1)[1].replace("fit(None, [], None, None)\n", ""))
    first = tl(".", cwd=tmp_path)
    assert first.returncode == 1
    (entry,) = list(_cache_files(tmp_path))
    # each damage sealed again with this user's key: what the schema and version checks catch
    if damage == "truncate":
        data = cachefiles.payload(entry)
        cachefiles.dump(entry, data[: len(data) // 2])
    elif damage == "garbage":
        cachefiles.dump(entry, {"version": "0.1.0", "result": {"findings": "nope"}})
    elif damage == "other-version":
        d = cachefiles.load(entry)
        d["version"] = "0.0.0-other"
        d["result"]["findings"] = []
        cachefiles.dump(entry, d)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to chown")
        d = cachefiles.load(entry)
        d["result"]["findings"] = []
        cachefiles.dump(entry, d)
        os.chown(entry, 12345, 12345)
    second = tl(".", cwd=tmp_path)
    assert second.stdout == first.stdout and second.returncode == 1
    assert "Traceback" not in second.stderr


@pytest.mark.parametrize("damage", ["truncate", "other-user"])
def test_damaged_run_snapshot_is_ignored(tmp_path, damage):
    """The snapshot an unchanged tree is answered from: damaged or foreign, it is not trusted."""
    (tmp_path / "train.py").write_text(EVIL.split("import torch\n", 1)[1].replace("fit(None, [], None, None)\n", ""))
    first = tl(".", cwd=tmp_path)
    assert first.returncode == 1 and "TL" in first.stdout
    snaps = list(_cache_files(tmp_path, runs=True))  # findings of the run; all its results
    assert len(snaps) == 2
    for snap in snaps:
        d = cachefiles.load(snap)
        if damage == "truncate":
            cachefiles.dump(snap, json.dumps(d)[:40].encode())
            continue
        rs = d["results"] if isinstance(d["results"], list) else list(d["results"].values())
        for r in rs:
            r["findings"] = []  # a snapshot that would hide the findings
        cachefiles.dump(snap, d)
        if os.geteuid() != 0:
            pytest.skip("needs root to chown")
        os.chown(snap, 12345, 12345)
    second = tl(".", cwd=tmp_path)
    assert "Traceback" not in second.stderr
    assert second.stdout == first.stdout and second.returncode == 1


def test_cache_lives_only_where_configured(tmp_path):
    (tmp_path / "train.py").write_text("import torch\nx = torch.zeros(1)\nx.backward()\n")
    (tmp_path / "torchlint.toml").write_text('cache-dir = "build/tl-cache"\n')
    tl(".", cwd=tmp_path)
    assert (tmp_path / "build" / "tl-cache" / "CACHEDIR.TAG").exists()
    assert not (tmp_path / ".torchlint_cache").exists()
    tl(".", "--cache-dir", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert (tmp_path / "elsewhere" / "CACHEDIR.TAG").exists()


def test_symlinks_outside_the_roots_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret_train.py").write_text(EVIL.split("import torch\n", 1)[1].replace("fit(None, [], None, None)\n", ""))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ok.py").write_text("print('hi')\n")
    os.symlink(outside, repo / "linked_dir")
    os.symlink(outside / "secret_train.py", repo / "linked_file.py")
    r = tl(".", "--no-cache", cwd=repo)
    assert r.returncode == 0 and "secret" not in r.stdout and "linked" not in r.stdout
    (repo / "torchlint.toml").write_text("follow-symlinks = true\n")
    r = tl(".", "--no-cache", cwd=repo)
    assert r.returncode == 1 and "linked_dir" in r.stdout

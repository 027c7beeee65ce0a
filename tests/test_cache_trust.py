"""The cache trusts nothing it did not write: records are sealed with a key of this user's kept
outside the project, and validated against their schema when read (torchlint/integrity.py)."""
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

import cachefiles
from torchlint import integrity

TRAIN = textwrap.dedent("""
    import torch
    import torch.nn as nn


    def fit(model, loader, optimizer, criterion):
        model.train()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
""").lstrip()


def tl(*args, cwd, env=None):
    e = dict(os.environ, TORCHLINT_NO_DAEMON="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "torchlint", "check", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ the key
def test_key_is_made_once_private_in_the_user_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(integrity.ENV_KEY_FILE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert integrity.key_file() == str(tmp_path / "xdg" / "torchlint" / "key")
    k = integrity.load_key()
    st = os.stat(tmp_path / "xdg" / "torchlint" / "key")
    assert len(k) == 32 and stat.S_IMODE(st.st_mode) == 0o600
    assert integrity.load_key() == k  # the same key on the next use
    assert os.listdir(tmp_path / "xdg" / "torchlint") == ["key"]  # no temporary file left behind
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert integrity.key_file() == str(tmp_path / "home" / ".cache" / "torchlint" / "key")


def test_a_key_others_can_read_or_a_damaged_key_is_replaced(tmp_path, monkeypatch):
    kf = tmp_path / "k" / "key"
    monkeypatch.setenv(integrity.ENV_KEY_FILE, str(kf))
    k = integrity.load_key()
    os.chmod(kf, 0o644)
    k2 = integrity.load_key()
    assert k2 != k and stat.S_IMODE(os.stat(kf).st_mode) == 0o600
    kf.write_bytes(b"short")
    os.chmod(kf, 0o600)
    k3 = integrity.load_key()
    assert len(k3) == 32 and k3 not in (k, k2)


def test_key_made_by_concurrent_runs_is_one_key(tmp_path):
    kf = tmp_path / "key"
    code = "from torchlint import integrity; import sys; sys.stdout.write(integrity.load_key().hex())"
    env = dict(os.environ, **{integrity.ENV_KEY_FILE: str(kf)})
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    keys = {p.communicate()[0] for p in procs}
    assert len(keys) == 1 and kf.read_bytes().hex() in keys


def test_seal_binds_the_key_and_the_name():
    k1, k2 = os.urandom(32), os.urandom(32)
    sealed = integrity.seal(k1, "v1/ab/abc.json", b'{"a": 1}')
    assert bytes(integrity.unseal(k1, "v1/ab/abc.json", sealed)) == b'{"a": 1}'
    assert integrity.unseal(k2, "v1/ab/abc.json", sealed) is None  # another user's key
    assert integrity.unseal(k1, "v1/ab/abd.json", sealed) is None  # another record's name
    assert integrity.unseal(k1, "v1/ab/abc.json", sealed[:-1] + b"2") is None  # its bytes changed
    assert integrity.unseal(k1, "v1/ab/abc.json", b'{"a": 1}') is None  # no seal at all


def test_deep_nesting_is_a_miss_not_an_error():
    assert integrity.loads(b"[" * 200_000 + b"]" * 200_000) is None
    deep = {"x": 1}
    for _ in range(50):
        deep = {"x": deep}
    assert not integrity.json_value(deep)
    assert integrity.json_value({"x": [1, "a", None, {"y": 2.5}]})


# ------------------------------------------------------------------ through the command line
def test_records_of_another_key_are_ignored_rebuilt_and_noted_with_verbose(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    other = {integrity.ENV_KEY_FILE: str(tmp_path / "other-key")}
    first = tl(".", cwd=tmp_path, env=other)  # the cache written with someone else's key
    assert first.returncode == 1 and "TL" in first.stdout
    entries = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / ".torchlint_cache") for f in fs
               if f.endswith(".json")]
    assert entries
    okey = integrity.load_key_file(str(tmp_path / "other-key"))
    for e in entries:  # the same findings removed, sealed again with that other key
        name = cachefiles.name_of(e)
        d = json.loads(bytes(integrity.unseal(okey, name, open(e, "rb").read())))
        for r in cachefiles.results_in(d):
            r["findings"] = []
        open(e, "wb").write(integrity.seal(okey, name, json.dumps(d).encode()))
    second = tl(".", "--verbose", cwd=tmp_path)
    assert second.stdout == first.stdout and second.returncode == 1
    assert "is not this user's" in second.stderr and "rebuilt" in second.stderr
    assert "Traceback" not in second.stderr
    third = tl(".", "--verbose", cwd=tmp_path)  # rebuilt with this user's key: nothing to note
    assert third.stdout == first.stdout and "cache file" not in third.stderr

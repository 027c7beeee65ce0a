"""`torchlint daemon`: a `check` served by the daemon is the in-process run, byte for byte.

Every subprocess gets a private XDG_RUNTIME_DIR, so these tests never meet a daemon of the
user's, and every daemon they start is stopped (or killed) when they end.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from torchlint import client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = os.path.join("fixtures", "loop_order", "bad")
GOOD = os.path.join("fixtures", "loop_order", "good")

pytestmark = pytest.mark.skipif(not client.supported(),
                                reason="the daemon needs AF_UNIX, socket.send_fds and fork")

BUGGY = textwrap.dedent('''\
    def train(model, loader, optimizer, criterion):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
''')


def _env(rundir, **extra):
    env = dict(os.environ)
    env.pop("TORCHLINT_NO_DAEMON", None)
    env["XDG_RUNTIME_DIR"] = rundir
    env.update(extra)
    return env


def tl(env, *args, cwd=ROOT, timeout=120, umask=-1):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout, umask=umask)


def local(env, *args, cwd=ROOT, umask=-1):
    return tl(dict(env, TORCHLINT_NO_DAEMON="1"), *args, cwd=cwd, umask=umask)


def _new_rundir():
    d = tempfile.mkdtemp(prefix="tld", dir="/tmp" if os.path.isdir("/tmp") else None)
    env = _env(d)
    # the socket must live under this directory (a path too long would fall back to /tmp/torchlint-UID)
    if not client.runtime_dir(env).startswith(d + os.sep):
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip("no short enough private directory for a socket")
    return d, env


def _status(env):
    return client.request("status", env=env, **client.identity())


def _requests(env):
    st = _status(env)
    assert st is not None, "the daemon is not running"
    return st["requests"]


def _kill_daemon(env):
    """The finalizer's last resort, after `daemon stop`."""
    try:
        lock = client.paths(env)["lock"]
        with open(lock) as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return
    from torchlint.daemon import lock_is_free

    if pid and not lock_is_free(lock):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def fresh_env():
    """A private runtime directory; any daemon started in it is stopped at the end."""
    d, env = _new_rundir()
    yield env
    tl(env, "daemon", "stop", timeout=30)
    _kill_daemon(env)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon_env():
    d, env = _new_rundir()
    try:
        r = tl(env, "daemon", "start", "--idle-timeout", "600", timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().startswith("torchlint daemon started (pid ")
        yield env
    finally:
        tl(env, "daemon", "stop", timeout=30)
        _kill_daemon(env)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def env(daemon_env):
    """The shared daemon, started again if a test before stopped it, or if it is stale (torchlint's
    sources changed since it started: the next check would make it exit)."""
    st = _status(daemon_env)
    if st is None or st.get("stale"):
        r = tl(daemon_env, "daemon", "start", "--idle-timeout", "600", timeout=60)
        assert r.returncode == 0, r.stderr
    return daemon_env


# -- routing ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,routed", [
    ([], True),
    (["check"], True),
    (["src/"], True),
    (["check", "src/", "--no-cache", "-o", "r.json"], True),
    (["train.py", "--select", "TL1"], True),
    (["check", "--help"], True),
    (["--no-cache"], True),
    (["check", "--", "--dynamic"], True),  # a path named --dynamic
    (["check", "src/", "--dynamic"], False),
    (["src/", "--dynamic", "--device", "cuda"], False),
    (["check", "--no-daemon"], False),
    (["--no-daemon", "src/"], False),
    (["rule", "TL103"], False),
    (["rules"], False),
    (["lsp"], False),
    (["confirm", "train.py"], False),
    (["daemon", "status"], False),
    (["--help"], False),
    (["-h"], False),
    (["--version"], False),
])
def test_which_commands_go_to_the_daemon(argv, routed):
    assert client.wants_daemon(argv, {}) is routed
    assert client.wants_daemon(argv, {"TORCHLINT_NO_DAEMON": "1"}) is False
    assert client.wants_daemon(argv, {"TORCHLINT_NO_DAEMON": ""}) is routed


def test_socket_directory_is_private(fresh_env):
    p = client.paths(fresh_env)
    assert p["socket"].startswith(fresh_env["XDG_RUNTIME_DIR"] + os.sep)
    assert len(os.fsencode(p["socket"])) < client.SUN_PATH_MAX
    client.check_dir(p["dir"], create=True)
    assert os.stat(p["dir"]).st_mode & 0o777 == 0o700


# -- identical results --------------------------------------------------------------------

@pytest.mark.parametrize("path,code", [(BAD, 1), (GOOD, 0)])
def test_check_through_the_daemon_is_the_in_process_run(env, path, code):
    args = ("check", path, "--no-cache", "--output-format", "concise")
    before = _requests(env)
    d = tl(env, *args)
    assert _requests(env) == before + 1  # it went through the daemon
    ref = local(env, *args)
    assert _requests(env) == before + 1
    assert d.returncode == ref.returncode == code, d.stderr
    assert d.stdout == ref.stdout and d.stderr == ref.stderr
    assert d.stdout


def test_cache_writes_after_the_answer_and_an_edit_through_the_daemon(env, tmp_path):
    """The worker answers, then writes the run's snapshot; the next check reads it, and an
    edit is seen exactly as by an in-process run with no cache."""
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "evaluate.py").write_text("import torch\n\n\ndef evaluate(model, x):\n    return model(x)\n")
    cache = tmp_path / "cache"
    args = ("check", ".", "--cache-dir", str(cache), "--output-format", "concise")
    first = tl(env, *args, cwd=tmp_path)
    assert first.returncode == 1 and b"TL103" in first.stdout
    deadline = time.time() + 20
    while not list(cache.glob("v*/run-*.json")) and time.time() < deadline:
        time.sleep(0.05)
    assert list(cache.glob("v*/run-*.json")), "the worker never wrote the run snapshot"
    assert tl(env, *args, cwd=tmp_path).stdout == first.stdout
    (tmp_path / "train.py").write_text(BUGGY.replace("    for x, y", "    optimizer.zero_grad()\n    for x, y"))
    before = _requests(env)
    d = tl(env, *args, cwd=tmp_path)
    ref = local(env, "check", ".", "--no-cache", "--output-format", "concise", cwd=tmp_path)
    assert _requests(env) == before + 1
    assert d.returncode == ref.returncode and d.stdout == ref.stdout


def test_implicit_check_text_output_and_help(env):
    before = _requests(env)
    d, ref = tl(env, BAD, "--no-cache", "-j", "1"), local(env, BAD, "--no-cache", "-j", "1")
    assert d.returncode == ref.returncode == 1 and d.stdout == ref.stdout
    # click names the program as this process would have ("python -m torchlint")
    d, ref = tl(env, "check", "--help"), local(env, "check", "--help")
    assert d.returncode == ref.returncode == 0 and d.stdout == ref.stdout
    assert b"Usage: python -m torchlint check" in d.stdout and b"--no-daemon" in d.stdout
    # a usage error: click's message and exit status 2
    d, ref = tl(env, "check", "--output-format", "nope"), local(env, "check", "--output-format", "nope")
    assert d.returncode == ref.returncode == 2 and d.stderr == ref.stderr
    assert _requests(env) == before + 3


def test_output_file_is_written_in_the_clients_directory(env, tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    before = _requests(env)
    d = tl(env, "check", ".", "--no-cache", "-o", "report.json", "--output-format", "json", cwd=tmp_path)
    assert _requests(env) == before + 1
    assert d.returncode == 1, d.stderr
    report = tmp_path / "report.json"
    via_daemon = json.loads(report.read_text())
    report.unlink()
    ref = local(env, "check", ".", "--no-cache", "-o", "report.json", "--output-format", "json", cwd=tmp_path)
    assert ref.returncode == 1 and json.loads(report.read_text()) == via_daemon
    assert [f["code"] for f in via_daemon] == ["TL103"]
    assert not os.path.exists(os.path.join(ROOT, "report.json"))


def test_environment_and_umask_are_the_clients(env, tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    before = _requests(env)
    # NO_COLOR is read from the client's environment; --color forces escapes unless it is set
    d = tl(dict(env, NO_COLOR="1"), "check", "train.py", "--no-cache", "--color", cwd=tmp_path)
    assert b"\x1b[" not in d.stdout and d.returncode == 1
    d = tl(env, "check", "train.py", "--no-cache", "--color", cwd=tmp_path)
    assert b"\x1b[" in d.stdout and d.returncode == 1
    # a big environment (more than one read of the socket) and bytes that are not UTF-8
    odd = dict(env, TL_ODD=os.fsdecode(b"caf\xe9"), **{f"TL_BIG{i}": "x" * 100_000 for i in range(3)})
    d = tl(odd, "check", "train.py", "--no-cache", "--output-format", "concise", cwd=tmp_path)
    assert d.returncode == 1 and d.stdout == local(odd, "check", "train.py", "--no-cache", "--output-format",
                                                   "concise", cwd=tmp_path).stdout
    # the cache directory is made with the client's umask
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for sub, run in (("a", tl), ("b", local)):
        (tmp_path / sub / "train.py").write_text(BUGGY)
        r = run(env, "check", "train.py", "--cache-dir", "cache", cwd=tmp_path / sub, umask=0o077)
        assert r.returncode == 1, r.stderr
    assert _requests(env) == before + 4
    mode = os.stat(tmp_path / "b" / "cache").st_mode & 0o777
    assert os.stat(tmp_path / "a" / "cache").st_mode & 0o777 == mode and not mode & 0o077


def test_configuration_error_exits_two_through_the_daemon(env, tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "pyproject.toml").write_text('[tool.torchlint]\nselect = "TL1"\n')
    before = _requests(env)
    d = tl(env, ".", "--no-cache", cwd=tmp_path)
    assert _requests(env) == before + 1
    ref = local(env, ".", "--no-cache", cwd=tmp_path)
    assert d.returncode == ref.returncode == 2
    assert b"`tool.torchlint.select` must be a list of strings" in d.stderr and b"pyproject.toml" in d.stderr
    assert b"Traceback" not in d.stderr and d.stderr == ref.stderr and d.stdout == ref.stdout


def test_concurrent_checks(env):
    before = _requests(env)
    args = [sys.executable, "-m", "torchlint", "check", BAD, "--no-cache", "--output-format", "concise", "-j", "1"]
    procs = [subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    ref = local(env, *args[3:])
    assert [p.returncode for p in procs] == [1, 1, 1]
    assert all(out == (ref.stdout, ref.stderr) for out in outs)
    assert _requests(env) == before + 3


# -- what stays in the client's process ---------------------------------------------------

def test_dynamic_no_daemon_and_the_environment_switch_are_never_routed(env, tmp_path):
    (tmp_path / "f.py").write_text("x = 1\n")
    before = _requests(env)
    r = tl(env, "check", "f.py", "--no-cache", "--dynamic", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = tl(env, "check", "f.py", "--no-cache", "--no-daemon", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = tl(dict(env, TORCHLINT_NO_DAEMON="1"), "check", "f.py", "--no-cache", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = tl(env, "rule", "TL103")
    assert r.returncode == 0 and b"## What it does" in r.stdout
    assert _requests(env) == before


def _raw_request(monkeypatch, argv):
    # pytest replaced this process's stdin; the request's stdio only describes the fds sent
    monkeypatch.setattr(client, "_stdio", lambda: [["utf-8", "strict", False, False]] * 3)
    return client._check_request(argv)


def test_the_daemon_refuses_dynamic_itself(env, monkeypatch):
    """Even a client that asks: the daemon never runs code."""
    req = _raw_request(monkeypatch, ["check", GOOD, "--dynamic"])
    sock = client.connect(client.paths(env)["socket"], 5.0)
    with sock, open(os.devnull, "rb") as i, open(os.devnull, "wb") as o:
        client.send_msg(sock, req, fds=(i.fileno(), o.fileno(), o.fileno()))
        reply = client.recv_msg(sock)
    assert reply == {"refused": "not a static check"}
    assert _status(env) is not None


# -- falling back -------------------------------------------------------------------------

def test_stale_socket_without_listener_falls_back(fresh_env):
    p = client.paths(fresh_env)
    client.check_dir(p["dir"], create=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(p["socket"])
    s.close()  # the file stays, nobody listens
    t = time.monotonic()
    d = tl(fresh_env, "check", BAD, "--no-cache", "--output-format", "concise")
    ref = local(fresh_env, "check", BAD, "--no-cache", "--output-format", "concise")
    assert d.returncode == ref.returncode == 1 and d.stdout == ref.stdout and d.stderr == ref.stderr
    assert time.monotonic() - t < 60
    r = tl(fresh_env, "daemon", "status")
    assert r.returncode == 1 and b"no daemon running" in r.stdout
    # and `start` replaces the dead socket
    r = tl(fresh_env, "daemon", "start", timeout=60)
    assert r.returncode == 0, r.stderr
    assert _status(fresh_env)["requests"] == 0


def test_start_stop_status_and_fallback_after_stop(fresh_env):
    r = tl(fresh_env, "daemon", "status")
    assert r.returncode == 1 and b"no daemon running" in r.stdout
    r = tl(fresh_env, "daemon", "stop")
    assert r.returncode == 0 and b"no daemon running" in r.stdout
    r = tl(fresh_env, "daemon", "start", "--idle-timeout", "60", timeout=60)
    assert r.returncode == 0 and b"torchlint daemon started (pid " in r.stdout, r.stderr
    r = tl(fresh_env, "daemon", "start", timeout=60)
    assert r.returncode == 0 and b"already running" in r.stdout
    d = tl(fresh_env, "check", GOOD, "--no-cache")
    assert d.returncode == 0
    r = tl(fresh_env, "daemon", "status")
    assert r.returncode == 0 and b"requests: 1" in r.stdout and b"socket:" in r.stdout
    r = tl(fresh_env, "daemon", "stop")
    assert r.returncode == 0 and b"torchlint daemon stopped (pid " in r.stdout
    assert not os.path.exists(client.paths(fresh_env)["socket"])
    d = tl(fresh_env, "check", BAD, "--no-cache")
    assert d.returncode == 1 and b"TL1" in d.stdout
    assert tl(fresh_env, "daemon", "status").returncode == 1


def test_unsafe_directory_is_an_error_for_the_daemon_and_ignored_by_check(fresh_env):
    p = client.paths(fresh_env)
    os.mkdir(p["dir"], 0o700)
    os.chmod(p["dir"], 0o755)
    r = tl(fresh_env, "daemon", "start", timeout=60)
    assert r.returncode == 2
    assert b"torchlint: error: unsafe directory for the daemon's socket" in r.stderr and b"Traceback" not in r.stderr
    r = tl(fresh_env, "daemon", "status")
    assert r.returncode == 2 and b"torchlint: error:" in r.stderr
    d = tl(fresh_env, "check", GOOD, "--no-cache")
    assert d.returncode == 0, d.stderr


def test_a_client_of_another_torchlint_makes_the_daemon_exit(fresh_env, monkeypatch):
    assert tl(fresh_env, "daemon", "start", timeout=60).returncode == 0
    req = dict(_raw_request(monkeypatch, ["check", GOOD]), version="0.0.0-other")
    sock = client.connect(client.paths(fresh_env)["socket"], 5.0)
    with sock, open(os.devnull, "rb") as i, open(os.devnull, "wb") as o:
        client.send_msg(sock, req, fds=(i.fileno(), o.fileno(), o.fileno()))
        reply = client.recv_msg(sock)
    assert "stale" in reply
    deadline = time.monotonic() + 10
    while _status(fresh_env) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _status(fresh_env) is None
    assert not os.path.exists(client.paths(fresh_env)["socket"])


# -- the worker's life --------------------------------------------------------------------

def _big_project(tmp_path, n=80):
    for i in range(n):
        (tmp_path / f"m{i}.py").write_text(BUGGY * 20)
    return tmp_path


def _has_taken_over(pid, proc) -> bool:
    """Whether the worker has acknowledged and made the client's stderr its own (Linux: /proc)."""
    if not os.path.isdir("/proc/self/fd"):  # no /proc to look: give it time
        time.sleep(0.5)
        return True
    try:
        theirs, ours = os.stat(f"/proc/{pid}/fd/2"), os.fstat(proc.stderr.fileno())
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def _wait_for_worker(env, proc, timeout=30):
    """The pid of the worker serving ``proc``, once the client has its acknowledgement (a worker
    that dies before that makes the client lint in its own process instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _status(env)
        if st and st.get("workers") and _has_taken_over(st["workers"][0], proc):
            return st["workers"][0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no worker started")


def _wait_no_worker(env, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _status(env).get("workers"):
            return True
        time.sleep(0.05)
    return False


def test_interrupt_reaches_the_worker(env, tmp_path):
    _big_project(tmp_path)
    # -j 1: a ^C also reaches the pool's processes (the worker leads their process group, as a
    # terminal's foreground group would), and they print their own KeyboardInterrupt
    # as from a terminal: ^C not ignored (a command started in the background by a shell
    # without job control, e.g. `.ci/run &`, inherits an ignored SIGINT, and so would this)
    proc = subprocess.Popen([sys.executable, "-m", "torchlint", "check", ".", "--no-cache", "-j", "1"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_worker(env, proc)
    time.sleep(0.5)  # into the lint (a ^C while click parses the arguments is its "Aborted!", status 1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    # what ^C does to an in-process run: "interrupted", status 2; the client waits for the
    # worker's status. (A ^C that lands inside libcst's native parser can be lost to that file's
    # result: the run then goes on to its end, but still says it was interrupted.)
    assert proc.returncode == 2, (out, err)
    assert err.endswith(b"torchlint: error: interrupted\n"), (out, err)
    assert b"Traceback" not in err
    assert _wait_no_worker(env)


def test_a_worker_killed_without_status(env, tmp_path):
    _big_project(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "torchlint", "check", ".", "--no-cache", "-j", "1"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid = _wait_for_worker(env, proc)
    os.kill(pid, signal.SIGKILL)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert err.endswith(client.WORKER_GONE.encode())
    assert _wait_no_worker(env)


def test_a_client_that_gives_up_before_the_go_never_gets_a_second_run(env, tmp_path):
    """A client that timed out waiting for the acknowledgement lints in process; the worker
    that acknowledged late must then not run the check too (it waits for the client's go)."""
    (tmp_path / "train.py").write_text(BUGGY)
    # the request a `torchlint` client in tmp_path makes (pytest's own import path, flags and
    # streams differ: the daemon would refuse them)
    argv = ["check", ".", "--no-cache", "-o", "report.json", "--output-format", "json"]
    probe = subprocess.run([sys.executable, "-c", "import json, sys; from torchlint import client; "
                            f"print(json.dumps(client._check_request({argv!r})))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    req = json.loads(probe.stdout)
    with open(os.devnull, "rb") as fin, open(os.devnull, "wb") as fout:
        sock = client.connect(client.paths(env)["socket"], 5.0)
        with sock:
            client.send_msg(sock, req, fds=(fin.fileno(), fout.fileno(), fout.fileno()))
            ack = client.recv_msg(sock)
    if not client._is_ack(ack):
        pytest.skip(f"the daemon refused this hand-made request: {ack}")
    assert _wait_no_worker(env)
    assert not (tmp_path / "report.json").exists()  # no go: the worker never linted
    # the same request with the go is served
    r = tl(env, "check", ".", "--no-cache", "-o", "report.json", "--output-format", "json", cwd=tmp_path)
    assert r.returncode == 1 and (tmp_path / "report.json").exists()

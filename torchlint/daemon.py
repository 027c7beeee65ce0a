"""`torchlint daemon`: a background process that keeps torchlint imported.

``serve`` imports click, libcst, the rules and the pipeline once, then answers requests on a
Unix socket (``client.paths()``; one daemon per environment and install of torchlint). A
``check`` request is served by fork: the worker process acknowledges with its pid, takes the
client's stdin/stdout/stderr (received over the socket), its working directory, environment,
umask and ``sys.argv``, runs ``torchlint.cli.main`` exactly as the client would have, and sends
the exit status. Nothing a run does (caches, imports, the collector's state) outlives its worker,
so a run through the daemon is an in-process run by construction; the daemon itself only
accepts, forks and reaps, in one thread.

The daemon never runs user code: it serves the static ``check`` only (the client runs
``--dynamic`` in its own process, and the daemon refuses it too), and it answers only its own
user (a 0700 directory, and the peer's uid where the platform tells it).

A request whose torchlint (version, package directory, environment, Python) differs from the
daemon's, or that arrives after torchlint's own source files changed on disk, gets
``{"stale": ...}`` and the daemon exits: the client then runs the check itself.
"""
from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time

from . import __version__
from . import client as _c

# imported before serving, so that a request pays none of it
WARM_MODULES = (
    "torchlint.cli", "torchlint.config", "torchlint.selection", "torchlint.runner", "torchlint.engine",
    "torchlint.parse", "torchlint.schedule", "torchlint.project", "torchlint.cache", "torchlint.discover",
    "torchlint.source", "torchlint.suppress", "torchlint.findings", "torchlint.fixes", "torchlint.fixer",
    "torchlint.baseline", "torchlint.vcs", "torchlint.notebook", "torchlint.output", "torchlint.model",
    "torchlint.rule", "torchlint.codes", "libcst", "libcst.native", "multiprocessing", "multiprocessing.connection",
    "difflib", "tempfile", "locale", "io", "types", "atexit", "traceback",
)
DEPENDENCIES = ("libcst", "click")  # an upgrade of these makes the daemon stale too
RECHECK_S = 60.0  # how often an idle daemon checks that its socket and sources are still its own
REQUEST_TIMEOUT = 1.0  # to read one request (a client sends it right after connecting)
SEND_TIMEOUT = 5.0  # for the worker to send the exit status
GO_TIMEOUT = 10.0  # for the client's go after the worker's acknowledgement
DEFAULT_IDLE_TIMEOUT = 28800.0


class AlreadyRunning(Exception):
    def __init__(self, pid=None):
        super().__init__(f"a torchlint daemon is already running{f' (pid {pid})' if pid else ''}")
        self.pid = pid


class _Stop(BaseException):
    pass


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} torchlint daemon[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# -- staleness ----------------------------------------------------------------------------

def source_files() -> list:
    """The files whose change makes a daemon stale: torchlint's and the rules' .py files (the rules
    may live outside the package, as in a source checkout) and the dependencies' top modules."""
    from importlib.util import find_spec

    dirs = [os.path.dirname(os.path.realpath(__file__))]
    spec = find_spec("torchlint.rules")  # imports the package `torchlint` only
    for d in (spec.submodule_search_locations or ()) if spec else ():
        d = os.path.realpath(d)
        if not any(d == x or d.startswith(x + os.sep) for x in dirs):
            dirs.append(d)
    out = []
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = sorted(s for s in subdirs if s != "__pycache__" and not s.startswith("."))
            out.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
    for name in DEPENDENCIES:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            out.append(spec.origin)
    return out


def stamps(dirs_files=None) -> dict:
    """path -> (mtime_ns, size) of the source files, and the set of files itself."""
    out = {}
    for p in source_files() if dirs_files is None else dirs_files:
        try:
            st = os.stat(p)
            out[p] = (st.st_mtime_ns, st.st_size)
        except OSError:
            out[p] = None
    return out


# -- the server ---------------------------------------------------------------------------

def _lock(path: str) -> int:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid = int(os.pread(fd, 32, 0).decode().strip() or 0) or None
        except (OSError, ValueError):
            pid = None
        os.close(fd)
        raise AlreadyRunning(pid) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_is_free(path: str) -> bool:
    """Whether no daemon holds the lock at ``path`` (then its socket, if any, is stale)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def warm_up() -> None:
    import importlib

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # an optional piece: it is imported by the worker if a run needs it
            _log(f"not preloaded: {name}: {exc}")
    from .rule import all_rules

    all_rules()


class Daemon:
    def __init__(self, paths: dict, idle_timeout: float):
        self.paths = paths
        self.idle_timeout = idle_timeout
        self.started = time.time()
        self.pid = os.getpid()
        self.requests = 0
        self.children: set = set()
        self.srv = None
        self.ino = None
        self.lock_fd = -1
        # stamped before the imports: an edit made while importing is seen as a change
        self.files = source_files()
        self.stamps = stamps(self.files)
        self.ident = _c.identity()
        self.flags = list(sys.flags)
        self.path = _c.import_path()

    # -- life cycle

    def serve(self) -> int:
        self.lock_fd = _lock(self.paths["lock"])
        try:
            warm_up()
            gc.collect()
            gc.freeze()  # the warm heap stays shared with the workers (the collector never writes to it)
            self._bind()
            old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
            try:
                _log(f"listening on {self.paths['socket']} (torchlint {__version__}, "
                     f"Python {sys.version.split()[0]}, idle timeout {self.idle_timeout:g} s)")
                self._loop()
            except (_Stop, KeyboardInterrupt):
                _log("stopped by a signal")
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
        finally:
            self._close()
        return 0

    def _on_signal(self, signum, _frame):
        raise _Stop(signum)

    def _bind(self) -> None:
        path = self.paths["socket"]
        if os.path.lexists(path):
            # we hold the lock, so no daemon of this install listens there: a stale socket
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise AlreadyRunning()
            finally:
                probe.close()
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        srv.listen(128)
        self.ino = os.lstat(path).st_ino
        self.srv = srv

    def _owns_socket(self) -> bool:
        try:
            return os.lstat(self.paths["socket"]).st_ino == self.ino
        except OSError:
            return False

    def _close(self) -> None:
        if os.getpid() != self.pid:  # never in a worker
            return
        if self.srv is not None:
            if self._owns_socket():
                try:
                    os.unlink(self.paths["socket"])
                except OSError:
                    pass
            self.srv.close()
            self.srv = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def _loop(self) -> None:
        last = last_check = time.monotonic()
        while True:
            self._reap()
            now = time.monotonic()
            if self.children:
                last = now  # not idle while a worker runs
            if self.idle_timeout > 0 and now - last >= self.idle_timeout:
                _log(f"no request for {self.idle_timeout:g} s: exiting")
                return
            timeout = 0.25 if self.children else RECHECK_S
            if self.idle_timeout > 0:
                timeout = max(min(timeout, self.idle_timeout - (now - last)), 0.01)
            self.srv.settimeout(timeout)
            try:
                conn, _addr = self.srv.accept()
            except socket.timeout:
                if time.monotonic() - last_check >= RECHECK_S:
                    last_check = time.monotonic()
                    if not self._owns_socket():
                        _log("the socket was removed or replaced: exiting")
                        return
                    why = self._stale()
                    if why:
                        _log(f"stale ({why}): exiting")
                        return
                continue
            last = time.monotonic()
            if self._handle(conn) == "exit":
                return

    # -- one connection

    def _handle(self, conn):
        fds: list = []
        try:
            conn.settimeout(REQUEST_TIMEOUT)
            uid = _c.peer_uid(conn)
            if uid is not None and uid != os.getuid():
                _log(f"refused a connection from uid {uid}")
                return None
            msg, fds = self._receive(conn)
            if not isinstance(msg, dict):
                return None
            cmd = msg.get("cmd")
            if cmd == "status":
                _c.send_msg(conn, self._status(msg))
                return None
            if cmd == "stop":
                _c.send_msg(conn, {"stopping": True, "pid": os.getpid()})
                _log("stop requested: exiting")
                return "exit"
            if cmd != "check":
                _c.send_msg(conn, {"error": f"unknown command {cmd!r}"})
                return None
            why = self._stale(msg)
            if why:
                _c.send_msg(conn, {"stale": why})
                _log(f"stale ({why}): exiting")
                return "exit"
            why = self._refusal(msg, fds)
            if why:
                _c.send_msg(conn, {"refused": why})
                return None
            self._fork(conn, msg, fds)
        except (OSError, ValueError, EOFError, UnicodeError) as exc:
            _log(f"bad request: {type(exc).__name__}: {exc}")
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            conn.close()
        return None

    def _receive(self, conn):
        data, fds, flags, _addr = socket.recv_fds(conn, 1 << 16, 8)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            for fd in fds:
                os.close(fd)
            raise ValueError("file descriptors were truncated")
        if not data:
            return None, fds
        try:
            return _c.recv_msg(conn, first=data), fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def _status(self, msg) -> dict:
        stale = self._stale(msg if "pkg" in msg else None)
        return {"pid": os.getpid(), "started": self.started, "uptime": time.time() - self.started,
                "requests": self.requests, "running": len(self.children), "workers": sorted(self.children), "socket": self.paths["socket"],
                "version": __version__, "python": sys.version.split()[0], "stale": stale}

    def _stale(self, msg=None):
        """Why this daemon cannot serve ``msg`` or any later request, or None."""
        if msg is not None:
            for key in ("version", "pkg", "prefix", "python"):
                if msg.get(key) != self.ident[key]:
                    return f"the client's {key} differs"
        now = stamps(self.files)
        if now != self.stamps or source_files() != self.files:
            return "torchlint's source files changed"
        return None

    def _refusal(self, msg, fds):
        """Why this one request is for the client to run itself, or None."""
        if msg.get("protocol") != _c.PROTOCOL:
            return "protocol"
        if len(fds) != 3:
            return "expected the three standard file descriptors"
        argv, env = msg.get("argv"), msg.get("env")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            return "bad argv"
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            return "bad environment"
        if not _c.wants_daemon(argv, env):
            return "not a static check"  # --dynamic runs code: never here
        if not isinstance(msg.get("cwd"), str) or not isinstance(msg.get("umask"), int) \
                or not isinstance(msg.get("argv0"), str):
            return "bad request"
        stdio = msg.get("stdio")
        if not (isinstance(stdio, list) and len(stdio) == 3 and all(isinstance(s, list) and len(s) == 4 for s in stdio)):
            return "bad stdio"
        if msg.get("flags") != self.flags:
            return "the client's interpreter flags differ"
        if msg.get("path") != self.path:
            return "the client's sys.path differs"
        return None

    def _fork(self, conn, msg, fds) -> None:
        for s in (sys.stdout, sys.stderr):  # nothing of the daemon's log may reach the client
            try:
                s.flush()
            except (OSError, ValueError):
                pass
        # no signal handler of the daemon may run in the worker (it would unlink the socket):
        # held back until the worker has reset them, and in the daemon until the fork is done
        held = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    _worker(conn, msg, fds, close=(self.srv, self.lock_fd), held=held)
                finally:
                    os._exit(2)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        self.children.add(pid)
        self.requests += 1


# -- the worker ---------------------------------------------------------------------------

def _worker(conn, msg, fds, close, held) -> None:
    """In the forked process: become the client's `torchlint check` and report its exit status."""
    try:
        srv, lock_fd = close
        srv.close()
        os.close(lock_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for name in ("SIGTERM", "SIGHUP", "SIGCHLD"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        try:
            os.setpgid(0, 0)  # so that the client's ^C reaches this worker's pool too
        except OSError:
            pass
        _c.send_msg(conn, {"pid": os.getpid()})
        conn.settimeout(GO_TIMEOUT)
        go = _c.recv_msg(conn)
        if not (isinstance(go, dict) and go.get("go") is True):
            raise EOFError
    except BaseException:
        os._exit(1)  # the client is gone, gave up waiting (it lints in process), or said nothing usable
    try:
        code = _become_client(msg, fds)
    except BaseException as exc:
        code = 2
        try:
            if os.environ.get("TORCHLINT_DEBUG"):
                import traceback

                traceback.print_exc()
            sys.stderr.write(f"torchlint: error: internal error in the daemon's worker: "
                             f"{type(exc).__name__}: {exc}\n")
            sys.stderr.flush()
        except BaseException:
            pass
    try:
        conn.settimeout(SEND_TIMEOUT)
        _c.send_msg(conn, {"exit": code})
    except BaseException:
        pass
    _write_deferred()
    os._exit(code)


def _write_deferred() -> None:
    """After the client has its report and exit status: the cache writes the run kept back
    (the run snapshot, the stat index; see ``cache.defer_writes``), with the client's
    streams let go first so that nothing waits on them."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        from . import cache

        cache.write_deferred()
    except BaseException:
        pass  # a snapshot not written: the next run is slower, not wrong


def _stream(fd: int, spec):
    import io

    encoding, errors, line_buffering, write_through = spec
    mode = "r" if fd == 0 else "w"
    raw = io.FileIO(fd, mode, closefd=False)
    raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    if write_through and mode == "w":  # python -u: text goes straight to the file
        buf = raw
    else:
        buf = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    stream = io.TextIOWrapper(buf, encoding=encoding, errors=errors, newline="\n",
                              line_buffering=line_buffering, write_through=write_through)
    stream.mode = mode
    return stream


def _become_client(msg, fds) -> int:
    import locale
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    del fds[:]
    os.umask(msg["umask"])
    streams = [_stream(i, spec) for i, spec in enumerate(msg["stdio"])]
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams
    os.environ.clear()
    os.environ.update(msg["env"])
    try:
        locale.setlocale(locale.LC_CTYPE, "")  # as the client's Python did at start-up
    except locale.Error:
        pass
    try:
        os.chdir(msg["cwd"])
    except OSError as exc:
        sys.stderr.write(f"torchlint: error: cannot enter {msg['cwd']}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        return 2
    argv = list(msg["argv"])
    sys.argv = [msg["argv0"]] + argv
    # click names the program from sys.argv[0] and __main__.__package__ ("python -m torchlint")
    main_module = types.ModuleType("__main__")
    main_module.__package__ = msg.get("main_package")
    sys.modules["__main__"] = main_module

    from . import cache
    from .cli import main as cli_main

    cache.defer_writes(True)  # written after the client has its answer (_write_deferred)
    # This process ends with os._exit after one check: the collector would only walk what the
    # check decoded (the cache's snapshot: a few hundred thousand objects, no cycles) at a
    # cost of 10-80 ms. Linting collects for itself where it matters (lint_text breaks the
    # model's cycles; a pool in this process collects every GC_EVERY files).
    gc.disable()

    try:
        cli_main.main(args=argv, standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc.code)
    try:
        import atexit

        atexit._run_exitfuncs()  # as at the end of an in-process run (multiprocessing cleans up here)
    except BaseException:
        pass
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            if s is sys.stdout:
                code = 120  # what Python exits with when it cannot flush stdout
    return code


def _exit_status(value) -> int:
    """The exit status a Python process gets for ``SystemExit(value)``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        sys.stderr.write(f"{value}\n")
    except (OSError, ValueError):
        pass
    return 1


# -- the `torchlint daemon ...` commands --------------------------------------------------

def _require_support() -> None:
    if not _c.supported():
        raise _c.DaemonError("the daemon needs Unix sockets that pass file descriptors and fork "
                             "(Linux or macOS, Python >= 3.9)")


def _existing_paths():
    """The daemon's paths, after checking its directory; None when the directory does not exist."""
    _require_support()
    p = _c.paths()
    try:
        _c.check_dir(p["dir"])
    except FileNotFoundError:
        return None
    return p


def _forget_stale_socket(p) -> None:
    if os.path.lexists(p["socket"]) and lock_is_free(p["lock"]):
        try:
            os.unlink(p["socket"])
        except OSError:
            pass


def _ask_status():
    return _c.request("status", **_c.identity())


def run(idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> int:
    """`torchlint daemon run`: serve in the foreground until stopped or idle."""
    _require_support()
    p = _c.paths()
    _c.check_dir(p["dir"], create=True)
    try:
        return Daemon(p, idle_timeout).serve()
    except AlreadyRunning as exc:
        raise _c.DaemonError(str(exc)) from None


def start(idle_timeout: float = DEFAULT_IDLE_TIMEOUT, wait_s: float = 15.0) -> int:
    """`torchlint daemon start`: a detached `torchlint daemon run`, once it answers."""
    import subprocess

    _require_support()
    p = _c.paths()
    _c.check_dir(p["dir"], create=True)
    st = _ask_status()
    if st is not None:
        if not st.get("stale"):
            print(f"torchlint daemon already running (pid {st.get('pid')})")
            return 0
        _stop_and_wait(p)  # serving another torchlint than this one: replace it
    _forget_stale_socket(p)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    log = os.open(p["log"], flags, 0o600)
    try:
        cmd = [sys.executable, "-m", "torchlint", "daemon", "run", "--idle-timeout", repr(float(idle_timeout))]
        # in its own directory, so that `python -m` puts nothing of the user's on sys.path
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=p["dir"],
                                start_new_session=True, close_fds=True)
    finally:
        os.close(log)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        st = _ask_status()
        if st is not None:
            print(f"torchlint daemon started (pid {st.get('pid')})")
            return 0
        rc = proc.poll()
        if rc is not None:
            st = _ask_status()  # another `start` may have won the race
            if st is not None:
                print(f"torchlint daemon already running (pid {st.get('pid')})")
                return 0
            raise _c.DaemonError(f"the daemon exited with status {rc}: {_tail(p['log'])}")
        time.sleep(0.05)
    raise _c.DaemonError(f"the daemon did not answer within {wait_s:g} s (its log: {p['log']})")


def _stop_and_wait(p, wait_s: float = 5.0):
    reply = _c.request("stop")
    if reply is None:
        return None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not lock_is_free(p["lock"]):
        time.sleep(0.02)
    return reply


def stop() -> int:
    """`torchlint daemon stop`: exit 0 whether or not a daemon was running."""
    p = _existing_paths()
    if p is None:
        print("no daemon running")
        return 0
    reply = _stop_and_wait(p)
    if reply is None:
        _forget_stale_socket(p)
        print("no daemon running")
        return 0
    print(f"torchlint daemon stopped (pid {reply.get('pid')})")
    return 0


def status() -> int:
    """`torchlint daemon status`: 0 and a description when one runs, 1 otherwise."""
    p = _existing_paths()
    st = _ask_status() if p is not None else None
    if st is None:
        if p is not None:
            _forget_stale_socket(p)
        print("no daemon running")
        return 1
    print(f"torchlint daemon running (pid {st.get('pid')})")
    print(f"  uptime:   {_duration(st.get('uptime', 0))}")
    print(f"  requests: {st.get('requests')}" + (f" ({st['running']} running)" if st.get("running") else ""))
    print(f"  socket:   {st.get('socket')}")
    print(f"  version:  torchlint {st.get('version')}, Python {st.get('python')}")
    if st.get("stale"):
        print(f"  stale:    {st['stale']} (it exits at the next check; `torchlint daemon start` replaces it)")
    return 0


def _duration(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else (f"{m}m {sec:02d}s" if m else f"{sec}s")


def _tail(path: str, n: int = 400) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(size - n, 0))
            text = fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return "(no log)"
    return text.splitlines()[-1] if text else "(empty log)"


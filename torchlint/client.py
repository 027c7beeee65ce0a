"""The `torchlint` command's entry point: hand a `check` to a running daemon, else run it here.

A fresh process spends most of a small run importing click, libcst and the rules. When a
``torchlint daemon`` (``torchlint/daemon.py``) is running for this interpreter and this
install, ``check`` is sent to it instead: the request carries the arguments, the working
directory, the whole environment and the three standard file descriptors; the daemon forks a
worker that becomes this command (same fds, directory, environment, ``sys.argv``) and runs
``torchlint.cli.main`` there, so the output is that of an in-process run by construction. The
worker acknowledges with its pid, and later sends the exit status.

Anything unusual before the acknowledgement (no daemon, a refused or stale daemon, a timeout,
a protocol error) falls back silently to running the CLI in this process. This module is
imported on every invocation, so it imports only what the fast path needs.
"""
import json
import os
import socket
import stat
import struct
import sys

from . import __version__

PROTOCOL = 1
ACK_TIMEOUT = 2.0  # seconds to wait for the daemon's worker to say it took the request
# the subcommands that are never sent to the daemon (anything else is an implicit `check`)
OTHER_COMMANDS = frozenset(("rule", "rules", "lsp", "confirm", "daemon"))
TOP_LEVEL_FLAGS = frozenset(("--help", "-h", "--version", "-V"))
# `check` options after which the command runs in this process
LOCAL_FLAGS = ("--no-daemon", "--dynamic")
MAX_MESSAGE = 1 << 24
SUN_PATH_MAX = 104  # bytes in sockaddr_un.sun_path on macOS and the BSDs (108 on Linux), NUL included
_LEN = struct.Struct("!I")
WORKER_GONE = "torchlint: error: the daemon's worker ended without an exit status\n"


class DaemonError(Exception):
    """The daemon cannot be used here (unsafe socket directory, platform, ...)."""


# -- where the daemon lives ---------------------------------------------------------------

def supported() -> bool:
    """AF_UNIX sockets that carry file descriptors, and fork (Linux, macOS, Python >= 3.9)."""
    return hasattr(socket, "AF_UNIX") and hasattr(socket, "send_fds") and hasattr(os, "fork") \
        and hasattr(os, "getuid")


def identity() -> dict:
    """What a daemon must share with its clients: this install of torchlint in this environment.

    ``sys.prefix`` (not ``sys.executable``) names the environment, so ``python``, ``python3``
    and the console script's interpreter of one virtualenv share a daemon; ``sys.version``
    tells two interpreters installed at one prefix apart.
    """
    return {"version": __version__, "pkg": os.path.dirname(os.path.realpath(__file__)),
            "prefix": os.path.realpath(sys.prefix), "python": sys.version}


def import_path() -> list:
    """``sys.path`` without the entry Python adds for the script, module or ``-c`` it runs."""
    return list(sys.path[0 if getattr(sys.flags, "safe_path", False) else 1:])


def _digest() -> str:
    import hashlib

    ident = identity()
    key = "\0".join((ident["prefix"], ident["python"], ident["pkg"], ident["version"]))
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def runtime_dir(env=None) -> str:
    """``<base>/torchlint-<uid>``: base is $XDG_RUNTIME_DIR when it is a directory and the socket
    path fits in ``sun_path`` there, else the temporary directory ($TMPDIR, $TEMP, $TMP, /tmp)."""
    env = os.environ if env is None else env
    name = f"torchlint-{os.getuid()}"
    bases = []
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        bases.append(xdg)
    tmp = "/tmp"
    for var in ("TMPDIR", "TEMP", "TMP"):
        v = env.get(var)
        if v and os.path.isdir(v):
            tmp = os.path.abspath(v)
            break
    bases.append(tmp)
    if tmp != "/tmp":
        bases.append("/tmp")
    for base in bases:
        d = os.path.join(base, name)
        if len(os.fsencode(os.path.join(d, "0" * 16 + ".sock"))) < SUN_PATH_MAX:
            return d
    raise DaemonError(f"no directory for the daemon's socket: {os.path.join(bases[0], name)} is too long "
                      f"for a socket path")


def paths(env=None) -> dict:
    d = runtime_dir(env)
    digest = _digest()
    return {"dir": d, "socket": os.path.join(d, digest + ".sock"), "log": os.path.join(d, digest + ".log"),
            "lock": os.path.join(d, digest + ".lock")}


def check_dir(d: str, create: bool = False) -> None:
    """Raise DaemonError unless ``d`` is a real directory of this user that nobody else can enter;
    FileNotFoundError when it does not exist (and ``create`` is false)."""
    if create:
        try:
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700)  # whatever the umask
        except FileExistsError:
            pass
        except OSError as exc:
            raise DaemonError(f"cannot create the daemon's directory {d}: {exc.strerror or exc}") from None
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        raise DaemonError(f"unsafe directory for the daemon's socket: {d} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise DaemonError(f"unsafe directory for the daemon's socket: {d} is not a directory")
    if st.st_uid != os.getuid():
        raise DaemonError(f"unsafe directory for the daemon's socket: {d} belongs to uid {st.st_uid}, "
                          f"not {os.getuid()}")
    if st.st_mode & 0o077:
        raise DaemonError(f"unsafe directory for the daemon's socket: {d} has mode "
                          f"{oct(st.st_mode & 0o7777)} (others may enter it; expected 0o700)")


# -- the wire format: a 4-byte length, then JSON; the first message may carry fds ----------

def send_msg(sock, obj, fds=()) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogateescape")
    payload = _LEN.pack(len(data)) + data
    if fds:
        n = socket.send_fds(sock, [payload], list(fds))
        payload = payload[n:]
    if payload:
        sock.sendall(payload)


def _recv_exact(sock, n: int, head: bytes = b"") -> bytes:
    buf = bytearray(head)
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 16))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_msg(sock, first: bytes = b""):
    """One message; None when the peer closed the connection before sending any byte."""
    try:
        head = _recv_exact(sock, 4, first[:4])
    except EOFError:
        if not first:
            return None
        raise
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE:
        raise ValueError("message too long")
    body = _recv_exact(sock, n, first[4:4 + n])
    return json.loads(body.decode("utf-8", "surrogateescape"))


def peer_uid(sock):
    """The uid at the other end (Linux's SO_PEERCRED), or None where it cannot be asked."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    size = struct.calcsize("3i")
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, size))
    return uid


def connect(path: str, timeout: float):
    """A connection to the daemon at ``path`` after checking its directory and its owner."""
    check_dir(os.path.dirname(path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        uid = peer_uid(sock)
        if uid is not None and uid != os.getuid():
            raise DaemonError(f"the process listening on {path} belongs to uid {uid}")
    except BaseException:
        sock.close()
        raise
    return sock


def request(cmd: str, timeout: float = 5.0, env=None, **extra):
    """Send a control request (`status`, `stop`) and return the reply; None when no daemon answers."""
    try:
        p = paths(env)
        sock = connect(p["socket"], timeout)
    except (OSError, DaemonError):
        return None
    with sock:
        try:
            send_msg(sock, dict(extra, cmd=cmd, protocol=PROTOCOL))
            return recv_msg(sock)
        except (OSError, ValueError, EOFError):
            return None


# -- routing ------------------------------------------------------------------------------

def wants_daemon(argv, env=None) -> bool:
    """Whether ``torchlint <argv>`` may be served by a daemon (a plain static `check`)."""
    env = os.environ if env is None else env
    if env.get("TORCHLINT_NO_DAEMON"):
        return False
    args = list(argv)
    if args and args[0] == "check":
        args = args[1:]
    elif args and (args[0] in OTHER_COMMANDS or args[0] in TOP_LEVEL_FLAGS):
        return False
    for a in args:
        if a == "--":  # the rest are paths
            break
        if a.startswith(LOCAL_FLAGS):  # also `--dynamic=...`, which click rejects in this process
            return False
    return True


def _stdio() -> list:
    """How this process's standard streams decode and encode, for the worker to do the same."""
    out = []
    for fd, stream in enumerate((sys.stdin, sys.stdout, sys.stderr)):
        if stream is None or getattr(stream, "fileno", None) is None or stream.fileno() != fd:
            raise ValueError("standard streams replaced")
        os.fstat(fd)  # open
        out.append([stream.encoding, stream.errors, bool(getattr(stream, "line_buffering", False)),
                    bool(getattr(stream, "write_through", False))])
    return out


def _check_request(argv) -> dict:
    umask = os.umask(0o022)
    os.umask(umask)
    main = sys.modules.get("__main__")
    req = {"cmd": "check", "protocol": PROTOCOL, "argv": list(argv), "argv0": sys.argv[0] if sys.argv else "torchlint",
           "main_package": getattr(main, "__package__", None), "cwd": os.getcwd(), "env": dict(os.environ),
           "umask": umask, "stdio": _stdio(), "flags": list(sys.flags), "path": import_path(),
           "exe": sys.executable}
    req.update(identity())
    return req


def run_in_daemon(argv):
    """Serve ``torchlint <argv>`` through the daemon: its exit status, or None to run it here."""
    # any failure before the acknowledgement means: lint in this process
    try:
        os.lstat(runtime_dir())  # the common case without a daemon: nothing more to do
        sock = connect(paths()["socket"], ACK_TIMEOUT)
    except Exception:
        return None
    try:
        req = _check_request(argv)
    except Exception:
        sock.close()
        return None
    with sock:
        try:
            send_msg(sock, req, fds=(0, 1, 2))
            ack = recv_msg(sock)
        except Exception:
            return None
        except KeyboardInterrupt:
            # ^C before the acknowledgement: a worker may have started all the same
            ack = _late_ack(sock)
            if ack is None or not _go(sock):
                raise
            return _wait(sock, ack, interrupted=True)
        if not _is_ack(ack):
            return None  # stale, refused, or not a torchlint daemon
        if not _go(sock):
            return None  # the worker will not start without the go
        return _wait(sock, ack["pid"])


def _go(sock) -> bool:
    """Tell the worker that acknowledged to start. Without it (this process gave up waiting
    and lints in process) the worker exits: the check never runs twice."""
    try:
        send_msg(sock, {"go": True})
        return True
    except Exception:
        return False


def _is_ack(msg) -> bool:
    return isinstance(msg, dict) and type(msg.get("pid")) is int and msg["pid"] > 0


def _late_ack(sock):
    try:
        sock.settimeout(ACK_TIMEOUT)
        msg = recv_msg(sock)
    except (KeyboardInterrupt, Exception):
        return None
    return msg["pid"] if _is_ack(msg) else None


def _wait(sock, pid: int, interrupted: bool = False) -> int:
    """The worker runs: wait for its exit status, forwarding the signals a terminal would send."""
    import signal

    def forward(signum, _frame):
        _kill(pid, signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # end the way an in-process run would

    def suspend(signum, _frame):  # ^Z: stop the worker with this process, resume it with it
        _kill(pid, signal.SIGSTOP)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        signal.signal(signum, suspend)  # continued
        _kill(pid, signal.SIGCONT)

    for name, handler in (("SIGTERM", forward), ("SIGHUP", forward), ("SIGQUIT", forward), ("SIGTSTP", suspend)):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)
    sock.settimeout(None)
    try:
        try:
            if interrupted:
                raise KeyboardInterrupt
            msg = recv_msg(sock)
        except KeyboardInterrupt:
            # a terminal's ^C reaches this process's group only: pass it on to the worker's, and
            # wait for the worker as long as an in-process run would go on
            _kill(pid, signal.SIGINT)
            try:
                msg = recv_msg(sock)
            except KeyboardInterrupt:  # a second ^C: pass it on, then give up soon
                _kill(pid, signal.SIGINT)
                sock.settimeout(2.0)
                try:
                    msg = recv_msg(sock)
                except (KeyboardInterrupt, OSError, ValueError, EOFError):
                    return 130
    except (OSError, ValueError, EOFError):
        msg = None
    if isinstance(msg, dict) and type(msg.get("exit")) is int:
        return msg["exit"]
    try:
        sys.stderr.write(WORKER_GONE)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return 2


def _kill(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)  # the worker leads its own process group (its pool workers too)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def main():
    argv = sys.argv[1:]
    if supported() and wants_daemon(argv):
        code = run_in_daemon(argv)
        if code is not None:
            sys.exit(code)
    from .cli import main as cli_main

    if argv and (argv[0] in OTHER_COMMANDS or argv[0] in TOP_LEVEL_FLAGS):
        cli_main()
        return
    # A check is the last thing this process does. The collector stays off for it (the lint
    # breaks its own cycles and collects where it matters: see ``engine.run``), and what it
    # leaves is frozen on the way out: the collection at interpreter exit would otherwise walk
    # every result and the decoded cache (10-20 ms of a warm run).
    import gc

    gc.disable()
    try:
        cli_main()
    finally:
        gc.freeze()

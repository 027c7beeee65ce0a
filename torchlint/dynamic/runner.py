"""Runs the child interpreter safely (parent side; never imports torch).

Safety model:

* the child is a new session and process group (``start_new_session``); on timeout the whole
  group gets SIGTERM, then SIGKILL two seconds later; after every run the group is SIGKILLed
  again so nothing the user's code forked is left behind;
* time: each job has ``timeout`` seconds from its start (interpreter start-up is allowed
  another 60 s); a job that hangs is killed and the remaining jobs restart in a fresh child;
* memory: ``RLIMIT_AS`` on CPU runs, and on every run a watchdog that sums the resident
  memory of the process group and kills it above the limit (CUDA reserves address space, so
  ``RLIMIT_AS`` is left alone there);
* output: stdout and stderr are read through pipes and only their last 16 KiB kept; the
  facts file is capped by the child writer (4 MiB) and read back at most 8 MiB;
* a child that exits, calls ``os._exit``, crashes or is killed in the middle of a job ends
  that job with a status, and the next jobs run in a new child.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Optional

TAIL = 16 * 1024
STARTUP_ALLOWANCE = 60.0


def default_memory_mb() -> int:
    env = os.environ.get("TORCHLINT_DYNAMIC_MEMORY_MB")
    if env and env.isdigit():
        return int(env)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        total = 16384
    return max(2048, min(16384, int(total * 0.6)))


class JobResult:
    def __init__(self, job_id):
        self.id = job_id
        self.facts: list = []
        self.status: Optional[str] = None  # ok | stopped | exit | exception | timeout | memory | died | ...
        self.detail: dict = {}
        self.seconds: Optional[float] = None

    def __repr__(self):
        return f"JobResult({self.id}, {self.status}, {len(self.facts)} facts)"


class RunOutcome:
    def __init__(self, on_event=None):
        self.jobs: dict = {}
        self.env: dict = {}
        self.stdout = ""
        self.stderr = ""
        self.children = 0
        self.wall = 0.0
        self.spawned_at: Optional[float] = None  # time.time() when the first child was started
        # on_event(outcome, kind, job id, data): each "spawn", "env", "start" and "end" as it happens
        self.on_event = on_event

    def event(self, kind: str, job=None, **data) -> None:
        if self.on_event is not None:
            try:
                self.on_event(self, kind, job, data)
            except Exception:  # progress reporting never stops a run
                pass


class _Tail(threading.Thread):
    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.buf: deque = deque()
        self.size = 0

    def run(self):
        try:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    break
                self.buf.append(chunk)
                self.size += len(chunk)
                while self.size > TAIL and len(self.buf) > 1:
                    self.size -= len(self.buf.popleft())
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        return b"".join(self.buf)[-TAIL:].decode("utf-8", "replace")


def _group_rss_mb(pgid: int) -> float:
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"/proc/{n}/stat", "rb") as fh:
                st = fh.read().rsplit(b")", 1)[1].split()
            if int(st[2]) != pgid:  # field 5: pgrp
                continue
            total += int(st[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, IndexError, ValueError):
            continue
    return total / 2**20


def _killpg(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _child_env(device: str, extra_path: list) -> dict:
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = list(extra_path) + [here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    env["WANDB_MODE"] = "disabled"
    env["TORCHLINT_DYNAMIC"] = "1"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    # the runs are a few tiny batches: intra-op threads gain nothing there and, on a machine with
    # few or busy cores (CI), their spinning made runs several times slower; the user's own
    # OMP_NUM_THREADS / MKL_NUM_THREADS are kept unless TORCHLINT_DYNAMIC_THREADS is set
    threads = str(default_threads())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get("TORCHLINT_DYNAMIC_THREADS") or not env.get(var):
            env[var] = threads
    return env


def default_threads() -> int:
    """CPU threads of the child's torch: ``TORCHLINT_DYNAMIC_THREADS``, else half the cores (1 to 4)."""
    env = os.environ.get("TORCHLINT_DYNAMIC_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _spawn(argv, env, cwd, device, memory_mb, shell=False):
    def limits():
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ValueError, OSError):
            pass
        if device == "cpu" and memory_mb:
            b = memory_mb * 2**20
            try:
                resource.setrlimit(resource.RLIMIT_AS, (b, b))
            except (ValueError, OSError):
                pass

    return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=limits, shell=shell)


def _read_facts(path: str, pos: int, out: list) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(pos)
            data = fh.read(8 * 2**20)
    except OSError:
        return pos
    end = data.rfind(b"\n")
    if end < 0:
        return pos
    for line in data[:end].split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return pos + end + 1


def _supervise(proc, results, outcome: RunOutcome, jobs_by_id, timeout, memory_mb, pos):
    """Watch one child until it exits or is killed; returns (file position, job ids ended)."""
    pgid = proc.pid
    out_t, err_t = _Tail(proc.stdout), _Tail(proc.stderr)
    out_t.start()
    err_t.start()
    current = None
    started_at = time.monotonic()
    job_started = None
    killed = None
    last_rss = 0.0
    while True:
        rc = proc.poll()
        facts: list = []
        pos = _read_facts(results, pos, facts)
        for f in facts:
            jid = f.get("job")
            if f.get("t") == "env":
                outcome.env.update({k: v for k, v in f.items() if k not in ("t", "job")})
                outcome.event("env", None, **outcome.env)
                continue
            if jid not in jobs_by_id:
                continue
            jr = outcome.jobs.setdefault(jid, JobResult(jid))
            if f.get("t") == "start":
                current, job_started = jid, time.monotonic()
                outcome.event("start", jid)
            elif f.get("t") == "end":
                if jr.status is None or jr.status == "ok":
                    jr.status = f.get("status")
                jr.seconds = f.get("seconds")
                jr.detail = {k: v for k, v in f.items() if k not in ("t", "job", "status", "seconds")}
                if current == jid:
                    current = None
                outcome.event("end", jid)
                continue
            jr.facts.append(f)
        if rc is not None:
            break
        now = time.monotonic()
        limit = (job_started + timeout) if current is not None else (started_at + timeout + STARTUP_ALLOWANCE)
        if current is None and job_started is not None:
            limit = job_started + timeout + STARTUP_ALLOWANCE
        if now > limit and killed is None:
            killed = "timeout"
        if memory_mb and now - last_rss > 0.5:
            last_rss = now
            if _group_rss_mb(pgid) > memory_mb:
                killed = "memory"
        if killed:
            _killpg(pgid, signal.SIGTERM)
            t_end = time.monotonic() + 2.0
            while proc.poll() is None and time.monotonic() < t_end:
                time.sleep(0.05)
            _killpg(pgid, signal.SIGKILL)
            proc.wait()
            pos = _read_facts(results, pos, facts := [])
            for f in facts:
                jid = f.get("job")
                if jid in jobs_by_id:
                    jr = outcome.jobs.setdefault(jid, JobResult(jid))
                    if f.get("t") != "end":
                        jr.facts.append(f)
            break
        time.sleep(0.03)
    _killpg(pgid, signal.SIGKILL)  # whatever the user's code forked
    out_t.join(1.0)
    err_t.join(1.0)
    outcome.stdout += out_t.text()
    outcome.stderr += err_t.text()
    outcome.stdout = outcome.stdout[-TAIL:]
    outcome.stderr = outcome.stderr[-TAIL:]
    if current is not None:
        jr = outcome.jobs.setdefault(current, JobResult(current))
        if killed == "timeout":
            jr.status = "timeout"
            jr.detail = {"seconds": timeout}
        elif killed == "memory":
            jr.status = "memory"
            jr.detail = {"limit_mb": memory_mb}
        else:
            jr.status = jr.status if jr.status not in (None, "ok") else "died"
            jr.detail = {"returncode": proc.returncode}
    return pos, current, killed, proc.returncode


def run_jobs(jobs: list, cfg: dict, timeout: float, device: str, memory_mb: Optional[int] = None,
             cwd: Optional[str] = None, on_event=None) -> RunOutcome:
    """Run jobs (scripts and harness calls) in as few child interpreters as possible;
    ``on_event(outcome, kind, job id, data)`` hears of each child started and each job's start and end."""
    outcome = RunOutcome(on_event)
    if not jobs:
        return outcome
    memory_mb = default_memory_mb() if memory_mb is None else memory_mb
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchlint-dyn-") as tmp:
        results = os.path.join(tmp, "facts.jsonl")
        open(results, "wb").close()
        conf = dict(cfg, results=results, jobs=jobs)
        by_id = {j["id"]: j for j in jobs}
        pos = 0
        start = 0
        env = _child_env(device, [])
        while start < len(jobs):
            conf["start"] = start
            cpath = os.path.join(tmp, f"config{start}.json")
            with open(cpath, "w", encoding="utf-8") as fh:
                json.dump(conf, fh)
            # `-c` puts the working directory first on sys.path: a project's own torchlint.py
            # must not stand in for this package
            argv = [sys.executable, "-c", "import sys; del sys.path[0]; from torchlint.dynamic.child import main; main()",
                    cpath]
            outcome.event("spawn", None, first=start == 0)
            if start == 0:
                outcome.spawned_at = time.time()
            proc = _spawn(argv, env, cwd or os.getcwd(), device, memory_mb)
            outcome.children += 1
            pos, current, killed, rc = _supervise(proc, results, outcome, by_id, timeout, memory_mb, pos)
            if outcome.env.get("error"):
                break
            done = [j["id"] for j in jobs if j["id"] in outcome.jobs and outcome.jobs[j["id"]].status]
            nxt = start
            while nxt < len(jobs) and jobs[nxt]["id"] in done:
                nxt += 1
            if nxt == start:  # the child died before finishing the first job: give up on it
                jid = jobs[start]["id"]
                jr = outcome.jobs.setdefault(jid, JobResult(jid))
                jr.status = jr.status or ("timeout" if killed == "timeout" else "died")
                jr.detail = jr.detail or {"returncode": rc, "stderr": outcome.stderr[-600:]}
                outcome.event("end", jid)
                nxt = start + 1
            start = nxt
    outcome.wall = time.monotonic() - t0
    return outcome


SITECUSTOMIZE = """\
try:
    from torchlint.dynamic.child import bootstrap as _tl_bootstrap
    _tl_bootstrap()
except Exception as _tl_exc:  # never break the user's interpreter
    import sys as _tl_sys
    print("torchlint dynamic: probes not installed:", _tl_exc, file=_tl_sys.stderr)
"""


def entry_argv(entry: str):
    """The command as an argv (``python`` replaced by this interpreter), or a shell line."""
    if any(tok in entry for tok in ("&&", "||", ";", "|", ">", "<", "$(", "`")):
        return entry, True
    argv = shlex.split(entry)
    if argv and os.path.basename(argv[0]) in ("python", "python3", f"python3.{sys.version_info[1]}"):
        argv[0] = sys.executable
    return argv, False


def run_entry(entry: str, job: dict, cfg: dict, timeout: float, device: str,
              memory_mb: Optional[int] = None, cwd: Optional[str] = None, on_event=None) -> RunOutcome:
    """Run the user's command with the probes installed through ``sitecustomize``."""
    outcome = RunOutcome(on_event)
    memory_mb = default_memory_mb() if memory_mb is None else memory_mb
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchlint-dyn-") as tmp:
        results = os.path.join(tmp, "facts.jsonl")
        open(results, "wb").close()
        site = os.path.join(tmp, "site")
        os.makedirs(site)
        with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as fh:
            fh.write(SITECUSTOMIZE)
        cpath = os.path.join(tmp, "config.json")
        with open(cpath, "w", encoding="utf-8") as fh:
            json.dump(dict(cfg, results=results, jobs=[job]), fh)
        env = _child_env(device, [site])
        env["TORCHLINT_DYNAMIC_CONFIG"] = cpath
        argv, shell = entry_argv(entry)
        try:
            proc = _spawn(argv, env, cwd or os.getcwd(), device, memory_mb, shell=shell)
        except OSError as exc:
            jr = outcome.jobs.setdefault(job["id"], JobResult(job["id"]))
            jr.status, jr.detail = "died", {"message": f"could not start `{entry}`: {exc}"}
            return outcome
        outcome.children = 1
        outcome.event("spawn", None, first=True, entry=entry)
        _, current, killed, rc = _supervise(proc, results, outcome, {job["id"]: job}, timeout, memory_mb, 0)
        jr = outcome.jobs.setdefault(job["id"], JobResult(job["id"]))
        if jr.status is None:
            jr.status = "died" if not killed else killed
            jr.detail = {"returncode": rc, "stderr": outcome.stderr[-600:]}
            if not any(f.get("t") == "start" for f in jr.facts):
                jr.detail["message"] = "the probes never started (is it a Python command?)"
        elif jr.status == "ok" and rc not in (0, None):
            jr.status, jr.detail = "exit", dict(jr.detail, code=rc)
    outcome.wall = time.monotonic() - t0
    return outcome

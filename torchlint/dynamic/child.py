"""The child interpreter: installs the probes, runs jobs, records facts.

Started by :mod:`torchlint.dynamic.runner` in its own process group with time, memory and
output limits.  Two ways in:

* ``python -c "from torchlint.dynamic.child import main; main()" CONFIG`` runs the jobs of a
  config file one after the other in this interpreter (scripts through ``runpy``, harness
  calls through :mod:`torchlint.dynamic.harness`), torch imported once;
* ``sitecustomize`` (written by the runner for ``--entry``) calls :func:`bootstrap` in every
  Python process the user's command starts.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _user_tb(exc, probes):
    out = []
    tb = exc.__traceback__
    while tb is not None:
        co = tb.tb_frame.f_code
        if probes._is_user(co.co_filename):
            out.append([os.path.abspath(co.co_filename), tb.tb_lineno, co.co_name])
        tb = tb.tb_next
    return out[::-1]  # innermost first


def missing_dependency(results: str, exc: ImportError) -> None:
    """Record that the child cannot import what the probes need (torch, usually): the parent
    names it and stops, instead of reporting a crash for every finding."""
    name = getattr(exc, "name", None) or "torch"
    fact = {"t": "env", "job": None, "missing": name, "python": sys.executable,
            "error": f"{type(exc).__name__}: {exc}"}
    with open(results, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(fact) + "\n")


class _ImportTimer:
    """A meta path finder that times the import of a few heavy modules the user's program may pull
    in (``torch._dynamo``, when the program compiles: see :mod:`.lazydynamo`), for the timing split
    of the benchmark; it only wraps their loader, which runs unchanged."""

    NAMES = ("torch._dynamo",)

    def __init__(self):
        self.seconds: dict = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.NAMES or fullname in self.seconds:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, timer = spec.loader, self

        orig_exec = loader.exec_module

        def exec_module(module):
            t0 = time.perf_counter()
            try:
                orig_exec(module)
            finally:
                timer.seconds[fullname] = round(time.perf_counter() - t0, 3)
        try:
            loader.exec_module = exec_module
        except AttributeError:
            return spec
        return spec

    def install(self):
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)


_TIMER = _ImportTimer()
_STARTED = [time.time(), time.process_time()]  # when this module was imported: the interpreter's start is behind


def _env(cfg, emit, import_s=None):
    import torch

    from .lazydynamo import install

    info = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "pid": os.getpid(),
            "startup_cpu": round(time.process_time(), 3), "dynamo_deferred": install(),
            "child_t0": _STARTED[0], "python_cpu": round(_STARTED[1], 3)}
    if import_s is not None:
        info["import_torch_s"] = import_s
    dev = cfg.get("device", "cpu")
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            emit("env", error=f"--device {dev}: CUDA is not available in this environment", **info)
            return False
        t0 = time.perf_counter()
        if ":" in dev:
            torch.cuda.set_device(int(dev.split(":", 1)[1]))
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
        info["cuda_init_s"] = round(time.perf_counter() - t0, 3)
        info["gpu"] = torch.cuda.get_device_name()
    emit("env", **info)
    return True


_THREADS = []


def _reset_torch(probes, anomaly):
    import torch
    from .probes import set_anomaly

    # a job that set its own thread count (torch.set_num_threads) must not slow down the next ones
    if not _THREADS:
        _THREADS.append(torch.get_num_threads())
    elif torch.get_num_threads() != _THREADS[0]:
        torch.set_num_threads(_THREADS[0])
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    set_anomaly(probes, anomaly)
    probes.anomaly_on = anomaly


def run_job(job, cfg, results):
    from . import probes as P

    emit = P.Writer(results, job["id"])
    jcfg = dict(cfg)
    jcfg["codes"] = job.get("codes") or cfg.get("codes")
    jcfg["targets"] = job.get("targets") or {}
    jcfg["groups"] = job.get("groups") or []
    t_setup = time.perf_counter()
    probes = P.install(jcfg, emit)
    _reset_torch(probes, "TL301" in (jcfg["codes"] or ()))
    setup_s = time.perf_counter() - t_setup
    imported_before = dict(_TIMER.seconds)
    emit("start", kind=job["kind"], path=job.get("path"), qualname=job.get("qualname"))
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    saved_mods = set(sys.modules)
    status, detail = "ok", {}
    t0 = time.perf_counter()
    c0 = time.process_time()
    probes.start_tracing()
    try:
        if job.get("cwd"):
            os.chdir(job["cwd"])
        if job["kind"] == "script":
            import runpy

            sys.argv = [job["path"]] + list(job.get("args") or [])
            sys.path.insert(0, os.path.dirname(os.path.abspath(job["path"])))
            runpy.run_path(job["path"], run_name="__main__")
        else:
            from . import harness

            def emit_h(_t, **d):
                if _t == "discard":
                    probes.reset()
                emit(_t, **d)
            harness.run(job, cfg.get("device", "cpu"), int(cfg.get("steps", 3)), probes, emit_h)
    except P.StopRun:
        status = "stopped"
    except SystemExit as exc:
        code = exc.code
        status, detail = ("ok" if code in (None, 0) else "exit"), {"code": code if isinstance(code, int) else str(code)}
    except BaseException as exc:  # the user's code raised: that is a result too
        status = "exception"
        detail = {"type": type(exc).__name__, "message": str(exc).split("\n")[0][:400],
                  "sites": _user_tb(exc, probes)}
        if isinstance(exc, KeyboardInterrupt):
            status = "interrupted"
    finally:
        sys.settrace(None)
        import threading

        threading.settrace(None)
        seconds = round(time.perf_counter() - t0, 3)
        t_fin = time.perf_counter()
        try:
            probes.finish(status)
        except Exception as exc:  # a probe bug must not lose the run
            emit("probe-error", message=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc()[-2000:])
        timing = {"probe_setup_s": round(setup_s + time.perf_counter() - t_fin, 3),
                  "imports_s": {k: v for k, v in _TIMER.seconds.items() if k not in imported_before}}
        emit("end", status=status, seconds=seconds, cpu=round(time.process_time() - c0, 3), timing=timing,
             **detail)
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        try:
            os.chdir(saved_cwd)
        except OSError:
            pass
        d = os.path.dirname(os.path.abspath(job.get("path") or "."))
        for m in set(sys.modules) - saved_mods:
            f = getattr(sys.modules.get(m), "__file__", None) or ""
            if m.startswith("_torchlint_dyn_") or (f and os.path.dirname(os.path.abspath(f)) == d):
                sys.modules.pop(m, None)


def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        cfg = json.load(fh)
    results = cfg["results"]
    sys.argv = sys.argv[:1]
    t0 = time.perf_counter()
    try:
        from . import probes as P  # imports torch
    except ImportError as exc:
        missing_dependency(results, exc)
        return
    import_s = round(time.perf_counter() - t0, 3)
    _TIMER.install()

    if not _env(cfg, P.Writer(results, None), import_s):
        return
    start = int(cfg.get("start", 0))
    import signal

    current = {"id": None}

    def on_term(signum, frame):
        if current["id"] is not None:
            P.Writer(results, current["id"])("end", status="timeout")
        os._exit(124)
    signal.signal(signal.SIGTERM, on_term)
    for job in cfg["jobs"][start:]:
        current["id"] = job["id"]
        run_job(job, cfg, results)
        current["id"] = None
    # leave no thread of the user's code behind us
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def bootstrap():
    """Entry mode: called from sitecustomize in every Python process of the user's command."""
    path = os.environ.get("TORCHLINT_DYNAMIC_CONFIG")
    if not path or os.environ.get("TORCHLINT_DYNAMIC_PID_DONE") == str(os.getpid()):
        return
    with open(path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    os.environ.pop("TORCHLINT_DYNAMIC_CONFIG", None)  # only the command's first Python process
    try:
        from . import probes as P  # imports torch
    except ImportError as exc:
        missing_dependency(cfg["results"], exc)
        return

    job = cfg["jobs"][0]
    results = cfg["results"]
    emit = P.Writer(results, job["id"])
    if not _env(cfg, emit):
        return
    jcfg = dict(cfg)
    jcfg["codes"] = job.get("codes") or cfg.get("codes")
    jcfg["targets"] = job.get("targets") or {}
    jcfg["groups"] = job.get("groups") or []
    probes = P.install(jcfg, emit)
    _reset_torch(probes, "TL301" in (jcfg["codes"] or ()))
    emit("start", kind="entry", path=None, argv=sys.argv)
    t0 = time.perf_counter()
    probes.start_tracing()
    state = {"status": "ok", "detail": {}}
    orig_hook = sys.excepthook

    def excepthook(tp, exc, tb):
        if isinstance(exc, P.StopRun):
            state["status"] = "stopped"
            return
        state["status"] = "exception"
        state["detail"] = {"type": tp.__name__, "message": str(exc).split("\n")[0][:400],
                           "sites": _user_tb(exc, probes)}
        orig_hook(tp, exc, tb)
    sys.excepthook = excepthook

    import atexit

    def done():
        sys.settrace(None)
        try:
            probes.finish(state["status"])
        except Exception as exc:
            emit("probe-error", message=f"{type(exc).__name__}: {exc}")
        emit("end", status=state["status"], seconds=round(time.perf_counter() - t0, 3), **state["detail"])
    atexit.register(done)
    import signal

    def on_term(signum, frame):
        state["status"] = "timeout"
        done()
        os._exit(124)
    signal.signal(signal.SIGTERM, on_term)

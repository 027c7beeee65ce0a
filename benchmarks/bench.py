"""Side-by-side throughput benchmark: torchlint against TorchFix, a bare libcst parse and ruff.

    python benchmarks/bench.py                      # the installed torch package's own source
    python benchmarks/bench.py /path/to/checkout    # plus any checkouts
    python benchmarks/bench.py --no-torch ../timm --jobs 4 --json out.json

For each corpus, in one invocation, on the same files and the same number of processes:

* torchlint cold     (empty cache: every file read, prefiltered, parsed when a rule could fire)
* torchlint warm     (cache filled, nothing changed: no file parsed)
* torchlint touched  (one file edited: it is re-linted, plus the files whose answers changed;
                      the most imported module, and a file of the median size)
* torchlint lsp      (the language server in the same tree, its index read from that cache:
                      from saving an edit of the same file to its diagnostics, a long-lived
                      process as in an editor; needs ``torchlint[lsp]``)
* TorchFix           (``torchfix --select ALL -j N``; another venv: ``--torchfix PATH``)
* libcst parse       (``libcst.parse_module`` of every file in a pool of N processes: the floor)
* ruff               (``ruff check --select ALL``, RAYON_NUM_THREADS=N; a reference, Rust)
* baseline cold      (``--baseline DIR``: torchlint cold from another checkout, e.g. an older
                      commit's ``git worktree``, right after torchlint cold on the same files;
                      the CPU seconds of the two are what to compare on a shared machine)

and torchlint cold on 10%, 50% and 100% of the files (every 10th, every 2nd, all: the same mix
of file sizes) to show that throughput does not degrade with the size of the tree. The 10% and
50% samples run right before the cold run on 100% (the machine's speed drifts over minutes),
the 10% sample three times (its median: a run of seconds varies most).

Each tool runs in a child ``python bench.py --_measure`` that records wall time and the peak
resident memory of the largest process of the tree (``getrusage(RUSAGE_CHILDREN).ru_maxrss``:
the busiest worker, or the parent when it is larger).  The torch source is copied to a scratch
folder first (discovery skips ``site-packages`` by default, as ruff does).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---------------------------------------------------------------- helpers run in children
def _measure(argv) -> int:
    """Run ``argv``; print {"wall", "maxrss_mb", "rc"} as JSON on the last line of stderr."""
    env = dict(os.environ)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - t0
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    err = p.stderr.decode("utf-8", "replace")
    sys.stderr.write(err[-2000:] + "\n")
    sys.stderr.write(json.dumps({"wall": wall, "maxrss_mb": ru.ru_maxrss / 1024, "rc": p.returncode,
                                 "cpu": ru.ru_utime + ru.ru_stime}) + "\n")
    return 0


def _parse_one(path: str) -> int:
    import libcst as cst

    try:
        with open(path, "rb") as fh:
            data = fh.read()
        cst.parse_module(data.decode("utf-8"))
        return 1
    except Exception:
        return 0


def _parse_floor(listfile: str, jobs: int) -> int:
    """libcst.parse_module of every file, N processes, chunked like torchlint's pool."""
    with open(listfile) as fh:
        files = [line.rstrip("\n") for line in fh if line.strip()]
    if jobs <= 1:
        ok = sum(_parse_one(f) for f in files)
    else:
        from concurrent.futures import ProcessPoolExecutor

        chunk = max(1, min(64, len(files) // (jobs * 8) or 1))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            ok = sum(pool.map(_parse_one, files, chunksize=chunk))
    print(f"parsed {ok}/{len(files)}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- the driver
_PYCACHE = tempfile.mkdtemp(prefix="torchlint-bench-pycache-")


def _env(env_extra=None) -> dict:
    """The children's environment: bytecode cached (in a scratch folder), as in an installed
    tool; some environments set PYTHONDONTWRITEBYTECODE, which makes every start compile."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = _PYCACHE
    env.update(env_extra or {})
    return env


def _run(argv, env_extra=None) -> dict:
    env = _env(env_extra)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--_measure", "--"] + argv,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    lines = p.stderr.decode("utf-8", "replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"wall": float("nan"), "maxrss_mb": float("nan"), "rc": -1, "err": "\n".join(lines[-5:])}


def py_files(root: str) -> list:
    out = []
    for d, dirs, fs in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in ("__pycache__", "node_modules"))
        out.extend(os.path.join(d, f) for f in sorted(fs) if f.endswith(".py"))
    return out


def torch_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bench: torch is not installed (pass --no-torch and a checkout)")
    return list(spec.submodule_search_locations)[0]


def copy_py(src: str, out: str, every: int = 1) -> str:
    """The .py files of ``src`` under ``out`` (mtimes kept): the benchmark edits one file.
    ``every`` > 1 keeps one file in ``every`` (a strided sample: the same mix of sizes)."""
    for f in py_files(src)[::max(1, every)]:
        t = os.path.join(out, os.path.relpath(f, src))
        os.makedirs(os.path.dirname(t), exist_ok=True)
        shutil.copy2(f, t)
    return out


def count_lines(files) -> int:
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            n += fh.read().count(b"\n")
    return n


def torchlint_cmd(paths, cache_dir, jobs):
    return [sys.executable, "-m", "torchlint", "check", *paths, "--cache-dir", cache_dir, "-j", str(jobs),
            "--exit-zero", "--no-progress", "-q", "--output-format", "concise", "-o", os.devnull]


def baseline_path(checkout: str, scratch: str) -> str:
    """A folder to put first on ``PYTHONPATH`` that imports the torchlint of ``checkout`` (a
    source checkout maps its ``rules/`` to ``torchlint.rules``: linked here)."""
    out = os.path.join(scratch, "baseline-path")
    pkg = os.path.join(out, "torchlint")
    os.makedirs(pkg)
    src = os.path.join(os.path.abspath(checkout), "torchlint")
    for n in os.listdir(src):
        os.symlink(os.path.join(src, n), os.path.join(pkg, n))
    if not os.path.exists(os.path.join(pkg, "rules")):
        os.symlink(os.path.join(os.path.abspath(checkout), "rules"), os.path.join(pkg, "rules"))
    return out


def pick_touched(files) -> str:
    """A module other files import (a change re-lints it and maybe its dependents): the
    most imported of the tree's modules with a function, falling back to the first file."""
    best, best_n = None, -1
    names = {}
    for f in files:
        base = os.path.splitext(os.path.basename(f))[0]
        if base != "__init__":
            names.setdefault(base, f)
    counts = dict.fromkeys(names, 0)
    for f in files[:: max(1, len(files) // 400)]:
        try:
            text = open(f, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for line in text.splitlines():
            s = line.strip()
            if s.startswith(("from ", "import ")):
                for tok in s.replace(",", " ").replace(".", " ").split():
                    if tok in counts:
                        counts[tok] += 1
    for name, n in counts.items():
        if n > best_n and "def " in open(names[name], encoding="utf-8", errors="replace").read():
            best, best_n = names[name], n
    return best or files[0]


def pick_median(files) -> str:
    """A file of the corpus's median size in lines (the typical edit)."""
    sized = []
    for f in files:
        with open(f, "rb") as fh:
            sized.append((fh.read().count(b"\n"), f))
    sized.sort()
    return sized[len(sized) // 2][1]


def touched_run(cmd, root: str, touched: str, env_extra=None, reps: int = 3) -> dict:
    """The median of ``reps`` runs of ``cmd``, each after an edit of ``touched`` (a comment
    appended, never seen by the cache before)."""
    return _median([_touched_once(cmd, root, touched, env_extra) for _ in range(reps)])


def _median(runs) -> dict:
    """The run of median wall time, with every wall time under ``walls`` when there are several."""
    runs = sorted(runs, key=lambda x: x["wall"])
    r = dict(runs[len(runs) // 2])
    if len(runs) > 1:
        r["walls"] = [x["wall"] for x in runs]
    return r


def _cold_median(sub, cache_dir: str, jobs: int, reps: int) -> dict:
    """torchlint cold on the files ``sub``, ``reps`` times from an empty ``cache_dir``: the median."""
    runs = []
    for _ in range(reps):
        shutil.rmtree(cache_dir, ignore_errors=True)
        runs.append(_run(torchlint_cmd(sub, cache_dir, jobs)))
    return _median(runs)


def _reps_note(r) -> str:
    return f" (median of {', '.join(f'{w:.2f}' for w in r['walls'])})" if "walls" in r else ""


def _touched_once(cmd, root: str, touched: str, env_extra=None) -> dict:
    """``cmd`` after an edit of ``touched`` (a comment appended, never seen by the cache
    before); the file is restored and the cache brought back to that state afterwards."""
    with open(touched, "rb") as fh:
        orig = fh.read()
    st = os.stat(touched)
    try:
        with open(touched, "ab") as fh:
            fh.write(b"\n# touched by benchmarks/bench.py at %d\n" % time.time_ns())
        r = _run(cmd, env_extra)
        n_lines = orig.count(b"\n")
        r["touched"] = f"{os.path.relpath(touched, root)}, {n_lines:,} lines"
    finally:
        with open(touched, "wb") as fh:
            fh.write(orig)
        os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns))
    _run(cmd, env_extra)  # the snapshot of the unchanged tree again
    return r


class _LspClient:
    """A minimal JSON-RPC client of ``torchlint lsp`` over stdio (for timing, no dependency)."""

    def __init__(self, cwd: str):
        import queue
        import threading

        # ``python -m`` puts the working directory first on sys.path: not the corpus (the torch
        # source has a ``types.py``); the workspace is the client's rootUri
        self.proc = subprocess.Popen([sys.executable, "-m", "torchlint", "lsp"], cwd=cwd, env=_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.inbox: "queue.Queue" = queue.Queue()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            header = {}
            while True:
                line = out.readline()
                if not line:
                    self.inbox.put(None)
                    return
                line = line.strip()
                if not line:
                    break
                k, _, v = line.decode("ascii").partition(":")
                header[k.lower()] = v.strip()
            self.inbox.put(json.loads(out.read(int(header["content-length"]))))

    def send(self, method: str, params, request: bool = False):
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self.next_id += 1
            msg["id"] = self.next_id
        body = json.dumps(msg).encode("utf-8")
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()
        return msg.get("id")

    def wait(self, pred, timeout: float = 600.0):
        import queue

        deadline = time.perf_counter() + timeout
        while True:
            try:
                msg = self.inbox.get(timeout=max(0.01, deadline - time.perf_counter()))
            except queue.Empty:
                raise TimeoutError("the language server did not answer") from None
            if msg is None:
                raise RuntimeError("the language server exited")
            if pred(msg):
                return msg

    def peak_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")


def lsp_save(root: str, cache_dir: str, touched: str, saves: int = 5) -> dict:
    """``torchlint lsp`` started in ``root`` with the cache the CLI runs filled: the time until
    its workspace index is ready, then, ``saves`` times, from an edit of ``touched`` saved to
    the diagnostics of the saved text (the median is reported)."""
    from pathlib import Path

    cfg = os.path.join(root, "torchlint.toml")  # the server finds the CLI's cache through it
    with open(cfg, "w") as fh:
        fh.write(f"cache-dir = {json.dumps(cache_dir)}\n")
    with open(touched, "rb") as fh:
        orig = fh.read()
    st = os.stat(touched)
    uri = Path(touched).as_uri()
    client = _LspClient(os.path.dirname(os.path.abspath(root)))
    try:
        t0 = time.perf_counter()
        rid = client.send("initialize", {"processId": os.getpid(), "rootUri": Path(root).as_uri(), "capabilities": {},
                                         "workspaceFolders": [{"uri": Path(root).as_uri(), "name": "bench"}]}, True)
        client.wait(lambda m: m.get("id") == rid)
        client.send("initialized", {})
        client.wait(lambda m: m.get("method") == "window/logMessage" and "indexed" in m["params"]["message"])
        index_s = time.perf_counter() - t0
        text = orig.decode("utf-8")
        client.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                              "text": text}})
        client.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri)
        times = []
        for version in range(2, 2 + saves):
            text += f"# edit {version} by benchmarks/bench.py\n"
            with open(touched, "w", encoding="utf-8") as fh:
                fh.write(text)
            t = time.perf_counter()
            client.send("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                                   "contentChanges": [{"text": text}]})
            client.send("textDocument/didSave", {"textDocument": {"uri": uri}})
            client.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                        and m["params"]["uri"] == uri and m["params"].get("version") == version)
            times.append(time.perf_counter() - t)
        peak = client.peak_mb()
        rid = client.send("shutdown", None, True)
        client.wait(lambda m: m.get("id") == rid, 30)
        client.send("exit", None)
        client.proc.wait(30)
        times.sort()
        return {"wall": times[len(times) // 2], "index_s": index_s, "saves": times, "maxrss_mb": peak, "rc": 0,
                "touched": os.path.relpath(touched, root)}
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
        os.remove(cfg)
        with open(touched, "wb") as fh:
            fh.write(orig)
        os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns))


def bench_corpus(name, root, args, scratch) -> dict:
    files = py_files(root)
    lines = count_lines(files)
    jobs = args.jobs
    res = {"corpus": name, "root": root, "files": len(files), "lines": lines, "jobs": jobs, "rows": {}}
    rows = res["rows"]
    listfile = os.path.join(scratch, f"{name}.files")
    with open(listfile, "w") as fh:
        fh.write("\n".join(files) + "\n")
    cache = os.path.join(scratch, f"{name}.cache")
    shutil.rmtree(cache, ignore_errors=True)

    def row(label, r, n_files=len(files), n_lines=lines):
        r.update(files=n_files, lines=n_lines)
        rows[label] = r
        print(f"  {label:<22} {r['wall']:8.2f} s{_reps_note(r)}  rc={r.get('rc')}  {r['maxrss_mb']:.0f} MB",
              file=sys.stderr)

    print(f"{name}: {len(files)} files, {lines} lines, {jobs} processes", file=sys.stderr)
    # warm the bytecode caches of the tools (not their result caches)
    subprocess.run([sys.executable, "-m", "torchlint", "--version"], env=_env(), capture_output=True)
    tf = args.torchfix or shutil.which("torchfix")
    if "torchfix" in args.tools and tf and os.path.exists(tf):
        subprocess.run([tf, "--version"], env=_env(), capture_output=True)
    # The order keeps what is compared close in time (the machine's speed drifts over minutes):
    # the 10% and 50% samples, then the whole tree cold, then the libcst floor; TorchFix right
    # after torchlint on the same sample of files.
    if "torchlint" in args.tools and not args.no_scaling:
        res["scaling"] = {}
        for pct, step, reps in ((10, 10, 3), (50, 2, 1)):  # the 10% sample (seconds, the noisiest): a median of 3
            sub = files[::step]
            res["scaling"][pct] = r = _cold_median(sub, os.path.join(scratch, f"{name}.cache{pct}"), jobs, reps)
            r.update(files=len(sub), lines=count_lines(sub))
            print(f"  cold on {pct:>3}%: {r['wall']:8.2f} s{_reps_note(r)}  {r['lines'] / r['wall']:,.0f} lines/s",
                  file=sys.stderr)
    if "torchlint" in args.tools:
        row("torchlint cold", _run(torchlint_cmd([root], cache, jobs)))
        if "scaling" in res:
            res["scaling"][100] = dict(rows["torchlint cold"])
        if args.baseline:  # (an old checkout may still start a daemon: not for a benchmark)
            env = {"PYTHONPATH": args.baseline_path, "TORCHLINT_NO_DAEMON": "1"}
            r = _run(torchlint_cmd([root], cache + "-baseline", jobs), env)
            r["baseline"] = args.baseline
            row("baseline cold", r)
    if "libcst" in args.tools:
        row("libcst parse (floor)", _run([sys.executable, os.path.abspath(__file__), "--_parse-floor",
                                          listfile, str(jobs)]))
    if "torchlint" in args.tools:
        row("torchlint warm", _run(torchlint_cmd([root], cache, jobs)))
        touched = pick_touched(files)
        median = pick_median(files)
        cmd = torchlint_cmd([root], cache, jobs)
        row("torchlint touched", touched_run(cmd, root, touched))
        row("torchlint touched, median file", touched_run(cmd, root, median))
        if "lsp" in args.tools:
            try:
                r = lsp_save(root, cache, touched)
                print(f"  torchlint lsp: index ready in {r['index_s']:.2f} s; save -> diagnostics "
                      + ", ".join(f"{x:.2f}" for x in r["saves"]) + " s", file=sys.stderr)
                row("torchlint lsp, save (same file)", r)
                r = lsp_save(root, cache, median)
                print(f"  torchlint lsp, the median file: save -> diagnostics "
                      + ", ".join(f"{x:.2f}" for x in r["saves"]) + " s", file=sys.stderr)
                row("torchlint lsp, save (the median file)", r)
            except Exception as exc:  # pygls missing, a server error: the other figures stand
                print(f"  torchlint lsp: not measured ({type(exc).__name__}: {exc})", file=sys.stderr)
    if "torchfix" in args.tools:
        tf = args.torchfix or shutil.which("torchfix")
        if tf and os.path.exists(tf):
            k = max(1, args.torchfix_every)
            if k == 1:
                row("TorchFix 0.7.0", _run([tf, "--select", "ALL", "-j", str(jobs), root]))
            else:  # a strided sample (same mix of files); compared by throughput
                sub = files[::k]
                n_sub = count_lines(sub)
                if "torchlint" in args.tools:
                    # torchlint cold on the same files just before: the two figures come from
                    # the same minutes of the machine (the whole-tree run was many minutes ago);
                    # a run of seconds, so the median of three
                    row(f"torchlint cold (the same 1 in {k} files)",
                        _cold_median(sub, os.path.join(scratch, f"{name}.cache-tf"), jobs, 3), len(sub), n_sub)
                row(f"TorchFix 0.7.0 (1 in {k} files)",
                    _run([tf, "--select", "ALL", "-j", str(jobs)] + sub), len(sub), n_sub)
        else:
            print("  TorchFix: not found (pass --torchfix PATH)", file=sys.stderr)
    if "ruff" in args.tools and shutil.which("ruff"):
        row("ruff (reference)", _run(["ruff", "check", "--no-cache", "--isolated", "--select", "ALL",
                                      "--exit-zero", "-q", "-o", os.devnull, root],
                                     {"RAYON_NUM_THREADS": str(jobs)}))
    return res


def render(results, load) -> str:
    out = []
    for res in results:
        rows = res["rows"]
        cold = rows.get("torchlint cold")
        base = cold["lines"] / cold["wall"] if cold else None  # lines/s
        out.append(f"### {res['corpus']}{res.get('sampled', '')}: {res['files']:,} files, {res['lines']:,} lines, "
                   f"{res['jobs']} processes (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start, "
                   f"{load[3]:.2f} at end)\n")
        out.append("| run | wall (s) | CPU (s) | files/s | lines/s | peak MB / process | vs torchlint cold |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for label, r in rows.items():
            w = r["wall"]
            # time on the whole corpus relative to torchlint cold (throughput ratio for samples)
            ratio = f"{base / (r['lines'] / w):.2f}×" if base else "-"
            note = f" ({r['touched']})" if r.get("touched") else ""
            rc = "" if r.get("rc", 0) in (0, 1) else f" [rc {r.get('rc')}]"
            out.append(f"| {label}{note}{rc} | {w:.2f}{_reps_note(r)} | {r.get('cpu', float('nan')):.2f} | {r['files'] / w:,.0f} | {r['lines'] / w:,.0f} | "
                       f"{r['maxrss_mb']:.0f} | {ratio} |")
        if "baseline cold" in rows and cold:
            b = rows["baseline cold"]
            out.append(f"\ntorchlint cold against the baseline ({b['baseline']}), run one after the other: "
                       f"{cold['cpu']:.1f} against {b['cpu']:.1f} CPU-s ({100 * (cold['cpu'] / b['cpu'] - 1):+.0f}%), "
                       f"{cold['wall']:.1f} against {b['wall']:.1f} s wall")
        same = next((r for label, r in rows.items() if label.startswith("torchlint cold (the same")), None)
        tfx = next((r for label, r in rows.items() if label.startswith("TorchFix")), None)
        if same is not None and tfx is not None:
            out.append(f"\nTorchFix against torchlint cold on the same {same['files']:,} files, run one after the "
                       f"other: {tfx['wall'] / same['wall']:.2f}× the time")
        lsp = next((r for r in rows.values() if "index_s" in r), None)
        if lsp is not None:
            out.append(f"\n`torchlint lsp` in the same tree: workspace index ready in {lsp['index_s']:.2f} s "
                       f"(from the cache the CLI runs filled); an edit of {lsp['touched']} saved -> its "
                       "diagnostics: " + ", ".join(f"{x:.2f}" for x in lsp["saves"]) + " s (the row: the median)")
        if res.get("scaling"):
            out.append("")
            out.append("| torchlint cold on | files | lines | wall (s) | lines/s |")
            out.append("|---|---:|---:|---:|---:|")
            for pct, r in res["scaling"].items():
                reps = _reps_note(r)
                out.append(f"| {pct}% | {r['files']:,} | {r['lines']:,} | {r['wall']:.2f}{reps} | "
                           f"{r['lines'] / r['wall']:,.0f} |")
            rates = [r["lines"] / r["wall"] for r in res["scaling"].values()]
            out.append(f"\nspread of lines/s: {100 * (max(rates) - min(rates)) / max(rates):.0f}%")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_measure"]:
        return _measure(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    if argv[:1] == ["--_parse-floor"]:
        return _parse_floor(argv[1], int(argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkouts", nargs="*", help="more corpora (folders)")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true", help="skip the installed torch package's source")
    ap.add_argument("--tools", default="torchlint,lsp,torchfix,libcst,ruff")
    ap.add_argument("--torchfix", default="/tmp/tfenv/bin/torchfix" if os.path.exists("/tmp/tfenv/bin/torchfix") else None)
    ap.add_argument("--torchfix-every", type=int, default=1,
                    help="run TorchFix on every K-th file only (it is slow); compared by lines/s")
    ap.add_argument("--sample", type=int, default=1,
                    help="bench one file in K of each corpus (a strided sample), e.g. on a loaded machine")
    ap.add_argument("--no-scaling", action="store_true", help="skip the 10%%/50%% runs")
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("--baseline", help="a checkout of another torchlint (git worktree add DIR COMMIT): its cold "
                    "run follows torchlint cold on the same files")
    args = ap.parse_args(argv)
    if args.baseline and not os.path.isdir(os.path.join(args.baseline, "torchlint")):
        print(f"bench: error: {args.baseline}: not a torchlint checkout", file=sys.stderr)
        return 2
    args.tools = set(args.tools.split(","))
    load0 = os.getloadavg()
    scratch = tempfile.mkdtemp(prefix="torchlint-bench-")
    args.baseline_path = baseline_path(args.baseline, scratch) if args.baseline else None
    results = []
    try:
        corpora = []
        if not args.no_torch:
            corpora.append(("torch", copy_py(torch_dir(), os.path.join(scratch, "src", "torch"), args.sample)))
        for c in args.checkouts:
            if not os.path.isdir(c):
                print(f"bench: error: {c}: not a folder", file=sys.stderr)
                return 2
            name = os.path.basename(os.path.abspath(c).rstrip("/"))
            corpora.append((name, copy_py(os.path.abspath(c), os.path.join(scratch, "src", name), args.sample)))
        for name, root in corpora:
            results.append(bench_corpus(name, root, args, scratch))
            if args.sample > 1:
                results[-1]["sampled"] = f" (1 file in {args.sample})"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(_PYCACHE, ignore_errors=True)
    load = tuple(load0) + (os.getloadavg()[0],)
    print(render(results, load))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"load": load, "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A big tree as a new user runs it (issue 24, item 9): does the progress bar move until the
output, does a new ``--select`` re-lint the tree, does the cache stay bounded?

    python benchmarks/big_tree.py [--root DIR | --generate N] [--every N] [-j 2] [--rounds 5] [--json OUT]

Copies the ``.py`` files of ``--root`` (default: the installed torch package, 2,285 files;
``--every N`` keeps one in N) to a scratch folder, or writes ``--generate N`` training modules
of about 50 lines that import each other (module i uses module i // 2's evaluation helper: a
cheaper tree with cross-module dependencies), and runs ``torchlint check`` there:

1. cold, on a pseudo-terminal (so the progress bar is drawn, as in a terminal): the wall time,
   every update of the bar with its time, the phases after the first pass over the files, and
   the longest time the bar stood still (between two updates, or from the last one to the exit);
2. warm (nothing changed), then with other selections (``--select TL1``, ``--ignore TL103``,
   ``--extend-select`` of every preview rule): each should cost what a warm run costs, since the
   selection is not part of the cache key;
3. ``--rounds`` rounds of editing 20 files (a function appended, then the next round's) and a run
   after each: the cache's size (bytes and files) after every round.

Prints a Markdown table and exits 1 when a contract is broken: a selection change takes more than
``--select-factor`` (default 5) times a warm run plus one second, or the cache after the edit
rounds is more than 10% larger than after the first edited run (entries of old contents must be
replaced, not kept). The bar's stalls are reported, not judged (they scale with the machine's
load); compare them with the cold run's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench import _env, copy_py, py_files, torch_dir  # noqa: E402
from lsp_latency import BLOCK, HEADER  # noqa: E402


def generate(out: str, n: int) -> str:
    """``n`` modules of a package, each a model, its training loop and an evaluation helper
    (every seventh loop forgets to clear the gradients), module i calling module i // 2's
    helper after each epoch."""
    pkg = os.path.join(out, "pkg")
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for i in range(n):
        clear = "pass  # gradients are never cleared here" if i % 7 == 3 else "optimizer.zero_grad()"
        body = HEADER + BLOCK.format(i=i, clear=clear)
        if i:
            j = i // 2
            body = body.replace("from torch.utils.data import DataLoader, TensorDataset\n",
                                f"from torch.utils.data import DataLoader, TensorDataset\n\nfrom .m{j} import evaluate_{j}\n")
            body += (f"\n\ndef fit_{i}(model, loader, optimizer, criterion, device, epochs):\n"
                     f"    for epoch in range(epochs):\n"
                     f"        train_{i}(model, loader, optimizer, criterion, device)\n"
                     f"        print(epoch, evaluate_{j}(model, loader, device))\n")
        with open(os.path.join(pkg, f"m{i}.py"), "w", encoding="utf-8") as fh:
            fh.write(body)
    return out

_BAR = re.compile(r"\] (\d+)/(\d+) ([^\r\n\x1b]*?)\s*$")


def _cmd(root, cache, jobs, *extra):
    """``torchlint check .`` as a user types it: the installed script, which (unlike
    ``python -m``) does not put the tree on ``sys.path``, where the torch source's own
    ``random.py`` and ``signal/`` would shadow the standard library's."""
    script = os.path.join(os.path.dirname(sys.executable), "torchlint")
    head = [script] if os.path.exists(script) else [sys.executable, "-P", "-m", "torchlint"]
    return head + ["check", ".", "--cache-dir", cache, "-j", str(jobs), "--exit-zero", "--output-format", "concise",
                   *extra]


def run_on_pty(argv, cwd) -> dict:
    """Run ``argv`` with stderr on a pseudo-terminal; the bar's updates with their times."""
    import pty

    master, slave = pty.openpty()
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=slave, env=_env({"TERM": "xterm"}))
    os.close(slave)
    updates, buf = [], ""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        now = time.monotonic() - t0
        buf += data.decode("utf-8", "replace")
        *done, buf = buf.split("\r")
        for piece in done:
            m = _BAR.search(piece)
            if m:
                updates.append((round(now, 3), int(m.group(1)), int(m.group(2)), m.group(3).strip()))
    p.wait()
    wall = time.monotonic() - t0
    os.close(master)
    return {"wall": wall, "rc": p.returncode, "updates": updates}


def timed(argv, cwd) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    if r.returncode not in (0, 1):
        raise SystemExit(f"big_tree: {' '.join(argv[3:])} exited {r.returncode}: {r.stderr.decode()[-2000:]}")
    return time.monotonic() - t0


def cache_size(cache) -> tuple:
    n = size = 0
    for d, _, fs in os.walk(cache):
        for f in fs:
            n += 1
            size += os.path.getsize(os.path.join(d, f))
    return size, n


def stalls(res) -> dict:
    """The longest still bar, and what happens after the first pass reached 100%."""
    ups = res["updates"]
    if not ups:
        return {"longest_still_s": round(res["wall"], 2), "longest_still_at": "no bar drawn",
                "after_first_pass_s": None, "phases": []}
    times = [0.0] + [u[0] for u in ups] + [res["wall"]]
    gaps = [(b - a, i) for i, (a, b) in enumerate(zip(times, times[1:]))]
    longest, at = max(gaps)
    where = "before the first update" if at == 0 else (
        "from the last update to the exit" if at == len(ups) else f"after {ups[at - 1][1]}/{ups[at - 1][2]} {ups[at - 1][3]}")
    full = next((u[0] for u in ups if u[3] == "files" and u[1] == u[2]), None)
    phases = []
    for u in ups:
        if u[3] != "files" and (not phases or phases[-1] != u[3]):
            phases.append(u[3])
    return {"longest_still_s": round(longest, 2), "longest_still_at": where,
            "after_first_pass_s": None if full is None else round(res["wall"] - full, 2), "phases": phases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", help="the tree to copy (default: the installed torch package)")
    ap.add_argument("--generate", type=int, metavar="N", help="write N generated modules instead")
    ap.add_argument("--every", type=int, default=1, help="keep one file in N")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--select-factor", type=float, default=5.0)
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args(argv)

    src = f"{args.generate} generated modules" if args.generate else args.root or torch_dir()
    scratch = tempfile.mkdtemp(prefix="tl-bigtree-")
    try:
        if args.generate:
            tree = generate(os.path.join(scratch, "tree"), args.generate)
        else:
            tree = copy_py(src, os.path.join(scratch, "tree"), args.every)
        files = py_files(tree)
        cache = os.path.join(scratch, "cache")
        out = {"files": len(files), "load_before": os.getloadavg()}
        cold = run_on_pty(_cmd(tree, cache, args.jobs), tree)
        if cold["rc"] not in (0, 1):
            raise SystemExit(f"big_tree: the cold run exited {cold['rc']}")
        out["cold"] = {"wall_s": round(cold["wall"], 2), "updates": len(cold["updates"]), **stalls(cold)}
        out["cache_after_cold"] = cache_size(cache)
        warm = timed(_cmd(tree, cache, args.jobs), tree)
        out["warm_s"] = round(warm, 2)
        sel = {}
        preview = subprocess.run([sys.executable, "-c", "from torchlint.selection import preview_codes;"
                                  "print(','.join(sorted(preview_codes())))"], capture_output=True, text=True)
        for label, extra in (("--select TL1", ["--select", "TL1"]), ("--ignore TL103", ["--ignore", "TL103"]),
                             ("--extend-select <preview rules>", ["--extend-select", preview.stdout.strip()])):
            sel[label] = round(timed(_cmd(tree, cache, args.jobs, *extra), tree), 2)
        out["selection_s"] = sel
        sizes = []
        edited = [f for f in files if os.path.getsize(f) > 0][:: max(1, len(files) // 20)][:20]
        for r in range(args.rounds):
            for f in edited:
                with open(f, "a", encoding="utf-8") as fh:
                    fh.write(f"\n\ndef _bench_round_{r}():\n    return {r}\n")
            t = timed(_cmd(tree, cache, args.jobs), tree)
            sizes.append({"round": r + 1, "wall_s": round(t, 2), "bytes": cache_size(cache)[0],
                          "files": cache_size(cache)[1]})
        out["edit_rounds"] = sizes
        out["load_after"] = os.getloadavg()
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    mb = lambda b: f"{b / 1e6:.1f} MB"
    c = out["cold"]
    print(f"{out['files']} files ({src}), -j{args.jobs}; load average {out['load_before'][0]:.1f} before, "
          f"{out['load_after'][0]:.1f} after\n")
    print("| measure | figure |\n|---|---|")
    print(f"| cold run, on a terminal | {c['wall_s']} s wall, {c['updates']} updates of the bar |")
    print(f"| after the first pass reached 100% | {c['after_first_pass_s']} s, phases: "
          f"{', '.join(c['phases']) or 'none'} |")
    print(f"| longest time the bar stood still | {c['longest_still_s']} s ({c['longest_still_at']}) |")
    print(f"| warm run (nothing changed) | {out['warm_s']} s |")
    for label, t in out["selection_s"].items():
        print(f"| warm run with `{label}` | {t} s |")
    print(f"| cache after the cold run | {mb(out['cache_after_cold'][0])}, {out['cache_after_cold'][1]} files |")
    for s in out["edit_rounds"]:
        print(f"| after edit round {s['round']} (20 files) | {s['wall_s']} s; cache {mb(s['bytes'])}, "
              f"{s['files']} files |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    broken = []
    limit = args.select_factor * out["warm_s"] + 1.0
    broken += [f"`{k}` took {t} s (warm {out['warm_s']} s)" for k, t in out["selection_s"].items() if t > limit]
    rounds = out["edit_rounds"]
    if len(rounds) >= 2 and rounds[-1]["bytes"] > 1.10 * rounds[0]["bytes"]:
        broken.append(f"the cache grew from {mb(rounds[0]['bytes'])} to {mb(rounds[-1]['bytes'])} over "
                      f"{len(rounds)} edit rounds")
    for b in broken:
        print(f"\nBROKEN: {b}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

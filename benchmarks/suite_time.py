"""How long the default test suite takes (issue 24, item 10: it once took 19.5 minutes on a
busy 2-core machine; the budget is 5 minutes).

    flock /work/notes/suite.lock python benchmarks/suite_time.py [--budget 300] [-- PYTEST ARGS]

Runs ``python -m pytest -q -p no:cacheprovider`` (the default run: ``-n auto``, ``@slow`` tests
deselected) with ``--durations`` and ``-rfEs``, and prints a Markdown summary: the wall time, the
CPU time of the suite's processes, the load average before and after (the figures of a busy
machine are not those of a quiet one), the outcome counts, the skip reasons grouped, and the
slowest tests. Exits 1 when the suite fails or its wall time exceeds ``--budget`` seconds.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=300.0, help="seconds of wall time (default 300)")
    ap.add_argument("--slowest", type=int, default=15)
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)

    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--durations={args.slowest}", "-rfEs",
           *args.pytest_args]
    load_before = os.getloadavg()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    out = r.stdout
    summary = next((ln.strip("= ") for ln in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed)", ln)), "?")
    skips = collections.Counter()
    for m in re.finditer(r"^SKIPPED \[(\d+)\] [^:]+(?::\d+)?: (.*)$", out, re.M):
        skips[m.group(2).strip()] += int(m.group(1))
    slow = re.findall(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)$", out, re.M)

    print(f"`{' '.join(cmd[1:])}` at {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip() or '?'}, "
          f"{os.cpu_count()} CPUs\n")
    print("| measure | figure |\n|---|---|")
    print(f"| wall time | {wall:.0f} s (budget {args.budget:.0f} s) |")
    print(f"| CPU time of the suite's processes | {cpu:.0f} s |")
    print(f"| load average (1 min) before / after | {load_before[0]:.1f} / {load_after[0]:.1f} |")
    print(f"| outcome | {summary} |")
    for reason, n in skips.most_common():
        print(f"| skipped: {reason} | {n} |")
    if slow:
        print("\nslowest:\n")
        print("| seconds | phase | test |\n|---:|---|---|")
        for secs, phase, test in slow:
            print(f"| {secs} | {phase} | `{test}` |")
    broken = []
    if r.returncode != 0:
        failed = [ln for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
        broken.append(f"the suite failed (exit {r.returncode}):\n" + "\n".join(failed or out.splitlines()[-30:])
                      + r.stderr[-2000:])
    if wall > args.budget:
        broken.append(f"the suite took {wall:.0f} s, over the budget of {args.budget:.0f} s")
    for b in broken:
        print(f"\nBROKEN: {b}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

"""Thousands of random edit steps on generated multi-module projects: a cached run,
``--no-cache -j1``, ``-j2``, the language server's lint and the first pass of ``--fix --diff``
must agree at every step (``tests/properties.py``; the default suite runs 240 steps).

    python benchmarks/properties.py                 # 100 sequences of 30 steps
    python benchmarks/properties.py --sequences 20 --steps 50 --seed 7
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from properties import Checker, edit, random_project, write  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=100)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--jobs2-every", type=int, default=5, help="run -j2 every N steps (it forks a pool)")
    args = ap.parse_args()
    start = time.perf_counter()
    failures = 0
    for n in range(args.sequences):
        seed = args.seed + n
        rng = random.Random(seed)
        with tempfile.TemporaryDirectory(prefix="tl-props-") as tmp:
            root = os.path.join(tmp, "proj")
            os.mkdir(root)
            checker = Checker(root, os.path.join(tmp, "cache"))
            project = random_project(rng)
            history = []
            for step in range(args.steps):
                paths = write(root, project)
                bad = checker.check(paths, jobs2=step % args.jobs2_every == 0)
                if bad:
                    failures += 1
                    print(f"seed {seed} step {step} after {history}: {bad}", file=sys.stderr)
                    break
                history.append(edit(project, rng))
    total = args.sequences * args.steps
    print(f"{args.sequences} sequences, {total} edit steps, {failures} disagreeing sequences, "
          f"{time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

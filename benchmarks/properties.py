"""Thousands of random edit steps on generated multi-module projects: a cached run,
``--no-cache -j1``, the language server (saving each step's edits) and every pass of
``--fix --diff`` must agree at every step, ``-j2`` every few steps (``tests/properties.py``;
the default suite runs 240 steps). It prints the steps and comparisons actually made and the
findings the steps produced, by code.

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

from collections import Counter  # noqa: E402

from properties import Checker, edit, random_project, write  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=100)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--jobs2-every", type=int, default=5, help="run -j2 every N steps (it forks a pool)")
    args = ap.parse_args()
    start = time.perf_counter()
    failures, steps = 0, 0
    compared, codes = Counter(), Counter()
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
                steps += 1
                if bad:
                    failures += 1
                    print(f"seed {seed} step {step} after {history}: {bad}", file=sys.stderr)
                    break
                history.append(edit(project, rng))
            compared.update(checker.compared)
            codes.update(checker.codes)
    print(f"{args.sequences} sequences, {steps} edit steps checked, {failures} disagreeing sequences, "
          f"{time.perf_counter() - start:.1f} s")
    print("comparisons with --no-cache -j1:", ", ".join(f"{k} {v}" for k, v in sorted(compared.items())))
    print("findings at the steps (cold), by code:", ", ".join(f"{k} {v}" for k, v in sorted(codes.items())))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the property-based tests with many examples (default 10,000) and print a summary.

    python benchmarks/fuzz.py [N] [--workers W]
    python benchmarks/fuzz.py --cache N [--workers W]

It runs tests/test_fuzz.py with TORCHLINT_FUZZ_EXAMPLES=N/W in W processes, each with its own
hypothesis seed: in total N generated programs checked for internal errors and determinism,
N/3 for fix parse + idempotence, N/15 for cache and process-count invariance.

With ``--cache N`` it runs the fuzz of the cache's files instead (tests/test_cache_attacks.py:
N damaged copies of a built cache with the tree unchanged and N with one file edited, in total,
each checked against the ``--no-cache`` result; each worker its own seed).
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cache", type=int, default=None, metavar="N", help="fuzz the cache's files instead")
    args = ap.parse_args()
    if args.cache is not None:
        return fuzz_cache(args.cache, args.workers)
    per = max(args.n // args.workers, 1)
    env = dict(os.environ, TORCHLINT_FUZZ_EXAMPLES=str(per))
    t = time.time()
    procs = []
    for w in range(args.workers):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(ROOT, "tests", "test_fuzz.py"),
             f"--hypothesis-seed={1000 + w}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    rc, outs = 0, []
    for p in procs:
        out = p.communicate()[0]
        outs.append(out)
        rc = rc or p.returncode
    dt = time.time() - t
    passed = sum(int(m) for o in outs for m in re.findall(r"(\d+) passed", o))
    failed = sum(int(m) for o in outs for m in re.findall(r"(\d+) failed", o))
    for o in outs:
        if "failed" in o or "Error" in o:
            print(o[-4000:])
    total = per * args.workers
    print(f"examples: {total} (internal-error/determinism), {max(per // 3, 10) * args.workers} (fixes), "
          f"{max(per // 15, 5) * args.workers} (cache/processes); {args.workers} worker(s); "
          f"tests passed {passed}, failed {failed}; wall {dt:.0f} s; exit {rc}")
    return rc


def fuzz_cache(n: int, workers: int) -> int:
    per = max(n // workers, 1)
    t = time.time()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider",
         os.path.join(ROOT, "tests", "test_cache_attacks.py"), "-k", "never_change"], cwd=ROOT,
        env=dict(os.environ, TORCHLINT_CACHE_FUZZ_CASES=str(per), TORCHLINT_CACHE_FUZZ_SEED=str(1000 + w)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for w in range(workers)]
    rc = 0
    for p in procs:
        out = p.communicate()[0]
        if p.returncode:
            rc = p.returncode
            print(out[-4000:])
    print(f"cache fuzz: {2 * per * workers} damaged caches ({per * workers} unchanged tree, {per * workers} one "
          f"file edited); {workers} worker(s); wall {time.time() - t:.0f} s; exit {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())

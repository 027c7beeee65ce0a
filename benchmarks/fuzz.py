"""Run the property-based tests with many examples (default 10,000) and print a summary.

    python benchmarks/fuzz.py [N]

It runs tests/test_fuzz.py with TORCHLINT_FUZZ_EXAMPLES=N: N generated programs checked for
internal errors and determinism, N/3 for fix parse + idempotence, N/15 for cache and
process-count invariance.
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    env = dict(os.environ, TORCHLINT_FUZZ_EXAMPLES=str(n))
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(ROOT, "tests", "test_fuzz.py"), "--hypothesis-show-statistics"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    dt = time.time() - t
    print(r.stdout[-6000:])
    print(f"examples: {n} (internal-error/determinism), {max(n // 3, 10)} (fixes), "
          f"{max(n // 15, 5)} (cache/processes); wall {dt:.0f} s; exit {r.returncode}")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())

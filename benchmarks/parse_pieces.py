"""Parsing in pieces (``torchlint.parse``) against libcst's whole-file parse, file by file.

    python benchmarks/parse_pieces.py /path/to/tree            # every .py file under it
    python benchmarks/parse_pieces.py /path/to/tree --memory 5 # and the peak memory of the 5 largest

For every file: both parses must give the same code and equal trees (``deep_equals``); the
CPU time of each is summed. With ``--memory N``, the N largest files are parsed each way in a
fresh process and the peak resident memory of each is printed side by side.
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _peak(path: str, how: str) -> float:
    code = ("import sys, gc; gc.disable(); import libcst; from torchlint.parse import parse_module;"
            f"src = open({path!r}, encoding='utf-8').read();"
            f"{'parse_module' if how == 'pieces' else 'libcst.parse_module'}(src);"
            # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec
            "print(next(int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(HERE)})
    return float(out.stdout.strip() or "nan")


def main() -> int:
    import libcst as cst

    from torchlint.parse import parse_module

    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--memory", type=int, default=0, help="peak memory of the N largest files")
    args = ap.parse_args()
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(args.tree) for f in fs if f.endswith(".py"))
    gc.disable()
    whole_s = pieces_s = 0.0
    differ = []
    lines = 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                src = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        lines += src.count("\n")
        t = time.process_time()
        try:
            whole = cst.parse_module(src)
        except Exception:
            whole = None
        whole_s += time.process_time() - t
        t = time.process_time()
        try:
            ours = parse_module(src)
        except Exception:
            ours = None
        pieces_s += time.process_time() - t
        if (whole is None) != (ours is None) or (whole is not None and (ours.code != src or not whole.deep_equals(ours))):
            differ.append(path)
        del whole, ours
        gc.collect()
    print(f"{len(files)} files, {lines:,} lines: whole-file parse {whole_s:.2f} CPU-s, in pieces {pieces_s:.2f} CPU-s "
          f"({pieces_s / whole_s:.2f}x); trees that differ: {len(differ)}")
    for path in differ:
        print("  differs:", path)
    if args.memory:
        print(f"\npeak resident memory, MB (a fresh process per parse):\n{'file':60} {'lines':>7} {'whole':>7} {'pieces':>7}")
        for path in sorted(files, key=os.path.getsize, reverse=True)[:args.memory]:
            n = open(path, encoding="utf-8").read().count("\n")
            print(f"{os.path.relpath(path, args.tree):60} {n:7,} {_peak(path, 'whole'):7.0f} {_peak(path, 'pieces'):7.0f}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

"""Lint real checkouts and report, per repository: files, training loops found, findings per
rule, and time.

    python benchmarks/realworld.py PATH... [--jobs N] [--findings] [--cross] [--markdown]

Each PATH is one repository (or a folder of one, e.g. ``accelerate/examples``) and is linted
as one tree with every default rule, exactly as ``torchlint check PATH`` would (no cache).

* *training loops*: loops that run ``backward()`` in their iteration, directly or through a
  function of the linted tree, counting the innermost such loop (an epoch loop around a
  batch loop is one training loop).
* ``--findings`` lists every finding.
* ``--cross`` lints each repository a second time with the call graph switched off (no
  calls resolved to functions of the tree, no summaries, no model classes of other modules)
  and lists the findings that only the cross-function analysis reports (``+``) and the ones
  it removes (``-``), to judge what it adds.
* ``--markdown`` prints the table as Markdown (for docs/evaluation.md).

Bad paths are reported with a clear message and exit status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torchlint.discover import discover  # noqa: E402
from torchlint.engine import LintOptions, _merge, run  # noqa: E402
from torchlint.model import ModuleModel, ProjectIndex  # noqa: E402
from torchlint.selection import enabled_codes  # noqa: E402


def training_loops(files, results) -> int:
    """Innermost loops whose iteration runs backward (directly or via a helper of the tree)."""
    import libcst as cst

    from torchlint.discover import module_name_for
    from torchlint.model.ir import LoopOp, walk
    from torchlint.model.queries import analysable_functions, trains
    from torchlint.source import SourceError, read_source

    project = ProjectIndex.for_files(files)
    _merge(project, results)
    n = 0
    for f, r in zip(files, results):
        if not r.parsed or r.error or not f.endswith(".py"):
            continue
        try:
            src = read_source(f)
            data = src.data
            if b"backward" not in data and not r.queries:
                continue
            name, is_pkg = module_name_for(f)
            mm = ModuleModel(f, f, src.text, cst.parse_module(src.text), name, is_pkg, project)
        except (SourceError, cst.ParserSyntaxError, RecursionError, Exception):
            continue
        for fn in analysable_functions(mm):
            loops = [op for op in walk(fn.body) if isinstance(op, LoopOp)]
            training = [lp for lp in loops if trains(mm, lp.body)]
            for lp in training:
                inner = any(o is not lp and _inside(o, lp) for o in training)
                if not inner:
                    n += 1
    return n


def _inside(loop, outer) -> bool:
    lp = loop.parent
    while lp is not None:
        if lp is outer:
            return True
        lp = lp.parent
    return False


@contextlib.contextmanager
def call_graph_off():
    """Lint as if every function were analysed alone: no call edges, summaries or imported classes."""
    saved = (ModuleModel.resolve_call, ModuleModel.external_class, ModuleModel.call_result_facts,
             ModuleModel.function_named, ModuleModel.loader_moves)
    ModuleModel.resolve_call = lambda self, fn, op: None
    ModuleModel.external_class = lambda self, name: None
    ModuleModel.call_result_facts = lambda self, fn, op, arg_facts=(): frozenset()
    ModuleModel.function_named = lambda self, fn, name: None
    ModuleModel.loader_moves = lambda self, fn, expr: False
    try:
        yield
    finally:
        (ModuleModel.resolve_call, ModuleModel.external_class, ModuleModel.call_result_facts,
         ModuleModel.function_named, ModuleModel.loader_moves) = saved


def lint_repo(path: str, opts: LintOptions, jobs: int) -> dict:
    d = discover([path])
    files = [f for f in d.files if f.endswith((".py", ".pyi", ".ipynb"))]
    import resource

    t0 = time.perf_counter()
    c0 = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    results = run(files, opts, jobs=jobs)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - c0
    findings = [f for r in results for f in r.findings]
    return {
        "path": path, "files": len(files), "results": results, "time": elapsed, "cpu": cpu,
        "findings": findings, "loops": training_loops(files, results), "file_list": files,
        # call sites resolved to a function of another module of the tree (the call graph's
        # cross-module edges, as the modules export them)
        "xcalls": sum(len(r.called) for r in results),
        "errors": [r.error for r in results if r.error],
    }


def _key(f) -> tuple:
    return (f.path, f.line, f.code)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", metavar="PATH")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--findings", action="store_true", help="list every finding")
    ap.add_argument("--cross", action="store_true",
                    help="also lint without the call graph and list what cross-function analysis changes")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)

    bad = [p for p in args.paths if not os.path.exists(p)]
    if bad:
        for p in bad:
            print(f"realworld.py: error: {p}: no such file or directory", file=sys.stderr)
        return 2
    opts = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
    repos = [lint_repo(p, opts, args.jobs) for p in args.paths]

    codes = sorted({f.code for r in repos for f in r["findings"]})
    head = ["repository", "files", "training loops", "cross-module calls", "findings"] + codes + \
        ["wall (s)", "CPU (s)"]
    rows = []
    common = os.path.commonpath([os.path.abspath(r["path"]) for r in repos])
    for r in repos:
        c = Counter(f.code for f in r["findings"])
        name = os.path.relpath(os.path.abspath(r["path"]), common) if len(repos) > 1 else \
            os.path.basename(os.path.abspath(r["path"]))
        rows.append([name, r["files"], r["loops"], r["xcalls"], len(r["findings"])] + [c.get(k, 0) for k in codes]
                    + [f"{r['time']:.1f}", f"{r['cpu']:.1f}"])
    tot = ["total"] + [sum(r[i] for r in rows) for i in range(1, 5)] + \
        [sum(r[5 + i] for r in rows) for i in range(len(codes))] + [f"{sum(x['time'] for x in repos):.1f}",
                                                                    f"{sum(x['cpu'] for x in repos):.1f}"]
    rows.append(tot)
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        for row in [head] + rows:
            print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    print(f"\n(jobs={args.jobs}, cache off; wall = wall-clock time of the engine run, CPU = its CPU time "
          "including worker processes; counting training loops is not included)")
    for r in repos:
        for e in r["errors"]:
            print(f"  {r['path']}: {e}")

    if args.findings:
        for r in repos:
            print(f"\n## {r['path']}")
            for f in sorted(r["findings"], key=lambda f: (f.path, f.line)):
                print(f"{f.path}:{f.line}: {f.code} {f.message}")

    if args.cross:
        print("\n# What cross-function analysis changes (+ only with it, - only without it)")
        for r in repos:
            with call_graph_off():
                local = run(r["file_list"], opts, jobs=1)
            local_f = {_key(f): f for x in local for f in x.findings}
            full_f = {_key(f): f for f in r["findings"]}
            plus = [full_f[k] for k in sorted(set(full_f) - set(local_f))]
            minus = [local_f[k] for k in sorted(set(local_f) - set(full_f))]
            print(f"\n## {r['path']}: +{len(plus)} -{len(minus)}")
            for sign, fs in (("+", plus), ("-", minus)):
                for f in fs:
                    print(f"{sign} {f.path}:{f.line}: {f.code} {f.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time the dynamic mode: confirmation per finding, on CPU and on a GPU.

    python benchmarks/dynamic_bench.py --device cpu [--device cuda] [--full] [--json out.json]
    python benchmarks/dynamic_bench.py --single --device cuda     # one finding, cold, its time split
    python benchmarks/dynamic_bench.py --reach --device cuda      # every buggy fixture: verdicts by family

For each device it reports:

* the child interpreter's start-up (``import torch`` etc., CPU seconds) and, on CUDA, the
  CUDA start-up (context creation and first allocation) apart;
* the entry way: one grouped run over the buggy fixtures (one per rule, or all with
  ``--full``), wall time per finding, and each script's own time inside the child;
* the harness way over the findings it applies to;
* with ``--full``, the default way (harness, module construction, scripts) over the findings of
  every rule with a probe: wall time per confirmed finding, start-up included;
* a single finding confirmed alone (cold: a fresh child), the latency a user sees.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from torchlint.dynamic import confirm_findings, observe  # noqa: E402
from torchlint.dynamic.plan import Source, harness_spec  # noqa: E402
from torchlint.findings import Finding, Span  # noqa: E402

try:
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib

REQUIRED = ["TL101", "TL102", "TL103", "TL104", "TL201", "TL202", "TL204", "TL301", "TL401", "TL402", "TL403",
            "TL501", "TL601", "TL602"]


def all_cases():
    """Every buggy-fixture finding of every rule with a probe (the expected.toml lists)."""
    import glob

    from torchlint.dynamic import PROBED

    out = []
    for exp in sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "expected.toml"))):
        with open(exp, "rb") as fh:
            table = tomllib.load(fh)
        for rel, items in sorted(table.items()):
            if rel.startswith("bad/"):
                for item in items:
                    code, line = item.split(":")
                    if code in PROBED:
                        out.append((os.path.join(os.path.dirname(exp), rel), code, int(line)))
    return out


def cases(full: bool):
    import glob

    out, seen = [], set()
    for exp in sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "expected.toml"))):
        with open(exp, "rb") as fh:
            table = tomllib.load(fh)
        for rel, items in sorted(table.items()):
            if not rel.startswith("bad/"):
                continue
            path = os.path.join(os.path.dirname(exp), rel)
            for item in items:
                code, line = item.split(":")
                if code in REQUIRED and (full or code not in seen):
                    seen.add(code)
                    out.append((path, code, int(line)))
    return out


def finding(path, code, line):
    return Finding(code, code, "", path, Span.of(line, 0, line, 1))


def bench(device: str, full: bool, steps: int) -> dict:
    cs = cases(full)
    res = {"device": device, "findings": len(cs), "steps": steps}
    # 1. per-script cost inside one child, and the start-up
    t0 = time.perf_counter()
    out = observe(sorted({c[0] for c in cs}), device=device, steps=steps, timeout=300, codes=REQUIRED)
    res["observe_wall_s"] = round(time.perf_counter() - t0, 2)
    res["child_startup_cpu_s"] = out.env.get("startup_cpu")
    res["cuda_init_s"] = out.env.get("cuda_init_s")
    res["gpu"] = out.env.get("gpu")
    res["torch"] = out.env.get("torch")
    if out.env.get("error"):
        res["error"] = out.env["error"]
        return res
    secs = [j.seconds for j in out.jobs.values() if j.seconds is not None]
    cpus = [j.detail.get("cpu") for j in out.jobs.values() if j.detail.get("cpu") is not None]
    res["script_s"] = {"median": round(statistics.median(secs), 3), "max": round(max(secs), 3),
                       "sum": round(sum(secs), 2)} if secs else None
    res["script_cpu_s"] = {"median": round(statistics.median(cpus), 3), "sum": round(sum(cpus), 2)} if cpus else None
    # confirmation per finding with the start-up apart: the scripts' own time in a warm child
    res["per_finding_warm_s"] = round(sum(secs) / max(1, len(cs)), 3) if secs else None
    # 2. the entry way, grouped
    fs = [finding(*c) for c in cs]
    t0 = time.perf_counter()
    confirm_findings(fs, [], device=device, steps=steps, timeout=300, way="entry")
    wall = time.perf_counter() - t0
    res["entry_wall_s"] = round(wall, 2)
    res["entry_per_finding_s"] = round(wall / max(1, len(fs)), 3)
    res["entry_verdicts"] = {v: sum(1 for f in fs if f.dynamic["verdict"] == v)
                             for v in ("confirmed", "refuted", "not-reached")}
    res["entry_detail"] = [{"finding": f"{os.path.relpath(f.path, ROOT)}:{f.code}:{f.line}",
                            "verdict": f.dynamic["verdict"]} for f in fs]
    # 3. the harness way
    hs = [c for c in cs if harness_spec(c[0], Source.of(c[0]).enclosing(c[2])[0], c[1])[0] is not None]
    hf = [finding(*c) for c in hs]
    if hf:
        t0 = time.perf_counter()
        confirm_findings(hf, [], device=device, steps=steps, timeout=300, way="harness")
        wall = time.perf_counter() - t0
        res["harness_wall_s"] = round(wall, 2)
        res["harness_per_finding_s"] = round(wall / len(hf), 3)
        res["harness_verdicts"] = {v: sum(1 for f in hf if f.dynamic["verdict"] == v)
                                   for v in ("confirmed", "refuted", "not-reached")}
    # 4. the default way (harness, module construction, scripts) over every probed rule's findings
    if full:
        af = [finding(*c) for c in all_cases()]
        t0 = time.perf_counter()
        confirm_findings(af, [], device=device, steps=steps, timeout=120)
        wall = time.perf_counter() - t0
        conf = sum(1 for f in af if f.dynamic["verdict"] == "confirmed")
        res["auto_findings"] = len(af)
        res["auto_wall_s"] = round(wall, 2)
        res["auto_per_confirmed_s"] = round(wall / max(1, conf), 3)
        res["auto_verdicts"] = {v: sum(1 for f in af if f.dynamic["verdict"] == v)
                                for v in ("confirmed", "refuted", "not-reached")}
        res["auto_not_reached"] = [f"{os.path.relpath(f.path, ROOT)}:{f.code}:{f.line}: {f.dynamic['evidence'][:160]}"
                                   for f in af if f.dynamic["verdict"] == "not-reached"]
    # 5. one finding alone, cold, with where its time went
    res.update(single_cold(cs[0], device, steps))
    return res


def single_cold(case, device: str, steps: int) -> dict:
    """Confirm one finding in a fresh child, the latency a user sees, split into the interpreter's
    start, ``import torch`` (with the probes' module), the CUDA start, the ``torch._dynamo`` import
    that torch's optimizers make on their first use, the program under the probes, the probes'
    own set-up and finish, and the rest (planning, judging, the parent's polling, teardown)."""
    from torchlint.dynamic import runner

    seen = []
    orig = runner.run_jobs

    def spy(*a, **k):
        out = orig(*a, **k)
        seen.append(out)
        return out
    runner.run_jobs = spy
    try:
        f = finding(*case)
        t0 = time.perf_counter()
        confirm_findings([f], [], device=device, steps=steps, timeout=300, way="entry")
        total = time.perf_counter() - t0
    finally:
        runner.run_jobs = orig
    res = {"single_cold_s": round(total, 2),
           "single": f"{os.path.relpath(f.path, ROOT)}:{f.code} -> {f.dynamic['verdict']}"}
    if not seen or seen[0].spawned_at is None:
        return res
    out = seen[0]
    env = out.env
    jobs = [j for j in out.jobs.values() if j.seconds is not None]
    job_s = sum(j.seconds for j in jobs)
    timing = [j.detail.get("timing") or {} for j in jobs]
    dynamo = sum((t.get("imports_s") or {}).get("torch._dynamo", 0.0) for t in timing)
    split = {
        "interpreter_start_s": round(env.get("child_t0", out.spawned_at) - out.spawned_at, 3),
        "import_torch_s": env.get("import_torch_s"),
        "cuda_init_s": env.get("cuda_init_s") or 0.0,
        "torch_dynamo_import_s": round(dynamo, 3),
        "program_s": round(job_s - dynamo, 3),
        "probes_setup_finish_s": round(sum(t.get("probe_setup_s", 0.0) for t in timing), 3),
    }
    known = sum(v for v in split.values() if isinstance(v, (int, float)))
    split["rest_s"] = round(total - known, 3)
    res["single_split"] = split
    try:
        import importlib.util

        import torch  # noqa: F401  (only to find its files: is its bytecode cached?)

        res["torch_pyc_cached"] = os.path.exists(importlib.util.cache_from_source(torch.__file__))
    except Exception:
        pass
    return res


FAMILIES = [("TL1", "loop order (TL1xx)"), ("TL2", "modes, grad mode, state (TL2xx)"), ("TL3", "autograd (TL3xx)"),
            ("TL4", "loss (TL4xx)"), ("TL5", "memory (TL5xx)"), ("TL6", "device (TL6xx)"), ("TL7", "data (TL7xx)"),
            ("TL8", "debug (TL8xx)")]


def reach(device: str, steps: int, timeout: float) -> dict:
    """`torchlint confirm fixtures/*/bad` with every rule selected (preview included): the verdict
    of every static finding, counted by rule family (the table of docs/dynamic.md)."""
    import glob
    import subprocess

    from torchlint.codes import CODES

    codes = ",".join(c for c in sorted(CODES) if not c.startswith("TL0"))
    files = sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "bad", "*.py")))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torchlint", "confirm", "--select", codes, "--device", device,
                           "--steps", str(steps), "--timeout", str(timeout), "--output-format", "json", *files],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    try:
        found = json.loads(proc.stdout)
    except ValueError:
        return {"device": device, "error": (proc.stderr or proc.stdout)[-2000:]}
    rows, left = {}, []
    for f in found:
        d = f.get("dynamic") or {}
        fam = next((name for pre, name in FAMILIES if f["code"].startswith(pre)), "other")
        r = rows.setdefault(fam, {"findings": 0, "confirmed": 0, "refuted": 0, "not-reached": 0})
        r["findings"] += 1
        r[d.get("verdict", "not-reached")] = r.get(d.get("verdict", "not-reached"), 0) + 1
        if d.get("verdict") != "confirmed":
            left.append(f"{os.path.relpath(f['filename'], ROOT)}:{f['location']['row']} {f['code']} "
                        f"{d.get('verdict')}: {d.get('evidence', '')[:220]}")
    return {"device": device, "wall_s": round(wall, 1), "programs": len(files), "families": rows, "left": left}


def print_reach(r: dict) -> None:
    if r.get("error"):
        print("   ", r["error"])
        return
    print(f"== reach on the buggy fixtures, {r['device']}: {r['programs']} programs, {r['wall_s']} s")
    print("| rule family | static findings | confirmed | refuted | not reached | decided |")
    print("|---|---|---|---|---|---|")
    tot = {"findings": 0, "confirmed": 0, "refuted": 0, "not-reached": 0}
    for _, name in FAMILIES + [(None, "other")]:
        x = r["families"].get(name)
        if not x:
            continue
        for k in tot:
            tot[k] += x[k]
        dec = x["confirmed"] + x["refuted"]
        print(f"| {name} | {x['findings']} | {x['confirmed']} | {x['refuted']} | {x['not-reached']} | "
              f"{100 * dec / x['findings']:.0f}% |")
    dec = tot["confirmed"] + tot["refuted"]
    print(f"| **all** | {tot['findings']} | {tot['confirmed']} | {tot['refuted']} | {tot['not-reached']} | "
          f"{100 * dec / max(1, tot['findings']):.1f}% |")
    for line in r["left"]:
        print("   ", line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", action="append", default=None)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--single", action="store_true",
                    help="only one finding alone in a fresh child, with its time split (a few seconds)")
    ap.add_argument("--reach", action="store_true",
                    help="confirm every buggy fixture with every rule selected: the verdicts by rule family")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    rows = []
    if args.reach:
        for dev in args.device or ["cpu"]:
            r = reach(dev, args.steps, args.timeout)
            rows.append(r)
            print_reach(r)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=2)
        return
    if args.single:
        for dev in args.device or ["cpu"]:
            r = {"device": dev, **single_cold(cases(False)[0], dev, args.steps)}
            rows.append(r)
            print(f"== {dev}: one finding alone (cold child): {r['single_cold_s']} s ({r['single']})")
            for k, v in (r.get("single_split") or {}).items():
                print(f"   {k[:-2].replace('_', ' '):24s} {v} s")
            if "torch_pyc_cached" in r:
                print(f"   torch bytecode cached: {r['torch_pyc_cached']}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=2)
        return
    for dev in args.device or ["cpu"]:
        r = bench(dev, args.full, args.steps)
        rows.append(r)
        print(f"== {dev} ({r.get('gpu') or 'cpu'}, torch {r.get('torch')}): {r['findings']} findings")
        if r.get("error"):
            print("   ", r["error"])
            continue
        print(f"   child start-up (import torch ...): {r['child_startup_cpu_s']} s CPU"
              + (f"; CUDA start-up: {r['cuda_init_s']} s" if r.get("cuda_init_s") is not None else ""))
        print(f"   scripts in one child: median {r['script_s']['median']} s, max {r['script_s']['max']} s, "
              f"total {r['script_s']['sum']} s (CPU total {r['script_cpu_s']['sum']} s)")
        print(f"   entry way: {r['entry_wall_s']} s for {r['findings']} findings = {r['entry_per_finding_s']} s per "
              f"finding; verdicts {r['entry_verdicts']}")
        print(f"   per finding, start-up apart (scripts' own time in a warm child): {r['per_finding_warm_s']} s")
        if "harness_wall_s" in r:
            print(f"   harness way: {r['harness_wall_s']} s = {r['harness_per_finding_s']} s per finding; "
                  f"verdicts {r['harness_verdicts']}")
        if "auto_wall_s" in r:
            print(f"   default way, every probed rule: {r['auto_wall_s']} s for {r['auto_findings']} findings = "
                  f"{r['auto_per_confirmed_s']} s per confirmed finding (start-up included); verdicts "
                  f"{r['auto_verdicts']}")
            for line in r["auto_not_reached"]:
                print(f"      not reached: {line}")
        print(f"   one finding alone (cold child): {r['single_cold_s']} s ({r['single']})")
        if r.get("single_split"):
            print("      split: " + ", ".join(f"{k[:-2].replace('_', ' ')} {v} s" for k, v in r["single_split"].items())
                  + (f"; torch bytecode cached: {r['torch_pyc_cached']}" if "torch_pyc_cached" in r else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()

"""Lint real checkouts and report, per repository: files, training loops found, findings per
rule, and time; or score the labelled real-world benchmark (``--manifest``).

    python benchmarks/realworld.py PATH... [--jobs N] [--findings] [--cross] [--markdown]
    python benchmarks/realworld.py --manifest [FILE] [--root DIR] [--labels FILE] [--part P]
                                   [--repo SUBSTR] [--dump-unjudged OUT.jsonl] [--markdown]
    python benchmarks/realworld.py --check-split [--manifest FILE]

Each PATH is one repository (or a folder of one, e.g. ``accelerate/examples``) and is linted
as one tree with every default rule, exactly as ``torchlint check PATH`` would (no cache).

* *training loops*: loops that run ``backward()`` in their iteration, directly or through a
  function of the linted tree, counting the innermost such loop (an epoch loop around a
  batch loop is one training loop); in ``.py`` files and notebooks (their code cells). The
  manifest mode calls them *training scripts*.
* ``--findings`` lists every finding.
* ``--cross`` lints each repository a second time with the call graph switched off (no
  calls resolved to functions of the tree, no summaries, no model classes of other modules)
  and lists the findings that only the cross-function analysis reports (``+``) and the ones
  it removes (``-``), to judge what it adds.
* ``--markdown`` prints the table as Markdown (for docs/evaluation.md).

Bad paths are reported with a clear message and exit status 2.

Manifest mode (the benchmark of ``benchmarks/realworld/``, see docs/evaluation.md):

* ``--manifest`` reads ``benchmarks/realworld/manifest.toml`` (repositories pinned to commits,
  each ``part = "tuned"`` or ``"heldout"``); each repository's checkout is
  ``ROOT/<owner>+<name>`` (``--root``, default ``$TORCHLINT_REALWORLD_ROOT`` or
  ``/work/scratch/realworld``) at the pinned commit, and each of its ``subpaths`` (or the
  whole checkout) is linted as ``torchlint check --no-cache`` would, with the default rule set.
* Findings are matched to ``labels.jsonl`` (one verdict per finding: repo, commit, path
  relative to the checkout, cell or null, line, code, verdict TRUE/FALSE/DEBATABLE, reason)
  on (repo, path, cell, code) and the line, preferring the exact line, else the nearest
  within 2 lines; a label is used by one finding at most; labels of another commit are
  ignored.
* It prints, per part and per rule: TRUE, FALSE, DEBATABLE, unjudged, precision
  TRUE/(TRUE+FALSE), DEBATABLE share of the judged findings, FALSE per 50 training scripts
  of the part, and labelled TRUE findings no longer reported ("lost").
* ``--dump-unjudged OUT`` writes the findings without a label as JSONL (repo, commit, part,
  path, cell, line, code, message) for judging.
* ``--extend-select CODE`` also runs rules outside the default set (preview rules); labelled
  TRUE findings of rules that did not run are listed apart, not counted as lost.
* ``--save-run FILE`` keeps the lint results; ``--from-run FILE`` scores them again (after
  new labels) without linting.
* ``--check-split`` recomputes the held-out rule of each batch of repositories (``batch``, 1
  when absent: a batch added later has its own split, so the earlier parts never change) and
  fails if a ``part`` disagrees. A batch's rule is the one its header line declares
  (``batch<N>_heldout_rule``): the sha1 order (the default), "every repository held-out", or
  "tuned afterwards" (a held-out batch scored once, then tuned on: every repository tuned).
  ``--batch N`` scores only batch N.
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
from torchlint.engine import LintOptions, run  # noqa: E402
from torchlint.model import ModuleModel  # noqa: E402
from torchlint.project import Workspace  # noqa: E402
from torchlint.selection import enabled_codes  # noqa: E402


def training_loops(files, results) -> int:
    """Innermost loops whose iteration runs backward (directly or via a helper of the tree).

    A loop that trains only by calling functions that hold a training loop themselves (an
    epoch loop calling ``train_one_epoch``) is not counted again: the callee's loop is."""
    import libcst as cst

    from torchlint.discover import module_name_for
    from torchlint.model.ir import BACKWARD, CALL, CallOp, LoopOp, walk
    from torchlint.model.queries import analysable_functions, is_kind, trains
    from torchlint.source import SourceError, read_source

    workspace = Workspace(files)
    workspace.merge(results)
    project = workspace.index
    found = []  # (mm, loop) of innermost training loops
    holders = set()  # "module.qualname" of the functions holding one
    for f, r in zip(files, results):
        if not r.parsed or r.error or not f.endswith((".py", ".ipynb")):
            continue
        try:
            if f.endswith(".ipynb"):  # a notebook is linted as its code cells, one program
                from torchlint.notebook import load

                text = load(f).text
                name, is_pkg = os.path.basename(f)[:-6].replace("-", "_"), False
            else:
                text = read_source(f).text
                name, is_pkg = module_name_for(f)
            if "backward" not in text and not r.queries:
                continue
            mm = ModuleModel(f, f, text, cst.parse_module(text), name, is_pkg, project)
        except (SourceError, cst.ParserSyntaxError, RecursionError, Exception):
            continue
        for fn in analysable_functions(mm):
            loops = [op for op in walk(fn.body) if isinstance(op, LoopOp)]
            training = [lp for lp in loops if trains(mm, lp.body)]
            for lp in training:
                if not any(o is not lp and _inside(o, lp) for o in training):
                    found.append((mm, lp))
                    holders.add(f"{mm.module_name}.{fn.qualname}")

    def callee(mm, op):
        t = op.info
        if t is None:
            return None
        if hasattr(t, "module") and hasattr(t, "name") and not hasattr(t, "body"):  # ExternalRef
            return project.resolve(t.qualname) or t.qualname
        return f"{mm.module_name}.{getattr(t, 'qualname', '')}"

    n = 0
    for mm, lp in found:
        via = [op for op in walk(lp.body) if isinstance(op, CallOp) and is_kind(mm, op, BACKWARD)]
        if via and all(op.kind == CALL and callee(mm, op) in holders for op in via):
            continue
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


MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "realworld", "manifest.toml")
LABELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "realworld", "labels.jsonl")
VERDICTS = ("TRUE", "FALSE", "DEBATABLE")


def load_manifest(path: str) -> list:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    entries = data.get("repo", [])
    rules = batch_rules(data, path)
    for e in entries:
        for k in ("repo", "commit", "part"):
            if k not in e:
                raise ValueError(f"{path}: entry {e.get('repo', '?')}: missing `{k}`")
        if e["part"] not in ("tuned", "heldout"):
            raise ValueError(f"{path}: {e['repo']}: part must be \"tuned\" or \"heldout\"")
        e.setdefault("subpaths", [])
        e.setdefault("batch", 1)
        if not isinstance(e["batch"], int) or isinstance(e["batch"], bool) or e["batch"] < 1:
            raise ValueError(f"{path}: {e['repo']}: batch must be a positive integer")
        e["split"] = rules.get(e["batch"], "sha1")
    return entries


def batch_rules(data: dict, path: str) -> dict:
    """The held-out rule each batch declares in the manifest's header: ``heldout_rule`` for
    batch 1, ``batch<N>_heldout_rule`` for batch N. Three rules are known: the sha1 rule (the text
    names ``sha1``: sha1(repo) ascending, the first ceil(n/4) held out), "every repository
    held-out" (a batch chosen and pinned as a held-out part before any lint), and "tuned
    afterwards" (a held-out batch that was scored once and then used for tuning: every repository
    tuned; the text keeps the scores it had as a held-out part). A batch that declares none gets
    the sha1 rule; a rule text that is none of these is an error."""
    import re

    rules = {}
    for key, text in data.items():
        m = re.fullmatch(r"(?:batch(\d+)_)?heldout_rule", key)
        if not m:
            continue
        batch = int(m.group(1) or 1)
        if not isinstance(text, str):
            raise ValueError(f"{path}: `{key}` must be a string")
        if "tuned afterwards" in text:
            rules[batch] = "none"
        elif "every repository held-out" in text:
            rules[batch] = "all"
        elif "sha1" in text:
            rules[batch] = "sha1"
        else:
            raise ValueError(f"{path}: `{key}`: unknown held-out rule {text!r} (it must name the sha1 "
                             "rule or say \"every repository held-out\" or \"tuned afterwards\")")
    return rules


def heldout_by_rule(repos) -> set:
    """The held-out rule of one batch of the manifest: sha1(repo) ascending, the first ceil(n/4)."""
    import hashlib

    order = sorted(repos, key=lambda r: hashlib.sha1(r.encode("utf-8")).hexdigest())
    return set(order[:(len(order) + 3) // 4])


def heldout_by_batches(entries) -> set:
    """The held-out repositories of the whole manifest: each batch's rule (``split``: "sha1",
    the default, "all" or "none", see `batch_rules`) applied to that batch on its own (``batch``, 1 when
    absent), so adding a batch never moves an earlier batch's repository from one part to the
    other."""
    batches, split = {}, {}
    for e in entries:
        b = e.get("batch", 1)
        batches.setdefault(b, []).append(e["repo"])
        split[b] = e.get("split", "sha1")
    return set().union(*(set(repos) if split[b] == "all" else set() if split[b] == "none"
                         else heldout_by_rule(repos) for b, repos in batches.items()))


def load_labels(path: str) -> list:
    import json

    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            if d.get("verdict") not in VERDICTS:
                raise ValueError(f"{path}:{n}: verdict must be one of {', '.join(VERDICTS)}")
            out.append(d)
    return out


def match_labels(findings: list, labels: list) -> tuple:
    """findings: dicts with repo, path, cell, line, code. Returns (verdict per finding or None,
    indices of the labels used). Exact line first, then the nearest within 2 lines."""
    from collections import defaultdict

    by_key = defaultdict(list)
    for i, lb in enumerate(labels):
        by_key[(lb["repo"], lb["path"], lb.get("cell"), lb["code"])].append(i)
    used, verdict = set(), [None] * len(findings)
    order = sorted(range(len(findings)), key=lambda k: (findings[k]["repo"], findings[k]["path"],
                                                         findings[k]["cell"] or 0, findings[k]["line"]))
    for tolerance in (0, 1, 2):
        for k in order:
            if verdict[k] is not None:
                continue
            f = findings[k]
            for i in by_key.get((f["repo"], f["path"], f["cell"], f["code"]), ()):
                if i not in used and abs(labels[i]["line"] - f["line"]) == tolerance:
                    used.add(i)
                    verdict[k] = labels[i]["verdict"]
                    break
    return verdict, used


def lint_manifest_entry(e: dict, root: str, jobs: int, extend_select=()) -> dict:
    """Lint one checkout as `torchlint check --no-cache` does (its config, the default rules,
    plus ``extend_select``)."""
    from torchlint.config import load_config
    from torchlint.runner import Runner

    base = os.path.join(root, e["repo"].replace("/", "+"))
    out = {"files": 0, "loops": 0, "findings": [], "errors": [], "time": 0.0}
    for sub in e["subpaths"] or [""]:
        path = os.path.join(base, sub) if sub else base
        cfg = load_config(None, start=path)
        runner = Runner(cfg, cfg.select, cfg.ignore, list(cfg.extend_select) + list(extend_select), jobs=jobs,
                        progress=False)
        out["enabled"] = runner.enabled
        files = runner.files([path])
        t0 = time.perf_counter()
        results = run(files, runner.opts, jobs=jobs)
        out["time"] += time.perf_counter() - t0
        out["files"] += len(files)
        out["loops"] += training_loops(files, results)
        for r in results:
            if r.error:
                out["errors"].append(r.error)
            for f in r.findings:
                out["findings"].append({
                    "repo": e["repo"], "commit": e["commit"], "part": e["part"],
                    "path": os.path.relpath(os.path.abspath(f.path), base).replace(os.sep, "/"),
                    "cell": f.cell, "line": f.line, "code": f.code, "message": f.message})
    return out


def _table(head, rows, markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
        lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths)))
                     for row in [head] + rows)


def score_rows(findings, verdicts, lost, scripts: int) -> list:
    """Per-rule rows (and a total row) of the scoring table."""
    codes = sorted({f["code"] for f in findings} | {lb["code"] for lb in lost})
    rows = []

    def row(name, sel, lost_n):
        c = Counter(verdicts[i] for i in sel)
        t, fa, d, u = c["TRUE"], c["FALSE"], c["DEBATABLE"], c[None]
        judged = t + fa + d
        prec = f"{t / (t + fa):.2f}" if t + fa else "–"
        share = f"{d / judged:.0%}" if judged else "–"
        per50 = f"{fa * 50 / scripts:.2f}" if scripts else "–"
        return [name, len(sel), t, fa, d, u, prec, share, per50, lost_n]

    for code in codes:
        sel = [i for i, f in enumerate(findings) if f["code"] == code]
        rows.append(row(code, sel, sum(1 for lb in lost if lb["code"] == code)))
    # the rule set's totals: engine diagnostics (TL0xx: a file or cell that does not parse, an
    # unused noqa) are listed on their own rows but are no rule's judgement, so they are not
    # counted in the precision, DEBATABLE share or FALSE rate of the rules (see
    # docs/evaluation.md); a FALSE TL001 (valid code reported) still shows on its row
    sel = [i for i, f in enumerate(findings) if not is_engine_code(f["code"])]
    rows.append(row("all rules", sel, sum(1 for lb in lost if not is_engine_code(lb["code"]))))
    return rows


def is_engine_code(code: str) -> bool:
    """TL000-TL009: diagnostics of the engine (internal error, syntax error, unused noqa, not
    analysed), not findings of a rule."""
    return code.startswith("TL00")


SCORE_HEAD = ["rule", "findings", "TRUE", "FALSE", "DEBATABLE", "unjudged", "precision",
              "DEBATABLE share", "FALSE / 50 scripts", "lost TRUE"]


def main_manifest(args) -> int:
    import json

    try:
        entries = load_manifest(args.manifest)
        labels = load_labels(args.labels)
    except (OSError, ValueError) as exc:
        print(f"realworld.py: error: {exc}", file=sys.stderr)
        return 2
    rule = heldout_by_batches(entries)
    wrong = [e["repo"] for e in entries if (e["part"] == "heldout") != (e["repo"] in rule)]
    if args.check_split:
        for r in wrong:
            print(f"realworld.py: {r}: `part` disagrees with the held-out rule", file=sys.stderr)
        for b in sorted({e["batch"] for e in entries}):
            repos = [e["repo"] for e in entries if e["batch"] == b]
            held = sorted(r for r in repos if r in rule)
            split = next(e["split"] for e in entries if e["batch"] == b)
            how = {"all": "every repository held out", "none": "held-out once, tuned afterwards"}.get(split, "sha1 rule")
            print(f"batch {b} ({how}): {len(repos)} repositories, {len(held)} held out: " + ", ".join(held))
        return 1 if wrong else 0
    if args.part != "all":
        entries = [e for e in entries if e["part"] == args.part]
    if args.batch:
        entries = [e for e in entries if e["batch"] in args.batch]
    if args.repo:
        entries = [e for e in entries if any(s.lower() in e["repo"].lower() for s in args.repo)]
    missing = [] if args.from_run else [e["repo"] for e in entries if not os.path.isdir(os.path.join(args.root, e["repo"].replace("/", "+")))]
    if missing:
        for r in missing:
            print(f"realworld.py: error: no checkout of {r} under {args.root} (see docs/evaluation.md)",
                  file=sys.stderr)
        return 2
    per_repo = {}
    if args.from_run:
        with open(args.from_run, encoding="utf-8") as fh:
            saved = json.load(fh)
        for e in entries:
            if e["repo"] not in saved:
                print(f"realworld.py: error: {args.from_run} has no run of {e['repo']}", file=sys.stderr)
                return 2
            per_repo[e["repo"]] = saved[e["repo"]]
            per_repo[e["repo"]]["enabled"] = set(saved[e["repo"]].get("enabled", ()))
    for e in entries:
        if e["repo"] in per_repo:
            continue
        per_repo[e["repo"]] = lint_manifest_entry(e, args.root, args.jobs, args.extend_select)
        r = per_repo[e["repo"]]
        print(f"  linted {e['repo']}: {r['files']} files, {r['loops']} training scripts, "
              f"{len(r['findings'])} findings, {r['time']:.1f}s", file=sys.stderr)
    if args.save_run:
        with open(args.save_run, "w", encoding="utf-8") as fh:
            json.dump({k: dict(v, enabled=sorted(v.get("enabled", ()))) for k, v in per_repo.items()}, fh)
    commits = {e["repo"]: e["commit"] for e in entries}
    labels = [lb for lb in labels if commits.get(lb["repo"]) == lb.get("commit")]
    findings = [f for e in entries for f in per_repo[e["repo"]]["findings"]]
    verdicts, used = match_labels(findings, labels)
    enabled = set().union(*(r.get("enabled", ()) for r in per_repo.values()))
    unmatched_true = [lb for i, lb in enumerate(labels) if i not in used and lb["verdict"] == "TRUE"]
    lost = [lb for lb in unmatched_true if lb["code"] in enabled]
    off = Counter(lb["code"] for lb in unmatched_true if lb["code"] not in enabled)

    part_of = {e["repo"]: e["part"] for e in entries}
    rows = [[e["repo"], e["part"], per_repo[e["repo"]]["files"], per_repo[e["repo"]]["loops"],
             len(per_repo[e["repo"]]["findings"])] for e in entries]
    rows.append(["total", "", sum(r[2] for r in rows), sum(r[3] for r in rows), sum(r[4] for r in rows)])
    print("# Repositories\n")
    print(_table(["repository", "part", "files", "training scripts", "findings"], rows, args.markdown))
    for part in ("tuned", "heldout", "all"):
        sel = [i for i, f in enumerate(findings) if part == "all" or f["part"] == part]
        if not sel and part != "all":
            continue
        scripts = sum(per_repo[e["repo"]]["loops"] for e in entries if part == "all" or e["part"] == part)
        part_lost = [lb for lb in lost if part == "all" or part_of[lb["repo"]] == part]
        title = {"tuned": "Tuned part", "heldout": "Held-out part", "all": "Both parts"}[part]
        n_repos = sum(1 for e in entries if part == "all" or e["part"] == part)
        print(f"\n# {title}: {n_repos} repositories, {scripts} training scripts\n")
        print(_table(SCORE_HEAD, score_rows([findings[i] for i in sel], [verdicts[i] for i in sel],
                                            part_lost, scripts), args.markdown))
    if off:
        print("\nLabelled TRUE findings of rules outside this run's rule set (not counted as lost): " +
              ", ".join(f"{c} {n}" for c, n in sorted(off.items())))
    if lost:
        print("\nLabelled TRUE findings no longer reported:")
        for lb in lost:
            cell = f" cell {lb['cell']}" if lb.get("cell") else ""
            print(f"  {lb['repo']} {lb['path']}{cell}:{lb['line']} {lb['code']}")
    for e in entries:
        for err in per_repo[e["repo"]]["errors"]:
            print(f"  {e['repo']}: {err}", file=sys.stderr)
    if args.findings:
        print()
        for f, v in zip(findings, verdicts):
            cell = f" cell {f['cell']}" if f["cell"] else ""
            print(f"{f['repo']} {f['path']}{cell}:{f['line']}: {f['code']} [{v or 'unjudged'}] {f['message']}")
    if args.dump_unjudged:
        with open(args.dump_unjudged, "w", encoding="utf-8") as fh:
            for f, v in zip(findings, verdicts):
                if v is None:
                    fh.write(json.dumps({k: f[k] for k in ("repo", "commit", "part", "path", "cell", "line", "code",
                                                           "message")}) + "\n")
        print(f"\n{sum(v is None for v in verdicts)} unjudged findings written to {args.dump_unjudged}",
              file=sys.stderr)
    return 0


def _key(f) -> tuple:
    return (f.path, f.line, f.code)


def rule_codes(values) -> list:
    """``--extend-select`` values as rule codes: each value may list several, comma-separated
    (``TL108,TL109``, as the CLI's option); a code that no rule has is an error (it would
    select nothing and the run would look like one in which the rule finds nothing)."""
    from torchlint.rule import all_rules

    known = set(all_rules())
    codes = [c.strip() for v in values for c in v.split(",") if c.strip()]
    unknown = [c for c in codes if not any(k.startswith(c) for k in known)]
    if unknown:
        raise ValueError(f"no rule has the code {', '.join(unknown)}")
    return codes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", metavar="PATH")
    ap.add_argument("--manifest", nargs="?", const=MANIFEST, default=None,
                    help="score the labelled benchmark of this manifest (default benchmarks/realworld/manifest.toml)")
    ap.add_argument("--root", default=os.environ.get("TORCHLINT_REALWORLD_ROOT", "/work/scratch/realworld"),
                    help="folder holding the checkouts, one <owner>+<name> folder per repository")
    ap.add_argument("--labels", default=LABELS, help="verdicts (JSONL)")
    ap.add_argument("--part", choices=("all", "tuned", "heldout"), default="all")
    ap.add_argument("--batch", type=int, action="append", default=[], metavar="N",
                    help="only the repositories of batch N of the manifest (repeatable)")
    ap.add_argument("--repo", action="append", default=[], help="only repositories whose name contains this")
    ap.add_argument("--extend-select", action="append", default=[], metavar="CODE",
                    help="also run these rules (e.g. a preview rule: --extend-select TL201; several: "
                         "TL108,TL109 or the option repeated)")
    ap.add_argument("--dump-unjudged", metavar="OUT", help="write the findings without a verdict as JSONL")
    ap.add_argument("--save-run", metavar="FILE", help="save the lint results (findings, counts) as JSON")
    ap.add_argument("--from-run", metavar="FILE", help="score a run saved by --save-run instead of linting")
    ap.add_argument("--check-split", action="store_true", help="check the manifest's parts against its held-out rule")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--findings", action="store_true", help="list every finding")
    ap.add_argument("--cross", action="store_true",
                    help="also lint without the call graph and list what cross-function analysis changes")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)
    try:
        args.extend_select = rule_codes(args.extend_select)
    except ValueError as e:
        print(f"realworld.py: error: --extend-select: {e}", file=sys.stderr)
        return 2
    if args.check_split and not args.manifest:
        args.manifest = MANIFEST
    if args.manifest:
        return main_manifest(args)
    if not args.paths:
        ap.error("give PATH... or --manifest")

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

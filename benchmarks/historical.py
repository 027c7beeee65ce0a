"""Recall on historical bugs: training bugs that maintainers of public repositories fixed.

    python benchmarks/historical.py [--manifest FILE] [--mirrors DIR] [--work DIR]
                                    [--only ID ...] [--part tuned|heldout] [--batch N]
                                    [--jobs N]
                                    [--json FILE] [--markdown] [-v]

For every ``[[bug]]`` of ``benchmarks/historical/manifest.toml`` the whole tree of the buggy and
of the fixed commit is written (``git archive``) under the work directory (default
``~/.cache/torchlint-bench/historical``; trees are kept between runs, findings never are) and
linted as one project with every rule, preview rules included (``--select`` with every code,
``--no-cache``), exactly as ``torchlint check TREE`` would.  The *default* columns count only
the codes enabled by the default configuration (``select = ["TL"]``, which leaves preview rules
out; the rules are independent, so filtering the all-rules run gives the default run's
findings).

* hit: a finding with one of the entry's codes within ``tolerance`` (3) lines of one of its
  sites on the buggy revision;
* false flag: a finding with one of the entry's codes within ``tolerance`` lines of the same
  site on the fixed revision (site lines are mapped through the diff of the two files, or
  given as ``fixed_lines``).

Recall is printed per rule family (the family of the entry's first code) and per part
(``tuned`` / ``heldout``, see the manifest for the rule that splits them).  Held-out entries
are scored like the others; they must never steer model work.  Entries come in batches
(``batch``, 1 when absent); each batch has its own held-out rule, declared in the manifest's
header (``heldout_rule`` for batch 1, ``batch<N>_heldout_rule`` for batch N): the sha1 rule of
batch 1, "every entry held-out" (a batch mined and pinned before any lint) or "tuned
afterwards" (a held-out batch scored once, then tuned on).  ``--batch N`` runs one batch.

The repositories come from bare mirrors: ``DIR/owner+name/repo`` (the layout of the search
tool's ``fetch``), ``DIR/owner+name.git`` or ``DIR/owner/name``.  Missing repositories are
listed (with the commits needed) and skipped; the exit status is then 3.  The benchmark is
run by developers, it is not part of the test suite.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

try:  # Python 3.11+
    import tomllib as _toml
except ImportError:  # pragma: no cover
    import tomli as _toml  # type: ignore

DEFAULT_MANIFEST = os.path.join(HERE, "historical", "manifest.toml")
DEFAULT_MIRRORS = os.environ.get("TORCHLINT_BENCH_MIRRORS", "/work/.mirror")
DEFAULT_WORK = os.path.join(os.path.expanduser("~"), ".cache", "torchlint-bench", "historical")

FAMILIES = {
    "TL1": "loop order (TL1xx)",
    "TL2": "train/eval/no_grad (TL2xx)",
    "TL3": "autograd (TL3xx)",
    "TL4": "losses (TL4xx)",
    "TL5": "memory (TL5xx)",
    "TL6": "device (TL6xx)",
    "TL7": "data (TL7xx)",
    "TL8": "debug (TL8xx)",
}


class BenchError(Exception):
    pass


def heldout(repo: str, fixed: str) -> bool:
    """The sha1 held-out rule of batch 1 (decided before any entry was linted)."""
    return int(hashlib.sha1(f"{repo}@{fixed}".encode()).hexdigest()[:8], 16) % 4 == 0


def batch_rules(data: dict) -> dict:
    """The held-out rule each batch declares in the manifest's header (``heldout_rule`` for
    batch 1, ``batch<N>_heldout_rule`` for batch N): "sha1" (the text names sha1: the rule of
    `heldout`), "all" ("every entry held-out": a batch mined and pinned before any lint) or
    "none" ("tuned afterwards": a held-out batch scored once, then tuned on).  A batch that
    declares none gets the sha1 rule; a text that is none of these is an error."""
    rules = {}
    for key, text in data.items():
        m = re.fullmatch(r"(?:batch(\d+)_)?heldout_rule", key)
        if not m:
            continue
        if not isinstance(text, str):
            raise BenchError(f"manifest: `{key}` must be a string")
        batch = int(m.group(1) or 1)
        if "tuned afterwards" in text:
            rules[batch] = "none"
        elif "every entry held-out" in text:
            rules[batch] = "all"
        elif "sha1" in text:
            rules[batch] = "sha1"
        else:
            raise BenchError(f"manifest: `{key}`: unknown held-out rule {text!r} (it must name the "
                             "sha1 rule or say \"every entry held-out\" or \"tuned afterwards\")")
    return rules


def expected_part(bug: dict, rule: str) -> str:
    """The part a batch's rule gives an entry."""
    if rule == "all":
        return "heldout"
    if rule == "none":
        return "tuned"
    return "heldout" if heldout(bug["repo"], bug["fixed"]) else "tuned"


def load_manifest(path: str) -> tuple:
    try:
        with open(path, "rb") as f:
            data = _toml.load(f)
    except (OSError, _toml.TOMLDecodeError) as e:
        raise BenchError(f"cannot read manifest {path}: {e}")
    tol = int(data.get("tolerance", 3))
    rules = batch_rules(data)
    bugs = data.get("bug", [])
    seen = set()
    for b in bugs:
        for k in ("id", "repo", "buggy", "fixed", "codes", "description", "sites", "part"):
            if k not in b:
                raise BenchError(f"manifest entry {b.get('id', '?')}: missing `{k}`")
        if b["id"] in seen:
            raise BenchError(f"manifest: duplicate id {b['id']}")
        seen.add(b["id"])
        batch = b.setdefault("batch", 1)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise BenchError(f"manifest entry {b['id']}: batch must be a positive integer")
        want = expected_part(b, rules.get(batch, "sha1"))
        if b["part"] != want:
            raise BenchError(f"manifest entry {b['id']}: part is {b['part']!r} but the held-out "
                             f"rule of batch {batch} gives {want!r}")
    return tol, bugs


# --- repositories and trees --------------------------------------------------------------

def find_mirror(mirrors: str, repo: str):
    owner_name = repo.replace("/", "+")
    for cand in (os.path.join(mirrors, owner_name, "repo", ".git"),
                 os.path.join(mirrors, owner_name, "repo"),
                 os.path.join(mirrors, owner_name + ".git"),
                 os.path.join(mirrors, repo, ".git"),
                 os.path.join(mirrors, repo)):
        if os.path.isfile(os.path.join(cand, "HEAD")) and os.path.isdir(os.path.join(cand, "objects")):
            return cand
    return None


def _git(gitdir: str, *args, **kw):
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, **kw)


def has_commit(gitdir: str, sha: str) -> bool:
    return _git(gitdir, "cat-file", "-e", sha + "^{commit}").returncode == 0


TREE_FILES = (".py", ".pyi", ".ipynb", "pyproject.toml", "setup.cfg", "torchlint.toml")


def materialise(gitdir: str, repo: str, sha: str, work: str) -> str:
    """The Python files (and configuration) of ``sha`` under ``work``, written once, atomically.

    Blobs the mirror lacks (snapshots leave out files of 4 MiB and more) are skipped.
    """
    dest = os.path.join(work, repo.replace("/", "+") + "@" + sha[:12])
    if os.path.isdir(dest):
        return dest
    os.makedirs(work, exist_ok=True)
    ls = _git(gitdir, "ls-tree", "-r", "-z", sha)
    if ls.returncode != 0:
        raise BenchError(f"{repo}@{sha[:12]}: git ls-tree failed: {ls.stderr.decode(errors='replace').strip()}")
    entries = []
    for rec in ls.stdout.decode("utf-8", errors="surrogateescape").split("\0"):
        if not rec:
            continue
        meta, path = rec.split("\t", 1)
        mode, kind, obj = meta.split()
        if kind == "blob" and mode != "120000" and path.endswith(TREE_FILES):
            entries.append((path, obj))
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=work)
    try:
        if entries:
            r = subprocess.run(["git", "--git-dir", gitdir, "cat-file", "--batch"],
                               input=b"".join(o.encode() + b"\n" for _, o in entries),
                               capture_output=True)
            data, pos = r.stdout, 0
            for path, obj in entries:
                nl = data.index(b"\n", pos)
                header = data[pos:nl].split()
                pos = nl + 1
                if len(header) < 3 or header[1] != b"blob":  # "<obj> missing"
                    continue
                size = int(header[2])
                blob, pos = data[pos:pos + size], pos + size + 1
                target = os.path.join(tmp, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(blob)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def file_lines(gitdir: str, sha: str, path: str):
    r = _git(gitdir, "show", f"{sha}:{path}")
    if r.returncode != 0:
        return None
    return r.stdout.decode("utf-8", errors="replace").splitlines()


def map_lines(old, new, lines) -> list:
    """Buggy-revision lines -> the corresponding lines of the fixed revision."""
    sm = difflib.SequenceMatcher(None, old, new, autojunk=False)
    out = []
    for ln in lines:
        i = ln - 1
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if i1 <= i < i2:
                out.append(j1 + (i - i1) + 1 if tag == "equal" else j1 + 1)
                break
        else:
            out.append(min(ln, max(len(new), 1)))
    return sorted(set(out))


# --- linting -----------------------------------------------------------------------------

def all_codes() -> str:
    """Every rule code, preview rules included (``ALL`` leaves preview rules out)."""
    from torchlint.selection import known_codes

    return ",".join(known_codes())


def lint(tree: str, jobs: int, timeout: float) -> tuple:
    """All findings of ``torchlint check --select <every code> --no-cache tree``, seconds."""
    cmd = [sys.executable, "-m", "torchlint", "check", "--select", all_codes(), "--no-cache",
           "--no-progress", "--output-format", "json", "--exit-zero", "-j", str(jobs), tree]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=timeout, cwd=tree,
                           env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    except subprocess.TimeoutExpired:
        raise BenchError(f"torchlint timed out after {timeout:.0f} s on {tree}")
    dt = time.perf_counter() - t0
    try:
        findings = json.loads(r.stdout.decode() or "[]")
    except json.JSONDecodeError:
        raise BenchError(f"torchlint failed on {tree} (exit {r.returncode}): "
                         f"{r.stderr.decode(errors='replace')[-2000:]}")
    for f in findings:
        f["rel"] = os.path.relpath(f["filename"], tree).replace(os.sep, "/")
        f["line"] = f["location"]["row"]
        if f.get("cell") is not None:
            f["line"] = _notebook_raw_line(f["filename"], f["cell"], f["location"]["row"])
    return findings, dt


_NB_CACHE: dict = {}


def _notebook_raw_line(path: str, cell: int, row: int) -> int:
    from torchlint import notebook

    nb = _NB_CACHE.get(path)
    if nb is None:
        try:
            nb = _NB_CACHE[path] = notebook.load(path)
        except Exception:
            return row
    pos = nb.raw_position(cell, row, 0)  # the line in the .ipynb file's text
    return pos[0] if pos else row


def near(findings, codes, path, lines, tol):
    return [f for f in findings if (codes is None or f["code"] in codes) and f["rel"] == path
            and any(abs(f["line"] - ln) <= tol for ln in lines)]


# --- scoring -----------------------------------------------------------------------------

def score(bug, gitdir, buggy_findings, fixed_findings, tol):
    codes = set(bug["codes"])
    hits, flags, where = [], [], []
    for s in bug["sites"]:
        path, lines = s["path"], s["lines"]
        hits += near(buggy_findings, codes, path, lines, tol)
        fpath = s.get("fixed_path", path)
        flines = s.get("fixed_lines")
        if flines is None:
            old = file_lines(gitdir, bug["buggy"], path) or []
            new = file_lines(gitdir, bug["fixed"], fpath)
            flines = map_lines(old, new, lines) if new is not None else []
        flags += near(fixed_findings, codes, fpath, flines, tol)
        where.append((fpath, flines))
    return hits, flags, where


def family(code: str) -> str:
    return FAMILIES.get(code[:3], code[:3])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=DEFAULT_MANIFEST)
    ap.add_argument("--mirrors", default=DEFAULT_MIRRORS,
                    help="folder of bare mirrors (owner+name/repo, owner+name.git or owner/name)")
    ap.add_argument("--work", default=DEFAULT_WORK, help="where the trees are written (kept)")
    ap.add_argument("--only", nargs="*", default=None, help="entry ids to run")
    ap.add_argument("--part", choices=("tuned", "heldout"), default=None)
    ap.add_argument("--batch", type=int, action="append", default=[], metavar="N",
                    help="run only the entries of batch N (repeatable)")
    ap.add_argument("--jobs", "-j", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per torchlint run")
    ap.add_argument("--json", default=None, help="write per-entry results here")
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the findings near each site")
    a = ap.parse_args(argv)

    try:
        tol, bugs = load_manifest(a.manifest)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.only:
        unknown = set(a.only) - {b["id"] for b in bugs}
        if unknown:
            print(f"error: unknown entry id(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        bugs = [b for b in bugs if b["id"] in a.only]
    if a.part:
        bugs = [b for b in bugs if b["part"] == a.part]
    if a.batch:
        unknown = set(a.batch) - {b["batch"] for b in bugs}
        if unknown:
            print(f"error: no entry in batch(es): {', '.join(map(str, sorted(unknown)))}", file=sys.stderr)
            return 2
        bugs = [b for b in bugs if b["batch"] in a.batch]

    from torchlint.selection import enabled_codes

    default_codes = enabled_codes(["TL"], [])

    missing = []
    results = []
    for b in bugs:
        gitdir = find_mirror(a.mirrors, b["repo"])
        if gitdir is None or not (has_commit(gitdir, b["buggy"]) and has_commit(gitdir, b["fixed"])):
            missing.append(b)
            continue
        try:
            tb = materialise(gitdir, b["repo"], b["buggy"], a.work)
            tf = materialise(gitdir, b["repo"], b["fixed"], a.work)
            fb, tb_s = lint(tb, a.jobs, a.timeout)
            ff, tf_s = lint(tf, a.jobs, a.timeout)
        except BenchError as e:
            print(f"error: {b['id']}: {e}", file=sys.stderr)
            results.append({"id": b["id"], "part": b["part"], "batch": b["batch"], "codes": b["codes"],
                            "error": str(e)})
            continue
        hits, flags, where = score(b, gitdir, fb, ff, tol)
        dflt = [f for f in hits if f["code"] in default_codes]
        dflags = [f for f in flags if f["code"] in default_codes]
        res = {"id": b["id"], "repo": b["repo"], "part": b["part"], "batch": b["batch"], "codes": b["codes"],
               "family": family(b["codes"][0]), "hit": bool(hits), "hit_default": bool(dflt),
               "false_flag": bool(flags), "false_flag_default": bool(dflags),
               "hits": [(f["code"], f["rel"], f["line"]) for f in hits],
               "flags": [(f["code"], f["rel"], f["line"]) for f in flags],
               # an expected code elsewhere in a site's file: a finding too far from the root cause
               "elsewhere": [(f["code"], f["rel"], f["line"]) for f in fb
                             if f["code"] in b["codes"] and f not in hits
                             and f["rel"] in {s["path"] for s in b["sites"]}],
               "seconds": round(tb_s + tf_s, 1)}
        results.append(res)
        mark = "HIT " if hits else "miss"
        ff_mark = "  FALSE FLAG on fixed" if flags else ""
        print(f"{mark} {b['part']:7} {b['id']:40} {','.join(b['codes']):12} "
              f"({res['seconds']:.0f} s){ff_mark}", flush=True)
        if a.verbose:
            for code, rel, line in res["elsewhere"]:
                print(f"       elsewhere {code} {rel}:{line} (not within {tol} lines of a site)")
            for s in b["sites"]:
                for f in near(fb, None, s["path"], s["lines"], tol):
                    print(f"       buggy  {f['code']} {f['rel']}:{f['line']} {f['message'][:90]}")
            for (p, ls) in where:
                for f in near(ff, None, p, ls, tol):
                    print(f"       fixed  {f['code']} {f['rel']}:{f['line']} {f['message'][:90]}")

    report(results, a.markdown)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if missing:
        print(f"\n{len(missing)} entr{'y' if len(missing) == 1 else 'ies'} skipped: repository or "
              f"commit not found under {a.mirrors} (fetch or clone these, bare):", file=sys.stderr)
        for r in sorted({b["repo"] for b in missing}):
            shas = [x for b in missing if b["repo"] == r for x in (b["buggy"][:12], b["fixed"][:12])]
            print(f"  {r}  (needs {', '.join(shas)})", file=sys.stderr)
        return 3
    return 0


def _ratio(n, d):
    return f"{n}/{d} = {n / d:.2f}" if d else "-"


def report(results, markdown: bool) -> None:
    ok = [r for r in results if "error" not in r]
    parts = ("tuned", "heldout")
    rows = []
    fams = sorted({r["family"] for r in ok})
    for fam in fams + ["all"]:
        row = [fam]
        for p in parts:
            sel = [r for r in ok if r["part"] == p and (fam == "all" or r["family"] == fam)]
            row += [_ratio(sum(r["hit_default"] for r in sel), len(sel)),
                    _ratio(sum(r["hit"] for r in sel), len(sel))]
        rows.append(row)
    flags_row = ["false flags on fixed revisions"]
    for p in parts:
        sel = [r for r in ok if r["part"] == p]
        flags_row += [_ratio(sum(r["false_flag_default"] for r in sel), len(sel)),
                      _ratio(sum(r["false_flag"] for r in sel), len(sel))]
    rows.append(flags_row)
    head = ["family", "tuned: default rules", "tuned: all rules", "held-out: default rules",
            "held-out: all rules"]
    print()
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        w = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
        for row in [head] + rows:
            print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(row)))
    errs = [r for r in results if "error" in r]
    if errs:
        print(f"\n{len(errs)} entr{'y' if len(errs) == 1 else 'ies'} failed to run: "
              + ", ".join(r["id"] for r in errs))


if __name__ == "__main__":
    sys.exit(main())

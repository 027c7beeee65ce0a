"""torchlint's ignore rules against git's own: every (patterns, path) pair of the table below is
asked of ``git check-ignore`` in a temporary repository and of ``torchlint.gitignore``, and the
discovery walk is compared with ``git ls-files --others --exclude-standard``."""
import os
import shutil
import subprocess

import pytest

from torchlint import gitignore
from torchlint.discover import EXTENSIONS, discover

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

# (the .gitignore of the case's folder, paths below it; a path ending in "/" is a folder)
CASES = [
    ("doc/*.py", ["doc/a.py", "doc/sub/b.py", "x/doc/c.py", "doc/a.pyc"]),
    ("foo/**/bar.py", ["foo/bar.py", "foo/a/bar.py", "foo/a/b/bar.py", "x/foo/bar.py", "foo/xbar.py"]),
    ("*.log", ["a.log", "sub/b.log", "a.log.py", "log"]),
    ("build/", ["build/", "build/x.py", "sub/build/y.py", "build2.py", "out/build"]),
    ("/root.py", ["root.py", "sub/root.py"]),
    ("a/b", ["a/b", "x/a/b", "a/bc"]),
    ("**/logs", ["logs/x.py", "a/logs/y.py", "a/logsx/z.py"]),
    ("**/logs/debug.log", ["logs/debug.log", "a/b/logs/debug.log", "logs/other.log"]),
    ("logs/**", ["logs/", "logs/a.py", "logs/b/c.py", "xlogs/a.py"]),
    ("a/**/b", ["a/b", "a/x/b", "a/x/y/b", "ab", "a/xb"]),
    ("foo**/bar", ["foobar", "foo/bar", "fooX/bar", "foo/x/bar", "xfoo/bar"]),
    ("**foo", ["xfoo", "a/foo", "foox"]),
    ("a**b", ["ab", "axxb", "d/ab"]),
    ("***/z.py", ["z.py", "q/z.py", "q/r/z.py"]),
    ("*/x.py", ["x.py", "a/x.py", "a/b/x.py"]),
    ("**", ["any.py", "deep/er/file.py"]),
    ("**/", ["top.py", "dir/", "dir/f.py"]),
    ("*.py\n!keep.py", ["drop.py", "keep.py", "sub/keep.py", "sub/drop.py"]),
    ("out/\n!out/keep.py", ["out/keep.py", "out/drop.py"]),
    ("out/*\n!out/keep.py", ["out/keep.py", "out/drop.py", "out/sub/keep.py"]),
    ("*\n!*/\n!*.py", ["a.py", "a.txt", "d/b.py", "d/b.txt"]),
    ("\\#hash.py\n#comment.py\n\n  \n", ["#hash.py", "comment.py", "#comment.py"]),
    ("\\!bang.py\n!notneg.py", ["!bang.py", "bang.py", "notneg.py"]),
    ("trail\\ \nspaces.py   \ntab.py\t", ["trail ", "trail", "spaces.py", "tab.py", "tab.py\t"]),
    ("[abc].py", ["a.py", "d.py", "ab.py"]),
    ("[!abc].py", ["a.py", "d.py"]),
    ("[^abc]x.py", ["ax.py", "dx.py"]),
    ("[a-c]r.py\n[z-a]q.py", ["br.py", "dr.py", "zq.py", "aq.py"]),
    ("[]]b.py\n[!]]c.py", ["]b.py", "xb.py", "]c.py", "xc.py"]),
    ("[[:digit:]]*.py\n[[:upper:]][[:lower:]].py", ["1abc.py", "abc.py", "Ab.py", "ab.py"]),
    ("[abc\nm[[:foo:]].py\nn[[:digit:].py", ["[abc", "a", "mf.py", "n1.py", "n[.py", "n:.py"]),
    ("[a-]k.py\n[-b]j.py", ["ak.py", "-k.py", "bk.py", "-j.py", "bj.py", "cj.py"]),
    ("?.py\n??/", ["a.py", "ab.py", "xy/", "xy/f.py", "xyz/f.py"]),
    ("*.PY", ["up.PY", "low.py"]),
    ("a\\*b\nback\\\\slash", ["a*b", "axb", "back\\slash", "backslash"]),
    ("dironly/", ["dironly", "sub/dironly/", "sub/dironly/f.py"]),
    ("a/b/\n/*.tmp", ["a/b/", "a/b/f.py", "x/a/b/", "top.tmp", "sub/deep.tmp"]),
    ("a/**\n!a/keep/", ["a/", "a/keep/", "a/keep/f.py", "a/f.py"]),
    ("crlf.py\r\nnext.py\r\n", ["crlf.py", "next.py"]),
    ("*.py\nsub/", ["sub/", "other/sub/", "other/sub/k.py", "k.py"]),
    ("/sub/*\n!/sub/keep.py", ["sub/keep.py", "sub/drop.py", "x/sub/drop.py"]),
    ("**/b/**/c.py", ["b/c.py", "a/b/c.py", "a/b/x/y/c.py", "b.c.py"]),
    ("data-[0-9][0-9].py", ["data-12.py", "data-1.py", "data-ab.py"]),
    ("a?b", ["a/b", "axb"]),
    ("a[/]b", ["a/b", "a[/]b"]),
    ("x\\", ["x", "x\\"]),
    ("[a-c-e]1.py\n[\\]]2.py\n[a\\-c]3.py", ["b1.py", "-1.py", "d1.py", "e1.py", "]2.py", "-3.py", "b3.py"]),
    ("**/**/deep.py\na/**b.py\nq/b**", ["deep.py", "x/y/deep.py", "a/b.py", "a/xb.py", "a/x/b.py", "q/bz", "q/b/z"]),
    ("*/\n!keep/", ["top.py", "skip/", "skip/f.py", "keep/", "keep/f.py"]),
    ("gone/\n!gone/inner/", ["gone/inner/f.py", "gone/f.py"]),
    ("*.py\n!/sub/**/*.py", ["a.py", "sub/b.py", "sub/c/d.py", "x/sub/e.py"]),
]

# ignore files of several folders, info/exclude, and git's precedence between them
NESTED = {
    ".git/info/exclude": "*.bak\ninfo_only.py\ninfo_neg.py\n",
    ".gitignore": "!info_neg.py\n*.gen.py\n/toponly.py\nvendor/\nn/deep/*.py\n",
    "n/.gitignore": "!keep.gen.py\nlocal.py\n/anchored.py\n",
    "n/deep/.gitignore": "!back.py\n*.bak\n!x.bak\n",
}
NESTED_PATHS = ["a.bak", "n/x.bak", "n/deep/x.bak", "n/deep/y.bak", "info_only.py", "n/info_only.py",
                "info_neg.py", "m.gen.py", "n/m.gen.py", "n/keep.gen.py", "keep.gen.py", "toponly.py",
                "n/toponly.py", "local.py", "n/local.py", "n/deep/local.py", "anchored.py", "n/anchored.py",
                "n/deep/anchored.py", "vendor/v.py", "n/vendor/v.py", "n/deep/back.py", "n/deep/other.py",
                "n/deep/more/back.py"]


def _git(repo, *args, stdin=None):
    home = str(repo.parent / "home")
    env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=home, GIT_CONFIG_NOSYSTEM="1",
               GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    return subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, env=env, timeout=60)


def _make(repo, files: dict, paths):
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    for rel, text in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode())
    for rel in paths:
        p = repo / rel
        if rel.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("x = 1\n")


def _git_ignored(repo, paths):
    r = _git(repo, "check-ignore", "--stdin", "-z", stdin=b"".join(p.rstrip("/").encode() + b"\0" for p in paths))
    assert r.returncode in (0, 1), r.stderr.decode()
    return {p.decode() for p in r.stdout.split(b"\0") if p}


def _compare(repo, paths):
    want = _git_ignored(repo, paths)
    got = {p.rstrip("/") for p in paths if gitignore.check(str(repo), p.rstrip("/"), p.endswith("/"))}
    return want, got


@pytest.fixture(scope="module")
def table_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gi") / "repo"
    repo.mkdir()
    files = {f"case{i:02d}/.gitignore": text for i, (text, _) in enumerate(CASES)}
    paths = [f"case{i:02d}/{p}" for i, (_, ps) in enumerate(CASES) for p in ps]
    _make(repo, files, paths)
    return repo, paths


def test_table_is_large():
    assert len(CASES) >= 40 and sum(len(ps) for _, ps in CASES) >= 150


def test_patterns_match_git_check_ignore(table_repo):
    repo, paths = table_repo
    want, got = _compare(repo, paths)
    assert want, "git ignored nothing: the table is not being exercised"
    assert got == want, f"ignored by git only: {sorted(want - got)}; by torchlint only: {sorted(got - want)}"


@pytest.mark.parametrize("text, path, ignored", [
    ("doc/*.py", "doc/sub/b.py", False),
    ("foo/**/bar.py", "foo/bar.py", True),
    ("\\#hash.py", "#hash.py", True),
    ("out/\n!out/keep.py", "out/keep.py", True),
])
def test_issue_examples(tmp_path, text, path, ignored):
    (tmp_path / ".gitignore").write_text(text)
    (tmp_path / ".git").mkdir()
    assert gitignore.check(str(tmp_path), path, False) is ignored


def test_precedence_of_nested_files_and_info_exclude(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _make(repo, {}, NESTED_PATHS)
    for rel, text in NESTED.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    want, got = _compare(repo, NESTED_PATHS)
    assert "info_only.py" in want and "info_neg.py" not in want
    assert got == want, f"ignored by git only: {sorted(want - got)}; by torchlint only: {sorted(got - want)}"


def _walk_matches_git(repo, start=""):
    r = _git(repo, "ls-files", "--others", "--exclude-standard", "-z", "--", start or ".")
    want = {p.decode() for p in r.stdout.split(b"\0") if p and p.decode().endswith(EXTENSIONS)}
    top = repo / start if start else repo
    found = discover([str(top)], exclude=[".git"]).files
    got = {os.path.relpath(f, repo).replace(os.sep, "/") for f in found}
    assert want
    assert got == want, f"listed by git only: {sorted(want - got)}; by torchlint only: {sorted(got - want)}"


def test_discovery_walk_lists_what_git_lists(table_repo, tmp_path):
    repo, _ = table_repo
    _walk_matches_git(repo)
    _walk_matches_git(repo, "case01")  # a folder inside the repository: the parents' rules apply
    nested = tmp_path / "nested"
    nested.mkdir()
    _make(nested, {}, NESTED_PATHS)
    for rel, text in NESTED.items():
        (nested / rel).write_text(text)
    _walk_matches_git(nested)
    _walk_matches_git(nested, "n/deep")


def test_a_repository_inside_the_walk_has_its_own_rules(tmp_path):
    outer = tmp_path / "outer"
    _make(outer, {".gitignore": "*.py\n!main.py\n"}, ["main.py", "skip.py"])
    inner = outer / "inner"
    inner.mkdir()
    _make(inner, {".git/info/exclude": "secret.py\n"}, ["skip.py", "secret.py", "main.py"])
    found = {os.path.relpath(f, outer) for f in discover([str(outer)], exclude=[".git"]).files}
    assert found == {"main.py", os.path.join("inner", "skip.py"), os.path.join("inner", "main.py")}

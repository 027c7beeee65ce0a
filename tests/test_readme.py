"""The commands README.md and docs/ show work from a checkout today.

Every `torchlint ...` command of the README and the docs parses with the CLI; the README's usage
commands run on a buggy project and exit as documented; no install command names a package index
release (torchlint is not on PyPI); the pre-commit snippets name a real commit and the `local`
variant blocks a buggy commit; the README's install-and-run command runs verbatim in a fresh
virtualenv (slow)."""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

import click
import pytest

from torchlint.cli import main as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "fixtures", "notebooks", "fashion_cnn.ipynb")  # TL203 at cell 6, line 3
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
_PREFIXES = ("$ ", "- run: ", "run: ", "- ", "entry: ")


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
        return fh.read()


def _blocks(text):
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)


def _lines(block):
    """The block's lines, continuation lines joined, prompts and YAML list/run prefixes removed."""
    out, pending = [], ""
    for line in block.splitlines():
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        for pre in _PREFIXES:
            if line.startswith(pre):
                line = line[len(pre):]
        out.append(line)
    return out


def _strip_comment(line):
    tokens = []
    lexer = shlex.shlex(line, posix=True, punctuation_chars="<>|&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    for tok in lexer:
        tokens.append(tok)
    return tokens


def documented_commands():
    """(file, command line, inline) for every `torchlint ...` in a code block or an inline
    code span of the prose."""
    out = []
    for rel in DOCS:
        text = _read(rel)
        for block in _blocks(text):
            for line in _lines(block):
                if line.startswith("torchlint "):
                    out.append((rel, line, False))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for span in re.findall(r"`(torchlint [^`]+)`", prose):
            out.append((rel, span, True))
    return out


def install_commands():
    out = []
    for rel in DOCS:
        text = _read(rel)
        for line in re.findall(r"pip install[^`\n]*", text):
            out.append((rel, line))
    return out


def _args(line):
    """The words of the first command of a shell line (up to a redirection or an operator)."""
    out = []
    for tok in _strip_comment(line):
        if tok in ("<", ">", "|", "&&", "||", ";", "&"):
            break
        out.append(tok)
    return out


COMMANDS = documented_commands()


def _rest(ctx):
    protected = ctx.__dict__.get("_protected_args", None)  # click >= 8.2
    if protected is None:
        protected = ctx.protected_args
    return list(protected) + list(ctx.args)


def _parse(args):
    """Parse ``torchlint <args>`` as the CLI would (subcommands included), without running it."""
    ctx = cli.make_context("torchlint", list(args))
    group, rest = cli, _rest(ctx)
    while isinstance(group, click.Group):
        name, cmd, rest = group.resolve_command(ctx, rest)
        ctx = cmd.make_context(name, rest, parent=ctx)
        group, rest = cmd, _rest(ctx)


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20
    assert {rel for rel, _, _ in COMMANDS} >= {"README.md", "docs/ci.md", "docs/dynamic.md", "docs/editors.md"}


@pytest.mark.parametrize("rel,line,inline", COMMANDS, ids=[f"{r}:{l[:60]}" for r, l, _ in COMMANDS])
def test_documented_command_parses(rel, line, inline):
    try:
        _parse(_args(line)[1:])
    except click.exceptions.Exit as exc:  # --help, --version
        assert exc.exit_code == 0
    except click.exceptions.NoArgsIsHelpError:
        assert inline, f"{rel}: `{line}` only prints the help"  # prose naming a command group
    except click.ClickException as exc:
        pytest.fail(f"{rel}: `{line}` does not parse: {exc.format_message()}")


@pytest.mark.parametrize("rel,line", install_commands())
def test_no_install_from_the_package_index(rel, line):
    """torchlint is not published: no `pip install torchlint` or `torchlint[extra]`."""
    for tok in _args(line)[2:]:
        assert not re.fullmatch(r"torchlint(\[[\w,]+\])?([<>=!~].*)?", tok), f"{rel}: `{line}`"


BUGGY = """\
import torch
import torch.nn as nn


def fit(model, loader, epochs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
"""


def _usage_block():
    text = _read("README.md")
    usage = text.split("## Usage", 1)[1]
    return [line for line in _lines(_blocks(usage)[0]) if line.startswith("torchlint ")]


def test_readme_usage_commands_run_and_exit_as_documented(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "fixtures", "mode", "bad"), src)
    (src / "train.py").write_text(BUGGY)
    (tmp_path / "train.py").write_text(BUGGY)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    ran = []
    for line in _usage_block():
        cmd = line.split("  #", 1)[0].strip()
        sub = cmd.split()[1]
        if sub in ("lsp", "confirm"):
            continue  # a server, the opt-in dynamic mode (tests/test_dynamic.py)
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        lints = sub not in ("rule", "rules", "-V")
        expected = 1 if lints else 0
        assert r.returncode == expected, f"`{cmd}` exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr and "error" not in r.stderr, f"`{cmd}`: {r.stderr}"
        if lints and "sarif" not in cmd:
            assert "TL" in r.stdout, f"`{cmd}` reported nothing: {r.stdout}"
        ran.append(sub)
    assert ran.count("rule") == 1 and ran.count("-V") == 1 and len(ran) >= 9, ran
    assert (tmp_path / "torchlint.sarif").exists()


def _precommit_snippets():
    text = _read("README.md").split("## pre-commit", 1)[1].split("\n## ", 1)[0]
    import yaml  # pre-commit depends on pyyaml

    return [yaml.safe_load(b) for b in _blocks(text)]


def _pinned_revisions():
    """(file, commit) for every commit the README and the docs pin: pre-commit `rev:` lines and
    `git+...@COMMIT` install commands."""
    out = []
    for rel in DOCS:
        for rev in re.findall(r"^\s*rev:\s*(\S+)|git\+https://[^\s'\"@]+@([^\s'\"]+)", _read(rel), re.M):
            if (rev[0] or rev[1]) != "COMMIT":  # the prose's placeholder
                out.append((rel, rev[0] or rev[1]))
    return out


def test_readme_precommit_revision_is_a_real_commit_with_the_hook():
    pytest.importorskip("yaml")
    remote = next(s for s in _precommit_snippets() if s["repos"][0]["repo"] != "local")["repos"][0]
    rev = remote["rev"]
    assert re.fullmatch(r"[0-9a-f]{40}", str(rev)), f"pin a full commit id, not {rev!r}"
    # one revision everywhere (README, docs/ci.md): the one whose hook the README describes
    pins = _pinned_revisions()
    assert len(pins) >= 4 and {r for _, r in pins} == {rev}, pins
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT,
                                                     capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    hooks = subprocess.run(["git", "show", f"{rev}:.pre-commit-hooks.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert hooks.returncode == 0, f"{rev} is not a commit of this repository: {hooks.stderr}"
    defined = {h["id"]: h for h in __import__("yaml").safe_load(hooks.stdout)}
    assert [h["id"] for h in remote["hooks"]] == ["torchlint"] and "torchlint" in defined
    # the pinned hook checks notebooks too (a revision from before `jupyter` skips them)
    assert "jupyter" in defined["torchlint"]["types_or"], defined["torchlint"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git not available")
def test_readme_local_precommit_hook_blocks_a_buggy_commit(tmp_path):
    pytest.importorskip("pre_commit")
    yaml = pytest.importorskip("yaml")
    local = next(s for s in _precommit_snippets() if s["repos"][0]["repo"] == "local")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PRE_COMMIT_HOME=str(tmp_path / "pc-home"), GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".pre-commit-config.yaml").write_text(yaml.safe_dump(local))
    (work / "train.py").write_text(BUGGY)
    (work / "ok.py").write_text("print('hello')\n")
    shutil.copy(NOTEBOOK, work / "lab.ipynb")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(cmd, cwd=work, check=True, env=env)
    r = subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "train.py:12:13: TL103" in out
    assert "lab.ipynb:cell 6:3:1: TL203" in out, out  # notebooks are checked (types_or: jupyter)


@pytest.mark.slow
def test_readme_install_and_run_command_runs_verbatim(tmp_path):
    """README's first command, as a new user types it, in a fresh copy of the checkout."""
    text = _read("README.md")
    cmd = next(line for line in _lines(_blocks(text.split("## Try it", 1)[1])[0]) if "pip install ." in line)
    copy = tmp_path / "torchlint"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__",
                                                           ".torchlint_cache", "build"))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(os.path.dirname(os.path.dirname(sys.executable))))
    r = subprocess.run(["bash", "-c", cmd], cwd=copy, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # findings: the programs are buggy
    assert "fixtures/loop_order/bad/logistic_regression_step_before_backward.py:61:13: TL101 " in r.stdout
    assert re.search(r"^Found \d+ errors\.$", r.stdout, re.M)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git not available")
def test_readme_precommit_snippet_runs_through_try_repo(tmp_path):
    """The remote snippet's revision, installed by pre-commit from this repository."""
    pytest.importorskip("pre_commit")
    remote = next(s for s in _precommit_snippets() if s["repos"][0]["repo"] != "local")["repos"][0]
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pc-home"), GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(BUGGY)
    shutil.copy(NOTEBOOK, work / "lab.ipynb")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(cmd, cwd=work, check=True, env=env)
    r = subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", ROOT, remote["hooks"][0]["id"],
                        "--ref", remote["rev"], "--all-files"], cwd=work, env=env, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "train.py:12:13: TL103" in out
    assert "lab.ipynb:cell 6:3:1: TL203" in out, out

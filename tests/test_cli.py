"""The command line contract: exit codes, formats, selection, configuration errors."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

BUGGY = textwrap.dedent('''\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def train(model, loader, optimizer, criterion, epochs):
        for epoch in range(epochs):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()


    def main():
        model = nn.Linear(10, 2)
        data = TensorDataset(torch.randn(64, 10), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, loader, optimizer, nn.CrossEntropyLoss(), epochs=2)


    if __name__ == "__main__":
        main()
''')

CLEAN = BUGGY.replace("        for x, y in loader:\n",
                      "        for x, y in loader:\n            optimizer.zero_grad()\n")


def tl(*args, cwd=None, input=None):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True,
                          text=True, input=input, timeout=120)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def test_text_output_and_exit_one(project):
    r = tl("train.py", "--no-cache", cwd=project)
    assert r.returncode == 1, r.stderr
    assert "train.py:11:13: TL103 " in r.stdout
    assert "Found 1 error." in r.stdout


def test_clean_file_exits_zero(project):
    r = tl("clean.py", "--no-cache", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "All checks passed!" in r.stdout


def test_check_subcommand_is_the_default(project):
    a = tl("check", "train.py", "--no-cache", cwd=project)
    b = tl("train.py", "--no-cache", cwd=project)
    assert a.stdout == b.stdout and a.returncode == b.returncode == 1


def test_exit_zero_and_ignore(project):
    assert tl("train.py", "--no-cache", "--exit-zero", cwd=project).returncode == 0
    r = tl("train.py", "--no-cache", "--ignore", "TL1", cwd=project)
    assert r.returncode == 0, r.stdout
    r = tl("train.py", "--no-cache", "--select", "TL2", cwd=project)
    assert r.returncode == 0


def test_unknown_rule_code_is_a_usage_error(project):
    r = tl("train.py", "--select", "TL999", cwd=project)
    assert r.returncode == 2
    assert "TL999" in r.stderr and "Traceback" not in r.stderr


def test_json_is_ruff_compatible(project):
    r = tl("train.py", "--no-cache", "--output-format", "json", cwd=project)
    data = json.loads(r.stdout)
    assert [d["code"] for d in data] == ["TL103"]
    d = data[0]
    assert d["location"] == {"row": 11, "column": 13}
    assert d["filename"].endswith("train.py") and os.path.isabs(d["filename"])
    assert d["url"].endswith("TL103.md")
    assert d["name"] == "missing-zero-grad"
    assert d["fix"]["applicability"] == "unsafe"


def test_json_lines(project):
    r = tl("train.py", "clean.py", "--no-cache", "--output-format", "json-lines", cwd=project)
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["code"] == "TL103"


def test_github_annotations_are_escaped(project):
    r = tl("train.py", "--no-cache", "--output-format", "github", cwd=project)
    line = r.stdout.strip()
    assert line.startswith("::error file=train.py,line=11,col=13,endLine=11,endColumn=")
    assert "title=torchlint (TL103)::TL103 " in line


def test_sarif_is_valid_shape(project):
    r = tl("train.py", "--no-cache", "--output-format", "sarif", cwd=project)
    doc = json.loads(r.stdout)
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    ids = [x["id"] for x in run["tool"]["driver"]["rules"]]
    assert "TL103" in ids and "TL101" in ids
    res = run["results"][0]
    assert res["ruleId"] == "TL103"
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "train.py"
    assert loc["region"]["startLine"] == 11 and loc["region"]["startColumn"] == 13
    assert run["tool"]["driver"]["rules"][res["ruleIndex"]]["id"] == "TL103"


def test_lsp_format_uses_zero_based_positions(project):
    r = tl("train.py", "--no-cache", "--output-format", "lsp", cwd=project)
    doc = json.loads(r.stdout)
    (uri, diags), = doc.items()
    assert uri.startswith("file:///") and uri.endswith("train.py")
    d = diags[0]
    assert d["range"]["start"] == {"line": 10, "character": 12}
    assert d["source"] == "torchlint" and d["code"] == "TL103"
    assert d["codeDescription"]["href"].endswith("TL103.md")


def test_statistics(project):
    r = tl("train.py", "--no-cache", "--statistics", cwd=project)
    assert r.stdout.split() == ["1", "TL103", "missing-zero-grad"]


def test_noqa_suppresses(project):
    src = BUGGY.replace("optimizer.step()\n", "optimizer.step()  # noqa: TL103\n")
    (project / "train.py").write_text(src)
    assert tl("train.py", "--no-cache", cwd=project).returncode == 0
    src = BUGGY.replace("optimizer.step()\n", "optimizer.step()  # noqa: TL101\n")
    (project / "train.py").write_text(src)
    assert tl("train.py", "--no-cache", cwd=project).returncode == 1


def test_file_level_noqa(project):
    (project / "train.py").write_text("# torchlint: noqa\n" + BUGGY)
    assert tl("train.py", "--no-cache", cwd=project).returncode == 0


def test_config_select_and_per_file_ignores(project):
    (project / "pyproject.toml").write_text('[tool.torchlint]\nper-file-ignores = { "train.py" = ["TL103"] }\n')
    assert tl(".", "--no-cache", cwd=project).returncode == 0
    (project / "pyproject.toml").write_text('[tool.torchlint]\nignore = ["TL10"]\n')
    assert tl(".", "--no-cache", cwd=project).returncode == 0


@pytest.mark.parametrize("body,needle", [
    ('[tool.torchlint]\nselect = "TL1"\n', "`tool.torchlint.select` must be a list of strings"),
    ('[tool.torchlint]\nunknown-key = 1\n', "unknown key `tool.torchlint.unknown-key`"),
    ('[tool.torchlint]\nignore = ["XX1"]\n', "unknown rule code or prefix `XX1`"),
    ('[tool.torchlint\nselect = 1\n', "invalid TOML"),
])
def test_bad_config_exits_two_with_the_key(project, body, needle):
    (project / "pyproject.toml").write_text(body)
    r = tl(".", "--no-cache", cwd=project)
    assert r.returncode == 2
    assert needle in r.stderr and "pyproject.toml" in r.stderr
    assert "Traceback" not in r.stderr


def test_syntax_error_is_tl001_and_other_files_still_linted(project):
    (project / "broken.py").write_text("def f(:\n    pass\n")
    r = tl(".", "--no-cache", cwd=project)
    assert r.returncode == 1
    assert "broken.py:1:" in r.stdout and "TL001" in r.stdout
    assert "train.py:11:13: TL103" in r.stdout


def test_missing_path_is_an_error_but_others_are_linted(project):
    r = tl("train.py", "nope.py", "--no-cache", cwd=project)
    assert r.returncode == 2
    assert "nope.py" in r.stderr and "TL103" in r.stdout


def test_gitignore_and_exclude_are_honoured(project):
    sub = project / "generated"
    sub.mkdir()
    (sub / "copy.py").write_text(BUGGY)
    (project / ".gitignore").write_text("generated/\n")
    (project / "clean.py").unlink()
    r = tl(".", "--no-cache", cwd=project)
    assert "generated" not in r.stdout and "train.py" in r.stdout
    # a path named on the command line is always linted
    r = tl("generated/copy.py", "--no-cache", cwd=project)
    assert "TL103" in r.stdout


def test_rule_and_rules_commands():
    r = tl("rule", "TL103")
    assert r.returncode == 0
    assert "## What it does" in r.stdout and "## Why is this bad?" in r.stdout and "Use instead:" in r.stdout
    r = tl("rule", "TL999")
    assert r.returncode == 2 and "unknown rule code" in r.stderr
    r = tl("rules", "--output-format", "json")
    codes = [x["code"] for x in json.loads(r.stdout)]
    assert "TL101" in codes and "TL204" in codes


def test_version():
    from torchlint import __version__

    r = tl("--version")
    assert __version__ in r.stdout


def test_static_linter_never_imports_torch(project):
    code = ("import sys, runpy; sys.argv=['torchlint', 'train.py', '--no-cache'];\n"
            "import torchlint.cli as c\n"
            "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().endswith("ok"), r.stderr


def test_cache_gives_identical_results(project):
    a = tl(".", cwd=project)
    assert (project / ".torchlint_cache" / "CACHEDIR.TAG").exists()
    assert (project / ".torchlint_cache" / ".gitignore").exists()
    b = tl(".", cwd=project)
    assert a.stdout == b.stdout and a.returncode == b.returncode == 1


def test_short_version_flag_prints_name_and_version():
    from torchlint import __version__

    for flag in ("-V", "--version"):
        r = tl(flag)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"torchlint {__version__}"


def test_missing_file_alone_is_an_error_without_all_checks_passed(project):
    r = tl("nosuch.py", "--no-cache", cwd=project)
    assert r.returncode == 2
    assert "nosuch.py: no such file or directory" in r.stderr
    assert "All checks passed!" not in r.stdout + r.stderr
    # a clean file next to a missing one: still an error, still no "All checks passed!"
    r = tl("clean.py", "nosuch.py", "--no-cache", cwd=project)
    assert r.returncode == 2 and "All checks passed!" not in r.stdout


EVAL_NO_GRAD = textwrap.dedent('''\
    import torch


    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            logits = model(x)
            correct += (logits.argmax(dim=1) == y).sum().item()
        return correct / len(loader.dataset)
''')


def test_stdin_filename_reports_under_the_name_and_honours_per_file_ignores(project):
    r = tl("--stdin-filename", "pkg/train.py", "--no-cache", cwd=project, input=BUGGY)
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith(os.path.join("pkg", "train.py") + ":11:13: TL103 ")
    # `-` with the name, as editors call ruff
    r2 = tl("check", "--stdin-filename", "pkg/train.py", "-", "--no-cache", cwd=project, input=BUGGY)
    assert r2.stdout == r.stdout and r2.returncode == 1
    # `-` alone: reported as `-`
    r = tl("-", "--no-cache", "--output-format", "concise", cwd=project, input=BUGGY)
    assert r.stdout.startswith("-:11:13: TL103 "), r.stdout
    # the configuration of the named path applies, not that of the file on disk (there is none)
    (project / "pyproject.toml").write_text('[tool.torchlint]\nper-file-ignores = { "scripts/*" = ["TL103"] }\n')
    r = tl("--stdin-filename", "scripts/train.py", cwd=project, input=BUGGY)
    assert r.returncode == 0 and "All checks passed!" in r.stdout, r.stdout + r.stderr
    r = tl("--stdin-filename", "other/train.py", cwd=project, input=BUGGY)
    assert r.returncode == 1 and "TL103" in r.stdout


def test_stdin_filename_with_force_exclude_honours_the_exclusions(project):
    (project / "pyproject.toml").write_text('[tool.torchlint]\nextend-exclude = ["generated/"]\n')
    r = tl("--stdin-filename", "generated/train.py", "--force-exclude", "-", cwd=project, input=BUGGY)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    r = tl("--stdin-filename", "generated/train.py", "--force-exclude", "--fix", "-", cwd=project, input=BUGGY)
    assert r.returncode == 0 and r.stdout == BUGGY
    # without --force-exclude a file named explicitly is linted, as on the command line
    r = tl("--stdin-filename", "generated/train.py", "-", cwd=project, input=BUGGY)
    assert r.returncode == 1 and "TL103" in r.stdout
    # the same for a file on disk named by pre-commit (its folder is excluded)
    (project / "generated").mkdir()
    (project / "generated" / "train.py").write_text(BUGGY)
    r = tl("generated/train.py", "--force-exclude", "--no-cache", cwd=project)
    assert r.returncode == 0, r.stdout
    assert tl("generated/train.py", "--no-cache", cwd=project).returncode == 1


def test_stdin_with_fix_writes_the_fixed_source_to_stdout(project):
    r = tl("--stdin-filename", "evaluate.py", "--fix", cwd=project, input=EVAL_NO_GRAD)
    assert r.returncode == 0, r.stderr
    assert "    with torch.no_grad():\n        for x, y in loader:\n" in r.stdout
    assert "Found 1 error (1 fixed, 0 remaining)." in r.stderr
    assert not (project / "evaluate.py").exists()


def test_stdin_cannot_be_mixed_with_paths_or_undecodable(project):
    r = tl("-", "train.py", cwd=project, input=BUGGY)
    assert r.returncode == 2 and "stdin" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "torchlint", "-"], cwd=project, capture_output=True,
                       input=b"x = '\xff\xfe'\n", timeout=120)
    assert r.returncode == 2 and b"not valid UTF-8" in r.stderr and b"Traceback" not in r.stderr


def test_fix_prints_what_remains_and_exits_zero_when_nothing_does(project):
    (project / "evaluate.py").write_text(EVAL_NO_GRAD)
    # with the cache on: a run's memo of content hashes must not serve the pre-fix results
    first = tl("evaluate.py", "train.py", cwd=project)
    assert first.returncode == 1 and "TL203 [*]" in first.stdout
    r = tl("evaluate.py", "train.py", "--fix", cwd=project)
    assert r.returncode == 1, r.stdout + r.stderr
    # only the remaining (unsafe-fixable) finding is listed, at its line in the fixed file
    assert "TL203" not in r.stdout
    assert "train.py:11:13: TL103 " in r.stdout
    assert "Found 2 errors (1 fixed, 1 remaining)." in r.stdout
    assert "1 more fix available with `--unsafe-fixes`." in r.stdout
    r = tl("evaluate.py", "train.py", "--fix", "--unsafe-fixes", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "Found 1 error (1 fixed, 0 remaining).\n"
    r = tl("evaluate.py", "train.py", cwd=project)
    assert r.returncode == 0 and "All checks passed!" in r.stdout


INLINE_VALIDATION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "fixtures", "mode", "bad", "inline_validation_without_eval_mode.py")


def test_eval_mode_fix_counted_by_check_is_applied_inside_the_epoch_loop(project):
    """Issue 24, item 3: TL201's fix once put `model.eval()` above the epoch loop, where the
    loop's `model.train()` undid it; `--fix` then dropped it silently while `check` kept
    saying "1 more fix available". What check counts, --fix applies, and it holds."""
    with open(INLINE_VALIDATION, encoding="utf-8") as fh:
        source = fh.read()
    (project / "validate.py").write_text(source)
    check = tl("validate.py", "--select", "TL201", "--no-cache", cwd=project)
    assert check.returncode == 1 and check.stdout.count(": TL201 ") == 1, check.stdout
    assert "1 more fix available with `--unsafe-fixes`." in check.stdout
    r = tl("validate.py", "--select", "TL201", "--no-cache", "--fix", cwd=project)  # unsafe: not applied
    assert r.returncode == 1 and r.stdout == check.stdout
    assert (project / "validate.py").read_text() == source
    r = tl("validate.py", "--select", "TL201", "--no-cache", "--fix", "--unsafe-fixes", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "Found 1 error (1 fixed, 0 remaining).\n"
    fixed = (project / "validate.py").read_text().splitlines()
    train = fixed.index("        model.train()")
    (evals,) = [n for n, ln in enumerate(fixed) if ln.strip() == "model.eval()"]
    val_loop = next(n for n, ln in enumerate(fixed) if "in val_loader" in ln)
    assert train < evals < val_loop and fixed[evals].startswith("        "), "\n".join(fixed[train:val_loop + 1])
    r = tl("validate.py", "--select", "TL201", "--no-cache", cwd=project)
    assert r.returncode == 0 and "All checks passed!" in r.stdout


def test_fix_with_nothing_fixable_prints_what_check_prints(project):
    plain = tl("train.py", "--no-cache", cwd=project)
    fixed = tl("train.py", "--no-cache", "--fix", cwd=project)
    assert fixed.stdout == plain.stdout and fixed.returncode == plain.returncode == 1
    assert (project / "train.py").read_text() == BUGGY
    clean = tl("clean.py", "--no-cache", "--fix", cwd=project)
    assert clean.returncode == 0 and clean.stdout == "All checks passed!\n"


def test_confirm_without_torch_names_the_missing_dependency(project, tmp_path):
    """No "the process ended abruptly" per finding: one clear error, exit 2."""
    # torch invisible to this interpreter: found by no import path
    hide = ("import sys; sys.modules['torch'] = None\n"
            "sys.argv = ['torchlint', 'confirm', 'train.py']\n"
            "from torchlint.cli import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", hide], cwd=project, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the dynamic mode needs `torch`" in r.stderr and "pip install torch" in r.stderr
    assert "Traceback" not in r.stderr and "abruptly" not in r.stdout + r.stderr
    # a torch that is found but cannot be imported (a broken install): the child says so
    fake = tmp_path / "fake-site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-m", "torchlint", "confirm", "train.py"], cwd=project,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the dynamic mode needs `torch`" in r.stderr and "libtorch_cpu.so" in r.stderr
    assert "abruptly" not in r.stdout + r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("newline", ["\n", "\r"])
def test_diff_ends_its_last_line_before_would_fix(project, newline):
    """A file whose changed lines reach its end without a newline (or whose lines end in a
    lone carriage return): the diff's every line ends with a newline, so "Would fix" starts a
    line of the terminal (stdout and stderr in one stream, as a terminal shows them)."""
    source = EVAL_NO_GRAD.replace("        return correct / len(loader.dataset)\n", "").rstrip("\n")
    (project / "evaluate.py").write_bytes(source.replace("\n", newline).encode())
    for args, given in ((("evaluate.py",), None), (("--stdin-filename", "evaluate.py", "-"), source)):
        r = subprocess.run([sys.executable, "-m", "torchlint", "--no-cache", "--diff", *args], cwd=project,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, input=given and given.encode(), timeout=120)
        out = r.stdout.decode()
        assert r.returncode == 1, out
        assert "+    with torch.no_grad():" in out
        assert out.endswith("\nWould fix 1 error.\n"), repr(out)
        body = out[:-len("Would fix 1 error.\n")]
        assert all(line.endswith("\n") for line in body.splitlines(True) if line), repr(out)
        if newline == "\n" and given is None:
            assert body.endswith("\n\\ No newline at end of file\n"), repr(out)

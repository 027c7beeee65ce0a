"""One answer whatever the cache, the jobs or the command, on generated projects under random
edit sequences (``tests/properties.py``; thousands more steps: ``benchmarks/properties.py``)."""
import random
from collections import Counter

import pytest

from properties import Checker, edit, random_project, write

SEQUENCES, STEPS = 12, 20  # 240 edit steps


@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_cached_cold_jobs_lsp_and_fix_agree_under_random_edits(tmp_path, seed):
    """At every step a cached run and the language server (saving the step's edits) agree
    with ``--no-cache -j1``; ``--fix`` acts only on what it reports every fourth step; ``-j2``
    (a pool of processes) at the first and the last step."""
    rng = random.Random(seed)
    root = tmp_path / "proj"
    root.mkdir()
    checker = Checker(str(root), str(tmp_path / "cache"))
    project = random_project(rng)
    history = []
    for step in range(STEPS):
        paths = write(str(root), project)
        bad = checker.check(paths, jobs2=step in (0, STEPS - 1), lsp=True, fix=step % 4 == 0)
        assert not bad, (seed, history, project.files(), bad)
        history.append(edit(project, rng))
    assert checker.compared == {"cached": STEPS, "lsp": STEPS, "fix": STEPS // 4, "-j2": 2}


def test_the_edit_sequences_reach_the_cross_module_rules(tmp_path):
    """The generated projects are not trivially clean: over the sequences of the test above,
    the rules that read other modules' facts fire (a helper's mode for TL201/TL202, its clear
    for TL103, its callers' ``no_grad`` for TL302), and each sequence edits several ways."""
    from torchlint.engine import LintOptions, run
    from torchlint.selection import enabled_codes, preview_codes

    opts = LintOptions(frozenset(enabled_codes(["TL"], [], sorted(preview_codes()))))
    codes, kinds = Counter(), Counter()
    for seed in range(SEQUENCES):
        rng = random.Random(seed)
        project = random_project(rng)
        root = tmp_path / str(seed)
        root.mkdir()
        for _ in range(STEPS // 4):  # (the first steps of each sequence: cheap enough)
            codes.update(f.code for r in run(write(str(root), project), opts) for f in r.findings)
            kinds[edit(project, rng)] += 1
    assert {"TL103", "TL201", "TL202", "TL203", "TL302"} <= set(codes), codes
    assert len(kinds) >= 8, kinds


def test_the_language_server_relints_what_a_save_changed_the_answers_of(tmp_path):
    """A helper that cleared an optimizer now puts the model in eval mode, and the training
    loop now passes it the model: saved helpers.py then train.py. The helper's summary depends
    on its call sites (its parameter is a model because train.py passes one), so saving
    train.py must lint helpers.py again in the server's index, and train.py with it: TL202,
    as ``--no-cache`` reports (the server kept the helper's stale summary)."""
    from properties import Helper, Project

    root = tmp_path / "proj"
    root.mkdir()
    checker = Checker(str(root), str(tmp_path / "cache"))
    project = Project(helpers=[Helper("h0", "zero_grad", "helpers")], loop_calls=["h0"])
    assert not checker.check(write(str(root), project), fix=False)
    project.helpers[0].kind = "eval"
    paths = write(str(root), project)
    assert not checker.check(paths, fix=False)
    assert ("TL202", 17) in {(c, line) for _, c, line, _, _ in checker.last_cold}

"""One answer whatever the cache, the jobs or the command, on generated projects under random
edit sequences (``tests/properties.py``; thousands more steps: ``benchmarks/properties.py``)."""
import random

import pytest

from properties import Checker, edit, random_project, write

SEQUENCES, STEPS = 12, 20  # 240 edit steps


@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_cached_cold_jobs_lsp_and_fix_agree_under_random_edits(tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path / "proj"
    root.mkdir()
    checker = Checker(str(root), str(tmp_path / "cache"))
    project = random_project(rng)
    history = []
    for step in range(STEPS):
        paths = write(str(root), project)
        # -j2 forks a pool: at the first and the last step of each sequence
        bad = checker.check(paths, jobs2=step in (0, STEPS - 1), lsp=step % 2 == 0, fix=step % 4 == 0)
        assert not bad, (seed, history, project.files(), bad)
        history.append(edit(project, rng))

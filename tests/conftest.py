import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")


@pytest.fixture
def lint_source(tmp_path):
    """Lint one module's source text with every default rule; returns [(code, line), ...]."""
    from torchlint.engine import LintOptions, lint_text
    from torchlint.selection import enabled_codes, preview_codes

    def _lint(text, name="train.py", select=("TL",)):
        p = tmp_path / name
        p.write_text(text)
        # every rule the selection names, preview rules included (rule tests test rules, not the
        # default set; tests of the default set go through the CLI)
        preview = sorted(c for c in preview_codes() if any(c.startswith(p) for p in select))
        opts = LintOptions(frozenset(enabled_codes(list(select), [], preview)))
        res = lint_text(str(p), text, opts, module_name=name[:-3])
        return [(f.code, f.line) for f in res.findings]

    return _lint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# Parametrised tests that all read one grouped run (a module-scoped fixture that runs many programs
# in one child interpreter). pytest-xdist sets a module-scoped fixture up once in every worker that
# runs one of its tests, so with the default `-n auto` each run happened once per worker (twice on
# CI's 2 cores: the correct-fixture sweep of tests/test_dynamic.py alone cost ~70 CPU-s a time).
# Their cases go to one worker as a unit; every other test is scheduled alone. (xdist's own
# `--dist loadgroup` and `xdist_group` marks would say this, but with pytest 9.2 and xdist 3.8 the
# group never reaches the scheduler: xdist renames `item._nodeid`, which pytest no longer reads.)
ONE_WORKER = {
    "tests/test_dynamic.py::test_entry_confirms_buggy_fixture": "dynamic entry runs",
    "tests/test_dynamic.py::test_harness_way_on_buggy_fixtures": "dynamic harness runs",
    "tests/test_dynamic.py::test_probes_stay_quiet_on_correct_fixture": "dynamic correct-fixture runs",
    "tests/test_dynamic.py::test_new_rule_probes_confirm_buggy_fixture": "dynamic new-rule runs",
    "tests/test_dynamic.py::test_verdict_names_code_line_and_observation": "dynamic safety runs",
    "tests/test_dynamic.py::test_correct_program_is_refuted": "dynamic safety runs",
    "tests/test_dynamic.py::test_misbehaving_program_yields_not_reached": "dynamic safety runs",
    "tests/test_dynamic.py::test_forked_children_are_killed": "dynamic safety runs",
}


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist keeps its scheduler
    try:
        from xdist.scheduler import LoadScopeScheduling
    except ImportError:  # pragma: no cover - an xdist without it schedules as it always did
        return None

    class OneWorkerPerGroupedRun(LoadScopeScheduling):
        """`--dist load` but the tests of ONE_WORKER's groups go to one worker together (the
        largest units first, xdist's loadscope order); every other test is a unit of its own."""

        def _split_scope(self, nodeid):
            return ONE_WORKER.get(nodeid.split("[", 1)[0], nodeid)

    return OneWorkerPerGroupedRun(config, log)

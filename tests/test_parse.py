"""Parsing a long file in pieces gives the tree libcst gives for the whole file."""
import glob
import os

import libcst as cst
import pytest

from torchlint import parse
from torchlint.parse import parse_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of a few lines, so that short files are cut many times."""
    monkeypatch.setattr(parse, "CHUNK_LINES", 3)
    monkeypatch.setattr(parse, "BIG_LINES", 12)


@pytest.fixture
def pieces(monkeypatch):
    """What libcst was asked to parse: [(entry point, text)]."""
    seen = []
    real_module, real_expr = cst.parse_module, cst.parse_expression

    def module(text, *a, **k):
        seen.append(("module", text))
        return real_module(text, *a, **k)

    def expression(text, *a, **k):
        seen.append(("expression", text))
        return real_expr(text, *a, **k)

    monkeypatch.setattr(cst, "parse_module", module)
    monkeypatch.setattr(cst, "parse_expression", expression)
    return seen


def _same_as_whole(src: str):
    module = parse_module(src)
    assert module.code == src
    assert module.deep_equals(cst.parse_module(src))
    return module


def _python_files():
    files = []
    for pattern in ("torchlint/**/*.py", "rules/**/*.py", "fixtures/**/*.py", "benchmarks/*.py", "tests/*.py"):
        files += glob.glob(os.path.join(ROOT, pattern), recursive=True)
    return sorted(files)


def _parse_in_pieces(files) -> int:
    cut = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            src = f.read()
        cut += len(parse._cuts(src)) > 1
        _same_as_whole(src)
    return cut


def test_a_sixth_of_the_files_of_this_repository_parse_in_pieces_to_the_whole_file_tree(small_pieces):
    """Every sixth file (a fixed stride over the sorted list, so the sample is the same on every
    run and spans engine, rules, fixtures, benchmarks and tests); the slow test below parses all."""
    files = _python_files()[::6]
    assert len(files) > 100
    assert _parse_in_pieces(files) > 50  # most of them were really cut


@pytest.mark.slow
def test_every_file_of_this_repository_parses_in_pieces_to_the_whole_file_tree(small_pieces):
    files = _python_files()
    assert len(files) > 300
    assert _parse_in_pieces(files) > 150


def test_a_piece_never_begins_inside_a_string_a_bracket_or_after_a_decorator(small_pieces, pieces):
    src = '''"""Training utilities.

def not_code():
    this is prose in a docstring
"""
import torch

HELP = """
usage:
train.py --epochs N
"""


@torch.no_grad()
@staticmethod
def evaluate(model, loader):
    model.eval()
    return [
model(x) for x in loader
]


if torch.cuda.is_available():
    device = "cuda"
else:
    device = "cpu"
try:
    import apex
except ImportError:
    apex = None
finally:
    pass
'''
    _same_as_whole(src)
    parsed = [text for kind, text in pieces if kind == "module"][:-1]  # the last: the reference parse
    assert len(parsed) > 2
    for text in parsed:
        assert not text.startswith(("def not_code", "usage", "train.py", "def evaluate", "model(x)", "else", "except",
                                    "finally", '"""\n'))


def test_a_syntax_error_is_reported_where_the_whole_file_parse_reports_it(small_pieces):
    lines = [f"x{i} = {i}\n" for i in range(40)]
    lines[25] = "def broken(:\n"
    src = "".join(lines)
    with pytest.raises(cst.ParserSyntaxError) as whole:
        cst.parse_module(src)
    with pytest.raises(cst.ParserSyntaxError) as ours:
        parse_module(src)
    assert (ours.value.raw_line, ours.value.raw_column) == (whole.value.raw_line, whole.value.raw_column)


def test_pieces_that_disagree_on_indentation_or_line_ending_fall_back_to_the_whole_file(small_pieces):
    two = "def f(x):\n  return x\n\n\n" + "".join(f"y{i} = {i}\n" for i in range(10))
    four = "def g(x):\n    if x:\n        return 1\n    return 0\n"
    _same_as_whole(two + four)
    _same_as_whole((two + four).replace("\n", "\r\n"))
    _same_as_whole(two.replace("\n", "\r\n") + four)


def test_a_long_table_is_parsed_a_few_elements_at_a_time(small_pieces, pieces):
    rows = []
    for i in range(30):
        if i % 7 == 0:
            rows.append(f"    # group {i // 7}\n\n")
        rows.append(f"    OpInfo('op{i}', dtypes=(torch.float32, torch.bfloat16),\n           sample_inputs=lambda t: [t.argmax(dim=1)]),\n")
    src = ("import torch\n\n\nop_db: list[OpInfo] = [\n" + "".join(rows) + "]  # the table\n\n\n"
           "cases = {\n" + "".join(f"    ('k{i}', {i}): [{i}, {i + 1}],\n" for i in range(30)) + "}\n"
           "print(len(op_db))\n\n\n"
           "TUNING: dict = {\n" + "".join(
               f"    ('bsr_dense_addmm', 'NVIDIA A100', (torch.float16, 0.{k})): {{\n"
               + "".join(f"        ({m}, {m}, {m}, 16, 16): (1, 16, {k}, 2),  # tuned\n" for m in range(20))
               + "    },\n" for k in range(3)) + "}\n")
    module = _same_as_whole(src)
    assert isinstance(module.body[1].body[0].value, cst.List)
    exprs = [text for kind, text in pieces if kind == "expression"]
    assert len(exprs) > 4  # the literals were parsed in several groups of elements
    assert all(len(e.splitlines()) < 10 for e in exprs)  # the nested tables of TUNING too


def test_what_is_not_a_plain_literal_is_parsed_whole(small_pieces):
    comp = "table = {\n    k: v\n    for k, v in pairs\n" + "".join(f"    # {i}\n" for i in range(20)) + "}\n"
    _same_as_whole("import torch\n" + comp + "y = 1\n")
    call = "model = nn.Sequential(\n" + "".join("    nn.Linear(8, 8),\n" for _ in range(20)) + ")\n"
    _same_as_whole("import torch\n" + call + "z = [\n" + "".join(f"    {i},\n" for i in range(20)) + "] + extra\n")


def test_a_long_class_is_parsed_a_few_members_at_a_time(small_pieces, pieces):
    methods = []
    for i in range(12):
        methods.append(f"""
        # test {i}
        @skip_if_lt_x_gpu(2)
        @with_dist_debug_levels(levels=["OFF", "INFO"])
        def test_ddp_{i}(self):
            model = nn.Linear(8, 8).cuda(self.rank)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(4, 8, device=self.rank)).sum().backward()
                opt.step()
            # trailing note on test {i}
""")
    src = ('"""Distributed tests."""\nimport torch\n\n\nclass DistributedTest:  # the suite\n'
           "    class _DistTestBase:\n        world_size = 2\n" + "".join(methods)
           + "\n# a note at column 0 inside the class\n        def last(self):\n            pass\n"
           + "        # def disabled(self):\n        #     pass\n\n\n# the end of the suite\nrun_tests()\n")
    module = _same_as_whole(src)
    assert isinstance(module.body[2], cst.ClassDef)
    parsed = [text for kind, text in pieces if kind == "module"][:-1]
    assert max(len(t.splitlines()) for t in parsed) < 20  # no piece holds the whole class


def test_the_lines_around_cuts_come_back_as_in_the_whole_file(small_pieces):
    members = "".join(f"    def f{i}(self):\n        return {i}\n" for i in range(8))
    # comments between a class's header and its first member; a deep comment after a member,
    # past a column-0 one (libcst gives both to that member's footer)
    _same_as_whole("import os\n\n\nclass A:\n\n# col0\n        # deep\n" + members
                   + "\n# col0\n        # deep\n    z = 1\n" + members.replace("def f", "def g"))
    # no newline at the end of a file that ends inside a long class
    _same_as_whole("import os\n\n\nclass A:\n" + members + "    z = 1")
    # libcst 1.9 drops the blank line of "x = 1\n\n    # c\n" when that is all it parses: a
    # piece must not end so
    _same_as_whole("".join(f"import m{i}\n" for i in range(8)) + "\n    # stray comment\n"
                   + "".join(f"x{i} = {i}\n" for i in range(8)))


def test_mutated_real_files_parse_in_pieces_as_they_parse_whole(small_pieces):
    """Real files of this repository, broken and reshaped at random lines (a fixed seed):
    truncated, without their last newline, with stray or deep comments, unclosed brackets,
    stray quotes, tabs, dedented lines. Both parses fail alike or give equal trees."""
    import random

    rng = random.Random(20261126)
    files = _python_files()
    sources = [open(p, encoding="utf-8").read() for p in files]
    sources = [s for s in sources if 40 < s.count("\n") < 1500]

    def mutate(src: str) -> str:
        lines = src.splitlines(keepends=True)
        i = rng.randrange(len(lines))
        how = rng.randrange(8)
        if how == 0:
            return "".join(lines[:i])
        if how == 1:
            return src.rstrip("\n")
        if how == 2:
            return "".join(lines[:i] + ["\n", "    # stray comment\n"] + lines[i:])
        if how == 3:
            return "".join(lines[:i] + ["x = (\n"] + lines[i:])
        if how == 4:
            return "".join(lines[:i] + ['"""\n'] + lines[i:])
        if how == 5:
            return src.replace("    ", "\t")
        if how == 6:
            return "".join(lines[:i] + ["\n", "# col0\n", "        # deep\n"] + lines[i:])
        return "".join(lines[:i] + [lines[i].lstrip()] + lines[i + 1:])

    for _ in range(150):
        src = rng.choice(sources)
        for _ in range(rng.randint(1, 3)):
            src = mutate(src) or "\n"
        try:
            whole = cst.parse_module(src)
        except cst.ParserSyntaxError:
            with pytest.raises(cst.ParserSyntaxError):
                parse_module(src)
            continue
        ours = parse_module(src)
        assert ours.code == whole.code
        assert ours.deep_equals(whole)


def test_libcst_is_pinned_to_the_versions_the_parser_is_tested_with():
    """``parse.py`` replaces libcst internals during a parse (pieces joined into one tree, node
    validation off): the package pins the libcst versions that is tested with, the installed
    one is among them, and with another version the parse is plain ``libcst.parse_module``."""
    import re

    import libcst as cst

    from torchlint import parse

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("libcst"))
    low = tuple(int(x) for x in re.search(r">=([\d.]+)", spec).group(1).split(".")[:2])
    high = tuple(int(x) for x in re.search(r"<([\d.]+)", spec).group(1).split(".")[:2])
    assert [v for v in parse.TESTED_LIBCST if low <= v < high] == list(parse.TESTED_LIBCST)
    assert low == min(parse.TESTED_LIBCST) and high == (max(parse.TESTED_LIBCST)[0], max(parse.TESTED_LIBCST)[1] + 1)
    assert parse.libcst_version() in parse.TESTED_LIBCST
    text = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(200))
    parse._TESTED[:] = [False]  # an untested libcst: libcst's own parse, no swap
    try:
        seen = []
        real = cst.parse_module
        cst.parse_module = lambda t, *a, **k: seen.append(len(t)) or real(t, *a, **k)
        try:
            module = parse.parse_module(text)
        finally:
            cst.parse_module = real
        assert seen == [len(text)] and module.deep_equals(real(text))
    finally:
        parse._TESTED[:] = []


def test_future_fstrings_coding_cookie_reads_as_utf8_and_is_linted(tmp_path):
    """``# -*- coding: future_fstrings -*-`` (the future-fstrings package's codec: UTF-8 with
    f-strings rewritten for Python < 3.6) is plain UTF-8 Python on supported interpreters;
    a codec nobody knows stays a clear error."""
    from torchlint.engine import LintOptions, run
    from torchlint.source import SourceError, decode

    src = decode("# -*- coding: future_fstrings -*-\nname = 'é'\nprint(f'{name}')\n".encode("utf-8"), "t.py")
    assert src.encoding == "utf-8" and "name = 'é'" in src.text
    with pytest.raises(SourceError, match="unknown encoding: no_such_codec"):
        decode(b"# -*- coding: no_such_codec -*-\nx = 1\n", "u.py")
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "# -*- coding: future_fstrings -*-\n"
        "import logging\n"
        "import torch\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, val_loader):\n"
        "        self.model = model\n"
        "        self.val_loader = val_loader\n\n"
        "    def _valid_epoch(self):\n"
        "        self.model.eval()\n"
        "        total = 0.0\n"
        "        for x, y in self.val_loader:\n"
        "            total += torch.nn.functional.mse_loss(self.model(x), y).item()\n"
        "        logging.info(f'val loss {total / len(self.val_loader):.4f}')\n"
        "        return total\n", encoding="utf-8")
    res = run([str(trainer)], LintOptions(frozenset({"TL203"})), jobs=1)[0]
    assert res.error is None, res.error
    assert [(f.code, f.line) for f in res.findings] == [("TL203", 14)]

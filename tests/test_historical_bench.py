"""The historical-bug benchmark's manifest (benchmarks/historical.py): entries are pinned, each
batch obeys the held-out rule its header line declares (batch 1 keeps its sha1 rule when a
batch is added), and a manifest that breaks a rule is refused with a clear message."""
import importlib.util
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("historical_bench", os.path.join(ROOT, "benchmarks", "historical.py"))
hist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hist)

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib


def test_manifest_batches_are_split_by_their_own_rules():
    _, bugs = hist.load_manifest(hist.DEFAULT_MANIFEST)
    with open(hist.DEFAULT_MANIFEST, "rb") as fh:
        header = tomllib.load(fh)
    assert hist.batch_rules(header) == {1: "sha1", 2: "none", 3: "none", 4: "none", 5: "none", 6: "all"}
    assert all(len(b["buggy"]) == 40 and len(b["fixed"]) == 40 for b in bugs)
    first = [b for b in bugs if b["batch"] == 1]
    second = [b for b in bugs if b["batch"] == 2]
    third = [b for b in bugs if b["batch"] == 3]
    fourth = [b for b in bugs if b["batch"] == 4]
    fifth = [b for b in bugs if b["batch"] == 5]
    sixth = [b for b in bugs if b["batch"] == 6]
    assert len(bugs) == len(first) + len(second) + len(third) + len(fourth) + len(fifth) + len(sixth)
    # batch 1 keeps the sha1 split it had before batch 2 was added: 45 entries, 7 held out
    assert len(first) == 45
    assert [b["id"] for b in first if b["part"] == "heldout"] == \
        [b["id"] for b in first if hist.heldout(b["repo"], b["fixed"])]
    assert sum(b["part"] == "heldout" for b in first) == 7
    # batch 2: from repositories that neither manifest had before; held out whole, scored once
    # (its rule keeps the score), then tuned on
    assert len(second) == 19 and {b["part"] for b in second} == {"tuned"}
    assert "6a6d8ae" in header["batch2_heldout_rule"] and "6/19" in header["batch2_heldout_rule"]
    assert not {b["repo"] for b in second} & {b["repo"] for b in first}
    with open(os.path.join(ROOT, "benchmarks", "realworld", "manifest.toml"), "rb") as fh:
        realworld = {e["repo"] for e in tomllib.load(fh)["repo"]}
    assert not {b["repo"] for b in second} & realworld
    # batch 3: from repositories that no earlier batch and no real-world batch has; held out
    # whole, scored once (its rule keeps the score), then tuned on
    assert len(third) == 24 and {b["part"] for b in third} == {"tuned"}
    assert "fa18173" in header["batch3_heldout_rule"] and "6/24" in header["batch3_heldout_rule"]
    assert not {b["repo"].lower() for b in third} & {b["repo"].lower() for b in first + second}
    assert not {b["repo"].lower() for b in third} & {r.lower() for r in realworld}
    # batch 4: from repositories that no earlier batch and no real-world batch has; held out
    # whole, scored once (its rule keeps the score), then tuned on
    assert len(fourth) == 23 and {b["part"] for b in fourth} == {"tuned"}
    assert "4d0d963" in header["batch4_heldout_rule"] and "10/23" in header["batch4_heldout_rule"]
    assert not {b["repo"].lower() for b in fourth} & {b["repo"].lower() for b in first + second + third}
    assert not {b["repo"].lower() for b in fourth} & {r.lower() for r in realworld}
    # batch 5: from repositories that no earlier batch and no real-world batch has; held out
    # whole, scored once (its rule keeps the score), then tuned on
    assert len(fifth) == 20 and {b["part"] for b in fifth} == {"tuned"}
    assert "af595c8" in header["batch5_heldout_rule"] and "10/20" in header["batch5_heldout_rule"]
    assert not {b["repo"].lower() for b in fifth} & {b["repo"].lower() for b in first + second + third + fourth}
    assert not {b["repo"].lower() for b in fifth} & {r.lower() for r in realworld}
    # batch 6: a fresh batch, held out whole, from repositories that no earlier batch and no
    # real-world batch has
    assert len(sixth) == 20 and {b["part"] for b in sixth} == {"heldout"}
    assert "every entry held-out" in header["batch6_heldout_rule"]
    assert not {b["repo"].lower() for b in sixth} & {b["repo"].lower() for b in first + second + third + fourth + fifth}
    assert not {b["repo"].lower() for b in sixth} & {r.lower() for r in realworld}
    assert len({b["id"] for b in bugs}) == len(bugs)


def _manifest(tmp_path, header: str, entries: str) -> str:
    path = tmp_path / "manifest.toml"
    path.write_text(textwrap.dedent(header) + textwrap.dedent(entries))
    return str(path)


_ENTRY = """
[[bug]]
id = "{id}"
repo = "{repo}"
buggy = "{sha}"
fixed = "{sha}"
{batch}part = "{part}"
codes = ["TL103"]
description = "d"
sites = [{{ path = "train.py", lines = [3] }}]
"""

SHA = "0" * 40


def _entry(id, repo, part, batch=None):
    return _ENTRY.format(id=id, repo=repo, sha=SHA, part=part,
                         batch="" if batch is None else f"batch = {batch}\n")


def _sha1_part(repo):
    return "heldout" if hist.heldout(repo, SHA) else "tuned"


HEADER = """
tolerance = 3
heldout_rule = "int(sha1(repo + '@' + fixed)[:8], 16) % 4 == 0"
batch2_heldout_rule = "batch 2: every entry held-out; mined and pinned before any lint"
"""


def test_a_batch_declared_all_heldout_accepts_only_heldout_entries(tmp_path):
    ok = _entry("a", "o/a", _sha1_part("o/a")) + _entry("b", "o/b", "heldout", batch=2)
    _, bugs = hist.load_manifest(_manifest(tmp_path, HEADER, ok))
    assert [(b["id"], b["batch"]) for b in bugs] == [("a", 1), ("b", 2)]
    bad = _entry("a", "o/a", _sha1_part("o/a")) + _entry("b", "o/b", "tuned", batch=2)
    with pytest.raises(hist.BenchError, match="entry b: part is 'tuned' but the held-out rule of batch 2 gives 'heldout'"):
        hist.load_manifest(_manifest(tmp_path, HEADER, bad))


def test_batch_one_keeps_the_sha1_rule(tmp_path):
    repo = next(r for r in (f"o/r{i}" for i in range(100)) if hist.heldout(r, SHA))
    wrong = _entry("a", repo, "tuned")
    with pytest.raises(hist.BenchError, match="held-out rule of batch 1 gives 'heldout'"):
        hist.load_manifest(_manifest(tmp_path, HEADER, wrong))
    # a batch without a header line of its own gets the sha1 rule too
    with pytest.raises(hist.BenchError, match="rule of batch 3 gives 'heldout'"):
        hist.load_manifest(_manifest(tmp_path, HEADER, _entry("a", repo, "tuned", batch=3)))


def test_a_batch_tuned_afterwards_is_all_tuned(tmp_path):
    header = HEADER.replace("every entry held-out; mined and pinned before any lint",
                            "scored once as held-out at abc1234, tuned afterwards")
    _, bugs = hist.load_manifest(_manifest(tmp_path, header, _entry("b", "o/b", "tuned", batch=2)))
    assert bugs[0]["part"] == "tuned"
    with pytest.raises(hist.BenchError, match="gives 'tuned'"):
        hist.load_manifest(_manifest(tmp_path, header, _entry("b", "o/b", "heldout", batch=2)))


@pytest.mark.parametrize("header, entry, message", [
    (HEADER + 'batch3_heldout_rule = "whatever we like"\n', _entry("a", "o/a", "tuned", batch=3),
     "unknown held-out rule"),
    (HEADER, _entry("a", "o/a", "heldout", batch=0), "batch must be a positive integer"),
    (HEADER, _entry("a", "o/a", "heldout", batch='"2"'), "batch must be a positive integer"),
])
def test_a_broken_rule_or_batch_is_refused(tmp_path, header, entry, message):
    with pytest.raises(hist.BenchError, match=message):
        hist.load_manifest(_manifest(tmp_path, header, entry))


def test_the_command_line_reports_a_broken_manifest_and_an_unknown_batch(tmp_path, capsys):
    bad = _manifest(tmp_path, HEADER, _entry("b", "o/b", "tuned", batch=2))
    assert hist.main(["--manifest", bad]) == 2
    assert "held-out rule of batch 2" in capsys.readouterr().err
    good = _manifest(tmp_path, HEADER, _entry("b", "o/b", "heldout", batch=2))
    assert hist.main(["--manifest", good, "--batch", "5", "--mirrors", str(tmp_path)]) == 2
    assert "no entry in batch(es): 5" in capsys.readouterr().err

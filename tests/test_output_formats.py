"""Machine-readable output: SARIF valid against the OASIS 2.1.0 schema, URIs percent-encoded,
ruff's JSON fields (``cell`` always present)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from torchlint.output import file_uri

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The OASIS SARIF 2.1.0 schema (errata 01), as published in oasis-tcs/sarif-spec
# (sarif-2.1/schema/sarif-schema-2.1.0.json).
SCHEMA = os.path.join(ROOT, "tests", "data", "sarif-schema-2.1.0.json")
NOTEBOOK = os.path.join(ROOT, "fixtures", "notebooks", "fashion_cnn.ipynb")
# names a file system allows and a URI must encode
AWKWARD = ["my project", "run #3", "données 100%"]

TRAIN = '''\
import torch
import torch.nn as nn

from helpers import evaluate


def train(model, loader, val_loader, optimizer, criterion, epochs):
    for epoch in range(epochs):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        evaluate(model, val_loader)
'''

HELPERS = '''\
import torch


def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        return sum((model(x).argmax(dim=1) == y).sum().item() for x, y in loader)
'''


def tl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "torchlint", *args, "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def awkward_tree(tmp_path):
    d = tmp_path.joinpath(*AWKWARD)
    d.mkdir(parents=True)
    (d / "train loop #1.py").write_text(TRAIN, encoding="utf-8")
    (d / "helpers.py").write_text(HELPERS, encoding="utf-8")
    shutil.copy(NOTEBOOK, d / "étude.ipynb")
    return d


def _validator():
    jsonschema = pytest.importorskip("jsonschema")
    with open(SCHEMA, encoding="utf-8") as fh:
        schema = json.load(fh)
    checker = jsonschema.FormatChecker()
    # without a URI parser jsonschema skips the `uri` formats: the test would prove nothing
    assert not checker.conforms("a b.py", "uri-reference"), "install rfc3986-validator (test extras)"
    return jsonschema.Draft4Validator(schema, format_checker=checker)


def test_sarif_validates_against_the_oasis_schema(awkward_tree):
    validator = _validator()
    r = tl(".", "--output-format", "sarif", cwd=awkward_tree)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])
    run = doc["runs"][0]
    uris = {res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for res in run["results"]}
    assert uris == {"train%20loop%20%231.py", "%C3%A9tude.ipynb"}
    base = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert base.endswith("/my%20project/run%20%233/donn%C3%A9es%20100%25/")
    # also from outside the tree: absolute file URIs
    r = tl(str(awkward_tree), "--output-format", "sarif", cwd=awkward_tree.parent)
    doc = json.loads(r.stdout)
    assert not list(validator.iter_errors(doc))


def test_lsp_format_uris_round_trip_to_the_files(awkward_tree):
    pytest.importorskip("pygls")
    from torchlint.lsp import uri_to_path

    r = tl(".", "--output-format", "lsp", cwd=awkward_tree)
    doc = json.loads(r.stdout)
    assert len(doc) == 2
    for uri in doc:
        assert uri.startswith("file:///") and " " not in uri and "#" not in uri and uri.isascii()
        assert os.path.isfile(uri_to_path(uri)), uri
    assert {os.path.basename(uri_to_path(u)) for u in doc} == {"train loop #1.py", "étude.ipynb"}


def test_file_uri_encodes_undecodable_names(tmp_path):
    pytest.importorskip("pygls")
    from torchlint.lsp import uri_to_path

    if sys.platform == "darwin":
        pytest.skip("macOS file systems refuse names that are not UTF-8")
    name = os.fsdecode(b"caf\xe9.py")  # Latin-1 bytes: a surrogate escape in Python
    path = os.path.join(str(tmp_path), name)
    uri = file_uri(path)
    assert uri.endswith("/caf%E9.py")
    assert uri_to_path(uri) == path


def test_json_cell_key_is_null_outside_notebooks(awkward_tree):
    r = tl(".", "--output-format", "json", cwd=awkward_tree)
    data = json.loads(r.stdout)
    by_file = {os.path.basename(d["filename"]): d for d in data}
    assert set(by_file) == {"train loop #1.py", "étude.ipynb"}
    assert "cell" in by_file["train loop #1.py"] and by_file["train loop #1.py"]["cell"] is None
    assert isinstance(by_file["étude.ipynb"]["cell"], int)
    r = tl(".", "--output-format", "json-lines", cwd=awkward_tree)
    assert all("cell" in json.loads(line) for line in r.stdout.splitlines())

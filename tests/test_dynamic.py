"""The dynamic mode (issue 9): findings confirmed by running the code, both ways, safely.

Every run here is a child interpreter (torch imported once per child), so the tests group
their runs: one `confirm_findings` call per (way, device) over many fixtures.  By default (and
in CI) every buggy fixture of the covered rules and every correct fixture of their families
runs; `TORCHLINT_DYNAMIC_SUBSET=1` runs a quick representative subset instead (the smallest
buggy fixture of each rule, the smallest correct fixture of each family).  The same tests run
with `device="cuda"` on a machine with a GPU and skip cleanly without one.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

from torchlint.dynamic import PROBED, confirm_findings, observe  # noqa: E402
from torchlint.dynamic.plan import Source, harness_spec  # noqa: E402
from torchlint.findings import Finding, Span  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
# the rules the dynamic mode must cover
REQUIRED = {"TL101", "TL102", "TL103", "TL104", "TL201", "TL202", "TL204", "TL301", "TL401", "TL402", "TL403",
            "TL501", "TL601", "TL602"}
# the full sweep is the default; TORCHLINT_DYNAMIC_SUBSET=1 (without TORCHLINT_DYNAMIC_FULL=1) runs the subset
FULL = os.environ.get("TORCHLINT_DYNAMIC_FULL") == "1" or os.environ.get("TORCHLINT_DYNAMIC_SUBSET") != "1"
STEPS = 3
TIMEOUT = 90.0
HANG_TIMEOUT = 5.0
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"))]
# programs that need packages the test environment may not have
_OPTIONAL = ("accelerate", "lightning", "pytorch_lightning", "transformers", "timm", "torchvision", "gym", "cv2",
             "numpy", "diffusers", "mxnet", "matplotlib", "sklearn", "ignite", "monai", "torch_geometric", "ogb")
# the rules whose probes came with issue 23 (and the six rules of the catalogue that followed it):
# their buggy fixtures are confirmed by the whole pipeline (harness, model construction or script),
# with the stand-ins it uses
NEW_RULES = {"TL106", "TL107", "TL206", "TL302", "TL303", "TL405", "TL703",
             "TL108", "TL109", "TL205", "TL304", "TL603", "TL604"}
# a 50k-token GPT with 8 micro-batches per step: past the CPU run's time limit here (on a GPU it runs)
_GPU_SIZED = {"amp/bad/gpt_accumulation_clip_before_unscale.py"}


def _expected():
    out = []
    for exp in sorted(glob.glob(os.path.join(FIXTURES, "*", "expected.toml"))):
        fam_dir = os.path.dirname(exp)
        with open(exp, "rb") as fh:
            table = tomllib.load(fh)
        for rel, items in sorted(table.items()):
            path = os.path.join(fam_dir, rel)
            if rel.endswith(".py") and os.path.isfile(path):
                codes = [(c.split(":")[0], int(c.split(":")[1])) for c in items]
                out.append((os.path.basename(fam_dir), rel, path, codes))
    return out


def _importable(path):
    text = open(path, encoding="utf-8").read()
    for mod in _OPTIONAL:
        if f"import {mod}" in text or f"from {mod}" in text:
            try:
                __import__(mod)
            except ImportError:
                return False
    return True


def _bad_cases():
    """(path, code, line) of every buggy fixture finding of a required rule; by default the
    smallest buggy program of each rule."""
    cases = []
    for fam, rel, path, items in _expected():
        if not rel.startswith("bad/") or not _importable(path):
            continue
        cases.extend((path, code, line) for code, line in items if code in REQUIRED)
    if FULL:
        return cases
    best = {}
    for c in sorted(cases, key=lambda c: (os.path.getsize(c[0]), c[0], c[2])):
        best.setdefault(c[1], c)
    return sorted(best.values())


def _good_cases():
    """Correct programs of every family; by default the smallest of each family."""
    fams = {os.path.basename(os.path.dirname(e)) for e in glob.glob(os.path.join(FIXTURES, "*", "expected.toml"))}
    out = [(fam, path) for fam, rel, path, items in _expected()
           if fam in fams and rel.startswith("good/") and not items and _importable(path)]
    if FULL:
        return [p for _, p in out]
    best = {}
    for fam, path in sorted(out, key=lambda x: (os.path.getsize(x[1]), x[1])):
        best.setdefault(fam, path)
    return sorted(best.values())


def _finding(path, code, line):
    return Finding(code, code, "static finding", os.path.relpath(path, ROOT), Span.of(line, 0, line, 1))


def _case_id(c):
    return f"{os.path.relpath(c[0], FIXTURES)}:{c[1]}:{c[2]}"


BAD = _bad_cases()
GOOD = _good_cases()


@pytest.fixture(scope="module", autouse=True)
def _programs_run_their_tests_in_one_process():
    """A fixture program that is a test file runs `pytest.main([__file__])`; from inside this
    checkout that pytest reads pyproject.toml's `-n auto` and starts a pool of workers (each one
    importing torch again) for a handful of tests: 25 s of the correct-fixture sweep's wall time."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTEST_ADDOPTS", (os.environ.get("PYTEST_ADDOPTS", "") + " -n0").strip())
        yield


@pytest.fixture(scope="module")
def entry_verdicts(request):
    cache = {}

    def get(device):
        if device not in cache:
            fs = [_finding(*c) for c in BAD]
            cwd = os.getcwd()
            os.chdir(ROOT)
            try:
                confirm_findings(fs, [], device=device, steps=STEPS, timeout=TIMEOUT, way="entry")
            finally:
                os.chdir(cwd)
            cache[device] = {(f.path, f.code, f.line): f.dynamic for f in fs}
        return cache[device]
    return get


def test_required_rules_have_probes_and_fixtures():
    assert REQUIRED <= set(PROBED)
    assert BAD, "no buggy fixture of the covered rules"
    assert FULL or {c for _, c, _ in BAD} == REQUIRED


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BAD, ids=[_case_id(c) for c in BAD])
def test_entry_confirms_buggy_fixture(case, device, entry_verdicts):
    """Each buggy program run as a script with the probes: its finding is confirmed."""
    path, code, line = case
    d = entry_verdicts(device)[(os.path.relpath(path, ROOT), code, line)]
    if device != "cpu" and code == "TL601" and d["verdict"] == "not-reached" and (
            "same device" in d["evidence"] or "should be the same" in d["evidence"]):
        return  # on a GPU an earlier line of the same program already failed with the device mismatch
    if code == "TL601" and d["verdict"] == "not-reached" and "no DataLoader batch was seen" in d["evidence"]:
        pytest.xfail("the TL601 probe follows a loader's batches only; full-batch data is not followed")
    assert d["verdict"] == "confirmed", d["evidence"]
    assert d["evidence"].startswith(f"{code} line {line}: ")


def _harness_cases():
    """Every buggy finding (not only the subset) inside a function the harness can call: the
    harness runs stand-ins, not the program, so it stays cheap."""
    out = []
    for fam, rel, path, items in _expected():
        if not rel.startswith("bad/") or not _importable(path):
            continue
        for code, line in items:
            if code in REQUIRED:
                spec, _ = harness_spec(path, Source.of(path).enclosing(line)[0], code)
                if spec is not None:
                    out.append((path, code, line))
    return out


@pytest.fixture(scope="module")
def harness_verdicts():
    cache = {}

    def get(device):
        if device not in cache:
            cases = _harness_cases()
            fs = [_finding(*c) for c in cases]
            confirm_findings(fs, [], device=device, steps=STEPS, timeout=TIMEOUT, way="harness")
            cache[device] = {(f.path, f.code, f.line): f.dynamic for f in fs}
        return cache[device]
    return get


@pytest.mark.parametrize("device", DEVICES)
def test_harness_way_on_buggy_fixtures(device, harness_verdicts):
    """The harness calls the finding's function with stand-ins.  It confirms the bugs that live in
    that function (loop order, grad mode, accumulation) and never refutes a real bug: one whose
    cause may be in the model or data it replaces is `not-reached`, never `refuted`."""
    verdicts = harness_verdicts(device)
    assert len(verdicts) >= 5, verdicts
    refuted = {k: d for k, d in verdicts.items() if d["verdict"] == "refuted"}
    assert not refuted
    own = {k: d for k, d in verdicts.items() if k[1] in ("TL101", "TL102", "TL103", "TL104", "TL204")}
    missed = {k: d["evidence"] for k, d in own.items() if d["verdict"] != "confirmed"}
    assert own and not missed, missed
    for k, d in verdicts.items():
        assert d["evidence"].startswith(f"{k[1]} line {k[2]}: "), d
        if d["verdict"] != "confirmed":
            assert "harness" in d["evidence"] or "stand-ins" in d["evidence"], d


@pytest.fixture(scope="module")
def good_runs():
    cache = {}

    def get(device):
        if device not in cache:
            cache[device] = observe(GOOD, device=device, steps=STEPS, timeout=TIMEOUT, codes=sorted(PROBED))
        return cache[device]
    return get


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", GOOD, ids=[os.path.relpath(p, FIXTURES) for p in GOOD])
def test_probes_stay_quiet_on_correct_fixture(path, device, good_runs):
    out = good_runs(device)
    jr = out.jobs[GOOD.index(path)]
    assert jr.status in ("ok", "stopped", "exception"), (jr.status, jr.detail, out.stderr[-2000:])
    if jr.status == "exception":  # the program itself failed here (e.g. needs several GPUs): say so
        import warnings

        warnings.warn(f"{os.path.relpath(path, FIXTURES)} raised {jr.detail.get('type')}: "
                      f"{jr.detail.get('message', '')[:200]} on {device}")
    # every probe is on: what --probe-all would report (an observation that is a bug by itself;
    # a weak one only confirms a static finding at its line) must not happen on a correct program
    fired = [(o["codes"], o["evidence"]) for o in jr.facts
             if o.get("t") in ("obs", "end104") and not o.get("weak")]
    intended = _INTENDED_OBSERVATIONS.get(os.path.relpath(path, FIXTURES))
    if intended:  # what the program does on purpose is observed, and nothing else
        assert fired and all(set(codes) <= intended for codes, _ in fired), fired
        return
    assert not fired


# correct programs that do on purpose what a probe observes, which the static rules leave alone on
# evidence: a layer's time/memory benchmark repeats forward/backward/step on one fixed input
# without clearing (the gradients do pile up; what is measured does not depend on them); a sum
# over the few gradient-accumulation passes of one step holds those passes' graphs until the
# step's function returns (the probe counts each backward as a step); a warm-up schedule stepped
# once before the epoch loop skips its lr = 0 first epoch (the probe sees a scheduler step before
# the first optimizer step, as PyTorch's own warning does)
_INTENDED_OBSERVATIONS = {"loop_order/good/attention_layer_time_memory_benchmark.py": {"TL103"},
                          "memory/good/gan_step_sums_divergence_over_accumulation_passes.py": {"TL501", "TL502"},
                          "loop_order/good/warmup_cosine_prestep_before_epoch_loop.py": {"TL105"}}


def _new_rule_cases():
    out = []
    for fam, rel, path, items in _expected():
        if rel.startswith("bad/") and _importable(path):
            out.extend((path, code, line) for code, line in items if code in NEW_RULES)
    return out


NEW_CASES = _new_rule_cases()


@pytest.fixture(scope="module")
def new_rule_verdicts():
    cases = [c for c in NEW_CASES if os.path.relpath(c[0], FIXTURES) not in _GPU_SIZED]
    fs = [_finding(*c) for c in cases]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        confirm_findings(fs, [], device="cpu", steps=STEPS, timeout=TIMEOUT)
    finally:
        os.chdir(cwd)
    return {(f.path, f.code, f.line): f.dynamic for f in fs}


@pytest.mark.parametrize("case", NEW_CASES, ids=[_case_id(c) for c in NEW_CASES])
def test_new_rule_probes_confirm_buggy_fixture(case, new_rule_verdicts):
    """TL106/TL107 (scaled gradients clipped or stepped: the CUDA-only program runs on the CPU with
    its GradScaler enabled there), TL206 (a kept state_dict() that changes with the next step),
    TL302 (`.data`), TL303 (forward hooks skipped), TL405 (log of softmax), TL703 (eps); TL108 (steps
    with no backward), TL109 (a backward through a retained graph after a step), TL205 (parameters
    created after the optimizer, in none), TL304 (a submodule cut from the graph in forward), TL603
    (a plain tensor attribute), TL604 (a loss weight left on the CPU)."""
    path, code, line = case
    rel = os.path.relpath(path, FIXTURES)
    if rel in _GPU_SIZED:
        pytest.skip("GPU-sized program: past the CPU time limit (benchmarks/dynamic_bench.py runs it on CUDA)")
    d = new_rule_verdicts[(os.path.relpath(path, ROOT), code, line)]
    assert d["evidence"].startswith(f"{code} line {line}: "), d
    if rel == "autograd/bad/legacy_char_rnn_loss_data_index.py":
        # its command line needs a text file: not reached, and the verdict says why
        assert d["verdict"] == "not-reached" and "needs arguments" in d["evidence"], d
        return
    assert d["verdict"] == "confirmed", d["evidence"]
    if "amp/" in rel:
        assert "enabled on the CPU" in d["evidence"], d["evidence"]


def test_probe_all_reports_what_no_static_finding_covers(tmp_path):
    """`confirm --probe-all` with a rule set that misses the bug: the probes still see it, and
    report it as a finding of its own at the line where it happened; a correct program gets none."""
    bad = os.path.join(FIXTURES, "loss", "bad", "sequential_softmax_head.py")
    good = os.path.join(FIXTURES, "loss", "good", "click_through_logits.py")
    r = _cli("confirm", "--probe-all", "--select", "TL801", "--output-format", "json", bad, good)
    out = json.loads(r.stdout)
    assert out, r.stderr[-2000:]
    assert {f["code"] for f in out} == {"TL401"}, out
    assert all(f["filename"].endswith("sequential_softmax_head.py") for f in out), out
    assert all(f["dynamic"]["verdict"] == "confirmed" and "probe-all" in f["message"] for f in out), out


# ---------------------------------------------------------------------------- verdict details
TRAIN = textwrap.dedent('''\
    """A small classifier trained on random data."""
    import os
    import sys
    import time

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def train(model, loader, optimizer, criterion):
        model.train()
        for x, y in loader:
            loss = criterion(model(x), y)
            {prelude}
            loss.backward()
            optimizer.step()


    def main():
        torch.manual_seed(0)
        ds = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
        loader = DataLoader(ds, batch_size=8, shuffle=True)
        model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        {before}
        for epoch in range(2):
            train(model, loader, optimizer, nn.CrossEntropyLoss())


    if __name__ == "__main__":
        main()
    ''')
LOOP_LINE = 16  # `loss.backward()` (after the one-line prelude)
STEP_LINE = 17


def _program(tmp_path, name, prelude="pass", before="pass"):
    p = tmp_path / name
    p.write_text(TRAIN.format(prelude=prelude, before=before))
    return p


@pytest.fixture(scope="module")
def safety_runs(tmp_path_factory):
    """One grouped run of programs that misbehave in every way the child must survive."""
    tmp = tmp_path_factory.mktemp("dyn")
    marker = tmp / "forked.pid"
    progs = {
        "missing_zero_grad": _program(tmp, "missing_zero_grad.py"),
        "correct": _program(tmp, "correct.py", prelude="optimizer.zero_grad()"),
        "raises": _program(tmp, "raises.py", before="raise ValueError('no data found')"),
        "exits": _program(tmp, "exits.py", before="sys.exit(3)"),
        "forks": _program(tmp, "forks.py", before=(
            "pid = os.fork()\n    if pid == 0:\n        time.sleep(120)\n        os._exit(0)\n"
            f"    open({str(marker)!r}, 'w').write(str(pid))")),
        "memory": _program(tmp, "memory.py", before="hog = torch.empty(2**40, dtype=torch.uint8).fill_(1)"),
        "os_exit": _program(tmp, "os_exit.py", before="os._exit(0)"),
        "hangs": _program(tmp, "hangs.py", before="while True:\n        time.sleep(0.01)"),
    }
    findings = {k: _finding(str(p), "TL103", STEP_LINE) for k, p in progs.items()}
    t0 = time.monotonic()
    # the hanging program alone with a short limit; the others with room for a slow machine
    confirm_findings([findings["hangs"]], [], device="cpu", steps=STEPS, timeout=HANG_TIMEOUT, way="entry")
    confirm_findings([f for k, f in findings.items() if k != "hangs"], [], device="cpu", steps=STEPS,
                     timeout=TIMEOUT, way="entry", memory_mb=6144)
    return findings, marker, time.monotonic() - t0


def test_verdict_names_code_line_and_observation(safety_runs):
    findings, _, _ = safety_runs
    d = findings["missing_zero_grad"].dynamic
    assert d["verdict"] == "confirmed", d
    assert d["evidence"].startswith(f"TL103 line {STEP_LINE}: step 2: gradient norm before backward was ")
    assert "gradients from step 1 were not cleared" in d["evidence"]


def test_correct_program_is_refuted(safety_runs):
    findings, _, _ = safety_runs
    d = findings["correct"].dynamic
    assert d["verdict"] == "refuted", d


@pytest.mark.parametrize("name,expect", [
    ("raises", "raised ValueError: no data found"),
    ("exits", "exited with status 3"),
    ("os_exit", "ended abruptly"),
    ("hangs", "time limit (5 s)"),
    ("memory", ""),
])
def test_misbehaving_program_yields_not_reached(safety_runs, name, expect):
    findings, _, _ = safety_runs
    d = findings[name].dynamic
    assert d["verdict"] == "not-reached", d
    assert expect in d["evidence"], d["evidence"]
    assert f"line {STEP_LINE}" in d["evidence"] or "memory" in d["evidence"], d["evidence"]


def test_forked_children_are_killed(safety_runs):
    findings, marker, _ = safety_runs
    assert findings["forks"].dynamic["verdict"] == "confirmed", findings["forks"].dynamic
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return  # gone
        if state in ("Z", "X"):
            return
        time.sleep(0.1)
    pytest.fail(f"the forked process {pid} outlived the run")


# ---------------------------------------------------------------------------- command line
def _cli(*args, cwd=ROOT, timeout=300):
    return subprocess.run([sys.executable, "-m", "torchlint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _first_bad(code):
    return next(((p, c, l) for p, c, l in BAD if c == code), None)


def test_confirm_command_reports_static_and_dynamic(tmp_path):
    p = _program(tmp_path, "train.py")  # never clears gradients: TL103 at the step
    proc = subprocess.Popen([sys.executable, "-m", "torchlint", "confirm", str(p), "--steps", "3", "--timeout", "60",
                             "--output-format", "json"], cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # progress arrives on stderr while the run goes on, not all at the end
    first = proc.stderr.readline()
    running = proc.poll() is None
    stdout, rest = proc.communicate(timeout=300)
    assert first.startswith("confirm: starting Python with the probes") and running, first + rest
    progress = (first + rest).splitlines()
    assert any(line.startswith("confirm: torch ") and line.endswith("ready (CPU)") for line in progress), progress
    assert any(line.startswith("confirm: running ") and "TL103 line" in line for line in progress), progress
    assert any(line.startswith("confirm: [1/1] train.py:") and ": TL103 confirmed (" in line
               for line in progress), progress
    assert proc.returncode == 1, rest
    out = json.loads(stdout)
    tl103 = [f for f in out if f["code"] == "TL103"]
    assert tl103 and tl103[0]["dynamic"]["verdict"] == "confirmed", out
    assert tl103[0]["dynamic"]["evidence"].startswith(f"TL103 line {tl103[0]['location']['row']}: ")


def test_dynamic_flag_with_entry_and_a_hanging_program_still_reports(tmp_path):
    p = _program(tmp_path, "train.py", before="while True:\n        time.sleep(0.01)")
    r = _cli(str(p), "--dynamic", "--entry", f"python {p.name}", "--timeout", "3", "--no-cache",
             cwd=str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert ": TL103" in r.stdout
    assert "dynamic: not-reached" in r.stdout and "time limit" in r.stdout, r.stdout


def test_bad_device_is_a_clear_message(tmp_path):
    p = _program(tmp_path, "train.py")
    r = _cli("confirm", str(p), "--device", "tpu", cwd=str(tmp_path), timeout=60)
    assert "Traceback" not in r.stderr
    assert "unknown device `tpu`" in r.stdout


def test_dynamic_is_opt_in_only(tmp_path):
    """No configuration key turns execution on; the LSP server and pre-commit never run code."""
    p = _program(tmp_path, "train.py", before="open('ran.txt', 'w').write('x')")
    (tmp_path / "pyproject.toml").write_text("[tool.torchlint]\ndynamic = true\n")
    r = _cli(str(p), "--no-cache", cwd=str(tmp_path), timeout=120)
    assert "dynamic:" not in r.stdout
    assert not (tmp_path / "ran.txt").exists()
    lsp = glob.glob(os.path.join(ROOT, "torchlint", "lsp*")) + glob.glob(os.path.join(ROOT, "torchlint", "lsp", "*.py"))
    for f in lsp:
        if f.endswith(".py"):
            text = open(f, encoding="utf-8").read()
            assert "confirm_findings" not in text and ".dynamic import" not in text


def test_match_lines_cover_multiline_statements_and_eval_loops(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f(model, loader):\n    for x in loader:\n        y = model(\n            x)\n    return y\n")
    src = Source(str(p))
    assert src.match_lines(3, "TL201") == [3, 4]
    assert src.match_lines(2, "TL203") == [2, 3, 4]
    assert src.enclosing(3)[0] == "f"


STANDIN_PROGRAM = textwrap.dedent('''\
    """An MNIST classifier logged to wandb, with a tqdm progress bar."""
    import torch
    import torch.nn as nn
    import wandb
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms
    from tqdm import tqdm


    def main():
        wandb.init(project="mnist")
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        loader = DataLoader(datasets.MNIST("data", train=True, download=True, transform=tf), batch_size=32,
                            shuffle=True)
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for x, y in tqdm(loader, desc=f"epoch {epoch}"):
                x, y = x.cuda(), y.cuda()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                wandb.log({"loss": loss.item()})


    if __name__ == "__main__":
        main()
    ''')


def test_missing_modules_and_cuda_are_stood_in_and_said(tmp_path):
    """A CUDA-only program that needs torchvision's MNIST, wandb and tqdm: on a CPU machine
    without them it still runs, and the evidence says what stood in for what."""
    import importlib.util

    missing = [m for m in ("wandb", "torchvision", "tqdm") if importlib.util.find_spec(m) is None]
    if not missing:
        pytest.skip("wandb, torchvision and tqdm are all installed here: nothing to stand in for")
    p = tmp_path / "mnist_wandb.py"
    p.write_text(STANDIN_PROGRAM)
    f = _finding(str(p), "TL103", 22)
    confirm_findings([f], [], device="cpu", steps=STEPS, timeout=TIMEOUT, way="entry")
    d = f.dynamic
    assert d["verdict"] == "confirmed", d
    assert "gradients from step 1 were not cleared" in d["evidence"]
    assert "with --device cpu, its `.cuda()`" in d["evidence"], d["evidence"]
    for m in missing:
        assert f"{m} is not installed" in d["evidence"], (m, d["evidence"])
    if "torchvision" in missing:
        assert "datasets.MNIST stood in by 256 random [1, 28, 28] images of 10 classes" in d["evidence"]
    assert not (tmp_path / "data").exists()


FAKE_VISION = {
    "torchvision/__init__.py": "from . import datasets, transforms\n",
    "torchvision/datasets.py": textwrap.dedent('''\
        import torch


        class VisionDataset(torch.utils.data.Dataset):
            def __init__(self, root, train=True, transform=None, download=False):
                raise RuntimeError("Dataset not found or corrupted. You can use download=True to download it")


        class MNIST(VisionDataset):
            pass
        '''),
    "torchvision/transforms/__init__.py": textwrap.dedent('''\
        import torch

        from .functional import Picture


        class ToTensor:
            def __call__(self, pic):
                if not isinstance(pic, Picture):
                    raise TypeError(f"pic should be PIL Image or ndarray. Got {type(pic)}")
                return pic.tensor
        '''),
    "torchvision/transforms/functional.py": textwrap.dedent('''\
        class Picture:
            def __init__(self, tensor):
                self.tensor = tensor


        def to_pil_image(x):
            return Picture(x)
        '''),
}


def test_absent_dataset_files_of_a_real_torchvision_are_stood_in(tmp_path, monkeypatch):
    """torchvision installed, its MNIST files absent: the dataset serves random images of MNIST's
    shape as PIL images (the program's ToTensor expects them), and the evidence says so."""
    lib = tmp_path / "lib"
    for rel, text in FAKE_VISION.items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_text(text)
    prog = tmp_path / "mnist.py"
    prog.write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms


        def main():
            data = datasets.MNIST("data", train=True, transform=transforms.ToTensor())
            loader = DataLoader(data, batch_size=32, shuffle=True)
            model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()


        if __name__ == "__main__":
            main()
        '''))
    monkeypatch.setenv("PYTHONPATH", str(lib))
    f = _finding(str(prog), "TL103", 15)
    confirm_findings([f], [], device="cpu", steps=STEPS, timeout=TIMEOUT, way="entry")
    d = f.dynamic
    assert d["verdict"] == "confirmed", d
    assert "datasets.MNIST could not load its files (RuntimeError: Dataset not found" in d["evidence"], d
    assert "datasets.MNIST stood in by 256 random [1, 28, 28] images of 10 classes" in d["evidence"], d
    assert "is not installed" not in d["evidence"], d


def test_a_finding_on_a_call_whose_callee_evaluates_is_never_refuted():
    """TL201 reported at `train(model, loader, ...)` (module level) for the evaluation inside the
    callee: the forwards run deeper than the flagged line, so the probe must not call the line
    clean (it once did: `refuted` for a real bug)."""
    path = os.path.join(ROOT, "fixtures", "mode", "bad", "mlp_module_with_dropout_scored_in_train_mode.py")
    f = _finding(path, "TL201", 50)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        confirm_findings([f], [], device="cpu", steps=STEPS, timeout=TIMEOUT, way="entry")
    finally:
        os.chdir(cwd)
    assert f.dynamic["verdict"] != "refuted", f.dynamic["evidence"]


def test_celeba_stand_in_yields_attribute_vectors_as_torchvision_does():
    """CelebA's default target is a vector of 40 binary attributes; a notebook's
    `target_transform=lambda attr: attr[31]` (smiling) indexes it. The stand-in gives the same
    shape, and the class-index form only for another target_type."""
    from torchlint.dynamic import standins

    celeba = standins._dataset_class("CelebA")
    ds = celeba(root=".", split="train", target_type="attr", target_transform=lambda attr: attr[31])
    x, y = ds[0]
    assert tuple(x.shape) == (3, 64, 64)
    assert int(y) in (0, 1)
    _, attrs = celeba(root=".", split="valid")[3]
    assert tuple(attrs.shape) == (40,) and set(attrs.tolist()) <= {0, 1}
    _, ident = celeba(root=".", split="valid", target_type="identity")[3]
    assert isinstance(ident, int)

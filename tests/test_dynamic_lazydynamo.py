"""The child's placeholder for ``torch._dynamo``: an eager program never imports the real
module and computes exactly what it computes without the placeholder; a program that compiles
gets the real module and runs."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROGRAM = r'''
import json, sys
import torch
if sys.argv[1] == "lazy":
    from torchlint.dynamic.lazydynamo import install
    assert install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 3))
x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
for opt_class in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
    opt = opt_class(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
    opt.load_state_dict(opt.state_dict())
out = {"weights": [p.detach().flatten().tolist() for p in model.parameters()],
       "eager_imported_dynamo": type(sys.modules.get("torch._dynamo")).__name__ == "module"}
if sys.argv[1] == "lazy":
    f = torch.compile(lambda t: torch.sin(t) * 2, backend="eager")
    out["compiled"] = f(torch.ones(2)).tolist()
    import torch._dynamo.config
    out["dynamo_imported"] = type(sys.modules.get("torch._dynamo")).__name__ == "module"
    out["same_object"] = torch._dynamo is sys.modules["torch._dynamo"]
print(json.dumps(out))
'''


def run(*args):
    proc = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eager_training_never_imports_dynamo_computes_the_same_and_compile_still_works():
    lazy, plain = run("lazy"), run("plain")
    assert plain["eager_imported_dynamo"]  # torch's optimizers import it on their own
    assert not lazy["eager_imported_dynamo"]
    assert lazy["weights"] == plain["weights"]
    # then the same program compiles: the real module arrives and is the one torch holds
    assert lazy["dynamo_imported"] and lazy["same_object"]
    assert lazy["compiled"] == pytest.approx([1.682942, 1.682942], rel=1e-5)


def test_the_child_keeps_the_placeholder_while_every_probe_is_installed(tmp_path):
    """The probes (and the stand-ins, which look at every module in sys.modules) must not make
    the placeholder import the real module: an eager training run in the child never imports it."""
    from torchlint.dynamic import PROBED, observe

    prog = tmp_path / "eager_train.py"
    prog.write_text(
        "import sys\n"
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    torch.nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()\n"
        "    opt.step()\n"
        "print('dynamo module:', type(sys.modules.get('torch._dynamo')).__name__)\n")
    out = observe([str(prog)], device="cpu", steps=3, timeout=120, codes=sorted(PROBED))
    jr = out.jobs[0]
    assert jr.status in ("ok", "stopped"), (jr.status, jr.detail, out.stderr[-2000:])
    assert out.env.get("dynamo_deferred") is True
    assert "dynamo module: Placeholder" in out.stdout, out.stdout[-2000:]
    assert "torch._dynamo" not in (jr.detail.get("timing") or {}).get("imports_s", {})

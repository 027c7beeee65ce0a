"""The dynamic mode: confirm static findings by running the code (opt-in, ``--dynamic`` / ``confirm``).

``confirm_findings`` sets ``finding.dynamic = {"verdict": ..., "evidence": ...}`` on every
finding, in place:

* ``confirmed`` – a probe saw the bug happen at the finding's line;
* ``refuted`` – the line ran, the run finished, and the probe saw the code behave correctly;
* ``not-reached`` – the run never executed the line (or could not decide), and says why.

The code runs in a child interpreter (see :mod:`torchlint.dynamic.runner` for the safety
model); this module never imports torch.  See docs/dynamic.md.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

from .plan import PROBED, Source, harness_spec, scope_of

__all__ = ["confirm_findings", "observe", "PROBED", "MissingDependency", "check_dependencies"]


class MissingDependency(Exception):
    """The interpreter cannot import what the dynamic mode runs with (torch)."""


def _missing_message(module: str, python: str, detail: str = "") -> str:
    extra = f" ({detail})" if detail else ""
    return (f"the dynamic mode needs `{module}`, which {python} cannot import{extra}; install it in "
            f"this environment (pip install {'torch' if module == 'torch' else module}, or "
            f"pip install 'torchlint[dynamic]' for torch), or run torchlint with the Python that has it")


def check_dependencies() -> None:
    """Raise :class:`MissingDependency` when torch cannot be found (without importing it: the
    child interpreter does that)."""
    import importlib.util
    import sys

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingDependency(_missing_message("torch", sys.executable, "No module named 'torch'"))


class _Progress:
    """One line on stderr (``write``) per event of the runs: the child starting, torch ready,
    each job starting, and each finding's verdict as soon as its job ends."""

    def __init__(self, write, total: int):
        self.write, self.total, self.done = write, total, set()
        self.jobs: dict = {}  # job id -> (label, items)
        self.started: dict = {}
        self.outcome = None
        self.timeout = 0.0

    def stage(self, jobs: list, items_of: dict, timeout: float) -> "_Progress":
        self.jobs = {j["id"]: (_label(j), items_of.get(j["id"], [])) for j in jobs}
        self.timeout = timeout
        return self

    def __call__(self, outcome, kind: str, job, data: dict) -> None:
        import time

        self.outcome = outcome
        if kind == "spawn":
            what = f"`{data['entry']}` with the probes" if data.get("entry") else "Python with the probes"
            self.write(f"confirm: starting {what}; importing torch can take a while")
        elif kind == "env" and data.get("torch"):
            dev = "CUDA" if data.get("gpu") else "CPU"
            self.write(f"confirm: torch {data['torch']} ready ({dev})")
        elif kind == "start" and job in self.jobs:
            label, items = self.jobs[job]
            self.started[job] = time.monotonic()
            codes = ", ".join(f"{f.code} line {f.line}" for f, _, _ in items)
            self.write(f"confirm: running {label} for {codes}")
        elif kind == "end" and job in self.jobs and self.outcome is not None:
            from .runner import JobResult

            _, items = self.jobs[job]
            jr = self.outcome.jobs.get(job) or JobResult(job)
            secs = time.monotonic() - self.started.get(job, time.monotonic())
            for f, path, lines in items:
                if jr.status is None:
                    continue
                verdict = _judge(f, path, lines, jr, self.timeout, Source.of(path))["verdict"]
                self.done.add(id(f))
                self.write(f"confirm: [{len(self.done)}/{self.total}] {f.path}:{f.line}: {f.code} {verdict} "
                           f"({secs:.1f} s)")


def _label(job: dict) -> str:
    if job.get("kind") == "harness":
        return f"{job.get('qualname')}() of {os.path.relpath(job['path'])} with stand-ins"
    if job.get("kind") == "script":
        return f"{os.path.relpath(job['path'])} as a script"
    return "the entry command"

CONCLUSIVE = ("ok", "stopped", "exit")
# codes whose cause is the function's own control flow: a harness run can refute them
HARNESS_REFUTES = {"TL101", "TL102", "TL103", "TL104", "TL105", "TL108", "TL204", "TL501", "TL502"}

# codes refuted only by what the probe saw (an "anti" fact), not by the line running quietly
NEEDS_ANTI = {
    "TL108": "no optimizer step followed it in the run",
    "TL109": "no backward() went back through a graph kept by retain_graph=True after an optimizer step",
    "TL205": "no optimizer step saw the parameters it creates get gradients",
    "TL304": "no backward() ran through the forward that calls it",
    "TL603": "no forward of a module holding the attribute ran",
    "TL604": "no forward of the loss module ran",
}

_REFUTE = {
    "TL101": "every optimizer step had gradients from a backward() that ran before it",
    "TL102": "no gradients were cleared between backward() and the step that should apply them",
    "TL103": "no gradients were left over from the previous step when backward() ran",
    "TL105": "scheduler.step() first ran after optimizer.step()",
    "TL204": "grad mode was on at every backward()",
    "TL301": "backward() ran after it without an in-place modification error",
    "TL501": "no long-lived variable kept a growing autograd graph",
    "TL502": "no long-lived variable kept a growing autograd graph",
    "TL601": "every batch tensor reached the model and the loss after .to(device)",
    "TL602": "no tensor created inside forward without device= met the inputs",
    "TL701": "the training loader shuffles",
    "TL702": "no argmax/max without dim ran on a batched tensor",
    "TL801": "anomaly detection was off at every backward()",
    "TL404": "the targets were integer class indices",
    "TL106": "the gradients were unscaled when clipped",
    "TL107": "no optimizer step applied gradients still multiplied by a GradScaler's scale",
    "TL206": "the state_dict() snapshot was not the live tensors",
    "TL302": "`.data` cut no graph and no write went behind autograd's version counter",
    "TL303": "the module was called through Module.__call__",
    "TL405": "log() did not take a softmax or sigmoid output",
    "TL703": "the normalisation layer has a small eps",
}


def _abs(p: str) -> str:
    return os.path.abspath(p)


def _dynamic(verdict: str, evidence: str) -> dict:
    return {"verdict": verdict, "evidence": evidence}


def _filter_facts(facts: list) -> list:
    """Drop what a harness attempt recorded before it was discarded for a stand-in shape mismatch."""
    out, pending = [], []
    for f in facts:
        t = f.get("t")
        if t == "harness":
            out.extend(pending)
            pending = []
            continue
        if t == "discard":
            pending = []
            continue
        pending.append(f)
    return out + pending


def _site_hit(sites, path: str, lines) -> bool:
    for s in sites or ():
        if len(s) >= 2 and s[0] == path and s[1] in lines:
            return True
    return False


def _status_reason(jr, line: int, timeout: float) -> str:
    st = jr.status
    d = jr.detail or {}
    if st == "timeout":
        return f"the run was stopped at the time limit ({timeout:g} s) before line {line} ran"
    if st == "memory":
        return f"the run was killed at the memory limit ({d.get('limit_mb')} MiB) before line {line} ran"
    if st == "died":
        rc = d.get("returncode")
        how = f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit status {rc}"
        msg = d.get("message") or "the process ended abruptly (os._exit, a crash or a kill)"
        return f"{msg} ({how}) before line {line} ran"
    if st == "exception":
        where = d.get("sites") or []
        at = f" at line {where[0][1]}" if where else ""
        return f"the run raised {d.get('type')}: {d.get('message', '')[:200]}{at} before line {line} ran"
    if st == "stopped":
        stop = next((f.get("reason") for f in jr.facts if f.get("t") == "stop"), "the run was capped")
        return f"{stop} (steps cap) before line {line} ran"
    if st == "interrupted":
        return f"the run was interrupted before line {line} ran"
    if st == "exit":
        why = next((x.get("message") for x in reversed(jr.facts) if x.get("t") == "argerr"), None)
        return (f"the program exited with status {d.get('code')} without running line {line}"
                + (f" (its command line needs arguments: {why[:200]})" if why else ""))
    return f"the run finished without executing line {line}"


def _when(step) -> str:
    return f"step {step}" if step else "before the first training step"


def _judge(f, path: str, lines: list, jr, timeout: float, src: Source) -> dict:
    d = _judge_facts(f, path, lines, jr, timeout, src)
    notes = list(dict.fromkeys(x.get("text") for x in jr.facts if x.get("t") == "standin" and x.get("text")))
    if notes and d["verdict"] != "not-reached" or notes and "line " + str(f.line) + " ran" in d["evidence"]:
        d["evidence"] += " [stand-ins: " + "; ".join(notes) + "]"
    return d


def _judge_facts(f, path: str, lines: list, jr, timeout: float, src: Source) -> dict:
    code, line = f.code, f.line
    head = f"{code} line {line}: "
    facts = _filter_facts(jr.facts)
    lineset = set(lines)
    # 1. positive observations at the finding's lines (an observation that is a bug by itself first)
    obs = [o for o in facts if o.get("t") == "obs"]
    # an observation that is a bug by itself first, then one whose own site is the finding's line
    for o in sorted(obs, key=lambda o: (bool(o.get("weak")), not _site_hit(o.get("sites", [])[:1], path, {line}))):
        if code not in o.get("codes", ()):
            continue
        if o.get("names"):
            scope = o.get("scope") or []
            _, _, first = src.enclosing(line)
            qual, node, _ = src.enclosing(line)
            firsts = {first, node.lineno if node is not None else 1}
            text = src.line_text(line)
            if scope and scope[0] == path and scope[1] in firsts and any(
                    n.split(".")[-1] in text for n in o["names"]):
                return _dynamic("confirmed", head + o["evidence"])
            continue
        if _site_hit(o.get("sites"), path, lineset):
            return _dynamic("confirmed", head + o["evidence"])
    reached = [x for x in facts if x.get("t") == "reach" and x.get("file") == path and x.get("line") in lineset]
    fwd = [x for x in facts if x.get("t") == "fwd"]
    state = next((x for x in reversed(facts) if x.get("t") == "state"), {})
    # 2. facts judged here: modes at forwards, backward without step
    if code in ("TL201", "TL202", "TL203"):
        if code == "TL201":
            mine = [x for x in fwd if x["sites"] and x["sites"][0][0] == path and x["sites"][0][1] in lineset]
            bad = [x for x in mine if x["training"]]
            if bad:
                x = bad[0]
                return _dynamic("confirmed", head + (
                    f"{_when(x['step'])}: the forward of {x['module']} at line {x['sites'][0][1]} ran in evaluation "
                    f"code with model.training=True (grad mode {'on' if x['grad'] else 'off'}): {x['active']} "
                    f"Dropout/BatchNorm layer(s) were in training mode, so dropout was active and batch-norm "
                    f"statistics were updated"))
            if mine:
                return _dynamic("refuted", head + f"the forward at line {line} ran {len(mine)} way(s), always with "
                                                  f"model.training=False")
        elif code == "TL202":
            mine = [x for x in fwd if _site_hit(x["sites"], path, lineset) and x["grad"]]
            bad = [x for x in mine if not x["training"]]
            if bad:
                x = bad[0]
                return _dynamic("confirmed", head + (
                    f"{_when(x['step'])}: the training forward of {x['module']} at line {x['sites'][0][1]} ran with "
                    f"model.training=False: dropout and batch norm were in evaluation mode while training"))
            summ = next((x for x in facts if x.get("t") == "fwdsum"), None)
            if mine and summ is not None:
                first_eval = summ.get("first_eval")
                last_train = max((x["train"][1] for x in summ["sites"] if x.get("train")
                                  and _site_hit(x["sites"], path, lineset)), default=None)
                if first_eval is None or last_train is None or last_train <= first_eval:
                    return _dynamic("not-reached", head + (
                        "every training forward under this line ran with model.training=True, but no "
                        "evaluation-mode forward ran before a later training step within the run's cap"))
                return _dynamic("refuted", head + (
                    f"the training forwards under this line ran with model.training=True up to step {last_train}, "
                    f"after an evaluation-mode forward at step {first_eval}"))
        else:
            mine = [x for x in fwd if x["sites"] and x["sites"][0][0] == path and x["sites"][0][1] in lineset]
            bad = [x for x in mine if x["grad"] and not x["training"]]
            if bad:
                x = bad[0]
                return _dynamic("confirmed", head + (
                    f"{_when(x['step'])}: the evaluation forward of {x['module']} at line {x['sites'][0][1]} ran with "
                    f"grad mode on: an autograd graph was built for a forward that never runs backward"))
            if mine and all(not x["grad"] for x in mine):
                return _dynamic("refuted", head + "every forward in this loop ran with grad mode off")
    if code == "TL104":
        for x in facts:
            if x.get("t") == "end104" and _site_hit(x.get("sites"), path, lineset):
                if jr.status in CONCLUSIVE:
                    return _dynamic("confirmed", head + x["evidence"])
                msg = (jr.detail or {}).get("message", "")
                if "No inf checks were recorded" in msg:  # GradScaler.update() saw no scaler.step()
                    return _dynamic("confirmed", head + x["evidence"] + f"; then GradScaler.update() raised "
                                                                        f"AssertionError: {msg[:120]}")
                return _dynamic("not-reached", head + f"{x['evidence']}, but " +
                                _status_reason(jr, line, timeout).replace(f" before line {line} ran",
                                                                          " before the run could finish"))
        for x in facts:
            if x.get("t") == "anti104" and _site_hit(x.get("sites"), path, lineset) and jr.status in CONCLUSIVE:
                return _dynamic("refuted", head + x["evidence"])
    if code in ("TL201", "TL203"):
        mine = [x for x in fwd if x["sites"] and x["sites"][0][0] == path and x["sites"][0][1] in lineset]
        if not mine and any(_site_hit(x["sites"][1:], path, lineset) for x in fwd):
            # the finding names a call (train(model, ...) whose callee evaluates): the forwards ran
            # deeper, where this probe does not tell evaluation from training, so it cannot refute
            return _dynamic("not-reached", head + (
                f"the forwards this finding is about ran in functions called from line {line}; the probe "
                f"judges the mode only of forwards written on the finding's own lines"))
    # 3. refuted: the line ran, the run finished, the probe stayed quiet
    if reached:
        k = reached[0].get("step", 0)
        anti = [x for x in facts if x.get("t") == "anti" and code in x.get("codes", ())
                and _site_hit(x.get("sites"), path, lineset)]
        if code in ("TL501", "TL502") and (state.get("backwards") or 0) < 4:
            return _dynamic("not-reached", head + f"line {line} ran, but only {state.get('backwards', 0)} backward() "
                                                  f"call(s) ran; at least 4 are needed to see a graph grow")
        if code == "TL104" and not anti:
            return _dynamic("not-reached", head + f"line {line} ran, but no optimizer of these parameters was "
                                                  f"seen, so the run cannot tell whether one should step")
        if code == "TL601" and not state.get("loader_batches") and jr.status in CONCLUSIVE:
            return _dynamic("not-reached", head + f"line {line} ran, but no DataLoader batch was seen: the probe "
                                                  f"follows the tensors of a loader's batches only (full-batch "
                                                  f"data built in the program is not followed)")
        if code == "TL301" and (state.get("backwards") or 0) <= k and jr.status in CONCLUSIVE:
            return _dynamic("not-reached", head + f"line {line} ran, but no backward() ran after it")
        if code in NEEDS_ANTI and not anti and jr.status in CONCLUSIVE:
            return _dynamic("not-reached", head + f"line {line} ran, but {NEEDS_ANTI[code]}")
        if jr.status in CONCLUSIVE:
            why = anti[0]["evidence"] if anti else _REFUTE.get(code, "the probe saw nothing wrong")
            return _dynamic("refuted", head + f"line {line} ran (step {max(k, 1)}) and {why}")
        return _dynamic("not-reached", head + f"line {line} ran, but " +
                        _status_reason(jr, line, timeout).replace(f" before line {line} ran",
                                                                  " before the probe could decide"))
    return _dynamic("not-reached", head + _status_reason(jr, line, timeout))


def _job_targets(items) -> dict:
    targets: dict = {}
    for f, path, lines in items:
        targets.setdefault(path, set()).update(lines)
    return {k: sorted(v) for k, v in targets.items()}


def _job_groups(items) -> list:
    """Each finding's statement lines: the run goes past its caps until every one of them ran."""
    return [[path, sorted(lines)] for _, path, lines in items]


def confirm_findings(findings, files: Iterable = (), device: str = "cpu", entry: Optional[str] = None,
                     steps: int = 3, timeout: float = 120.0, way: str = "auto",
                     memory_mb: Optional[int] = None, progress=None, probe_all: bool = False) -> list:
    """Run the code and set ``finding.dynamic`` on every finding (in place); returns the findings.

    ``way``: ``"auto"`` (the harness where it applies, then the entry for the rest),
    ``"harness"`` or ``"entry"`` (``entry`` or, without one, each file run as a script).
    ``progress``, if given, is called with a line of text for each step of the runs.
    ``probe_all``: every file of ``files`` with a ``__main__`` block also runs as a script with
    every probe on, and what a probe saw that is a bug by itself, where no static finding is,
    becomes a finding of its own (``dynamic`` confirmed), appended to the returned list.
    Raises :class:`MissingDependency` when torch cannot be imported.
    """
    from . import runner as _runner

    def run_jobs(jobs, base, timeout, device, memory_mb, cwd):
        items_of: dict = {}
        for f, path, lines in todo:
            jid = stage_assign.get(id(f))
            if jid is not None:
                items_of.setdefault(jid, []).append((f, path, lines))
        hook = prog.stage(jobs, items_of, timeout) if prog is not None else None
        out = _runner.run_jobs(jobs, base, timeout, device, memory_mb, cwd, on_event=hook)
        _raise_missing(out)
        return out

    def run_entry(entry, job, base, timeout, device, memory_mb, cwd):
        hook = prog.stage([job], {job["id"]: list(todo)}, timeout) if prog is not None else None
        out = _runner.run_entry(entry, job, base, timeout, device, memory_mb, cwd, on_event=hook)
        _raise_missing(out)
        return out

    def _raise_missing(out):
        if out.env.get("missing"):
            raise MissingDependency(_missing_message(out.env["missing"], out.env.get("python") or "Python",
                                                     out.env.get("error", "")))

    stage_assign: dict = {}

    findings = list(findings)
    device = (device or "cpu").strip()
    if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        for f in findings:
            f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: unknown device `{device}` "
                                                f"(use cpu, cuda or cuda:N)")
        return findings
    steps = max(1, int(steps))
    user_files = sorted({_abs(str(p)) for p in files} | {_abs(f.path) for f in findings})
    todo = []
    for f in findings:
        if f.code not in PROBED:
            f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: the dynamic mode has no probe for "
                                                f"{f.code} ({f.name})")
            continue
        path = _abs(f.path)
        if not os.path.isfile(path) or f.cell is not None:
            f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: {f.path} is not a Python file the "
                                                f"dynamic mode can run")
            continue
        todo.append((f, path, Source.of(path).match_lines(f.line, f.code)))
    if probe_all and way != "harness":
        return _probe_all(findings, todo, user_files, device, entry, steps, timeout, memory_mb, progress,
                          way)
    if not todo:
        return findings
    check_dependencies()
    prog = _Progress(progress, len(todo)) if progress is not None else None
    base = {"device": device, "steps": steps, "user_files": user_files}
    cwd = os.getcwd()

    if entry:
        job = {"id": 0, "kind": "entry", "codes": sorted({f.code for f, _, _ in todo}),
               "targets": _job_targets(todo), "groups": _job_groups(todo)}
        out = run_entry(entry, job, base, timeout, device, memory_mb, cwd)
        _apply(todo, {id(f): 0 for f, _, _ in todo}, out, timeout)
        return findings

    # harness jobs, one per function
    assign: dict = {}
    why_not: dict = {}
    jobs: list = []
    if way in ("auto", "harness"):
        by_fn: dict = {}
        for f, path, lines in todo:
            scope = scope_of(f, path)
            key = (path, scope)
            if key not in by_fn:
                spec, why = harness_spec(path, scope, f.code)
                by_fn[key] = spec
                if spec is None:
                    why_not[key] = why
                else:
                    spec["id"] = len(jobs)
                    jobs.append(spec)
            spec = by_fn[key]
            if spec is None:
                why_not[id(f)] = why_not[key]
                continue
            assign[id(f)] = spec["id"]
            spec.setdefault("_items", []).append((f, path, lines))
        for j in jobs:
            items = j.pop("_items")
            j["codes"] = sorted({f.code for f, _, _ in items})
            j["targets"] = _job_targets(items)
            j["groups"] = _job_groups(items)
        stage_assign = assign
        # harness calls run in a scratch directory: what the function writes (checkpoints, logs)
        # does not land in the project; the stand-ins need no file of it
        import shutil
        import tempfile

        scratch = tempfile.mkdtemp(prefix="torchlint-harness-") if jobs else None
        for j in jobs:
            j["cwd"] = scratch
        try:
            out = run_jobs(jobs, base, timeout, device, memory_mb, cwd) if jobs else None
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        if out is not None:
            _apply([t for t in todo if id(t[0]) in assign], assign, out, timeout)
            if out.env.get("error"):
                for f, _, _ in todo:
                    f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: {out.env['error']}")
                return findings
    if way == "harness":
        for f, path, lines in todo:
            if id(f) not in assign:
                f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: no harness: "
                                                    f"{why_not.get(id(f), 'not applicable')}")
        return findings
    # scripts: every file with a __main__ block, for the findings the harness did not settle
    rest = [t for t in todo if t[0].dynamic is None or t[0].dynamic.get("verdict") == "not-reached"]
    if not rest:
        return findings
    sjobs, sassign = [], {}
    by_path: dict = {}
    for f, path, lines in rest:
        if path not in by_path:
            # a file with a __main__ block runs as a script; so does one whose finding is module-level
            # code (running the file is what reaches it)
            if Source.of(path).runnable() or any(
                    q == path and scope_of(g, q) in ("", "<module>") for g, q, _ in rest):
                by_path[path] = {"id": len(sjobs), "kind": "script", "path": path, "args": [], "_items": [],
                                 "cwd": os.path.dirname(path)}
                sjobs.append(by_path[path])
            else:
                by_path[path] = None
        j = by_path[path]
        if j is None:
            why = why_not.get(id(f))
            msg = ("no --entry given and the file has no `if __name__ == \"__main__\":` block to run"
                   + (f"; no harness: {why}" if why else ""))
            if f.dynamic:
                f.dynamic = _dynamic("not-reached", f.dynamic["evidence"] + "; " + msg)
            else:
                f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: {msg}")
            continue
        j["_items"].append((f, path, lines))
        sassign[id(f)] = j["id"]
    for j in sjobs:
        items = j.pop("_items")
        j["codes"] = sorted({f.code for f, _, _ in items})
        j["targets"] = _job_targets(items)
        j["groups"] = _job_groups(items)
    if sjobs:
        stage_assign = sassign
        out = run_jobs(sjobs, base, timeout, device, memory_mb, cwd)
        if out.env.get("error"):
            for f, _, _ in rest:
                f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: {out.env['error']}")
            return findings
        keep = {id(f): f.dynamic for f, _, _ in rest}
        _apply([t for t in rest if id(t[0]) in sassign], sassign, out, timeout)
        for f, _, _ in rest:
            prev = keep.get(id(f))
            if prev and id(f) in sassign and f.dynamic["verdict"] == "not-reached":
                f.dynamic["evidence"] += "; harness: " + prev["evidence"].split(": ", 1)[-1]
    return findings


def _apply(items, assign, out, timeout):
    from .runner import JobResult

    for f, path, lines in items:
        jid = assign.get(id(f))
        jr = out.jobs.get(jid) or JobResult(jid)
        if jr.status is None:
            jr.status = "died"
            jr.detail = {"message": "the run produced no result", "returncode": None}
        if out.env.get("error"):
            f.dynamic = _dynamic("not-reached", f"{f.code} line {f.line}: {out.env['error']}")
            continue
        f.dynamic = _judge(f, path, lines, jr, timeout, Source.of(path))
        kind = next((x for x in jr.facts if x.get("t") == "start"), {}).get("kind")
        if kind == "harness" and f.dynamic["verdict"] == "refuted" and f.code not in HARNESS_REFUTES:
            # the stand-ins replace the user's model and data, where this bug may live
            f.dynamic = _dynamic("not-reached", f.dynamic["evidence"].replace(
                f"line {f.line} ran", f"with stand-ins for the model and data, line {f.line} ran", 1)
                + "; the cause may be in the model or data the harness replaces")
        if kind == "harness" and f.dynamic["verdict"] != "confirmed":
            call = next((x.get("call") for x in reversed(jr.facts) if x.get("t") == "harness"), None)
            if call:
                f.dynamic["evidence"] += f" (harness: {call} with stand-ins)"


def observe(paths, device: str = "cpu", steps: int = 3, timeout: float = 120.0, codes=None,
            memory_mb: Optional[int] = None, entry: Optional[str] = None):
    """Run each file as a script (or ``entry``) with every probe on; returns the RunOutcome.

    Used by the tests and the benchmark to check that correct programs make no probe fire.
    """
    from .runner import run_entry, run_jobs

    codes = sorted(codes or PROBED)
    paths = [_abs(p) for p in paths]
    base = {"device": device, "steps": steps, "user_files": paths}
    if entry:
        return run_entry(entry, {"id": 0, "kind": "entry", "codes": codes, "targets": {}}, base, timeout,
                         device, memory_mb)
    jobs = [{"id": i, "kind": "script", "path": p, "args": [], "codes": codes, "targets": {},
             "cwd": os.path.dirname(p)} for i, p in enumerate(paths)]
    return run_jobs(jobs, base, timeout, device, memory_mb)


def _probe_all(findings, todo, user_files, device, entry, steps, timeout, memory_mb, progress, way) -> list:
    """Confirm the static findings, then run every runnable file with every probe and report
    what the probes saw where no static finding is (``--probe-all``)."""
    from . import runner as _runner
    from ..codes import CODES
    from ..findings import Finding, Span

    if todo:
        confirm_findings(findings, user_files, device=device, entry=entry, steps=steps, timeout=timeout, way=way,
                         memory_mb=memory_mb, progress=progress)
    scripts = [p for p in user_files if os.path.isfile(p) and p.endswith(".py") and Source.of(p).runnable()]
    if entry is None and not scripts:
        return findings
    check_dependencies()
    codes = sorted(PROBED)
    base = {"device": device, "steps": steps, "user_files": user_files}
    if progress is not None:
        progress(f"confirm: --probe-all: running {len(scripts) if entry is None else 'the entry command'} "
                 f"{'script(s) ' if entry is None else ''}with every probe")
    if entry:
        out = _runner.run_entry(entry, {"id": 0, "kind": "entry", "codes": codes, "targets": {}}, base, timeout,
                                device, memory_mb, os.getcwd())
    else:
        jobs = [{"id": i, "kind": "script", "path": p, "args": [], "codes": codes, "targets": {},
                 "cwd": os.path.dirname(p)} for i, p in enumerate(scripts)]
        out = _runner.run_jobs(jobs, base, timeout, device, memory_mb, os.getcwd())
    if out.env.get("missing"):
        raise MissingDependency(_missing_message(out.env["missing"], out.env.get("python") or "Python",
                                                 out.env.get("error", "")))
    static = {}
    for f in findings:
        p = _abs(f.path)
        static.setdefault((f.code, p), set()).update(Source.of(p).match_lines(f.line, f.code))
    seen = set()
    extra = []
    for jr in out.jobs.values():
        for o in _filter_facts(jr.facts):
            if o.get("t") != "obs" or o.get("weak"):
                continue
            sites = [s for s in (o.get("sites") or []) if len(s) >= 2 and s[0] in user_files]
            if not sites:
                continue
            path, line = sites[0][0], int(sites[0][1])
            for code in o.get("codes") or ():
                if any(s[1] in static.get((code, s[0]), ()) for s in sites) or (code, path, line) in seen:
                    continue
                seen.add((code, path, line))
                rel = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
                f = Finding(code, CODES.get(code, code), f"observed while running the code (--probe-all); no "
                                                         f"static finding here", rel, Span.of(line, 0, line, 1))
                f.dynamic = _dynamic("confirmed", f"{code} line {line}: {o.get('evidence', '')}")
                extra.append(f)
    return findings + sorted(extra, key=lambda f: f.sort_key())

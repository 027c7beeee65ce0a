"""The probes installed in the child interpreter (imports torch; never imported by the linter).

Every probe records *facts* (what ran where, in which mode, with which gradients) and writes
them, one JSON object a line, to the results file.  The parent (:mod:`torchlint.dynamic.judge`)
turns facts into verdicts.  Nothing here changes what the user's program computes, except:

* every ``DataLoader`` iteration yields at most ``steps`` batches and loads in the main
  process (``num_workers=0``);
* the run stops (a ``StopRun`` exception, a ``BaseException`` so ``except Exception`` in user
  code does not swallow it) after ``4 * steps + 2`` backward calls or optimizer steps;
* anomaly detection is on when TL301 is being confirmed.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import weakref

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from . import standins

_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class StopRun(BaseException):
    """Raised by the probes to end a run once enough steps were seen."""


# ----------------------------------------------------------------------- writer
class Writer:
    """Appends JSON lines to the results file; capped in lines and bytes."""

    MAX_BYTES = 4 * 1024 * 1024

    def __init__(self, path: str, job):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.job = job
        self.written = 0
        self.lock = threading.Lock()

    def __call__(self, _t: str, **data) -> None:
        kind = _t
        data["t"] = kind
        data["job"] = self.job
        try:
            line = (json.dumps(data, default=str) + "\n").encode("utf-8", "replace")
        except Exception:
            return
        with self.lock:
            if self.written + len(line) > self.MAX_BYTES and kind not in ("end", "state"):
                return
            self.written += len(line)
            try:
                os.write(self.fd, line)
            except OSError:
                pass


def _is_inplace(func, kwargs) -> str:
    name = getattr(func, "__name__", "")
    if kwargs.get("inplace") is True:
        return name
    if "out" in kwargs and kwargs["out"] is not None:
        return name + "(out=)"
    if name == "__setitem__":
        return "index assignment"
    if name.endswith("_") and not name.endswith("__") and not name.startswith("_"):
        return name
    if name in ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__"):
        return name
    return ""


_FACTORIES = {"zeros", "ones", "arange", "randn", "rand", "empty", "full", "eye", "tensor",
              "linspace", "randint", "randperm"}
_VIEWISH = {"ViewBackward0", "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2",
            "SqueezeBackward3", "UnsqueezeBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0",
            "CloneBackward0", "SelectBackward0", "SliceBackward0", "ExpandBackward0",
            "ToCopyBackward0", "TBackward0", "PermuteBackward0", "TransposeBackward0",
            "ViewBackward1", "AsStridedBackward0", "IndexBackward0", "CatBackward0"}
_AT_FORWARD = {"TL205", "TL603", "TL604"}  # codes checked at the outermost forward of a module
_LOSSES = {"cross_entropy": "cross_entropy", "nll_loss": "nll_loss",
           "binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
           "binary_cross_entropy": "binary_cross_entropy"}


# ops whose result stays on the device of their tensor arguments
_KEEPS_DEVICE = {"__getitem__", "stack", "cat", "tensor", "float", "double", "long", "clone", "detach"}


def _tensors(obj, depth=0):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for o in obj[:64]:
            yield from _tensors(o, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in list(obj.values())[:64]:
            yield from _tensors(o, depth + 1)


def _provenance(t, limit=6):
    """The op that produced ``t``, looking through views: 'SoftmaxBackward0', ... or None."""
    fn = getattr(t, "grad_fn", None)
    for _ in range(limit):
        if fn is None:
            return None
        name = fn.name()
        if name not in _VIEWISH:
            return name
        nxt = [n for n, _ in fn.next_functions if n is not None]
        fn = nxt[0] if nxt else None
    return None


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "nan"
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.3e}"


# ------------------------------------------------------------------ optimizer state
class _Opt:
    __slots__ = ("ref", "name", "steps", "touched", "ever_touched", "bw_since_step", "state", "stale",
                 "cleared_between", "last_clear", "nonzero_after_bw", "first_step_before_bw",
                 "pending101", "first_bw_site", "bw_count", "norm_after_bw", "step_site", "last_bw_site",
                 "prev_steps_site", "window", "wiped", "scaled_by", "unscaled", "idle", "born", "born_sites",
                 "pending_empty", "await101")

    def __init__(self, opt):
        self.ref = weakref.ref(opt)
        self.name = type(opt).__name__
        self.steps = 0
        self.touched = False
        self.ever_touched = False
        self.bw_since_step = 0
        self.state = "fresh"  # fresh | stepped | clean
        self.stale = None  # (norm, step index) seen before a backward after a step
        self.cleared_between = None  # clear site between backwards of one step window
        self.last_clear = None
        self.nonzero_after_bw = False
        self.first_step_before_bw = False
        self.pending101 = None
        self.pending_empty = False  # the pending TL101 step had no gradient at all: an empty step
        self.await101 = None  # an empty step's TL101, until the next step shows whose step it was
        self.first_bw_site = None
        self.bw_count = 0
        self.norm_after_bw = 0.0
        self.step_site = None
        self.last_bw_site = None
        self.window = []  # lines of the backward() calls since the step (or the last clear)
        self.wiped = set()  # lines of backward() calls whose gradients a clear wiped before the step
        self.scaled_by = None  # (scale, backward sites): a GradScaler-scaled backward fed these gradients
        self.unscaled = False  # scaler.unscale_(optimizer) ran since the last step
        self.idle = 0  # steps in a row with no backward() reaching these parameters and no gradient (TL108)
        self.born = 0  # the parameter count (Probes.param_seq) when the optimizer was built (TL205)
        self.born_sites = None


class Probes(TorchFunctionMode):
    def __init__(self, cfg: dict, emit: Writer):
        super().__init__()
        self.cfg = cfg
        self.emit = emit
        self.steps = max(1, int(cfg.get("steps", 3)))
        self.codes = set(cfg.get("codes") or ())
        self.device = cfg.get("device", "cpu")
        self.user_files = {os.path.abspath(p) for p in cfg.get("user_files", ())}
        self.targets = {os.path.abspath(k): set(v) for k, v in (cfg.get("targets") or {}).items()}
        self.max_backward = 16 * max(3, self.steps) + 4
        self.max_steps = 5 * max(3, self.steps)
        self.max_forward = 200 * self.steps
        self._fn_cache: dict = {}
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self):
        self.opts: dict = {}
        self.backwards = 0
        self.loader_batches = 0  # DataLoader batches tagged for TL601 (the only tensors it follows)
        self.forwards = 0
        self.opt_steps = 0
        self.depth = 0
        self.in_backward = False
        self.in_scaler = None
        self.fwd_seen: set = set()
        self.fwd_sum: dict = {}
        self.first_eval = None
        self.inplace_log: list = []
        self.unmoved: dict = {}
        self.moved: dict = {}
        self.deviceless: dict = {}
        # ``t.type()`` strings of tensors not made without device= (id -> the string, kept alive):
        # ``x.type(t.type())`` takes t's device as ``x.type_as(t)`` does (``torch.cuda.FloatTensor``)
        self.type_strings: dict = {}
        self.moved_modules: dict = {}
        self.user_moved = False  # the program itself (not torch's own code) moved a tensor or module
        self.loaders: dict = {}
        self.last_loader = None
        self.loader_reported: set = set()
        self.anomaly_site = None
        self.user_anomaly = False
        self.series: dict = {}
        self.prev_roots: dict = {}
        self.cuda_mem: list = []
        self.reached: set = set()
        self.recent_lines: set = set()  # target lines run since the last backward()
        self.sched_first: set = set()
        self.emitted: set = set()
        self.stopped = False
        self.suspended = 0
        self.anomaly_on = False
        self.data_alias: dict = {}  # id(x.data result) -> (ref, (ref to x, sites))
        self.squashed: dict = {}  # id(softmax/sigmoid output without grad_fn) -> (ref, "softmax")
        self.scaled: dict = {}  # id(scaler.scale(loss) output) -> (ref, scale)
        self.snapshots: list = []  # state_dict() results kept by the program (TL206)
        self.sd_depth = 0
        self.standins: dict = {}  # what the run stood in for (CUDA on the CPU, missing modules)
        self.cuda_standin = self.device == "cpu" and not torch.cuda.is_available()
        self.check303 = False
        self.cut_check = False  # TL304: a finding's line calls a submodule whose output forward cuts
        self.current_root = None
        self.groups = [(os.path.abspath(p), set(lines)) for p, lines in (self.cfg.get("groups") or ())]
        self.all_reached_at = None
        self.param_seq = 0  # parameters created so far (TL205: created after the optimizer?)
        self.born: dict = {}  # id(param) -> (ref, seq, sites of its creation)
        self.fwd_roots: dict = {}  # id(module) -> ref: modules whose training forward ran since the last step
        self.retained = None  # the graph of the last backward(retain_graph=True) (TL109)
        self.cut_mods: dict = {}  # id(module) -> (ref, sites, ref to root): called at a TL304 finding's line
        self.checked603: set = set()
        self.placed: dict = {}  # tensors put on a device by the program (TL604): .to(device), device=
        self.loss_sites: dict = {}  # id(loss module) -> (ref, sites of its construction)

    # ------------------------------------------------------------------ sites
    def _is_user(self, filename: str) -> bool:
        r = self._fn_cache.get(filename)
        if r is None:
            a = os.path.abspath(filename)
            if self.user_files:
                r = a in self.user_files
            else:
                r = not (a.startswith(_TORCH_DIR) or a.startswith(_HERE) or "site-packages" in a
                         or a.startswith(sys.prefix) or filename.startswith("<"))
            self._fn_cache[filename] = r
        return r

    def sites(self, limit=8):
        """User frames on the stack, innermost first: [[file, line, function], ...]."""
        out = []
        f = sys._getframe(1)
        while f is not None and len(out) < limit:
            co = f.f_code
            if self._is_user(co.co_filename):
                out.append([os.path.abspath(co.co_filename), f.f_lineno, co.co_name])
            f = f.f_back
        return out

    def _may_stop(self, n, cap) -> bool:
        """At a cap: stop, unless some finding's statement has not run yet (a loop over a plain list
        of batches, which the loader cap cannot shorten, reaches the code after it late): then
        the run goes on until every one ran and 3 more optimizer steps followed, or 8 times the cap."""
        if n >= 8 * cap or not self.groups:
            return True
        if self.all_reached_at is None:
            if not all(any((p, ln) in self.reached for ln in lines) for p, lines in self.groups):
                return False
            self.all_reached_at = self.opt_steps
        return self.opt_steps >= self.all_reached_at + 3

    def obs(self, code, sites, evidence, key=None, **extra):
        """A positive observation for ``code`` (codes may be a list) at ``sites``."""
        k = key or (code if isinstance(code, str) else tuple(code),
                    tuple(tuple(s[:2]) for s in sites[:1]))
        if k in self.emitted:
            return
        self.emitted.add(k)
        codes = [code] if isinstance(code, str) else list(code)
        self.emit("obs", codes=codes, sites=sites, evidence=evidence, step=self.backwards, **extra)

    def anti(self, code, sites, evidence):
        k = ("anti", code, tuple(tuple(s[:2]) for s in sites[:1]))
        if k in self.emitted:
            return
        self.emitted.add(k)
        self.emit("anti", codes=[code], sites=sites, evidence=evidence, step=self.backwards)

    # ------------------------------------------------------------------ coverage
    def tracer(self, frame, event, arg):
        if self.check303 and frame.f_code.co_name == "forward" and event == "call":
            self._direct_forward(frame)
        fn = os.path.abspath(frame.f_code.co_filename) if frame.f_code.co_filename in self._trace_files \
            else None
        if fn is None:
            return None
        lines = self.targets.get(fn)
        reached = self.reached
        recent = self.recent_lines

        def local(fr, ev, a):
            if ev == "line":
                ln = fr.f_lineno
                if ln in lines:
                    recent.add((fn, ln))
                    if (fn, ln) not in reached:
                        reached.add((fn, ln))
                        self.emit("reach", file=fn, line=ln, step=self.backwards)
            return local
        return local

    def start_tracing(self):
        self.check303 = "TL303" in self.codes
        self.cut_check = "TL304" in self.codes and bool(self.targets)
        if not self.targets and not self.check303:
            return
        # code objects carry the path as it was given: accept any spelling that resolves to it
        self._trace_files = _Spellings(self.targets)
        sys.settrace(self.tracer)
        threading.settrace(self.tracer)

    # ------------------------------------------------------------------ grads
    def _params(self, opt):
        for g in opt.param_groups:
            for p in g["params"]:
                if isinstance(p, torch.Tensor):
                    yield p

    def grad_state(self, opt):
        """(number of params, how many have a grad, total norm)."""
        n = have = 0
        sq = 0.0
        with torch.no_grad():
            for p in self._params(opt):
                n += 1
                g = p.grad
                if g is not None:
                    have += 1
                    try:
                        v = float(g.detach().float().norm())
                    except Exception:
                        v = 0.0
                    sq += v * v
        return n, have, math.sqrt(sq)

    def signature(self):
        sig = {}
        for key, st in list(self.opts.items()):
            opt = st.ref()
            if opt is None:
                del self.opts[key]
                continue
            sig[key] = [(id(p.grad), p.grad._version) if p.grad is not None else None
                        for p in self._params(opt)]
        return sig

    def opt_state(self, opt) -> _Opt:
        st = self.opts.get(id(opt))
        if st is None or st.ref() is not opt:
            st = _Opt(opt)
            self.opts[id(opt)] = st
        return st

    # ------------------------------------------------------------------ optimizer hooks
    def step_pre(self, opt, args, kwargs):
        if self.suspended:
            return
        st = self.opt_state(opt)
        # args holds the optimizer itself first, then step()'s own arguments
        closure = any(callable(a) and not isinstance(a, torch.optim.Optimizer) for a in args) or \
            (kwargs or {}).get("closure") is not None
        if self.in_scaler is opt:
            return
        sites = self.sites()
        if st.scaled_by is not None and "TL107" in self.codes and sites:
            sc, bsites = st.scaled_by
            _, _, norm = self.grad_state(opt)
            self.obs("TL107", sites, f"step {st.steps + 1}: {st.name}.step() at line {sites[0][1]} applied gradients "
                                     f"still multiplied by the GradScaler's scale {_fmt(sc)} (scaled backward at line "
                                     f"{bsites[0][1] if bsites else '?'}): gradient norm {_fmt(norm)}, "
                                     f"{_fmt(norm / sc) if sc else '?'} once unscaled, so the update was {_fmt(sc)} "
                                     f"times too large and steps with inf/NaN gradients were not skipped")
        self._check_step(opt, st, sites, closure)

    def step_post(self, opt, args, kwargs):
        if self.suspended:
            return
        self.opt_steps += 1
        if self.snapshots:
            self._check_snapshots()
        if self.last_loader is not None:  # the loader whose batch fed this (training) step
            self._check_loader_shuffle(self.last_loader)
        if self.opt_steps >= self.max_steps and not self.stopped and self._may_stop(self.opt_steps, self.max_steps):
            self.stopped = True
            self.emit("stop", reason=f"run capped after {self.opt_steps} optimizer steps", step=self.backwards)
            raise StopRun()

    def _check_step(self, opt, st: _Opt, sites, closure: bool, what="optimizer.step()"):
        st.steps += 1
        k = st.steps
        st.step_site = sites
        if st.await101 is not None:
            # an empty step ran before the first backward; that backward's gradients are applied
            # by this step: by the same line again (it steps before each backward), or by a step
            # of its own elsewhere (the empty step was a deliberate one before training)
            psites, ev = st.await101
            st.await101 = None
            if sites and psites and tuple(sites[0][:2]) == tuple(psites[0][:2]):
                self.obs("TL101", psites, ev)
        if closure:
            st.touched = True
            self._after_step(st)
            return
        n, have, norm = self.grad_state(opt)
        line = sites[0][1] if sites else "?"
        if "TL205" in self.codes:
            self._check_missing_params(opt, st, sites, what)
        if st.touched:
            if "TL108" in self.codes and sites:
                self.anti("TL108", sites, f"backward() at line {st.last_bw_site[0][1] if st.last_bw_site else '?'} "
                                          f"gave the parameters of {st.name} their gradients before {what}")
            st.idle = 0
        elif have == 0 or norm == 0.0:
            st.idle += 1
            if st.idle >= 2 and "TL108" in self.codes and sites:
                self._obs108(st, sites, what, n, have)
        if not st.touched:
            if not st.ever_touched:
                if k == 1:
                    st.first_step_before_bw = True
                st.pending_empty = have == 0
                st.pending101 = (sites, f"step {k}: {what} at line {line} ran before any backward(): "
                                        f"{n - have} of {n} parameters of {st.name} had no gradient (grad None)"
                                        + (f", gradient norm {_fmt(norm)}" if have else ""))
            elif norm == 0.0:
                st.pending_empty = False
                st.pending101 = (sites, f"step {k}: {what} at line {line} ran with all-zero gradients and no "
                                        f"backward() since the previous step")
        elif norm == 0.0 and (st.norm_after_bw > 0 or st.first_step_before_bw):
            if st.first_step_before_bw:
                self.obs("TL101", sites, f"step {k}: {what} at line {line} applied all-zero gradients of "
                                         f"{st.name}: the gradients were cleared and the backward() of this "
                                         f"iteration had not run yet")
            else:
                clear = st.last_clear
                csites = (clear or [])
                if not clear:  # cleared by assignment (p.grad = None): the target lines run since backward
                    csites = [[f, ln, "?"] for f, ln in sorted(self.recent_lines)]
                cl = f"by {clear[0][2] if False else 'zero_grad()'} at line {clear[0][1]} " if clear else ""
                self.obs("TL102", csites + sites,
                         f"step {k}: gradients were cleared {cl}after backward() (gradient norm "
                         f"{_fmt(st.norm_after_bw)}) and before {what} at line {line}: the step applied "
                         f"all-zero gradients")
        elif st.bw_since_step >= 2 and st.cleared_between and st.wiped & set(st.window):
            clear = st.cleared_between
            self.obs("TL102", clear + sites,
                     f"step {k}: {st.bw_since_step} backward() calls ran since the previous step but "
                     f"zero_grad() at line {clear[0][1] if clear else '?'} cleared the gradients between them: "
                     f"only the last micro-batch's gradient (norm {_fmt(norm)}) reached {what}")
        elif st.stale is not None:
            snorm, sstep = st.stale
            self.obs("TL103", sites,
                     f"step {k}: gradient norm before backward was {_fmt(snorm)}, gradients from step "
                     f"{sstep} were not cleared, so {what} at line {line} applied the sum of "
                     f"{k - sstep + 1} steps' gradients")
        self._after_step(st)

    def _obs108(self, st: _Opt, sites, what, n, have):
        """TL108: the optimizer stepped again with no backward() reaching its parameters since its
        previous step, and no gradient to apply (grad None or zero)."""
        line = sites[0][1]
        grads = (f"{n - have} of {n} parameters had no gradient (grad None)" if have < n else "") + \
            (" and " if have and have < n else "") + (f"{have} had all-zero gradients" if have else "")
        self.obs("TL108", sites, f"step {st.steps}: {what} at line {line} ran {st.idle} times in a row with no "
                                 f"backward() reaching the parameters of {st.name} since its previous step: {grads}, "
                                 f"so the step changed no weight from a loss")
        st.pending101 = None  # the cause is the missing backward(), not its order (TL101)

    def param_born(self, param):
        """TL205: every parameter created, in order, with the user frames that created it."""
        self.param_seq += 1
        if len(self.born) > 200000:
            self.born = {k: v for k, v in self.born.items() if v[0]() is not None}
        try:
            self.born[id(param)] = (weakref.ref(param), self.param_seq, self.sites())
        except TypeError:
            pass

    def _check_missing_params(self, opt, st: _Opt, sites, what):
        """TL205: at a step, trainable parameters of the models trained since the last step that
        backward() gave gradients, that no optimizer holds, and that were created after this
        optimizer was built (a layer replaced, a model rebuilt)."""
        roots = [r() for r in self.fwd_roots.values()]
        self.fwd_roots = {}
        roots = [m for m in roots if m is not None]
        if not roots or not sites:
            return
        held = set()
        for other in list(self.opts.values()):
            o = other.ref()
            if o is not None:
                held.update(id(p) for p in self._params(o))
        missing, seen = [], set()
        for m in roots:
            for p in m.parameters():
                if id(p) in seen or id(p) in held or not p.requires_grad or p.grad is None:
                    continue
                seen.add(id(p))
                b = self.born.get(id(p))
                if b is not None and b[0]() is p and b[1] > st.born:
                    missing.append((p, b))
        if not missing:
            return
        p0, (_, _, bsites) = missing[0]
        n = sum(p.numel() for p, _ in missing)
        with torch.no_grad():
            gn = math.sqrt(sum(float(p.grad.detach().float().norm()) ** 2 for p, _ in missing))
        owner = type(roots[0]).__name__
        made = ("line " + ", called from line ".join(str(x[1]) for x in bsites[:3])) if bsites else \
            "code outside the project"
        built = f" at line {st.born_sites[0][1]}" if st.born_sites else ""
        self.obs("TL205", bsites + sites,
                 f"step {st.steps}: {what} at line {sites[0][1]} ran, but {len(missing)} trainable parameter(s) of "
                 f"{owner} ({n} values, shapes {[list(p.shape) for p, _ in missing[:4]]}), created at {made} after "
                 f"{st.name} was built{built}, are in no optimizer: backward() gave them gradients (norm {_fmt(gn)}) "
                 f"and no step ever applies them, so they never train",
                 key=("TL205", tuple(bsites[0][:2]) if bsites else None))

    def _after_step(self, st: _Opt):
        st.scaled_by = None
        st.unscaled = False
        st.touched = False
        st.bw_since_step = 0
        st.cleared_between = None
        st.stale = None
        st.window = []
        st.wiped = set()
        st.state = "stepped"

    def scaler_step(self, orig):
        probes = self

        def step(scaler, optimizer, *args, **kwargs):
            if probes.suspended or not isinstance(optimizer, torch.optim.Optimizer):
                return orig(scaler, optimizer, *args, **kwargs)
            st = probes.opt_state(optimizer)
            probes._check_step(optimizer, st, probes.sites(), bool(args) or "closure" in kwargs,
                               what="scaler.step(optimizer)")
            probes.in_scaler = optimizer
            try:
                return orig(scaler, optimizer, *args, **kwargs)
            except AssertionError as exc:  # GradScaler refuses a step no scaled backward preceded
                if st.pending101 is not None:
                    psites, ev = st.pending101
                    probes.obs("TL101", psites, ev + f"; GradScaler raised AssertionError: {str(exc)[:120]}")
                    st.pending101 = None
                raise
            finally:
                probes.in_scaler = None
        return step

    def zero_grad_wrapper(self, orig, is_module):
        probes = self

        def zero_grad(obj, *args, **kwargs):
            if probes.suspended:
                return orig(obj, *args, **kwargs)
            sites = probes.sites()
            before = {k: st for k, st in probes.opts.items()}
            r = orig(obj, *args, **kwargs)
            for key, st in before.items():
                opt = st.ref()
                if opt is None:
                    continue
                if is_module:
                    ids = {id(p) for p in obj.parameters()}
                    if not any(id(p) in ids for p in probes._params(opt)):
                        continue
                elif opt is not obj:
                    continue
                st.last_clear = sites
                if st.bw_since_step >= 1 and st.nonzero_after_bw:
                    st.wiped.update(st.window)
                    st.window = []
                    if not st.cleared_between:
                        st.cleared_between = sites
                st.nonzero_after_bw = False
            return r
        return zero_grad

    # ------------------------------------------------------------------ backward
    def backward_wrapper(self, orig, is_tensor):
        probes = self

        def backward(*args, **kwargs):
            if probes.in_backward or probes.suspended:
                return orig(*args, **kwargs)
            probes.in_backward = True
            try:
                return probes._backward(orig, args, kwargs, is_tensor)
            finally:
                probes.in_backward = False
        return backward

    def _backward(self, orig, args, kwargs, is_tensor):
        sites = self.sites()
        if self.backwards >= self.max_backward and not self.stopped and \
                self._may_stop(self.backwards, self.max_backward):
            self.stopped = True
            self.emit("stop", reason=f"run capped after {self.backwards} backward() calls", step=self.backwards)
            raise StopRun()
        self.backwards += 1
        k = self.backwards
        line = sites[0][1] if sites else "?"
        t = args[0] if args else kwargs.get("tensors")
        if isinstance(t, (list, tuple)):
            t = t[0] if t else None
        grad_on = torch.is_grad_enabled()
        has_graph = isinstance(t, torch.Tensor) and t.grad_fn is not None
        if not grad_on:
            if not has_graph:
                self.obs("TL204", sites, f"step {k}: backward() at line {line} ran with grad mode off "
                                         f"(torch.no_grad/inference_mode): the loss had no grad_fn, so no "
                                         f"gradient could be computed")
            else:
                self.anti("TL204", sites, f"step {k}: backward() at line {line} ran with grad mode off, but the "
                                          f"loss carried its graph and gradients were computed")
        if self.user_anomaly and self.anomaly_site:
            self.obs("TL801", self.anomaly_site,
                     f"step {k}: anomaly detection turned on at line {self.anomaly_site[0][1]} was still on at "
                     f"backward() (line {line}): every backward runs slower with extra checks")
        # gradient state before the backward: stale (never cleared) and cleared-between detection
        for key, st in list(self.opts.items()):
            opt = st.ref()
            if opt is None:
                continue
            n, have, norm = self.grad_state(opt)
            if st.state == "stepped":
                if norm == 0.0:
                    st.state = "clean"
                    st.stale = None
                elif st.stale is None:
                    st.stale = (norm, st.steps)
            if st.bw_since_step >= 1 and st.nonzero_after_bw and norm == 0.0:
                st.wiped.update(st.window)
                st.window = []
                st.nonzero_after_bw = False
                if not st.cleared_between:
                    st.cleared_between = st.last_clear or [[f, ln, "?"] for f, ln in sorted(self.recent_lines)] \
                        or sites
        sig = self.signature()
        cut = self._cut_snapshot() if self.cut_mods else None
        retain = kwargs.get("retain_graph")
        if retain is None:
            retain = args[2] if len(args) > 2 else kwargs.get("create_graph", args[3] if len(args) > 3 else False)
        if "TL109" in self.codes and isinstance(t, torch.Tensor) and t.grad_fn is not None:
            if self.retained is not None and self.opt_steps > self.retained["opt_steps"]:
                self._check_retained(t, sites, k)
            self.retained = None
            if retain:
                self.retained = self._retain(t, sites)
        import warnings

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r = orig(*args, **kwargs)
        except RuntimeError as exc:
            self._backward_error(exc, sites, k, grad_on, has_graph, locals().get("caught") or [])
            raise
        if self.anomaly_on and k >= 2:  # anomaly detection is slow: the first two backward calls only
            self.anomaly_on = False
            set_anomaly(self, self.user_anomaly)
        after = self.signature()
        scaled = self._lookup(self.scaled, t) if isinstance(t, torch.Tensor) and self.scaled else None
        for key, st in list(self.opts.items()):
            if sig.get(key) == after.get(key):
                continue
            opt = st.ref()
            if opt is None:
                continue
            st.touched = True
            st.ever_touched = True
            if scaled is not None:
                st.scaled_by = (scaled, sites)
            st.bw_since_step += 1
            st.bw_count += 1
            st.last_bw_site = sites
            st.window.append(tuple(sites[0][:2]) if sites else None)
            if st.first_bw_site is None:
                st.first_bw_site = sites
            _, _, st.norm_after_bw = self.grad_state(opt)
            st.nonzero_after_bw = st.norm_after_bw > 0
            if st.pending101 is not None:
                psites, ev = st.pending101
                ev += f"; backward() at line {line} computed them only afterwards"
                if st.pending_empty:
                    st.await101 = (psites, ev)
                else:
                    self.obs("TL101", psites, ev)
                st.pending101 = None
        if cut:
            self._cut_check(cut, sites, k)
        self.recent_lines.clear()
        if "TL501" in self.codes or "TL502" in self.codes:
            self._measure_graphs(k)
        if self.device.startswith("cuda") and torch.cuda.is_available():
            self.cuda_mem.append(torch.cuda.memory_allocated())
        self.checkpoint()
        return r

    def _retain(self, t, sites):
        """TL109: the graph a backward(retain_graph=True) keeps, and the versions of the optimizers'
        parameters at that moment."""
        nodes, _ = _graph(t.grad_fn)
        versions = {}
        for st in self.opts.values():
            opt = st.ref()
            if opt is not None:
                for p in self._params(opt):
                    v = versions.get(id(p))
                    versions[id(p)] = (weakref.ref(p), p._version, (v[2] if v else ()) + (st,))
        return {"nodes": nodes, "versions": versions, "sites": sites, "opt_steps": self.opt_steps,
                "steps": {id(st): st.steps for st in self.opts.values()}}

    def _check_retained(self, t, sites, k):
        """TL109: this backward goes back through the graph kept by the previous backward(retain_graph=True),
        and an optimizer step in between changed parameters that shared part of the graph reaches."""
        ret = self.retained
        nodes, leaves = _graph(t.grad_fn)
        shared = [n for n in nodes if n in ret["nodes"]]
        if not shared:
            self.anti("TL109", sites, f"backward() at line {sites[0][1] if sites else '?'} went through a graph built "
                                      f"after the step (it shares no node with the one kept at line "
                                      f"{ret['sites'][0][1] if ret['sites'] else '?'})")
            return
        changed, stepped = [], {}
        for parent, var in leaves:
            if parent not in ret["nodes"]:
                continue
            v = ret["versions"].get(id(var))
            if v is None or v[0]() is not var or var._version == v[1]:
                continue
            mine = [st for st in v[2] if st.steps > ret["steps"].get(id(st), 0)]
            if mine:
                changed.append((var, v[1]))
                stepped.update((id(st), st) for st in mine)
        if not changed:
            self.anti("TL109", sites, f"backward() at line {sites[0][1] if sites else '?'} went back through "
                                      f"{len(shared)} node(s) of the graph kept at line "
                                      f"{ret['sites'][0][1] if ret['sites'] else '?'}, but no parameter they reach "
                                      f"was changed by a step in between")
            return
        st = next(iter(stepped.values()))
        ssites = st.step_site or []
        rline = ret["sites"][0][1] if ret["sites"] else "?"
        line = sites[0][1] if sites else "?"
        var, v0 = changed[0]
        self.obs("TL109", sites + ssites,
                 f"step {k}: backward() at line {line} went back through {len(shared)} autograd node(s) of the graph "
                 f"kept by backward(retain_graph=True) at line {rline}, and {st.name}.step() at line "
                 f"{ssites[0][1] if ssites else '?'} ran in between: {len(changed)} parameter(s) that graph reaches "
                 f"had changed (shape {list(var.shape)}: version {v0} when the graph was kept, {var._version} now), "
                 f"so these gradients mix activations of the old weights with the new ones (or backward() fails "
                 f"on a saved tensor modified in place)")

    def _backward_error(self, exc, sites, k, grad_on, has_graph, caught=()):
        msg = str(exc).split("\n")[0].split(" Hint:")[0]
        fwd_sites = []  # anomaly detection's traceback of the forward op whose saved tensor changed
        import re

        for w in caught:
            text = str(w.message)
            if "Traceback of forward call" in text:
                for fm in re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', text):
                    if self._is_user(fm.group(1)):
                        fwd_sites.append([os.path.abspath(fm.group(1)), int(fm.group(2)), fm.group(3)])
        line = sites[0][1] if sites else "?"
        if "modified by an inplace operation" in msg:
            recent = [r for r in self.inplace_log if r["step"] == k - 1 or r["step"] == k]
            shape = None
            import re

            m = re.search(r"\[torch\.\w+ \[([\d, ]*)\]\]", msg)
            if m:
                shape = [int(s) for s in m.group(1).replace(" ", "").split(",") if s]
            cands = [r for r in recent if shape is None or r["shape"] == shape] or recent
            osites = []
            for r in cands[-4:]:
                osites.extend(r["sites"][:1])
            ops = ", ".join(f"the in-place {r['op']} at line {r['sites'][0][1]}" for r in cands[-3:] if r["sites"])
            fwd = fwd_sites[-1:] if fwd_sites else []
            self.obs("TL301", osites + fwd + sites,
                     f"step {k}: " + (f"{ops} changed a tensor autograd had saved" +
                                      (f" for the op at line {fwd[0][1]} (traced by anomaly detection)" if fwd else "")
                                      + "; " if ops else "")
                     + f"backward() at line {line} failed: {msg[:300]}",
                     key=("TL301-bw", k))
        elif "does not require grad" in msg and not grad_on:
            self.obs("TL204", sites, f"step {k}: backward() at line {line} under no_grad raised: {msg[:200]}")

    # ------------------------------------------------------------------ forward hooks
    def fwd_pre(self, module, args):
        self.depth += 1
        if self.suspended:
            return
        if self.depth != 1:
            if self.cut_check and torch.is_grad_enabled():
                self._cut_candidate(module)
            return
        if self.cut_check:
            self.current_root = weakref.ref(module)
        if self.codes & _AT_FORWARD:
            self._forward_checks(module, args)
        self.forwards += 1
        if self.forwards > self.max_forward and not self.stopped and self._may_stop(self.forwards, self.max_forward):
            self.stopped = True
            self.emit("stop", reason=f"run capped after {self.forwards} forward calls", step=self.backwards)
            raise StopRun()
        sites = self.sites()
        if not sites:
            return
        if isinstance(module, nn.modules.loss._Loss):
            return
        training = bool(module.training)
        grad = torch.is_grad_enabled()
        skey = tuple((s[0], s[1]) for s in sites)
        step = self.backwards + (1 if grad else 0)
        summ = self.fwd_sum.get(skey)
        if summ is None and len(self.fwd_sum) < 400:
            summ = self.fwd_sum[skey] = {"sites": sites, "module": type(module).__name__, "train": None,
                                         "eval": None}
        if summ is not None:
            k2 = "train" if training else "eval"
            summ[k2] = [summ[k2][0] if summ[k2] else step, step, grad]
        if not training and self.first_eval is None:
            self.first_eval = step
        key = (skey, training, grad)
        if key not in self.fwd_seen and len(self.fwd_seen) < 400:
            self.fwd_seen.add(key)
            active = sum(1 for m in module.modules()
                         if isinstance(m, (nn.Dropout, nn.modules.batchnorm._BatchNorm)) and m.training)
            self.emit("fwd", sites=sites, module=type(module).__name__, training=training, grad=grad,
                      active=active, step=self.backwards + (1 if grad else 0))
        if "TL601" in self.codes:
            self._check_inputs(module, args, sites)

    def _forward_checks(self, module, args):
        """TL205 (the models a step should train), TL603 (plain tensor attributes), TL604 (loss weights)."""
        is_loss = isinstance(module, nn.modules.loss._Loss)
        if "TL205" in self.codes and not is_loss and torch.is_grad_enabled() and len(self.fwd_roots) < 64:
            self.fwd_roots[id(module)] = weakref.ref(module)
        if "TL603" in self.codes and id(module) not in self.checked603:
            self.checked603.add(id(module))
            try:
                self._check_plain_tensors(module, args)
            except Exception as exc:  # a probe must never break the user's forward
                self.emit("probe-error", message=f"TL603: {type(exc).__name__}: {exc}")
        if "TL604" in self.codes and is_loss:
            self._check_loss_weight(module, args)

    def _assign_sites(self, cls, name):
        """The lines of the project's classes (cls and its bases) that assign ``self.<name> =``."""
        import inspect
        import re

        key = (cls, name)
        hit = self._fn_cache.get(key)
        if hit is not None:
            return hit
        out = []
        pat = re.compile(r"\bself\." + re.escape(name) + r"\s*(?::[^=]*)?=(?!=)")
        for c in cls.__mro__:
            if c in (nn.Module, object) or c.__module__.startswith("torch."):
                continue
            try:
                fn = os.path.abspath(inspect.getsourcefile(c) or "")
                if not self._is_user(fn):
                    continue
                lines, start = inspect.getsourcelines(c)
            except (OSError, TypeError):
                continue
            out.extend([fn, start + i, c.__name__] for i, text in enumerate(lines) if pat.search(text))
        self._fn_cache[key] = out
        return out

    def _check_plain_tensors(self, root, args):
        """TL603: tensors kept as plain attributes of a module (not parameters or buffers): not in
        state_dict(), and Module.to() leaves them where they are."""
        dev = next((t.device for t in _tensors(args)), None)
        pdev = next((t.device for t in root.parameters()), None)
        for i, m in enumerate(root.modules()):
            if i > 2000:
                break
            for name, v in list(vars(m).items()):
                if not isinstance(v, torch.Tensor) or isinstance(v, nn.Parameter) or v.dim() == 0:
                    continue
                sites = self._assign_sites(type(m), name)
                if not sites:
                    continue
                cls = type(m).__name__
                self.suspended += 1
                try:
                    keys = list(m.state_dict(keep_vars=True).keys())
                    moved = None
                    try:  # what Module.to() does with it: the module without its parameters and submodules
                        shell = type(m).__new__(type(m))
                        shell.__dict__.update(vars(m))
                        shell.__dict__.update(_parameters={}, _modules={}, _buffers=dict(m._buffers))
                        nn.Module._apply(shell, lambda t: t.to("meta"))
                        moved = (getattr(shell, name).device, len(m._buffers))
                    except Exception:
                        moved = None
                finally:
                    self.suspended -= 1
                ev = (f"the forward of {type(root).__name__} ran with `{cls}.{name}`, a plain tensor attribute "
                      f"({v.dtype}, shape {list(v.shape)}, on {v.device}) that is neither a parameter nor a buffer: "
                      f"state_dict() of {cls} has {len(keys)} key(s), none of them `{name}`")
                if moved is not None:
                    ev += (f"; Module.to('meta') on {cls} moved its {moved[1]} buffer(s) and left `{name}` on "
                           f"{moved[0]}, as model.to(device) leaves it")
                if pdev is not None and pdev != v.device:
                    ev += f"; here the model's parameters are on {pdev} and `{name}` on {v.device}"
                elif dev is not None and dev != v.device:
                    ev += f"; here the input is on {dev} and `{name}` on {v.device}"
                self.obs("TL603", sites, ev, key=("TL603", cls, name), weak=True)

    def _check_loss_weight(self, module, args):
        """TL604: the class weight of a loss module on another device than its input, or (on one
        device) made on the CPU and never moved while the program moved its model."""
        inp = next(_tensors(args), None)
        if inp is None:
            return
        for bname in ("weight", "pos_weight"):
            w = module._buffers.get(bname) if hasattr(module, "_buffers") else None
            if not isinstance(w, torch.Tensor) or w.dim() == 0:
                continue
            made = self.loss_sites.get(id(module))
            msites = made[1] if made and made[0]() is module else []
            sites = self.sites()
            if not (msites or sites):
                continue
            cls = type(module).__name__
            built = f" (built at line {msites[0][1]})" if msites else ""
            at = f"at line {sites[0][1]}" if sites else ""
            if w.device != inp.device:
                self.obs("TL604", msites + sites,
                         f"step {self.backwards + 1}: the {bname} of {cls}{built} is on {w.device} and its input "
                         f"{at} on {inp.device}: the loss cannot combine them (a device mismatch)",
                         key=("TL604", tuple(msites[0][:2]) if msites else None, bname))
            elif not self.moved_modules or id(module) in self.moved_modules or \
                    self._lookup_ref(self.placed, w) is not None:
                if msites:
                    self.anti("TL604", msites, f"the {bname} of {cls}{built} was where its input was ({w.device}), "
                                               f"and it {'moved with the loss module' if id(module) in self.moved_modules else 'was put there by the program' if self.moved_modules else 'stayed with an unmoved model'}")
            else:
                mdev = next(iter(self.moved_modules.values()))
                self.obs("TL604", msites + sites,
                         f"step {self.backwards + 1}: the {bname} of {cls}{built} ({w.dtype}, shape {list(w.shape)}) "
                         f"was made on {w.device} without device= and never moved (neither it nor the loss module "
                         f"went through .to()), while the program moved its model with .to({mdev}); the loss "
                         f"{at} ran on {inp.device} here, on a GPU this is a device mismatch",
                         key=("TL604", tuple(msites[0][:2]) if msites else None, bname))

    def _lookup_ref(self, table, t):
        r = table.get(id(t))
        return t if r is not None and r() is t else None

    def loss_init(self, orig):
        probes = self

        def __init__(mod, *args, **kwargs):
            orig(mod, *args, **kwargs)
            if not probes.suspended and "TL604" in probes.codes:
                if len(probes.loss_sites) > 1000:
                    probes.loss_sites = {k: v for k, v in probes.loss_sites.items() if v[0]() is not None}
                probes.loss_sites[id(mod)] = (weakref.ref(mod), probes.sites())
        return __init__

    def _cut_candidate(self, module):
        """TL304: a submodule called from a finding's line (``self.encoder(x).detach()``)."""
        if id(module) in self.cut_mods or len(self.cut_mods) > 64:
            return
        f = sys._getframe(2)
        for _ in range(16):
            if f is None or self._is_user(f.f_code.co_filename):
                break
            f = f.f_back
        if f is None or not self._is_user(f.f_code.co_filename):
            return
        fn = os.path.abspath(f.f_code.co_filename)
        if f.f_lineno not in self.targets.get(fn, ()):
            return
        self.cut_mods[id(module)] = (weakref.ref(module), [[fn, f.f_lineno, f.f_code.co_name]], self.current_root)

    def _cut_snapshot(self):
        snap = []
        for mref, msites, rref in list(self.cut_mods.values()):
            m = mref()
            root = rref() if rref is not None else None
            if m is None or root is None:
                continue
            mine = [p for p in m.parameters() if p.requires_grad]
            ids = {id(p) for p in mine}
            others = [p for p in root.parameters() if p.requires_grad and id(p) not in ids]
            if not mine or not others:
                continue
            snap.append((m, msites, mine, [_grad_sig(p) for p in mine], others, [_grad_sig(p) for p in others]))
        return snap

    def _cut_check(self, snap, sites, k):
        for m, msites, mine, before, others, obefore in snap:
            if [_grad_sig(p) for p in mine] != before:
                self.anti("TL304", msites, f"backward() at line {sites[0][1] if sites else '?'} gave gradients to "
                                           f"the parameters of {type(m).__name__} called at line {msites[0][1]}")
                continue
            if [_grad_sig(p) for p in others] == obefore:
                continue
            none = sum(1 for p in mine if p.grad is None)
            got = sum(1 for p, b in zip(others, obefore) if _grad_sig(p) != b)
            self.obs("TL304", msites + sites,
                     f"step {k}: backward() at line {sites[0][1] if sites else '?'} gave no gradient to the "
                     f"{len(mine)} parameter(s) of {type(m).__name__} called at line {msites[0][1]} "
                     f"({none} still grad None), while {got} other parameter(s) of the model got gradients: the "
                     f"forward cut {type(m).__name__}'s output from the graph there, so it never trains",
                     key=("TL304", tuple(msites[0][:2])), weak=True)

    def fwd_post(self, module, args, output):
        self.depth = max(0, self.depth - 1)

    def _param_device(self, module):
        p = next(module.parameters(), None)
        return p.device if p is not None else None

    def _check_inputs(self, module, args, sites):
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            return  # these scatter their inputs to the devices themselves
        pdev = self._param_device(module)
        if pdev is None:
            return
        for t in _tensors(args):
            line = sites[0][1]
            if t.device != pdev and t.dim() > 0:
                self.obs("TL601", sites, f"step {self.backwards + 1}: the input of {type(module).__name__} at "
                                         f"line {line} was on {t.device} (shape {list(t.shape)}) while its "
                                         f"parameters were on {pdev}")
                return
            if id(module) in self.moved_modules and self._is_unmoved(t):
                self.obs("TL601", sites, f"step {self.backwards + 1}: a batch tensor from the DataLoader "
                                         f"(shape {list(t.shape)}) reached {type(module).__name__} at line "
                                         f"{line} without .to(device), while the model was moved with "
                                         f".to({self.moved_modules[id(module)]}); on {self.device} both are on "
                                         f"{pdev}, on a GPU this is a device mismatch")
                return

    # ------------------------------------------------------------------ taint helpers
    def _is_moved(self, t):
        r = self.moved.get(id(t))
        return r is not None and r() is t

    def _is_unmoved(self, t):
        r = self.unmoved.get(id(t))
        return r is not None and r() is t

    def _tag(self, table, t, value=True):
        try:
            table[id(t)] = weakref.ref(t) if value is True else (weakref.ref(t), value)
        except TypeError:
            pass
        if len(table) > 20000:
            for k in [k for k, v in table.items() if (v() if callable(v) else v[0]()) is None]:
                del table[k]

    def _deviceless(self, t):
        r = self.deviceless.get(id(t))
        if r is None:
            return None
        ref, site = r
        return site if ref() is t else None

    def tag_batch(self, batch):
        if "TL601" not in self.codes:
            return
        self.loader_batches += 1
        for t in _tensors(batch):
            r = self.moved.get(id(t))
            if r is not None and r() is t:
                continue  # a collate function moved it already
            self._tag(self.unmoved, t)

    # ------------------------------------------------------------------ torch function mode
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.suspended:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        codes = self.codes
        if (name == "__get__" or name == "__set__") and "TL302" in codes and args and \
                isinstance(args[0], torch.Tensor) and getattr(getattr(func, "__self__", None), "__name__", "") == "data":
            return self._data_attr(func, name, args, kwargs)
        if self.cuda_standin:
            args, kwargs, same = self._cuda_on_cpu(name, args, kwargs)
            if same is not None:  # `.cuda()` stood in by the CPU: still a move for the device probes
                if "TL602" in codes or "TL601" in codes:
                    self._propagate(func, name, args, kwargs, same)
                if "TL604" in codes:
                    self._tag(self.placed, same)
                return same
        if name == "__getitem__" and "TL302" in codes and args and isinstance(args[0], torch.Tensor) and \
                args[0].dim() == 0 and self._lookup(self.data_alias, args[0]) is not None:
            sites = self.sites()
            if sites:
                self.obs("TL302", sites, f"step {self.backwards + 1}: `.data[...]` at line {sites[0][1]} indexed the "
                                         f"0-dim tensor that `.data` returned (a loss is a 0-dim tensor since "
                                         f"PyTorch 0.4): this raises IndexError; `.item()` reads the value",
                         key=("TL302-index", tuple(sites[0][:2])))
        if name in ("log", "log2", "log10") and "TL405" in codes and args and isinstance(args[0], torch.Tensor):
            out = func(*args, **kwargs)
            self._log_check(name, args[0], out)
            return out
        if name in _LOSSES and args:
            self._loss_check(name, args, kwargs)
        inplace = ""
        if "TL301" in codes or "TL302" in codes:
            inplace = _is_inplace(func, kwargs)
        alias = None
        if inplace and "TL302" in codes and args and isinstance(args[0], torch.Tensor):
            alias = self._lookup(self.data_alias, args[0])
            if alias is not None:
                src = alias[0]()
                alias = (src, src._version, args[0].detach().clone() if args[0].numel() <= 1 << 22 else None) \
                    if src is not None else None
        if name in ("argmax", "max") and "TL702" in codes and args and isinstance(args[0], torch.Tensor):
            if len(args) == 1 and "dim" not in kwargs and args[0].dim() >= 2 and args[0].shape[0] > 1:
                sites = self.sites()
                if sites:
                    self.obs("TL702", sites, f"step {self.backwards + 1}: {name}() at line {sites[0][1]} without "
                                             f"dim= on a tensor of shape {list(args[0].shape)} returned one "
                                             f"index for the whole batch", weak=True)
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:
            self._op_error(exc, name, args, kwargs)
            raise
        if alias is not None:
            self._data_inplace(inplace, args[0], alias)
        if name in ("softmax", "sigmoid", "_softmax") and "TL405" in codes and isinstance(out, torch.Tensor) and \
                out.grad_fn is None:
            self._tag(self.squashed, out, name.strip("_"))
        if inplace and "TL301" in codes and args and isinstance(args[0], torch.Tensor) and torch.is_grad_enabled():
            t = args[0]
            if t.requires_grad:
                sites = self.sites()
                if sites:
                    self.inplace_log.append({"op": inplace, "sites": sites, "shape": list(t.shape),
                                             "step": self.backwards, "version": t._version})
                    del self.inplace_log[:-200]
        if "TL602" in codes or "TL601" in codes:
            self._propagate(func, name, args, kwargs, out)
        if "TL604" in codes and isinstance(out, torch.Tensor):
            self._place(name, args, kwargs, out)
        return out

    def _place(self, name, args, kwargs, out):
        """TL604: tensors the program put on a device (``.to(device)``, ``.cuda()``, ``device=``), and
        small tensors computed from them outside forward (weights derived from moved labels)."""
        if (name in ("to", "cuda") and (name == "cuda" or "device" in kwargs or any(
                isinstance(a, (str, torch.device, int, torch.Tensor)) and not isinstance(a, bool)
                for a in args[1:]))) or (name in _FACTORIES and kwargs.get("device") is not None):
            self._tag(self.placed, out)
        elif self.placed and self.depth == 0 and not out.requires_grad and 0 < out.numel() <= 65536 and any(
                self._lookup_ref(self.placed, t) is not None for t in _tensors(args)):
            self._tag(self.placed, out)

    def _lookup(self, table, t):
        r = table.get(id(t))
        if r is None:
            return None
        ref, value = r
        return value if ref() is t else None

    def standin(self, key, text, sites=None):
        """Record once per run what was stood in for (said in the evidence)."""
        if key in self.standins:
            return
        self.standins[key] = text
        self.emit("standin", key=key, text=text, sites=sites or [], step=self.backwards)

    def _cuda_on_cpu(self, name, args, kwargs):
        """CUDA-only code on a CPU run: `.cuda()`, `device="cuda"`, `.to("cuda")` and pinned
        memory run on the CPU instead (without CUDA they would raise before any training)."""
        def is_cuda(v):
            return (isinstance(v, str) and v.startswith("cuda")) or (isinstance(v, torch.device) and v.type == "cuda")

        hit = False
        if name in ("cuda", "pin_memory") and args and isinstance(args[0], torch.Tensor):
            self._standin_cuda()
            return args, kwargs, args[0]
        dev = kwargs.get("device")
        if dev is not None and is_cuda(dev):
            kwargs = dict(kwargs)
            kwargs["device"] = "cpu"
            hit = True
        if name == "to" and any(is_cuda(a) for a in args[1:]):
            args = tuple("cpu" if i and is_cuda(a) else a for i, a in enumerate(args))
            hit = True
        if hit:
            self._standin_cuda()
        return args, kwargs, None

    def _standin_cuda(self):
        if "cuda" not in self.standins:
            sites = self.sites()
            self.standin("cuda", f"the program asks for CUDA (line {sites[0][1] if sites else '?'}); with "
                                 f"--device cpu, its `.cuda()`/`device=\"cuda\"` tensors stayed on the CPU", sites)

    def _data_attr(self, func, name, args, kwargs):
        """TL302: `x.data` read or assigned."""
        src = args[0]
        grad_fn = src.grad_fn
        version = src._version
        out = func(*args, **kwargs)
        if _torch_caller(sys._getframe(1)):  # torch's own `.data` (Module._apply swaps param.data)
            return out
        sites = self.sites()
        if not sites:
            return out
        line, k = sites[0][1], self.backwards + 1
        what = "a parameter" if isinstance(src, nn.Parameter) else "a tensor that requires grad"
        if name == "__set__":
            new = args[1] if len(args) > 1 else None
            if src.requires_grad and isinstance(new, torch.Tensor):
                self.obs("TL302", sites, f"step {k}: `.data =` at line {line} swapped the values of {what} "
                                         f"(shape {list(src.shape)}) for a {new.dtype} tensor of shape "
                                         f"{list(new.shape)} on {new.device} without any shape, dtype or device "
                                         f"check, and autograd's version counter stayed at {src._version}",
                         weak=True)
            return out
        if isinstance(out, torch.Tensor):
            self._tag(self.data_alias, out, (weakref.ref(src), sites))
        if grad_fn is not None and torch.is_grad_enabled():
            self.obs("TL302", sites, f"step {k}: `.data` at line {line} read a tensor attached to the autograd "
                                     f"graph (produced by {grad_fn.name()}, shape {list(src.shape)}): the value it "
                                     f"returned has no grad_fn, so the gradient stops there without a `.detach()` "
                                     f"saying so, and it has its own version counter (version "
                                     f"{getattr(out, '_version', 0)}, the graph tensor's is {version}), so autograd "
                                     f"cannot see in-place changes made through it", weak=True)
        elif not src.requires_grad:
            self.anti("TL302", sites, f"`.data` at line {line} read a tensor outside the autograd graph "
                                      f"(requires_grad=False): nothing was cut")
        return out

    def _data_inplace(self, op, alias_t, alias):
        src, v0, before = alias
        if not src.requires_grad or src._version != v0:
            return
        sites = self.sites()
        if not sites:
            return
        n = None
        if before is not None:
            try:
                with torch.no_grad():
                    n = int((alias_t.detach() != before).sum())
            except Exception:
                n = None
        what = "a parameter" if isinstance(src, nn.Parameter) else "a tensor that requires grad"
        changed = f" ({n} of its {before.numel()} values changed this time)" if n is not None else ""
        self.obs("TL302", sites, f"step {self.backwards + 1}: {op}() at line {sites[0][1]} wrote into {what} of shape "
                                 f"{list(src.shape)} in place through `.data`{changed}, and autograd's version counter "
                                 f"stayed at {v0}: a backward through a graph that saved it uses the new values "
                                 f"silently (the same write under `torch.no_grad()` bumps the counter, and that "
                                 f"backward raises instead)", weak=True)

    def _log_check(self, name, x, out):
        """TL405: log() of softmax/sigmoid outputs."""
        sites = self.sites()
        if not sites:
            return
        prov = _provenance(x)
        kind = {"SoftmaxBackward0": "softmax", "SigmoidBackward0": "sigmoid"}.get(prov) or \
            self._lookup(self.squashed, x)
        line = sites[0][1]
        if not kind:
            self.anti("TL405", sites, f"{name}() at line {line} took a tensor "
                                      f"{'produced by ' + prov if prov else 'not produced by softmax or sigmoid'}")
            return
        try:
            with torch.no_grad():
                mn = float(x.detach().float().min())
                ninf = int(torch.isinf(out.detach()).sum()) if isinstance(out, torch.Tensor) else 0
                lo = float(out.detach().float().min()) if isinstance(out, torch.Tensor) else float("nan")
        except Exception:
            mn, ninf, lo = float("nan"), 0, float("nan")
        gap = {torch.float16: 17, torch.bfloat16: 92, torch.float64: 745}.get(x.dtype, 104)
        alt = "log_softmax" if kind == "softmax" else "logsigmoid"
        self.obs("TL405", sites, f"step {self.backwards + 1}: {name}() at line {line} took the output of {kind} "
                                 f"({x.dtype}, shape {list(x.shape)}; smallest value {_fmt(mn)}, log {_fmt(lo)})"
                                 + (f": {ninf} value(s) were already -inf" if ninf else "")
                                 + f"; a value that rounds to 0 in {x.dtype} (a logit gap above ~{gap}) gives -inf "
                                   f"and NaN gradients, which {alt} avoids by computing the log directly")

    def _op_error(self, exc, name, args, kwargs):
        msg = str(exc).split("\n")[0]
        sites = self.sites()
        if "leaf Variable that requires grad" in msg or "leaf variable" in msg.lower() and "in-place" in msg:
            self.obs("TL301", sites, f"step {self.backwards + 1}: {name} at line {sites[0][1] if sites else '?'} "
                                     f"raised: {msg[:200]}")
        elif "same device" in msg or "Expected all tensors" in msg or "device" in msg and "cpu" in msg:
            tensors = list(_tensors(list(args) + list(kwargs.values())))
            for t in tensors:
                s = self._deviceless(t)
                if s is not None:
                    self.obs("TL602", s + sites, f"step {self.backwards + 1}: a tensor created at line {s[0][1]} "
                                                 f"without device= (on {t.device}) met a tensor on another "
                                                 f"device at line {sites[0][1] if sites else '?'}: {msg[:160]}")
                    return
            for t in tensors:
                # a batch tensor left behind confirms TL601 only where the program put something on a
                # device itself: torch's own moves (nn.DataParallel moves a CPU model to cuda:0 on a
                # one-GPU machine) make a CPU-only program fail on a GPU, which is no TL601
                if self._is_unmoved(t) and self.user_moved:
                    self.obs("TL601", sites, f"step {self.backwards + 1}: a batch tensor from the DataLoader "
                                             f"on {t.device} reached {name} at line "
                                             f"{sites[0][1] if sites else '?'}: {msg[:160]}")
                    return
            self.emit("deverr", sites=sites, message=msg[:300], step=self.backwards + 1)

    def _loss_check(self, name, args, kwargs):
        x = args[0]
        target = args[1] if len(args) > 1 else kwargs.get("target")
        if not isinstance(x, torch.Tensor) or x.numel() == 0:
            return None
        sites = self.sites()
        if not sites:
            return None
        line = sites[0][1]
        step = self.backwards + 1
        with torch.no_grad():
            xf = x.detach().float()
            mn, mx = float(xf.min()), float(xf.max())
            cdim = 1 if x.dim() >= 2 else 0
            prov = _provenance(x)
            if name == "cross_entropy":
                rows = xf.sum(dim=cdim)
                probs = mn >= 0.0 and mx <= 1.0 and bool(torch.allclose(rows, torch.ones_like(rows), atol=1e-3))
                if probs or prov in ("SoftmaxBackward0",):
                    self.obs("TL401", sites, f"step {step}: the input of cross_entropy at line {line} held "
                                             f"probabilities{' from softmax' if prov == 'SoftmaxBackward0' else ''}: "
                                             f"every row sums to {_fmt(float(rows.mean()))}, values in "
                                             f"[{_fmt(mn)}, {_fmt(mx)}]; cross_entropy applies log_softmax again")
                else:
                    self.anti("TL401", sites, f"step {step}: the input of cross_entropy at line {line} held logits "
                                              f"(values in [{_fmt(mn)}, {_fmt(mx)}], rows sum to "
                                              f"{_fmt(float(rows.mean()))})")
                self._target_check(name, x, target, sites)
            elif name == "nll_loss":
                lse = torch.logsumexp(xf, dim=cdim)
                logp = mx <= 1e-4 and bool(torch.allclose(lse, torch.zeros_like(lse), atol=1e-3))
                if not logp:
                    rows = xf.sum(dim=cdim)
                    kind = ("probabilities (rows sum to 1)" if mn >= 0 and
                            bool(torch.allclose(rows, torch.ones_like(rows), atol=1e-3)) else "raw scores")
                    self.obs("TL403", sites, f"step {step}: nll_loss at line {line} received {kind}, not "
                                             f"log-probabilities: logsumexp over classes is "
                                             f"{_fmt(float(lse.mean()))} (log_softmax gives 0), values in "
                                             f"[{_fmt(mn)}, {_fmt(mx)}]")
                else:
                    self.anti("TL403", sites, f"step {step}: nll_loss at line {line} received log-probabilities "
                                              f"(logsumexp over classes 0, max {_fmt(mx)})")
                self._target_check(name, x, target, sites)
            elif name == "binary_cross_entropy_with_logits":
                inside = mn >= 0.0 and mx <= 1.0
                if prov == "SigmoidBackward0" or (
                        inside and x.numel() >= 16 and prov is None and not x.requires_grad):
                    self.obs("TL402", sites, f"step {step}: the input of binary_cross_entropy_with_logits at line "
                                             f"{line} came from sigmoid{'' if prov else ' (all values in [0, 1])'}: "
                                             f"values in [{_fmt(mn)}, {_fmt(mx)}]; the loss applies sigmoid again")
                else:
                    self.anti("TL402", sites, f"step {step}: the input of binary_cross_entropy_with_logits at line "
                                              f"{line} held logits (values in [{_fmt(mn)}, {_fmt(mx)}]"
                                              f"{', produced by ' + prov if prov else ''})")
        if "TL601" in self.codes:
            for t in ([x, target] if isinstance(target, torch.Tensor) else [x]):
                if self._is_unmoved(t) and self.moved_modules:
                    dev = next(iter(self.moved_modules.values()))
                    self.obs("TL601", sites, f"step {step}: a batch tensor from the DataLoader (shape "
                                             f"{list(t.shape)}) reached {name} at line {line} without "
                                             f".to(device), while the model was moved with .to({dev}); on a "
                                             f"GPU this is a device mismatch")
        return None

    def _target_check(self, name, x, target, sites):
        if not isinstance(target, torch.Tensor) or "TL404" not in self.codes:
            return
        if target.is_floating_point() and list(target.shape) != list(x.shape):
            t = target.detach()
            integral = bool(torch.all(t == t.round())) if t.numel() else False
            if integral:
                self.obs("TL404", sites, f"step {self.backwards + 1}: the target of {name} at line {sites[0][1]} "
                                         f"was {t.dtype} class indices (shape {list(t.shape)}, input "
                                         f"{list(x.shape)})")

    def _propagate(self, func, name, args, kwargs, out):
        if name == "type" and isinstance(out, str):
            if args and isinstance(args[0], torch.Tensor) and self._deviceless(args[0]) is None:
                if len(self.type_strings) >= 256:
                    self.type_strings.pop(next(iter(self.type_strings)))
                self.type_strings[id(out)] = out
            return
        if len(args) > 1 and isinstance(out, torch.Tensor) and (
                name == "type_as" and isinstance(args[1], torch.Tensor) and self._deviceless(args[1]) is None
                or name == "type" and isinstance(args[1], str) and self.type_strings.get(id(args[1])) is args[1]):
            self._tag(self.moved, out)  # on the device of the other tensor
            self.unmoved.pop(id(out), None)
            self.deviceless.pop(id(out), None)
            return
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
            devarg = name == "cuda" or "device" in kwargs or any(
                isinstance(a, (str, torch.device, int)) and not isinstance(a, bool) for a in args[1:]) or any(
                isinstance(a, torch.Tensor) for a in args[1:])
            if devarg and isinstance(out, torch.Tensor):
                if not self.user_moved and not _torch_caller(sys._getframe(1)):
                    self.user_moved = True
                self._tag(self.moved, out)
                self.unmoved.pop(id(out), None)
                self.deviceless.pop(id(out), None)
                return
        if name in _FACTORIES and self.depth > 0 and "device" not in kwargs and isinstance(out, torch.Tensor) \
                and "TL602" in self.codes and out.dim() > 0:
            if not any(isinstance(a, torch.Tensor) for a in args):
                sites = self.sites()
                if sites:
                    self._tag(self.deviceless, out, sites)
            return
        if self.moved and name in _KEEPS_DEVICE and isinstance(out, torch.Tensor):
            # a dataset's items taken from tensors it moved (``self.x[i]``), collated by
            # ``torch.stack``, or rebuilt by ``torch.tensor(moved)``: still on the device
            moved_in = list(_tensors(list(args)))
            if moved_in and all(self._is_moved(t) for t in moved_in):
                self._tag(self.moved, out)
                return
        if not (self.unmoved or self.deviceless):
            return
        ins = list(_tensors(list(args) + list(kwargs.values())))
        if not ins:
            return
        dl = [self._deviceless(t) for t in ins]
        if any(s is not None for s in dl):
            site = next(s for s in dl if s is not None)
            others = [t for t, s in zip(ins, dl) if s is None and t.dim() > 0]
            if others and self.depth > 0:
                mod_moved = bool(self.moved_modules)
                if mod_moved or any(t.device.type != "cpu" for t in others):
                    sites = self.sites()
                    self.obs("TL602", site + sites,
                             f"step {self.backwards + 1}: a tensor created at line {site[0][1]} inside forward "
                             f"without device= (on {ins[dl.index(site)].device}) was combined with the input "
                             f"at line {sites[0][1] if sites else '?'} by {name}; the model was moved with "
                             f".to({next(iter(self.moved_modules.values()), self.device)}), so on a GPU this "
                             f"is a device mismatch")
            elif isinstance(out, torch.Tensor):
                self._tag(self.deviceless, out, site)
        if self.unmoved and any(self._is_unmoved(t) for t in ins) and name not in ("to", "cuda"):
            if self.depth > 0 and self.moved_modules and "TL601" in self.codes and any(
                    not self._is_unmoved(t) and t.dim() > 0 for t in ins):
                sites = self.sites()
                t = next(t for t in ins if self._is_unmoved(t))
                self.obs("TL601", sites, f"step {self.backwards + 1}: a batch tensor from the DataLoader (shape "
                                         f"{list(t.shape)}) that never went through .to(device) met the model's "
                                         f"tensors in {name} at line {sites[0][1] if sites else '?'}, while the model "
                                         f"was moved with .to({next(iter(self.moved_modules.values()))}); on a GPU "
                                         f"this is a device mismatch", key=("TL601-op", name))
            if isinstance(out, torch.Tensor):
                self._tag(self.unmoved, out)

    # ------------------------------------------------------------------ module / loader patches
    def module_to(self, orig, is_cuda):
        probes = self

        def to(module, *args, **kwargs):
            r = orig(module, *args, **kwargs)
            dev = None
            if is_cuda:
                dev = "cuda"
            else:
                for a in list(args) + [kwargs.get("device")]:
                    if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool)):
                        dev = str(a)
                        break
            if dev is not None and isinstance(r, nn.Module) and not _torch_caller(sys._getframe(1)):
                # moves that torch makes itself (nn.DataParallel on one GPU) are not the program's
                probes.user_moved = True
                probes.moved_modules[id(r)] = dev
                probes.moved_modules[id(module)] = dev
            return r
        return to

    def loader_init(self, orig):
        probes = self

        def __init__(loader, *args, **kwargs):
            if "num_workers" in kwargs:
                kwargs["num_workers"] = 0
            kwargs.pop("persistent_workers", None)
            kwargs.pop("prefetch_factor", None)
            if len(args) > 4 and isinstance(args[4], int):  # num_workers given positionally
                args = list(args)
                args[4] = 0
            orig(loader, *args, **kwargs)
            if not probes.suspended:
                probes.loaders[id(loader)] = probes.sites()
        return __init__

    def loader_iter(self, orig):
        probes = self

        def __iter__(loader):
            it = orig(loader)
            cap = 8 * max(3, probes.steps)

            def gen():
                # batches followed by at least one optimizer step: a loop that steps several
                # optimizers per batch (a GAN) still runs as many iterations as a loop with one
                n, stepped, last = 0, 0, probes.opt_steps
                for batch in it:
                    if probes.opt_steps != last:
                        stepped, last = stepped + 1, probes.opt_steps
                    if not probes.suspended and (n >= cap or stepped >= 2 * max(3, probes.steps)):
                        break
                    n += 1
                    probes.last_loader = loader
                    probes.tag_batch(batch)
                    yield batch
            return gen()
        return __iter__

    def _check_loader_shuffle(self, loader):
        if "TL701" not in self.codes or id(loader) in self.loader_reported:
            return
        self.loader_reported.add(id(loader))
        sampler = getattr(loader, "sampler", None)
        from torch.utils.data import IterableDataset, SequentialSampler

        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            return
        site = self.loaders.get(id(loader)) or []
        if isinstance(sampler, SequentialSampler) and getattr(loader, "batch_sampler", None) is not None and \
                type(loader.batch_sampler).__name__ == "BatchSampler":
            self.obs("TL701", site, f"step {self.backwards}: the DataLoader created at line "
                                    f"{site[0][1] if site else '?'} fed an optimizer step with a "
                                    f"SequentialSampler: batches come in the same order every epoch", weak=True)
        else:
            self.anti("TL701", site, f"the DataLoader created at line {site[0][1] if site else '?'} uses "
                                     f"{type(sampler).__name__}")

    def scheduler_step(self, orig):
        probes = self

        def step(sched, *args, **kwargs):
            f = sys._getframe(1)
            if probes.suspended or f.f_code.co_name in ("_initial_step", "__init__"):
                return orig(sched, *args, **kwargs)
            opt = getattr(sched, "optimizer", None)
            if id(sched) not in probes.sched_first and opt is not None:
                probes.sched_first.add(id(sched))
                st = probes.opt_state(opt)
                sites = probes.sites()
                if sites:
                    try:
                        lr0 = opt.param_groups[0]["lr"]
                    except Exception:
                        lr0 = None
                    if st.steps == 0:
                        r = orig(sched, *args, **kwargs)
                        try:
                            lr1 = opt.param_groups[0]["lr"]
                        except Exception:
                            lr1 = None
                        probes.obs("TL105", sites, f"step {probes.backwards + 1}: scheduler.step() at line "
                                                   f"{sites[0][1]} "
                                                   f"ran before the first optimizer.step() of {st.name}: the "
                                                   f"learning rate moved from {_fmt(lr0)} to {_fmt(lr1)} before "
                                                   f"any update used it")
                        return r
                    probes.anti("TL105", sites, f"scheduler.step() at line {sites[0][1]} first ran after "
                                                f"{st.steps} optimizer step(s)")
            return orig(sched, *args, **kwargs)
        return step

    def anomaly_setter(self, orig):
        probes = self

        def set_detect_anomaly(mode, *args, **kwargs):
            if not probes.suspended:
                sites = probes.sites()
                if sites:
                    probes.user_anomaly = bool(mode)
                    if mode:
                        probes.anomaly_site = sites
            return orig(mode, *args, **kwargs)
        return set_detect_anomaly

    def _direct_forward(self, frame):
        """TL303: a module's forward() entered straight from user code, not through Module.__call__."""
        caller = frame.f_back
        if caller is None or self.suspended or not self._is_user(caller.f_code.co_filename):
            return
        try:
            names = frame.f_code.co_varnames
            obj = frame.f_locals.get(names[0]) if names and frame.f_code.co_argcount else None
        except Exception:
            return
        if not isinstance(obj, nn.Module):
            return
        if caller.f_code.co_name == "forward":  # super().forward(x) inside the module's own forward
            try:
                cnames = caller.f_code.co_varnames
                if cnames and caller.f_locals.get(cnames[0]) is obj:
                    return
            except Exception:
                return
        import torch.nn.modules.module as modmod

        own = len(obj._forward_hooks) + len(obj._forward_pre_hooks)
        glob = len(modmod._global_forward_hooks) + len(modmod._global_forward_pre_hooks)
        sites = [[os.path.abspath(caller.f_code.co_filename), caller.f_lineno, caller.f_code.co_name]]
        f = caller.f_back
        while f is not None and len(sites) < 8:
            if self._is_user(f.f_code.co_filename):
                sites.append([os.path.abspath(f.f_code.co_filename), f.f_lineno, f.f_code.co_name])
            f = f.f_back
        self.obs("TL303", sites, f"step {self.backwards + 1}: {type(obj).__name__}.forward() was called directly at "
                                 f"line {caller.f_lineno}: Module.__call__ did not run, so no forward hook ran for "
                                 f"this call ({own} registered on the module itself and {glob} global ones, among "
                                 f"them the probes' own forward pre-hook, which saw no call)",
                 weak=own == 0 and glob <= 2)

    def norm_init(self, orig):
        """TL703: the eps of every normalisation layer built, and what it does to a unit-variance batch."""
        probes = self

        def __init__(mod, *args, **kwargs):
            orig(mod, *args, **kwargs)
            if probes.suspended or "TL703" not in probes.codes:
                return
            sites = probes.sites()
            eps = getattr(mod, "eps", None)
            if not sites or not isinstance(eps, float):
                return
            name, line = type(mod).__name__, sites[0][1]
            if eps <= 1e-3:
                probes.anti("TL703", sites, f"{name} built at line {line} has eps={eps:g}")
                return
            effect = probes._norm_effect(mod)
            probes.obs("TL703", sites, f"{name} built at line {line} has eps={_fmt(eps)} (momentum="
                                       f"{getattr(mod, 'momentum', None)}): it normalises by sqrt(var + {_fmt(eps)}) "
                                       f"instead of sqrt(var + 1e-05)" + effect)
        return __init__

    def _norm_effect(self, mod) -> str:
        import copy

        n = getattr(mod, "num_features", 0)
        if not isinstance(n, int) or n <= 0 or n > 4096:
            return ""
        self.suspended += 1
        try:
            m = copy.deepcopy(mod).float().train()
            torch.manual_seed(0)
            for shape in ((16, n), (8, n, 4, 4), (4, n, 2, 2, 2), (2, n, 16)):
                try:
                    with torch.no_grad():
                        x = torch.randn(*shape, device=next(m.parameters(), torch.zeros(())).device)
                        y = m(x)
                    return (f"; on a unit-variance batch of shape {list(shape)} its output had standard deviation "
                            f"{_fmt(float(y.std()))} instead of {_fmt(float(x.std()))}")
                except Exception:
                    continue
        except Exception:
            return ""
        finally:
            self.suspended -= 1
        return ""

    # ------------------------------------------------------------------ state_dict snapshots (TL206)
    def state_dict_wrapper(self, orig, is_module):
        probes = self

        def state_dict(obj, *args, **kwargs):
            if probes.suspended or "TL206" not in probes.codes or probes.sd_depth:
                return orig(obj, *args, **kwargs)
            probes.sd_depth += 1
            try:
                r = orig(obj, *args, **kwargs)
            finally:
                probes.sd_depth -= 1
            if args or kwargs.get("destination") is not None or kwargs.get("keep_vars"):
                return r
            sites = probes.sites()
            if sites and len(probes.snapshots) < 32:
                ts = list(_tensors(r.get("state") if not is_module and isinstance(r, dict) else r, depth=-1))
                entries = [(weakref.ref(t), _checksum(t)) for t in ts[:256] if t.is_floating_point()]
                if entries:
                    probes.snapshots.append({"sites": sites, "step": probes.opt_steps, "entries": entries,
                                             "what": "optimizer" if not is_module else "model",
                                             "name": type(obj).__name__, "done": False})
            return r
        return state_dict

    def _check_snapshots(self):
        """After an optimizer step: did the state_dict() snapshots kept by the program change with it?"""
        for snap in self.snapshots:
            if snap["done"] or snap["step"] >= self.opt_steps:
                continue
            alive = [(r(), c) for r, c in snap["entries"] if r() is not None]
            sites, line = snap["sites"], snap["sites"][0][1]
            if not alive:
                snap["done"] = True
                self.anti("TL206", sites, f"the {snap['name']}.state_dict() taken at line {line} was not kept past "
                                          f"the next step (a copy was kept instead)")
                continue
            changed = sum(1 for t, c in alive if _checksum(t) != c)
            if changed:
                snap["done"] = True
                snap["changed"] = (changed, len(alive), self.opt_steps)
                self.obs("TL206", sites, f"step {self.opt_steps}: the {snap['name']}.state_dict() kept at line {line} "
                                         f"(after step {snap['step']}) changed with the next optimizer step: "
                                         f"{changed} of its {len(alive)} tensors are the {snap['what']}'s live "
                                         f"tensors, not a copy, so restoring it restores the current values",
                         weak=True)
        if len(self.snapshots) > 24:
            self.snapshots = [x for x in self.snapshots if not x["done"]][-24:]

    def load_state_dict_wrapper(self, orig):
        probes = self

        def load_state_dict(obj, state_dict, *args, **kwargs):
            if not probes.suspended and "TL206" in probes.codes and isinstance(state_dict, dict):
                ids = {id(t) for t in _tensors(state_dict, depth=-1)}
                for snap in probes.snapshots:
                    if any(r() is not None and id(r()) in ids for r, _ in snap["entries"]) and snap.get("changed"):
                        sites = probes.sites()
                        changed, n, step = snap["changed"]
                        probes.obs("TL206", snap["sites"] + sites,
                                   f"the {snap['name']}.state_dict() kept at line {snap['sites'][0][1]} after step "
                                   f"{snap['step']} was restored at line {sites[0][1] if sites else '?'}, but "
                                   f"{changed} of its {n} tensors were the live tensors and had changed with the "
                                   f"training steps since (first at step {step}): the restore restored nothing",
                                   key=("TL206-restore", tuple(snap["sites"][0][:2])))
            return orig(obj, state_dict, *args, **kwargs)
        return load_state_dict

    # ------------------------------------------------------------------ GradScaler (TL106, TL107)
    def scaler_scale(self, orig):
        probes = self

        def scale(scaler, outputs):
            out = orig(scaler, outputs)
            if not probes.suspended and getattr(scaler, "_enabled", False):
                try:
                    sc = float(scaler.get_scale())
                except Exception:
                    sc = None
                for t in _tensors(out):
                    probes._tag(probes.scaled, t, sc)
            return out
        return scale

    def scaler_unscale(self, orig):
        probes = self

        def unscale_(scaler, optimizer):
            r = orig(scaler, optimizer)
            if not probes.suspended and isinstance(optimizer, torch.optim.Optimizer):
                st = probes.opt_state(optimizer)
                st.unscaled = True
                st.scaled_by = None
            return r
        return unscale_

    def scaler_init(self, orig):
        probes = self

        def __init__(scaler, *args, **kwargs):
            orig(scaler, *args, **kwargs)
            want = kwargs.get("enabled", args[5] if len(args) > 5 else True)
            if probes.cuda_standin and want and not getattr(scaler, "_enabled", True) and \
                    getattr(scaler, "_device", "") == "cuda" and {"TL106", "TL107"} & probes.codes:
                args = list(args)
                if args:
                    args[0] = "cpu"
                else:
                    kwargs["device"] = "cpu"
                orig(scaler, *args, **kwargs)
                sites = probes.sites()
                probes.standin("scaler", f"the GradScaler built at line {sites[0][1] if sites else '?'} for CUDA "
                                         f"was enabled on the CPU (torch disables it without CUDA)", sites)
        return __init__

    def clip_wrapper(self, orig, kind):
        probes = self

        def clip(parameters, *args, **kwargs):
            if probes.suspended or not ({"TL106"} & probes.codes):
                return orig(parameters, *args, **kwargs)
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            parameters = list(parameters)
            r = orig(parameters, *args, **kwargs)
            ids = {id(p) for p in parameters}
            sites = probes.sites()
            if not sites:
                return r
            line = sites[0][1]
            limit = args[0] if args else kwargs.get("max_norm", kwargs.get("clip_value"))
            for st in list(probes.opts.values()):
                opt = st.ref()
                if opt is None or not any(id(p) in ids for p in probes._params(opt)):
                    continue
                if st.scaled_by is not None:
                    sc, bsites = st.scaled_by
                    if kind == "norm" and isinstance(r, torch.Tensor):
                        norm = float(r)
                        size = (f"total norm {_fmt(norm)}, {_fmt(norm / sc)} once unscaled" if sc else
                                f"total norm {_fmt(norm)}")
                    else:
                        size = "values"
                    probes.obs("TL106", sites, f"step {probes.backwards}: {kind == 'norm' and 'clip_grad_norm_' or 'clip_grad_value_'}"
                                               f"() at line {line} clipped the gradients of {st.name} while they were "
                                               f"still multiplied by the GradScaler's scale {_fmt(sc)} (scaled "
                                               f"backward at line {bsites[0][1] if bsites else '?'}; {size}) against "
                                               f"{_fmt(float(limit)) if isinstance(limit, (int, float)) else limit}: the "
                                               f"threshold applies to gradients {_fmt(sc)} times too large")
                elif st.unscaled:
                    probes.anti("TL106", sites, f"clipping at line {line} ran after scaler.unscale_(): the gradients "
                                                f"were unscaled")
            return r
        return clip

    # ------------------------------------------------------------------ graph retention
    def _measure_graphs(self, k):
        holders = {}
        f = sys._getframe(2)
        seen_frames = 0
        while f is not None and seen_frames < 12:
            co = f.f_code
            if self._is_user(co.co_filename):
                seen_frames += 1
                loc = f.f_locals
                scope = (os.path.abspath(co.co_filename), co.co_firstlineno, co.co_name)
                for nm, v in list(loc.items()):
                    if nm.startswith("__"):
                        continue
                    holders[(scope, nm)] = v
                    if nm != "self" and self._user_object(v):
                        # a metric or meter object of the program (``train_loss = Metric(...)``):
                        # what its own attributes hold is held by the variable
                        holders[(scope, nm)] = [av for av in list(vars(v).values())[:200]
                                                if isinstance(av, (torch.Tensor, list, dict, tuple))]
                    if nm == "self" and hasattr(v, "__dict__"):
                        for an, av in list(vars(v).items())[:200]:
                            if isinstance(av, (torch.Tensor, list, dict, tuple)) and not isinstance(av, nn.Module):
                                holders[(scope, "self." + an)] = av
            f = f.f_back
        for key, v in holders.items():
            roots = [t.grad_fn for t in _tensors(v) if t.grad_fn is not None][:64]
            prev = self.prev_roots.get(key)
            if roots:
                seen = _reachable(roots)
                n = len(seen)
                # the holder still reaches the graph it held at the previous backward: it retains it
                kept = bool(prev) and all(id(r) in seen for r in prev)
                self.prev_roots[key] = roots  # strong references until the next measurement
            else:
                n, kept = 0, False
                self.prev_roots.pop(key, None)
            s = self.series.setdefault(key, [])
            if len(s) < 64:
                dims = max((t.dim() for t in _tensors(v) if t.grad_fn is not None), default=0)
                s.append((k, n, dims, kept))

    def _user_object(self, v) -> bool:
        """An instance of a plain class (not a module, not a tensor) defined in the program."""
        if isinstance(v, (torch.Tensor, nn.Module, type)) or not hasattr(v, "__dict__"):
            return False
        path = getattr(sys.modules.get(type(v).__module__), "__file__", None)
        return bool(path) and self._is_user(path)

    def graph_findings(self):
        """Variables whose reachable autograd graph grew at least twice without shrinking."""
        out = []
        for (scope, name), s in self.series.items():
            best = None
            run = [s[0]] if s else []
            for prev, cur in zip(s, s[1:]):
                if (cur[3] or prev[1] == 0) and cur[1] >= prev[1]:
                    run.append(cur)
                else:
                    run = [cur]
                ups = sum(1 for a, b in zip(run, run[1:]) if b[1] > a[1])
                if ups >= 2 and (best is None or len(run) > len(best)):
                    best = list(run)
            if best is None:
                continue
            dims = best[-1][2]
            mem = ""
            if self.cuda_mem:
                mem = "; CUDA memory allocated after each backward: " + ", ".join(
                    f"{m / 2**20:.2f} MiB" for m in self.cuda_mem[:len(s)][best[0][0] - 1:best[-1][0]])
            out.append(dict(codes=["TL501", "TL502"], names=[name], scope=list(scope),
                            sites=[[scope[0], scope[1], scope[2]]],
                            evidence=(f"steps {best[0][0]}–{best[-1][0]}: `{name}` kept the autograd graph of "
                                      f"every step (each step's graph still reachable at the next): "
                                      f"{_series(best)} graph nodes "
                                      f"reachable from it after each backward"
                                      f"{' (tensors of ' + str(dims) + ' dims)' if dims else ''}{mem}")))
        return out

    # ------------------------------------------------------------------ end of run
    def checkpoint(self, final=False, status=None):
        opts = []
        for st in self.opts.values():
            opts.append({"name": st.name, "steps": st.steps, "bw": st.bw_count, "first_bw": st.first_bw_site,
                         "step_site": st.step_site})
        self.emit("state", final=final, status=status, backwards=self.backwards, opt_steps=self.opt_steps,
                  forwards=self.forwards, opts=opts, loader_batches=self.loader_batches,
                  cuda_mem=self.cuda_mem[-8:] if self.cuda_mem else None)

    def finish(self, status):
        self.emit("fwdsum", first_eval=self.first_eval, sites=list(self.fwd_sum.values())[:400])
        for g in self.graph_findings():
            self.emit("obs", step=self.backwards, **g)
        for st in self.opts.values():
            opt = st.ref()
            if st.await101 is not None:  # no step applied that backward's gradients: TL101 stands
                self.obs("TL101", *st.await101)
                st.await101 = None
            if "TL108" in self.codes and opt is not None and st.steps and not st.bw_count and st.idle and \
                    st.step_site:
                n, have, _ = self.grad_state(opt)
                self._obs108(st, st.step_site, "optimizer.step()", n, have)
            if st.bw_count and st.steps == 0 and st.first_bw_site:
                self.emit("end104", sites=st.first_bw_site,
                          evidence=f"{st.bw_count} backward() call(s) computed gradients for the parameters "
                                   f"of {st.name} (first at line {st.first_bw_site[0][1]}), and "
                                   f"{st.name}.step() never ran: the weights never changed")
            elif st.bw_count and st.steps:
                self.emit("anti104", sites=st.first_bw_site or [],
                          evidence=f"{st.name}.step() ran {st.steps} time(s) after {st.bw_count} backward() call(s)")
        self.checkpoint(final=True, status=status)


class _Spellings:
    """Set-like: does a code object's filename resolve to one of the target files?"""

    def __init__(self, targets):
        self.targets = targets
        self.cache: dict = {}

    def __contains__(self, name):
        r = self.cache.get(name)
        if r is None:
            r = os.path.abspath(name) in self.targets if not name.startswith("<") else False
            self.cache[name] = r
        return r


def _torch_caller(frame) -> bool:
    """Whether the first frame outside the probes (from ``frame`` outwards) is torch's own code."""
    while frame is not None:
        fn = os.path.abspath(frame.f_code.co_filename)
        if not fn.startswith(_HERE):
            return fn.startswith(_TORCH_DIR + os.sep)
        frame = frame.f_back
    return False


def _graph(fn, limit=200000):
    """The autograd nodes reachable from ``fn`` (Python objects kept alive as the values, so
    their ids stay theirs while the result lives) and the parameters at its leaves, as
    (id of the node above, tensor)."""
    seen: dict = {}
    leaves = []
    stack = [fn]
    while stack and len(seen) < limit:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen[id(f)] = f
        try:
            nxt = f.next_functions
        except Exception:
            continue
        for n, _ in nxt:
            if n is None:
                continue
            if type(n).__name__ == "AccumulateGrad":
                var = getattr(n, "variable", None)
                if var is not None:
                    leaves.append((id(f), var))
                continue
            if id(n) not in seen:
                stack.append(n)
    return seen, leaves


def _grad_sig(p):
    g = p.grad
    return None if g is None else (id(g), g._version)


def _checksum(t):
    try:
        with torch.no_grad():
            x = t.detach().double()
            return (float(x.sum()), float(x.abs().sum()))
    except Exception:
        return None


def _series(run) -> str:
    vals = [str(e[1]) for e in run]
    if len(vals) > 7:
        vals = vals[:3] + ["…"] + vals[-3:]
    return " → ".join(vals)


def _reachable(fns, limit=200000):
    """The autograd nodes reachable from ``fns`` (AccumulateGrad leaves excluded), by id.

    The Python objects of the nodes are kept alive (as the values) for as long as the result
    is: a node's Python wrapper may be created afresh by each ``next_functions`` and freed as
    soon as it is dropped (whether the C++ node keeps it alive depends on the torch version),
    so an id alone could be reused by another node of the same walk, which would then be
    skipped as seen and the graph under it not counted.
    """
    seen: dict = {}
    stack = list(fns)
    while stack and len(seen) < limit:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        if type(fn).__name__ == "AccumulateGrad":
            continue
        seen[id(fn)] = fn
        try:
            for n, _ in fn.next_functions:
                if n is not None and id(n) not in seen:
                    stack.append(n)
        except Exception:
            pass
    return seen


# ----------------------------------------------------------------------- install
_INSTALLED = {}
_ANOMALY = [None]


def install(cfg: dict, emit: Writer) -> Probes:
    """Install every probe once per process; later calls reuse them with a fresh state."""
    if "probes" in _INSTALLED:
        p = _INSTALLED["probes"]
        p.cfg = cfg
        p.emit = emit
        p.codes = set(cfg.get("codes") or ())
        p.targets = {os.path.abspath(k): set(v) for k, v in (cfg.get("targets") or {}).items()}
        p.user_files = {os.path.abspath(x) for x in cfg.get("user_files", ())}
        p._fn_cache = {}
        p.reset()
        standins.install(p)
        return p
    p = Probes(cfg, emit)
    standins.install(p)
    _INSTALLED["probes"] = p
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    import torch.nn.modules.module as modmod
    from torch.utils.data import DataLoader

    register_optimizer_step_pre_hook(p.step_pre)
    register_optimizer_step_post_hook(p.step_post)
    modmod.register_module_forward_pre_hook(p.fwd_pre)
    modmod.register_module_forward_hook(p.fwd_post, always_call=True)
    orig_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self, *a, **k):
        orig_opt_init(self, *a, **k)
        st = p.opt_state(self)
        st.born = p.param_seq
        if "TL205" in p.codes and not p.suspended:
            st.born_sites = p.sites()
    torch.optim.Optimizer.__init__ = opt_init
    orig_param_new = nn.Parameter.__new__

    def param_new(cls, *a, **k):
        param = orig_param_new(cls, *a, **k)
        if "TL205" in p.codes and not p.suspended:
            p.param_born(param)
        return param
    nn.Parameter.__new__ = staticmethod(param_new)
    nn.modules.loss._Loss.__init__ = p.loss_init(nn.modules.loss._Loss.__init__)
    torch.Tensor.backward = p.backward_wrapper(torch.Tensor.backward, True)
    torch.autograd.backward = p.backward_wrapper(torch.autograd.backward, False)
    torch.optim.Optimizer.zero_grad = p.zero_grad_wrapper(torch.optim.Optimizer.zero_grad, False)
    nn.Module.zero_grad = p.zero_grad_wrapper(nn.Module.zero_grad, True)
    nn.Module.to = p.module_to(nn.Module.to, False)
    nn.Module.cuda = p.module_to(nn.Module.cuda, True)
    DataLoader.__init__ = p.loader_init(DataLoader.__init__)
    DataLoader.__iter__ = p.loader_iter(DataLoader.__iter__)
    try:
        from torch.amp.grad_scaler import GradScaler

        GradScaler.step = p.scaler_step(GradScaler.step)
    except Exception:
        pass
    from torch.nn.modules.batchnorm import _NormBase

    _NormBase.__init__ = p.norm_init(_NormBase.__init__)
    nn.Module.state_dict = p.state_dict_wrapper(nn.Module.state_dict, True)
    torch.optim.Optimizer.state_dict = p.state_dict_wrapper(torch.optim.Optimizer.state_dict, False)
    nn.Module.load_state_dict = p.load_state_dict_wrapper(nn.Module.load_state_dict)
    torch.optim.Optimizer.load_state_dict = p.load_state_dict_wrapper(torch.optim.Optimizer.load_state_dict)
    try:
        from torch.amp.grad_scaler import GradScaler

        GradScaler.__init__ = p.scaler_init(GradScaler.__init__)
        GradScaler.scale = p.scaler_scale(GradScaler.scale)
        GradScaler.unscale_ = p.scaler_unscale(GradScaler.unscale_)
    except Exception:
        pass
    import torch.nn.utils as nnutils
    import torch.nn.utils.clip_grad as clipmod

    for attr, kind in (("clip_grad_norm_", "norm"), ("clip_grad_value_", "value")):
        orig = getattr(nnutils, attr, None)
        if orig is not None:
            w = p.clip_wrapper(orig, kind)
            setattr(nnutils, attr, w)
            if getattr(clipmod, attr, None) is orig:
                setattr(clipmod, attr, w)
    from torch.optim import lr_scheduler

    lr_scheduler.LRScheduler.step = p.scheduler_step(lr_scheduler.LRScheduler.step)
    if hasattr(lr_scheduler, "ReduceLROnPlateau") and "step" in vars(lr_scheduler.ReduceLROnPlateau):
        lr_scheduler.ReduceLROnPlateau.step = p.scheduler_step(lr_scheduler.ReduceLROnPlateau.step)
    _ANOMALY[0] = torch.set_anomaly_enabled
    orig_set = torch.autograd.set_detect_anomaly
    p._orig_set_anomaly = orig_set
    torch.autograd.set_detect_anomaly = p.anomaly_setter(orig_set)
    try:
        orig_da_init = torch.autograd.detect_anomaly.__init__

        def da_init(self, check_nan=True):
            if not p.suspended:
                sites = p.sites()
                if sites:
                    p.user_anomaly = True
                    p.anomaly_site = sites
            orig_da_init(self, check_nan)
        torch.autograd.detect_anomaly.__init__ = da_init
    except Exception:
        pass
    import argparse

    orig_error = argparse.ArgumentParser.error

    def arg_error(parser, message):  # the reason a script exits with status 2
        p.emit("argerr", message=str(message)[:300])
        return orig_error(parser, message)
    argparse.ArgumentParser.error = arg_error
    p.__enter__()  # the TorchFunctionMode stays on for the whole run
    return p


def set_anomaly(p: Probes, on: bool) -> None:
    """Turn anomaly detection on or off without it counting as the user's call."""
    try:
        _ANOMALY[0](on, True)
    except Exception:
        pass

"""Planted bugs: recall on real training files (issue 20).

Takes the training files of the real-world benchmark's checkouts (``benchmarks/realworld/
manifest.toml``), plants one known bug at a time into a copy of a file's text (a *mutant*),
lints the mutant inside its own project (the other files of the repository as they are) and
asks whether torchlint reports the planted bug at the place it was planted.

    python benchmarks/planted.py [--root DIR] [--part tuned|heldout] [--batch N]
                                 [--repo SUBSTR] [--per-op N] [--jobs N] [--markdown] [--json OUT] [-v]

Operators (each a bug class of a default or preview rule; a site is taken only where the
planted change is a bug in that code, see ``OPERATORS``):

* ``drop-zero-grad`` (TL103): the only ``zero_grad()`` of a loop that runs ``backward()`` and
  ``step()`` becomes ``pass``.
* ``step-before-backward`` (TL101): an optimizer ``step()`` that follows ``backward()`` in
  the same block is moved just above it.
* ``zero-grad-after-backward`` (TL102): the ``zero_grad()`` above a ``backward()`` of the
  same block is moved just below it (between the backward and the step).
* ``scheduler-before-step`` (TL105): a scheduler ``step()`` after the optimizer ``step()``
  in the same block is moved above it.
* ``softmax-into-ce`` (TL401): the first argument of a ``CrossEntropyLoss``/``cross_entropy``
  call is wrapped in ``torch.softmax(..., dim=1)``.
* ``sigmoid-into-bce-logits`` (TL402): the same with ``torch.sigmoid`` and
  ``BCEWithLogitsLoss``/``binary_cross_entropy_with_logits``.
* ``float-targets`` (TL404): the target of a ``CrossEntropyLoss``/``cross_entropy`` call
  gets ``.float()``.
* ``drop-no-grad`` (TL203): a ``with torch.no_grad():`` (or ``inference_mode()``) around an
  evaluation loop (a ``for`` loop, no backward or step in the block) is removed, its body
  dedented.
* ``loss-item-dropped`` (TL501): ``total += loss.item()`` (``loss`` being backwarded in the
  same function) becomes ``total += loss``.
* ``drop-batch-move`` (TL601): ``x = x.to(device)`` / ``x = x.cuda()`` of a name bound by the
  ``for`` of a loop that runs ``backward()`` becomes ``pass``, when the model was moved.
* ``drop-shuffle`` (TL701): ``shuffle=True`` is removed from a ``DataLoader(...)`` assigned to a
  name that a ``for`` loop running ``backward()`` iterates in the same file.
* ``drop-eval`` (TL201, preview): a statement ``model.eval()`` directly followed (within 3
  statements) by a ``with torch.no_grad():`` becomes ``pass``.

A planted bug is *found* when the mutant has a finding of the operator's code within 3 lines
of the planted site (for ``drop-no-grad``, ``drop-zero-grad`` and ``drop-eval``: anywhere in
the loop or block the change affects) that the original file does not have there. A site
where the original file already has such a finding is *already reported* and not scored.
Other findings the mutant gains are counted as *other new findings*.

A notebook is mutated and linted as the program of its code cells (``notebook.load(path).text``,
what ``lint_cells`` lints: IPython lines neutralised, line for line), so its sites are program
lines, not ``cell N, line M``; a notebook whose program libcst cannot parse is skipped. The
results never depend on the order: sites are taken in file order, files in sorted order.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from typing import Callable, Iterator, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import libcst as cst  # noqa: E402
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider  # noqa: E402

from torchlint import notebook  # noqa: E402
from torchlint.discover import discover, module_name_for  # noqa: E402
from torchlint.engine import LintOptions, lint_text, run  # noqa: E402
from torchlint.project import Workspace  # noqa: E402
from torchlint.selection import enabled_codes  # noqa: E402
from torchlint.source import SourceError, read_source  # noqa: E402

import realworld  # noqa: E402  (benchmarks/realworld.py: the manifest)


class Mutant(NamedTuple):
    op: str
    code: str
    text: str
    lo: int  # the lines (1-based, in the mutant) where the planted bug must be reported
    hi: int
    orig_lo: int  # the same place in the original file
    orig_hi: int


def _lines(text: str) -> list:
    return text.splitlines(keepends=True)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


class _Sites:
    """The parsed file with positions and parents."""

    def __init__(self, text: str):
        self.text = text
        self.lines = _lines(text)
        self.wrapper = MetadataWrapper(cst.parse_module(text), unsafe_skip_copy=True)
        self.pos = self.wrapper.resolve(PositionProvider)
        self.parent = self.wrapper.resolve(ParentNodeProvider)
        self.module = self.wrapper.module

    def code(self, node) -> str:
        return self.module.code_for_node(node)

    def line(self, node) -> int:
        return self.pos[node].start.line

    def end(self, node) -> int:
        return self.pos[node].end.line

    def nodes(self, kind) -> list:
        return [n for n in self.pos if isinstance(n, kind)]

    def enclosing(self, node, kinds):
        p = self.parent.get(node)
        while p is not None and not isinstance(p, kinds):
            p = self.parent.get(p)
        return p

    def single_line(self, stmt) -> bool:
        return self.line(stmt) == self.end(stmt) and self.lines[self.line(stmt) - 1].strip() == self.code(stmt).strip()


def _call_stmt(s: _Sites, stmt, attr: str) -> Optional[cst.Call]:
    """``stmt`` is a simple statement whose one expression is ``X.attr(...)``."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    e = stmt.body[0]
    if not isinstance(e, cst.Expr) or not isinstance(e.value, cst.Call):
        return None
    f = e.value.func
    if isinstance(f, cst.Attribute) and f.attr.value == attr:
        return e.value
    return None


def _receiver(call: cst.Call) -> str:
    return cst.Module([]).code_for_node(call.func.value) if isinstance(call.func, cst.Attribute) else ""


def _is_backward(s: _Sites, stmt) -> bool:
    c = _call_stmt(s, stmt, "backward")
    return c is not None


_OPT_NAME = re.compile(r"(^|[._])(opt|optim|optimizer|optimiser)[a-z_0-9]*$|optimizer", re.I)
_SCHED_NAME = re.compile(r"sched|lr_", re.I)


def _is_opt_step(s: _Sites, stmt) -> bool:
    c = _call_stmt(s, stmt, "step")
    return c is not None and bool(_OPT_NAME.search(_receiver(c))) and not _SCHED_NAME.search(_receiver(c))


def _is_sched_step(s: _Sites, stmt) -> bool:
    c = _call_stmt(s, stmt, "step")
    return c is not None and bool(_SCHED_NAME.search(_receiver(c)))


def _blocks(s: _Sites) -> Iterator[list]:
    for n in s.nodes(cst.IndentedBlock):
        yield list(n.body)


def _replace_line(lines: list, ln: int, new: str) -> list:
    out = list(lines)
    old = out[ln - 1]
    nl = old[len(old.rstrip("\r\n")):] or "\n"
    out[ln - 1] = _indent(old) + new + nl
    return out


def _swap(lines: list, a: int, b: int) -> list:
    """Move single line ``b`` to just above line ``a`` (a < b), keeping ``b``'s indentation
    as ``a``'s."""
    out = list(lines)
    moved = out.pop(b - 1)
    moved = _indent(out[a - 1]) + moved.lstrip(" \t")
    out.insert(a - 1, moved)
    return out


def op_drop_zero_grad(s: _Sites):
    for loop in s.nodes((cst.For, cst.While)):
        body = s.code(loop)
        if body.count("zero_grad(") != 1 or ".backward(" not in body or ".step(" not in body:
            continue
        if re.search(r"\.grad\s*=\s*None|\.grad\.zero_\(|set_to_none|zero_grad\(\)\s*$", body, re.M) and \
                body.count("zero_grad(") + len(re.findall(r"\.grad\s*=\s*None|\.grad\.zero_\(", body)) > 1:
            continue
        inner = [n for n in s.nodes((cst.For, cst.While)) if n is not loop and s.enclosing(n, (cst.For, cst.While)) is loop
                 and "zero_grad(" in s.code(n)]
        if inner:
            continue  # the innermost loop holding it is visited on its own
        for stmt in s.nodes(cst.SimpleStatementLine):
            if _call_stmt(s, stmt, "zero_grad") is not None and s.enclosing(stmt, (cst.For, cst.While)) is loop \
                    and s.single_line(stmt):
                ln = s.line(stmt)
                text = "".join(_replace_line(s.lines, ln, "pass"))
                yield Mutant("drop-zero-grad", "TL103", text, s.line(loop), s.end(loop), s.line(loop), s.end(loop))
                break


def op_step_before_backward(s: _Sites):
    for block in _blocks(s):
        for i, st in enumerate(block):
            if not _is_backward(s, st) or not s.single_line(st):
                continue
            for st2 in block[i + 1:i + 6]:
                if _is_opt_step(s, st2) and s.single_line(st2):
                    a, b = s.line(st), s.line(st2)
                    text = "".join(_swap(s.lines, a, b))
                    yield Mutant("step-before-backward", "TL101", text, a, a + 1, a, b)
                    break
            break


def op_zero_grad_after_backward(s: _Sites):
    for block in _blocks(s):
        zg = next((st for st in block if _call_stmt(s, st, "zero_grad") is not None and s.single_line(st)), None)
        if zg is None:
            continue
        i = block.index(zg)
        bw = next((st for st in block[i + 1:] if _is_backward(s, st) and s.single_line(st)), None)
        if bw is None:
            continue
        j = block.index(bw)
        if not any(_is_opt_step(s, st) for st in block[j + 1:]):
            continue
        a, b = s.line(zg), s.line(bw)
        out = list(s.lines)
        moved = out.pop(a - 1)
        out.insert(b - 1, moved)  # now just below the backward (which moved up one line)
        yield Mutant("zero-grad-after-backward", "TL102", "".join(out), b - 1, b, a, b)


def op_scheduler_before_step(s: _Sites):
    for block in _blocks(s):
        for i, st in enumerate(block):
            if not _is_opt_step(s, st) or not s.single_line(st):
                continue
            for st2 in block[i + 1:i + 4]:
                if _is_sched_step(s, st2) and s.single_line(st2) and _call_stmt(s, st2, "step").args == ():
                    a, b = s.line(st), s.line(st2)
                    yield Mutant("scheduler-before-step", "TL105", "".join(_swap(s.lines, a, b)), a, a + 1, a, b)
                    break
            break


def _loss_calls(s: _Sites, kinds: tuple, funcs: tuple) -> Iterator[cst.Call]:
    """Calls of a loss instance built from ``nn.<kind>`` in this file, or of ``F.<func>``."""
    names = set()
    for a in s.nodes(cst.Assign):
        if isinstance(a.value, cst.Call):
            callee = s.code(a.value.func)
            if callee.rsplit(".", 1)[-1] in kinds and len(a.targets) == 1:
                names.add(s.code(a.targets[0].target))
    for c in s.nodes(cst.Call):
        callee = s.code(c.func)
        if (callee in names or callee.rsplit(".", 1)[-1] in funcs) and len(c.args) >= 2 \
                and all(x.keyword is None and not x.star for x in c.args[:2]) and s.line(c) == s.end(c):
            yield c


def _wrap(s: _Sites, expr, pre: str, post: str) -> Optional[str]:
    p = s.pos[expr]
    if p.start.line != p.end.line:
        return None
    ln = p.start.line
    line = s.lines[ln - 1]
    new = line[:p.start.column] + pre + line[p.start.column:p.end.column] + post + line[p.end.column:]
    out = list(s.lines)
    out[ln - 1] = new
    return "".join(out)


def _torch_name(s: _Sites) -> Optional[str]:
    m = re.search(r"^import torch\s*$", s.text, re.M)
    return "torch" if m else None


def _loss_arg_mutant(s: _Sites, op: str, code: str, kinds: tuple, funcs: tuple, arg: int, pre: str, post: str):
    """The first loss call of a training function with its argument ``arg`` wrapped."""
    for c in _loss_calls(s, kinds, funcs):
        if not _in_training_function(s, c):
            continue
        text = _wrap(s, c.args[arg].value, pre, post)
        if text:
            return Mutant(op, code, text, s.line(c), s.line(c), s.line(c), s.line(c))
    return None


def op_softmax_into_ce(s: _Sites):
    t = _torch_name(s)
    m = _loss_arg_mutant(s, "softmax-into-ce", "TL401", ("CrossEntropyLoss",), ("cross_entropy",), 0,
                         f"{t}.softmax(" if t else "(", ", dim=1)" if t else ").softmax(dim=1)")
    if m:
        yield m


def op_sigmoid_into_bce_logits(s: _Sites):
    t = _torch_name(s)
    m = _loss_arg_mutant(s, "sigmoid-into-bce-logits", "TL402", ("BCEWithLogitsLoss",),
                         ("binary_cross_entropy_with_logits",), 0,
                         f"{t}.sigmoid(" if t else "(", ")" if t else ").sigmoid()")
    if m:
        yield m


def op_float_targets(s: _Sites):
    m = _loss_arg_mutant(s, "float-targets", "TL404", ("CrossEntropyLoss", "NLLLoss"), ("cross_entropy", "nll_loss"),
                         1, "(", ").float()")
    if m:
        yield m


def _in_training_function(s: _Sites, node) -> bool:
    """The node sits in a function (or the module) whose text runs ``backward()``."""
    fn = s.enclosing(node, (cst.FunctionDef,))
    return ".backward(" in (s.code(fn) if fn is not None else s.text)


def op_drop_no_grad(s: _Sites):
    for w in s.nodes(cst.With):
        if len(w.items) != 1 or not isinstance(w.items[0].item, cst.Call) or w.items[0].asname is not None:
            continue
        if s.code(w.items[0].item.func) not in ("torch.no_grad", "torch.inference_mode"):
            continue
        if not isinstance(w.body, cst.IndentedBlock) or not any(isinstance(st, cst.For) for st in w.body.body):
            continue
        body = s.code(w.body)
        if ".backward(" in body or ".step(" in body or "autograd.grad" in body:
            continue
        a, b = s.line(w), s.end(w)
        if s.lines[a - 1].strip() != s.code(w).splitlines()[0].strip():
            continue
        head = _indent(s.lines[a - 1])
        inner = _indent(s.lines[s.line(w.body.body[0]) - 1])
        if not inner.startswith(head) or len(inner) <= len(head):
            continue
        cut = len(inner) - len(head)
        out = s.lines[:a - 1]
        for ln in range(a + 1, b + 1):
            line = s.lines[ln - 1]
            out.append(line[cut:] if line[:cut].strip() == "" and len(line) > cut else line.lstrip(" \t") if line.strip() else line)
        out += s.lines[b:]
        yield Mutant("drop-no-grad", "TL203", "".join(out), a, b - 1, a, b)
        return


def op_loss_item_dropped(s: _Sites):
    for st in s.nodes(cst.AugAssign):
        if not isinstance(st.operator, cst.AddAssign) or not isinstance(st.value, cst.Call):
            continue
        f = st.value.func
        if not (isinstance(f, cst.Attribute) and f.attr.value == "item" and not st.value.args
                and isinstance(f.value, cst.Name)):
            continue
        name = f.value.value
        fn = s.enclosing(st, (cst.FunctionDef,))
        scope = s.code(fn) if fn is not None else s.text
        if not re.search(rf"\b{re.escape(name)}\.backward\(", scope):
            continue
        loop = s.enclosing(st, (cst.For, cst.While))
        if loop is None:
            continue
        p = s.pos[st.value]
        if p.start.line != p.end.line:
            continue
        line = s.lines[p.start.line - 1]
        out = list(s.lines)
        out[p.start.line - 1] = line[:p.start.column] + name + line[p.end.column:]  # `loss.item()` -> `loss`
        yield Mutant("loss-item-dropped", "TL501", "".join(out), s.line(st), s.line(st), s.line(st), s.line(st))
        return


def op_drop_batch_move(s: _Sites):
    if not re.search(r"\.(to|cuda)\(", s.text):
        return
    for loop in s.nodes(cst.For):
        if ".backward(" not in s.code(loop):
            continue
        bound = {n.value for n in _names(loop.target)}
        for st in s.nodes(cst.SimpleStatementLine):
            if s.enclosing(st, (cst.For, cst.While)) is not loop or not s.single_line(st) or len(st.body) != 1:
                continue
            a = st.body[0]
            if not isinstance(a, cst.Assign) or len(a.targets) != 1 or not isinstance(a.targets[0].target, cst.Name):
                continue
            v = a.value
            if not (isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value in ("to", "cuda")
                    and isinstance(v.func.value, cst.Name) and v.func.value.value == a.targets[0].target.value
                    and a.targets[0].target.value in bound):
                continue
            if v.func.attr.value == "to" and (not v.args or "dtype" in s.code(v) or "float" in s.code(v.args[0].value)):
                continue
            ln = s.line(st)
            text = "".join(_replace_line(s.lines, ln, "pass"))
            yield Mutant("drop-batch-move", "TL601", text, ln, s.end(loop), ln, s.end(loop))
            return


def _names(t) -> list:
    if isinstance(t, cst.Name):
        return [t]
    if isinstance(t, (cst.Tuple, cst.List)):
        return [n for e in t.elements for n in _names(e.value)]
    return []


def _trained_names(s: _Sites) -> set:
    """Names iterated by a ``for`` loop whose body runs ``backward()`` (directly, ``enumerate``,
    ``tqdm``, ...), in this file."""
    out = set()
    for loop in s.nodes(cst.For):
        if ".backward(" in s.code(loop.body):
            out.update(n.value for n in s.nodes(cst.Name) if _within(s, n, loop.iter))
    return out


def _within(s: _Sites, node, outer) -> bool:
    p = node
    while p is not None:
        if p is outer:
            return True
        p = s.parent.get(p)
    return False


def op_drop_shuffle(s: _Sites):
    trained = _trained_names(s)
    for c in s.nodes(cst.Call):
        if s.code(c.func).rsplit(".", 1)[-1] != "DataLoader":
            continue
        a = s.parent.get(c)
        if not (isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
                and a.targets[0].target.value in trained):
            continue  # only a loader that a training loop of this file iterates
        for i, a in enumerate(c.args):
            if a.keyword is not None and a.keyword.value == "shuffle" and isinstance(a.value, cst.Name) \
                    and a.value.value == "True":
                p = s.pos[a]
                if p.start.line != p.end.line:
                    continue
                line = s.lines[p.start.line - 1]
                seg_end = p.end.column
                rest = line[seg_end:]
                m = re.match(r"\s*,\s*", rest)
                if m:
                    new = line[:p.start.column] + rest[m.end():]
                else:
                    head = line[:p.start.column].rstrip()
                    head = head[:-1] if head.endswith(",") else head
                    new = head + rest
                out = list(s.lines)
                out[p.start.line - 1] = new
                ln = s.line(c)
                yield Mutant("drop-shuffle", "TL701", "".join(out), ln, s.end(c), ln, s.end(c))
                return


def op_drop_eval(s: _Sites):
    for block in _blocks(s):
        for i, st in enumerate(block):
            c = _call_stmt(s, st, "eval")
            if c is None or c.args or not s.single_line(st):
                continue
            follow = block[i + 1:i + 4]
            w = next((x for x in follow if isinstance(x, cst.With) and "no_grad" in s.code(x.items[0].item)), None)
            if w is None:
                continue
            ln = s.line(st)
            text = "".join(_replace_line(s.lines, ln, "pass"))
            yield Mutant("drop-eval", "TL201", text, ln, s.end(w), ln, s.end(w))
            return


OPERATORS: dict = {
    "drop-zero-grad": op_drop_zero_grad,
    "step-before-backward": op_step_before_backward,
    "zero-grad-after-backward": op_zero_grad_after_backward,
    "scheduler-before-step": op_scheduler_before_step,
    "softmax-into-ce": op_softmax_into_ce,
    "sigmoid-into-bce-logits": op_sigmoid_into_bce_logits,
    "float-targets": op_float_targets,
    "drop-no-grad": op_drop_no_grad,
    "loss-item-dropped": op_loss_item_dropped,
    "drop-batch-move": op_drop_batch_move,
    "drop-shuffle": op_drop_shuffle,
    "drop-eval": op_drop_eval,
}


def mutants(text: str, per_op: int = 1, ops=None) -> list:
    """Every mutant of ``text`` (at most ``per_op`` per operator), each of which parses."""
    try:
        s = _Sites(text)
    except Exception:
        return []
    out = []
    for name, fn in OPERATORS.items():
        if ops and name not in ops:
            continue
        n = 0
        try:
            for m in fn(s):
                try:
                    cst.parse_module(m.text)
                    compile(m.text, "<mutant>", "exec")
                except Exception:
                    continue
                out.append(m)
                n += 1
                if n >= per_op:
                    break
        except Exception:
            continue
    return out


def _near(findings, code: str, lo: int, hi: int) -> list:
    return [f for f in findings if f.code == code and lo - 3 <= f.line <= hi + 3]


def score_file(path: str, text: str, opts: LintOptions, project, module_name: str, is_pkg: bool,
               per_op: int, ops=None) -> list:
    rows = []
    ms = mutants(text, per_op, ops)
    if not ms:
        return rows
    base = lint_text(path, text, opts, project, module_name=module_name, is_package=is_pkg, exports=False).findings
    base_keys = Counter((f.code, f.message) for f in base)
    for m in ms:
        got = lint_text(path, m.text, opts, project, module_name=module_name, is_package=is_pkg, exports=False).findings
        if _near(base, m.code, m.orig_lo, m.orig_hi):
            verdict = "already"
        elif _near(got, m.code, m.lo, m.hi):
            verdict = "found"
        else:
            verdict = "missed"
        new = Counter((f.code, f.message) for f in got) - base_keys
        other = sum(n for (c, _), n in new.items() if c != m.code)
        rows.append({"op": m.op, "code": m.code, "path": path, "line": m.orig_lo, "verdict": verdict,
                     "other_new": other})
    return rows


def run_tree(tree: str, opts: LintOptions, jobs: int, per_op: int, ops=None, root: Optional[str] = None) -> list:
    d = discover([tree])
    files = sorted(f for f in d.files if f.endswith((".py", ".pyi", ".ipynb")))
    ws = Workspace(files)
    run(files, opts, jobs=jobs, workspace=ws)
    rows = []
    for f in files:
        try:
            if f.endswith(".ipynb"):  # its code cells as one program, line for line (notebook.load)
                text = notebook.load(f).text
                name, is_pkg = notebook.module_name(f), False
            elif f.endswith(".py"):
                text = read_source(f).text
                name, is_pkg = module_name_for(f)
            else:
                continue
        except (SourceError, notebook.NotebookError, OSError, ValueError):
            continue
        if ".backward(" not in text and "DataLoader" not in text and "no_grad" not in text:
            continue
        for r in score_file(f, text, opts, ws.index, name, is_pkg, per_op, ops):
            r["path"] = os.path.relpath(f, root or tree)
            rows.append(r)
    return rows


def table(rows: list, default: set, markdown: bool) -> str:
    by = defaultdict(Counter)
    for r in rows:
        by[(r["op"], r["code"])][r["verdict"]] += 1
        by[(r["op"], r["code"])]["other"] += r["other_new"]
    head = ["operator", "code", "default", "planted", "found", "missed", "recall", "already reported", "other new findings"]
    out_rows = []
    tot = Counter()
    totd = Counter()
    for (op, code), c in sorted(by.items(), key=lambda kv: kv[0][1]):
        planted = c["found"] + c["missed"]
        rec = f"{c['found'] / planted:.2f}" if planted else "-"
        out_rows.append([op, code, "yes" if code in default else "preview", str(planted), str(c["found"]),
                         str(c["missed"]), rec, str(c["already"]), str(c["other"])])
        tot.update(c)
        if code in default:
            totd.update(c)
    for label, c in (("all (default rules)", totd), ("all", tot)):
        planted = c["found"] + c["missed"]
        out_rows.append([label, "", "", str(planted), str(c["found"]), str(c["missed"]),
                         f"{c['found'] / planted:.2f}" if planted else "-", str(c["already"]), str(c["other"])])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in out_rows]
        return "\n".join(lines)
    w = [max(len(x) for x in col) for col in zip(head, *out_rows)]
    return "\n".join("  ".join(x.ljust(n) for x, n in zip(r, w)) for r in [head] + out_rows)


def report(rows: list, default: set, markdown: bool) -> str:
    """One table per part of the manifest (tuned, then held-out), as in the other benchmarks."""
    out = []
    for part in ("tuned", "heldout"):
        mine = [r for r in rows if r.get("part", "tuned") == part]
        if mine:
            files = len({(r.get("repo"), r["path"]) for r in mine})
            out.append(f"{part} part: {len(mine)} planted sites in {files} files\n")
            out.append(table(mine, default, markdown) + "\n")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.environ.get("TORCHLINT_REALWORLD_ROOT", "/work/scratch/realworld"))
    ap.add_argument("--manifest", default=realworld.MANIFEST)
    ap.add_argument("--part", choices=("tuned", "heldout", "all"), default="tuned")
    ap.add_argument("--batch", type=int, action="append", default=[])
    ap.add_argument("--repo", action="append", default=[], help="only repositories whose name contains this")
    ap.add_argument("--op", action="append", default=[], choices=sorted(OPERATORS))
    ap.add_argument("--per-op", type=int, default=1, help="sites per operator and file (default 1)")
    ap.add_argument("--jobs", "-j", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", help="write every planted site and its verdict here")
    ap.add_argument("--from-json", help="print the tables of a saved --json run again, without linting")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    default = enabled_codes(("TL",), ())
    if a.from_json:
        try:
            with open(a.from_json) as fh:
                rows = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"planted: {a.from_json}: {exc}", file=sys.stderr)
            return 2
        print(report(rows, default, a.markdown))
        return 0
    try:
        entries = realworld.load_manifest(a.manifest)
    except (OSError, ValueError) as exc:
        print(f"planted: {exc}", file=sys.stderr)
        return 2
    every = enabled_codes(("TL",), (), extend_select=tuple(c for c in _all_codes()))
    opts = LintOptions(enabled=frozenset(every))
    rows, missing = [], []
    t0 = time.perf_counter()
    for e in entries:
        if a.part != "all" and e["part"] != a.part:
            continue
        if a.batch and e["batch"] not in a.batch:
            continue
        if a.repo and not any(x.lower() in e["repo"].lower() for x in a.repo):
            continue
        base = os.path.join(a.root, e["repo"].replace("/", "+"))
        if not os.path.isdir(base):
            missing.append(e["repo"])
            continue
        for sub in e["subpaths"] or [""]:
            tree = os.path.join(base, sub) if sub else base
            if not os.path.exists(tree):
                continue
            got = run_tree(tree, opts, a.jobs, a.per_op, set(a.op) or None, root=base)
            for r in got:
                r["repo"] = e["repo"]
                r["part"] = e["part"]
                if a.verbose:
                    print(f"{r['verdict']:8} {r['code']} {r['op']:26} {e['repo']}:{r['path']}:{r['line']}", file=sys.stderr)
            rows += got
    if missing:
        print(f"planted: {len(missing)} checkouts missing under {a.root}: {', '.join(missing)}", file=sys.stderr)
    print(report(rows, default, a.markdown))
    print(f"\n{len(rows)} planted sites in {len({(r['repo'], r['path']) for r in rows})} files, "
          f"{time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def _all_codes():
    from torchlint.selection import known_codes

    return known_codes()


if __name__ == "__main__":
    sys.exit(main())

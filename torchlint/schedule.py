"""Linting a tree in dependency order, in a pool of worker processes.

A module's results depend on what the modules it imports export (their function summaries and
class facts).  Linting every file against an empty project and then again against the full
one would parse a connected tree twice, so files are linted imported-first instead:

* ``import_graph`` reads the import statements of each file with a regular expression (no
  parse) and maps them to the tree's modules;
* ``dependency_order`` puts imports before importers: the import cycles (strongly connected
  components) in topological order, each ordered so that as few of its files as possible
  are linted before a file they import;
* ``OrderedPool`` hands each idle worker the next file whose imports are all done (when none
  is, it waits for the files being linted that the next one imports, or takes the next one in
  an import cycle), together with the exports of every file finished since that worker last
  heard.  Each worker keeps its own copy of the project, so a
  file is linted against everything finished before it started. The modules a finished
  file asked about and nobody has started move to the front of the queue. A file of an
  import cycle linted before a module it asks about keeps its tree in its worker, and is
  checked (and if need be linted from that tree) again once the module is done.

The graph is a guess (an import inside a string or an ``exec`` is missed); a file linted
before something it asks about is caught by the engine's answer check and linted again, so a
wrong guess costs time, never a wrong result.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from .project import Aspect, note_args_entry

_IMPORT_RE = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)|import[ \t]+([^\n#;]+))",
    re.M)


_CHASE_RE: dict = {}


def imported_names(data: bytes, module: str, is_package: bool, chase=None) -> set:
    """Absolute dotted names ``data`` imports (``from . import x`` gives ``pkg.x`` too).
    After ``import pkg`` the dotted uses ``pkg.a.b`` are names too, for the top-level names
    in ``chase`` (all when ``None``)."""
    out: set = set()
    used: set = set()
    if b"import" not in data:
        return out
    for m in _import_statements(data):
        dots, base, names, plain = m.group(1), m.group(2), m.group(3), m.group(4)
        if plain is not None:
            for part in plain.decode("utf-8", "replace").split(","):
                name = part.strip().split(" ")[0].strip("()\\ \t")
                if name:
                    out.add(name)
                    if " as " not in part:  # ``import torch`` then ``torch.nn.functional.relu``
                        used.add(name.split(".")[0])
            continue
        base = base.decode("utf-8", "replace")
        if dots:
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            up = len(dots) - 1
            if up > len(pkg):
                continue
            pkg = pkg[:len(pkg) - up] if up else pkg
            base = ".".join(pkg + ([base] if base else []))
        if not base:
            continue
        out.add(base)
        for part in names.decode("utf-8", "replace").strip("()").split(","):
            name = part.strip().split(" ")[0].strip("()\\ \t\r\n")
            if name and name != "*":
                out.add(f"{base}.{name}")
    if chase is not None:
        used &= chase
    if used:  # dotted uses of a plainly imported package name its submodules
        key = tuple(sorted(used))
        pat = _CHASE_RE.get(key)
        if pat is None:
            # no look-behind in the pattern: a pattern that starts with a literal is searched
            # for by that literal (ten times faster on the torch tree); what precedes a match
            # is checked here instead
            alts = b"|".join(re.escape(t.encode()) for t in key)
            pat = _CHASE_RE[key] = re.compile(rb"(?:" + alts + rb")(?:\.\w+)+")
        for m in pat.finditer(data):
            at = m.start()
            if at and (data[at - 1] in _NAME_BYTES):
                continue  # ``x.torch.nn`` or ``my_torch.nn``: not the imported name
            out.add(m.group(0).decode("ascii", "replace"))
    return out


# bytes that continue a dotted name: a match preceded by one is part of a longer name
_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")


def _import_statements(data: bytes):
    """The matches of ``_IMPORT_RE`` in ``data``, found from the occurrences of ``import``
    (each matched from the start of its line) instead of trying every line start."""
    pos = 0
    find, rfind, match = data.find, data.rfind, _IMPORT_RE.match
    while True:
        k = find(b"import", pos)
        if k < 0:
            return
        m = match(data, rfind(b"\n", 0, k) + 1)
        if m is not None and m.end() > k:
            yield m
            pos = m.end()
        else:
            pos = k + 6


def import_graph(files, project, read) -> list:
    """For each file (by index), the indices of the tree files it imports. A name a package
    ``__init__`` re-exports (``from .graph_module import GraphModule``) also points at the
    module that defines it: that is the file whose exports the importer will ask about."""
    from .discover import module_name_for

    index = {os.path.abspath(f): i for i, f in enumerate(files)}
    tops = {n.split(".", 1)[0] for n in project.by_name}  # the tree's packages (namespace ones too)
    by_key = {k: index.get(os.path.abspath(p)) for k, p in project.modules.items()}
    seen: list = []  # per file: (names it imports, import root, folder)
    reexported: dict = {}  # "pkg.name" -> index of the module of pkg that defines it
    for i, f in enumerate(files):
        data = read(f) if f.endswith((".py", ".pyi")) else None
        if not data:
            seen.append(None)
            continue
        name, is_pkg = module_name_for(f)
        ap = os.path.abspath(f)
        key = project.key_of_path.get(ap)
        names = imported_names(data, name, is_pkg, tops)
        seen.append((names, project.roots.get(key) if key else None, os.path.dirname(ap)))
        if is_pkg:
            for n in names:
                mod, _, attr = n.rpartition(".")
                if mod.startswith(name + ".") and by_key.get(mod) is not None and n not in by_key:
                    reexported.setdefault(f"{name}.{attr}", by_key[mod])
    deps = []
    for i, got_names in enumerate(seen):
        got = set()
        if got_names is not None:
            names, root, here = got_names
            for n in names:
                parts = n.split(".")
                # the longest prefix that is a tree module: where a name resolves
                for j in range(len(parts), 0, -1):
                    k = project.module_key(".".join(parts[:j]), root, here)
                    if k is not None:
                        t = by_key.get(k)
                        if t is not None and t != i:
                            got.add(t)
                        break
                t = reexported.get(n)
                if t is not None and t != i:
                    got.add(t)
        deps.append(sorted(got))
    return deps


def dependency_order(deps) -> list:
    """Imports before importers: the strongly connected components of the import graph in
    topological order (Tarjan), and inside each import cycle the order that leaves the fewest
    imports linted after their importer (the Eades-Lin-Smyth greedy heuristic: a file none
    of the rest imports goes last, one that imports none of the rest goes first, otherwise the
    one imported most and importing least)."""
    order: list = []
    for comp in strongly_connected(deps):
        order.extend(comp if len(comp) == 1 else _order_cycle(comp, deps))
    return order


def strongly_connected(deps) -> list:
    """Tarjan's components of ``deps`` (iteratively), each after the components it imports."""
    n = len(deps)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list = []
    comps: list = []
    counter = 0
    for start in range(n):
        if index[start] >= 0:
            continue
        work = [(start, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            edges = deps[v]
            while k < len(edges):
                w = edges[k]
                k += 1
                if index[w] < 0:
                    work.append((v, k))
                    work.append((w, 0))
                    break
                if on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
            else:
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack[w] = False
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(sorted(comp))
                if work:
                    u = work[-1][0]
                    if low[v] < low[u]:
                        low[u] = low[v]
    return comps


def _order_cycle(comp, deps) -> list:
    import heapq

    alive = set(comp)
    out = {v: {d for d in deps[v] if d in alive and d != v} for v in comp}
    inn: dict = {v: set() for v in comp}
    for v in comp:
        for d in out[v]:
            inn[d].add(v)
    n_out = {v: len(out[v]) for v in comp}
    n_in = {v: len(inn[v]) for v in comp}
    first: list = []
    last: list = []
    heap = [(n_out[v] - n_in[v], v) for v in comp]
    heapq.heapify(heap)
    sinks = [v for v in comp if not n_out[v]]
    sources = [v for v in comp if not n_in[v]]

    def remove(v) -> None:
        alive.discard(v)
        # its imports lose an importer, its importers an import
        for near, count, emptied in ((out[v], n_in, sources), (inn[v], n_out, sinks)):
            for u in near:
                if u in alive:
                    count[u] -= 1
                    if not count[u]:
                        emptied.append(u)
                    heapq.heappush(heap, (n_out[u] - n_in[u], u))

    while alive:
        if sinks:
            v = sinks.pop()
            if v in alive:
                first.append(v)
                remove(v)
            continue
        if sources:
            v = sources.pop()
            if v in alive:
                last.append(v)
                remove(v)
            continue
        delta, v = heapq.heappop(heap)
        if v in alive and delta == n_out[v] - n_in[v]:
            first.append(v)
            remove(v)
    return first + last[::-1]


# ---------------------------------------------------------------- the pool
# a busy worker is sent its next file before it finishes the one it has while more than this
# many files per worker are left to lint
_QUEUE_AHEAD_WHILE = 4
# a file of an import cycle that asked about files not linted yet is checked again from its
# kept tree at most this many times; each worker keeps at most this much source (a tree takes
# about 30-40 times its source in memory)
_MAX_CHECKS = 4
_KEEP_BYTES = 3_000_000

def exports_of(result) -> tuple:
    """What a result contributes to the project (sent to the workers)."""
    return (result.path, result.module, result.summaries, result.classes, result.reexports,
            result.stars, result.called)


class _Counts:
    """Calls-from-other-modules counts as ``ProjectReplica.apply`` updates them: its own
    counts over shared ``base`` ones, a qualname copied from ``base`` when first looked up
    (a file that changed touches a few of a tree's thousands)."""

    __slots__ = ("base", "own")
    _GONE = None

    def __init__(self, base: dict, own: dict):
        self.base, self.own = base, own

    def get(self, q):
        if q in self.own:
            return self.own[q]
        c = self.base.get(q)
        if c is not None:
            c = self.own[q] = list(c)
        return c

    def __setitem__(self, q, c) -> None:
        self.own[q] = c

    def pop(self, q, default=None):
        c = self.get(q)
        self.own[q] = self._GONE
        return default if c is None else c


class ProjectReplica:
    """A worker's copy of the project, updated with each finished file's exports (a file
    linted again replaces what it exported before)."""

    def __init__(self, project):
        self.project = project
        self.by_file: dict = {}
        self.counts: dict = {}
        self.heard: set = set()  # the module keys of the files applied

    def unheard(self, queries, memo) -> list:
        """The names a file asked about, got no answer for (``memo`` holds the answers), and
        that belong to tree modules not heard of yet (their file may not have been linted):
        the classes and functions themselves, and for a method the bases of its class."""
        p = self.project
        out: list = []
        for q in queries:
            if not memo[q].endswith(b"=null"):
                continue
            aspect, rest = q
            if aspect in (Aspect.CALLED, Aspect.NO_GRAD_CALLERS, Aspect.ARGS, Aspect.MODULES, Aspect.OVERRIDES):
                continue  # asked of every caller, not of one module; or of the module table
            if aspect is Aspect.METHOD:
                rest = rest.rpartition(".")[0]
            todo = [p.resolve(rest)]
            for _ in range(8 if aspect is Aspect.METHOD else 1):
                bases = []
                for key in todo:
                    mod = self.module_of(key)
                    if mod is None:
                        continue
                    if mod not in self.heard:
                        out.append(key)
                        continue
                    name = key[len(mod) + 1:]
                    if name and "." not in name and key not in p.summaries and key not in p.classes:
                        # maybe in a module it star-imports
                        out.extend(f"{star}.{name}" for star in p.stars.get(mod, ())
                                   if star not in self.heard)
                    if aspect is Aspect.METHOD:
                        facts = p.classes.get(key)
                        bases.extend(p.resolve(b) for b in (facts or {}).get("bases", ()))
                if not bases:
                    break
                todo = bases
        return out

    def module_of(self, key: str):
        """The tree module that holds ``key`` (its longest dotted prefix that is one)."""
        head = key
        while head:
            if head in self.project.modules:
                return head
            head = head.rpartition(".")[0]
        return None

    def apply(self, exports) -> None:
        p = self.project
        path, module, summaries, classes, reexports, stars, called = exports
        old = self.by_file.get(path)
        if old is not None and not isinstance(old, tuple):
            old = exports_of(old)  # a cached result: read what it exported
        touched = set()
        if old is not None:
            _, omod, osum, ocls, oreex, ostars, ocalled = old
            p.pending.pop(omod, None)
            for k in osum:
                p.summaries.pop(k, None)
            for k in ocls:
                p.classes.pop(k, None)
            for k in oreex:
                p.reexports.pop(k, None)
            if ostars and omod:
                p.stars.pop(omod, None)
            for q, off in ocalled:
                c = self.counts.get(q)
                if c:
                    c[0] -= 1
                    c[1] -= bool(off)
                    touched.add(q)
        self.by_file[path] = exports
        if module:
            self.heard.add(module)
        p.pending.pop(module, None)
        p.add_exports(module, summaries, classes, reexports, stars)
        for q, off in called:
            c = self.counts.get(q)
            if c is None:
                c = self.counts[q] = [0, 0]
            c[0] += 1
            c[1] += bool(off)
            touched.add(q)
        for q in touched:
            n, under = self.counts.get(q) or (0, 0)
            if n:
                p.called.add(q)
            else:
                self.counts.pop(q, None)
                p.called.discard(q)
            if q.endswith(")"):
                note_args_entry(p, q, bool(n))
            if n and under == n:
                p.called_under_no_grad.add(q)
            else:
                p.called_under_no_grad.discard(q)


def _die_with_parent(parent_pid: int, inherited) -> None:
    """A forked worker must not outlive the run that started it (a killed ``torchlint``,
    SIGKILL included). It closes the pipe ends it inherited from the pool (its own pipe's
    other end among them: while it held that, it never saw end-of-file when the pool died) and,
    on Linux, asks the kernel for SIGKILL when its parent dies; the thread reading the pipe
    exits the process at end-of-file, on other systems or if the parent was already gone."""
    for c in inherited:
        try:
            c.close()
        except OSError:
            pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the request
        os._exit(1)


def _worker_main(conn, project, parent_pid=None, inherited=()) -> None:
    """A worker: lint the files it is sent against its replica of the project. A thread
    reads what the pool sends while the worker lints: the pool sends a busy worker its next
    file, and neither side may block on a full pipe while the other does.

    Messages: ``("lint", i, path, opts, delta)``, ``("again", i, path, opts, delta)`` (check
    file ``i`` again, from the tree kept for it) and ``("drop", i)``. Each answers ``(i,
    result, awaited)``: ``result`` is ``None`` when a check found the file's answers as they
    were; ``awaited`` names what the file asked about in tree modules this worker has not
    heard of yet. While it is not empty the worker keeps the file's tree until told to check
    the file again or to drop it."""
    import gc
    import queue
    import threading

    from .engine import lint_job
    from .gcpolicy import WORKER_THRESHOLD

    if parent_pid is not None:
        _die_with_parent(parent_pid, inherited)
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the pool is gone: nobody will read what this worker lints
                os._exit(1)
            inbox.put(msg)
            if msg is None:
                return

    threading.Thread(target=read, daemon=True).start()
    gc.set_threshold(*WORKER_THRESHOLD)
    replica = ProjectReplica(project)
    kept: dict = {}  # i -> what relinting file i without parsing it needs
    while True:
        msg = inbox.get()
        if msg is None:
            return
        if msg[0] == "drop":
            kept.pop(msg[1], None)
            continue
        kind, i, path, opts, delta = msg
        gc.disable()  # (see below)
        for e in delta:
            replica.apply(e)
        keep = kept.pop(i, None) if kind == "again" else None
        memo: dict = {}
        if keep is not None and project.answers(keep["result"].queries, memo) == keep["result"].answers:
            # what it asked about is answered as before: so is the file
            r = keep["result"]
            same = True
        else:
            same = False
            if keep is None:
                keep = {}
            r = lint_job((path, opts, project), keep)
            memo = {}
            r.answers = project.answers(r.queries, memo)
        awaited = replica.unheard(r.queries, memo) if "tree" in keep else []
        if awaited:
            keep["result"] = r
            kept[i] = keep
        del keep
        # What a file's handling left alive (the result, the replica's exports, a kept tree:
        # millions of nodes) has no reference cycles (a lint leaves no cyclic garbage: the
        # model's cycles are broken), so the collector, off meanwhile, need not walk it three
        # times over as it ages through the generations: it leaves the collector's
        # generations, and refcounting frees it when it goes.
        gc.freeze()
        gc.enable()
        try:
            conn.send((i, None if same else r, awaited))
        except (OSError, ValueError):
            return


class InlinePool:
    """The same interface in this process (``-j 1``, or too few files for a pool)."""

    def __init__(self, files, base):
        self.files, self.project = files, base
        self.replica = ProjectReplica(base)

    def publish(self, result) -> None:
        self.replica.apply(exports_of(result))

    def publish_cached(self, results) -> None:
        """The cached results, all at once (nothing to replace yet)."""
        from .project import called_parts, merge_into

        merge_into(self.project, results)
        base, extra, _ = called_parts(results)
        self.replica.counts = _Counts(base, extra)
        for r in results:  # a cached result is read only if a later result replaces it
            self.replica.by_file[r.path] = r if r.is_lazy() else exports_of(r)

    def run(self, order, opts_for, deps=None, progress=None) -> dict:
        import gc

        from .engine import lint_job
        from .gcpolicy import GC_EVERY

        results = {}
        for n, i in enumerate(order, 1):
            if n % GC_EVERY == 0:
                gc.collect()
            r = lint_job((self.files[i], opts_for(i), self.project))
            r.answers = self.project.answers(r.queries)
            results[i] = r
            self.publish(r)
            if progress is not None:
                progress(1)
        return results

    def close(self) -> None:
        pass


@dataclass(eq=False)
class _Worker:
    """A worker process as the pool sees it."""

    proc: Any
    conn: Any
    synced: int = 0  # how much of the pool's log of exports it has heard
    tasks: list = field(default_factory=list)  # files sent to it and not answered yet, in order
    again: list = field(default_factory=list)  # files it keeps, queued for a check
    kept: int = 0  # bytes of source of the files it keeps


@dataclass
class _Kept:
    """A file whose worker keeps its tree for a later check."""

    worker: _Worker
    waits: Optional[set]  # the files it waits for; None once queued for its check
    asked: set  # the files it asked about


class OrderedPool:
    """``jobs`` worker processes kept for the whole run (every round of the engine)."""

    def __init__(self, files, jobs: int, base):
        import multiprocessing as mp

        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else methods[0])
        self.ctx, self.files, self.base = ctx, files, base
        self.workers: list = []
        self.log: list = []  # exports of finished files, in the order they finished
        # files kept for a check, checks, and checks that linted the kept tree again
        self.stats = {"kept": 0, "checked": 0, "relinted": 0}
        at = {os.path.abspath(f): i for i, f in enumerate(files)}
        self._index_of_module = {k: at[p] for p, k in base.key_of_path.items() if p in at}
        for _ in range(jobs):
            self._start()

    def _start(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        args = (child, self.base)
        if self.ctx.get_start_method() == "fork":  # the child has copies of the pool's pipe ends: it closes them
            args += (os.getpid(), [parent] + [w.conn for w in self.workers])
        p = self.ctx.Process(target=_worker_main, args=args, daemon=True)
        p.start()
        child.close()
        w = _Worker(p, parent)
        self.workers.append(w)
        return w

    def publish(self, result) -> None:
        self.log.append(exports_of(result))

    def file_of(self, name: str):
        """The index of the tree file whose module holds ``name`` (its longest module prefix)."""
        head = name
        while head:
            i = self._index_of_module.get(head)
            if i is not None:
                return i
            head = head.rpartition(".")[0]
        return None

    def publish_cached(self, results) -> None:
        for r in results:
            self.publish(r)

    def run(self, order, opts_for, deps=None, progress=None) -> dict:
        """Lint the files of ``order`` (indices into ``files``); returns {index: result}.

        A file that asked about a module of ``order`` not linted yet (an import cycle) is
        *kept*: its result stands for now, its worker keeps its tree, and the modules it asked
        about go to the front of the queue. When they are done (or a kept file it asked about
        changed), the worker checks the file again: if its answers changed it lints the tree
        again (the model and the rules, not the parse) and the new result replaces the old.
        Each worker keeps at most ``_KEEP_BYTES`` of source; a file not kept stands as it is,
        and the engine's answer check lints it again if needed."""
        return _Round(self, order, opts_for, deps, progress).run()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self.workers:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.kill()


_WAIT = -1  # (next_task) nothing to send now: the next file waits for files being linted


class _Round:
    """One ``OrderedPool.run``: the queue of files, the files done and the files kept."""

    def __init__(self, pool: OrderedPool, order, opts_for, deps, progress):
        self.pool, self.opts_for, self.progress = pool, opts_for, progress
        self.waiting = {i: set(deps[i]) for i in order} if deps is not None else {}
        self.pending = list(order)
        self.pending_set = set(order)
        self.in_order = {i: n for n, i in enumerate(order)}
        self.done: set = set()
        self.results: dict = {}
        self.kept: dict = {}  # i -> _Kept
        self.checks: dict = {}  # i -> how many times it was checked again
        self.published: dict = {}  # i -> where its last result is in the log
        self.sizes: dict = {}
        for w in pool.workers:
            w.again, w.kept = [], 0

    def weight(self, i) -> int:
        w = self.sizes.get(i)
        if w is None:
            try:
                w = os.path.getsize(self.pool.files[i])
            except OSError:
                w = 0
            self.sizes[i] = w
        return w

    def next_task(self) -> Optional[int]:
        """The first file (in order) whose imports are all done. When none of the next
        ones is, wait if what the next file lacks is being linted right now (linting it
        first would mean parsing it again), else take it anyway (an import cycle)."""
        pending, done = self.pending, self.done
        if not pending:
            return None
        best = None
        for n in range(min(len(pending), 64)):
            if not (self.waiting.get(pending[n], done) - done):
                # among the ready ones the largest first, so that no big file is left
                # for last while the other workers have nothing to do
                if best is None or self.weight(pending[n]) > self.weight(pending[best]):
                    best = n
        if best is not None:
            self.pending_set.discard(pending[best])
            return pending.pop(best)
        missing = self.waiting.get(pending[0], done) - done
        running = {i for w in self.pool.workers for i in w.tasks}
        if missing and missing <= running:
            return _WAIT
        self.pending_set.discard(pending[0])
        return pending.pop(0)

    def asked_files(self, r) -> set:
        asked = set()
        for aspect, name in r.queries:
            if aspect is Aspect.MODULES:
                continue
            j = self.pool.file_of(name)
            if j is not None and j in self.in_order:
                asked.add(j)
        return asked

    def to_front(self, asked) -> None:
        """The modules a finished file asked about and nobody has started go to the front
        (taken as soon as they are ready): the files after it that import them too will
        find their answers. A file asking about a later module is a sign of an import
        cycle ordered the wrong way round for it."""
        front = [j for j in asked if j in self.pending_set]
        if front:
            front.sort(key=self.in_order.__getitem__)
            for j in front:
                self.pending.remove(j)
            self.pending[:0] = front

    def check_again(self, i) -> None:
        k = self.kept.get(i)
        if k is not None and k.waits is not None:
            k.waits = None  # queued
            k.worker.again.append(i)

    def keep(self, w: _Worker, i, r, awaited) -> bool:
        """Whether ``w`` keeps the tree of ``i`` for a later check."""
        if self.checks.get(i, 0) >= _MAX_CHECKS or w.kept + self.weight(i) > _KEEP_BYTES:
            return False
        files = {self.pool.file_of(k) for k in awaited} - {None, i}
        waits = {j for j in files if j in self.in_order and j not in self.done}
        # done since the worker last heard: it will hear with the check (the others it
        # heard of already: a file the prefilter skipped exports nothing)
        news = {j for j in files & self.done if self.published[j] >= w.synced}
        if not waits and not news:
            return False
        self.kept[i] = _Kept(w, waits, self.asked_files(r))
        w.kept += self.weight(i)
        self.pool.stats["kept"] += 1
        if waits:
            self.to_front(waits)
        else:  # done meanwhile, and this worker has not heard yet: check now
            self.check_again(i)
        return True

    def finish(self, i, r) -> None:
        """Publish a result: a file done, or linted again with a new result."""
        first = i not in self.done
        self.results[i] = r
        self.done.add(i)
        self.published[i] = len(self.pool.log)
        self.pool.publish(r)
        if first:
            self.to_front(self.asked_files(r))
            if self.progress is not None:
                self.progress(1)
        for j, k in list(self.kept.items()):
            if k.waits is None or j == i:
                continue
            if first and i in k.waits:
                k.waits.discard(i)
                if not k.waits:
                    self.check_again(j)
            elif not first and i in k.asked:
                self.check_again(j)  # it asked about a file whose result changed

    @staticmethod
    def post(w: _Worker, msg) -> None:
        try:
            w.conn.send(msg)
        except (OSError, ValueError):
            pass  # it died: waiting for its result finds out (EOF), and re-queues its files

    def send(self, w: _Worker) -> bool:
        if w.again:
            i, kind = w.again.pop(0), "again"
        else:
            i, kind = self.next_task(), "lint"
            if i is None or i == _WAIT:
                return False
        delta = self.pool.log[w.synced:]
        w.synced = len(self.pool.log)
        w.tasks.append(i)
        self.post(w, (kind, i, self.pool.files[i], self.opts_for(i), delta))
        return True

    def feed(self) -> None:
        # every idle worker gets a file; then, while many files are left, each busy one
        # gets its next file too, so that it never waits for this process between two
        # files (near the end, a file queued behind a long one would idle another worker)
        workers = self.pool.workers
        for w in workers:
            if not w.tasks:
                self.send(w)
        if len(self.pending) > _QUEUE_AHEAD_WHILE * len(workers):
            for w in workers:
                if len(w.tasks) < 2:
                    self.send(w)

    def worker_died(self, w: _Worker) -> int:
        i = w.tasks.pop(0)
        # queued behind the one it died on: lint them again (what it kept is lost; those
        # results stand)
        lost = [j for j in w.tasks if j not in self.done]
        for j in [j for j, k in self.kept.items() if k.worker is w]:
            del self.kept[j]
        self.pending[:0] = [j for j in lost if j not in self.pending_set]
        self.pending_set.update(lost)
        self.pool.workers.remove(w)
        self.pool._start()
        return i

    def died_result(self, i):
        from .engine import FileResult, InternalErrorRule
        from .findings import Finding, Span, path_token

        r = FileResult(path_token(self.pool.files[i]))
        r.internal_error = True
        r.findings.append(Finding("TL000", InternalErrorRule.name,
                                  "internal error: the worker process linting this file died",
                                  r.path, Span.of(1, 0, 1, 0)))
        return r

    def receive(self, w: _Worker) -> None:
        """A worker's answer: a result, a check's outcome, or its death."""
        try:
            i, r, awaited = w.conn.recv()
            w.tasks.remove(i)
        except (EOFError, OSError):  # the worker died (killed, out of memory)
            i = self.worker_died(w)
            if i in self.done:  # checking a kept file: its result stands
                return
            r, awaited = self.died_result(i), []
        if i in self.kept:  # a check of a kept file
            del self.kept[i]
            w.kept -= self.weight(i)
            self.checks[i] = self.checks.get(i, 0) + 1
            self.pool.stats["checked"] += 1
            self.pool.stats["relinted"] += r is not None
        if r is not None:
            self.finish(i, r)
        if awaited and not self.keep(w, i, r if r is not None else self.results[i], awaited):
            self.post(w, ("drop", i))

    def run(self) -> dict:
        from multiprocessing.connection import wait

        self.feed()
        while any(w.tasks for w in self.pool.workers):
            busy = {w.conn: w for w in self.pool.workers if w.tasks}
            for conn in wait(list(busy)):
                self.receive(busy[conn])
            self.feed()
        for i, k in self.kept.items():
            self.post(k.worker, ("drop", i))
            k.worker.kept -= self.weight(i)
        return self.results

"""Latency of the language server on 500-, 2,000- and 5,000-line training files: from
`didChange` to the `publishDiagnostics` of that version, and from a code action request (on
a diagnostic, as an editor asks when the cursor is on it) to its answer.

    python benchmarks/lsp_latency.py [--lines 500,2000,5000] [--edits 30] [--debounce-ms 300]

Starts `python -m torchlint lsp` over stdio (as an editor would) once per size, opens a
generated training module (models, training loops, evaluation helpers; a few of them buggy),
waits for the first diagnostics, then makes `--edits` edits one at a time (a comment retyped,
a line opened in a training loop and deleted again, all over the file) and measures, for
each, the time until the diagnostics of that version arrive, then one code action request.
The server debounces changes (300 ms by default): diagnostics figures are net of it. Prints
p50/p95/max per size as a Markdown table (docs/editors.md).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time

from lsprotocol import types
from pygls.lsp.client import LanguageClient

BLOCK = '''

class Net{i}(nn.Module):
    """Block {i}: a small MLP with dropout and batch norm."""

    def __init__(self, d_in: int = 32, hidden: int = 64, n_out: int = 10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                  nn.Dropout(0.1), nn.Linear(hidden, n_out))

    def forward(self, x):
        return self.body(x)


def train_{i}(model, loader, optimizer, criterion, device):
    model.train()
    total = 0.0
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        {clear}
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / max(len(loader), 1)


@torch.no_grad()
def evaluate_{i}(model, loader, device):
    model.eval()
    correct = seen = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum().item()
        seen += y.numel()
    return correct / max(seen, 1)
'''

HEADER = '''"""A long training module: many models, loops and evaluation helpers (benchmark input)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
'''

FOOTER = '''

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.randn(64, 32), torch.randint(0, 10, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = Net0().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        train_0(model, loader, optimizer, criterion, device)
        print(epoch, evaluate_0(model, loader, device))


if __name__ == "__main__":
    main()
'''


def make_source(lines: int) -> str:
    parts = [HEADER]
    i = 0
    while sum(p.count("\n") for p in parts) + FOOTER.count("\n") < lines:
        # every seventh loop forgets to clear its gradients (TL103)
        clear = "pass  # gradients are never cleared here" if i % 7 == 3 else "optimizer.zero_grad()"
        parts.append(BLOCK.format(i=i, clear=clear))
        i += 1
    parts.append(FOOTER)
    return "".join(parts)


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def measure(n: int, args) -> dict:
    """One server session on a generated ``n``-line training module."""
    text = make_source(n)
    n_lines = text.count("\n")
    tmp = tempfile.mkdtemp(prefix="torchlint-lsp-bench-")
    path = os.path.join(tmp, "train_many.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    uri = "file://" + path

    client = LanguageClient("lsp-latency-bench", "1")
    arrived: dict = {}
    events: dict = {}

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: types.PublishDiagnosticsParams):
        if params.uri == uri and params.version is not None:
            arrived[params.version] = (time.perf_counter(), list(params.diagnostics))
            ev = events.get(params.version)
            if ev is not None:
                ev.set()

    env = dict(os.environ, TORCHLINT_LSP_DEBOUNCE_MS=str(args.debounce_ms))
    await client.start_io(sys.executable, "-m", "torchlint", "lsp", env=env)
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri="file://" + tmp, process_id=os.getpid()))
    client.initialized(types.InitializedParams())

    version = 1
    events[version] = asyncio.Event()
    t0 = time.perf_counter()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))
    await asyncio.wait_for(events[version].wait(), 120)
    first = arrived[version][0] - t0
    n_diags = len(arrived[version][1])
    await asyncio.sleep(1.0)  # let the startup index finish

    lines = text.splitlines(True)
    sites = [i for i, ln in enumerate(lines) if "total += loss.item()" in ln]
    rng = random.Random(n)
    diag_ms, action_ms = [], []
    inserted = None
    for k in range(args.edits):
        version += 1
        events[version] = asyncio.Event()
        # edits as typing makes them, all over the file: retype a comment at the end of a
        # line, open a new line in a training loop, delete it again
        if inserted is not None:
            change = types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(inserted, 0), types.Position(inserted + 1, 0)), text="")
            del lines[inserted]
            inserted = None
        elif k % 3 == 1:
            inserted = rng.choice(sites) + 1
            change = types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(inserted, 0), types.Position(inserted, 0)),
                text="        seen = 0\n")
            lines.insert(inserted, "        seen = 0\n")
        else:
            at = rng.choice(sites)
            old = lines[at].rstrip("\n")
            new = old.split("  #")[0] + f"  # edit {k}"
            change = types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(at, 0), types.Position(at, len(old))), text=new)
            lines[at] = new + "\n"
        t0 = time.perf_counter()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version), [change]))
        await asyncio.wait_for(events[version].wait(), 120)
        diag_ms.append((arrived[version][0] - t0) * 1000)
        # the editor asks for the code actions of a diagnostic (the cursor is on it)
        diags = arrived[version][1]
        if diags:
            d = diags[k % len(diags)]
            t0 = time.perf_counter()
            actions = await client.text_document_code_action_async(types.CodeActionParams(
                types.TextDocumentIdentifier(uri), d.range, types.CodeActionContext(diagnostics=[d])))
            action_ms.append((time.perf_counter() - t0) * 1000)
            assert actions, "no code action for a diagnostic"
        await asyncio.sleep(0.05)

    await client.shutdown_async(None)
    client.exit(None)
    await asyncio.sleep(0.2)
    await client.stop()
    deb = args.debounce_ms
    return {
        "lines": n_lines, "diagnostics": n_diags, "first_ms": first * 1000, "edits": len(diag_ms),
        "diag_p50": statistics.median(diag_ms) - deb, "diag_p95": _pct(diag_ms, 0.95) - deb,
        "diag_max": max(diag_ms) - deb,
        "action_p50": statistics.median(action_ms), "action_p95": _pct(action_ms, 0.95),
        "action_max": max(action_ms), "actions": len(action_ms),
    }


async def run(args) -> int:
    load = os.getloadavg()[0]
    rows = [await measure(int(n), args) for n in args.lines.split(",")]
    print(f"debounce {args.debounce_ms} ms; diagnostics: didChange -> publishDiagnostics of that version, "
          f"net of the debounce; code action: request -> answer (ms); load average "
          f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print("| lines | findings | first diagnostics | diagnostics p50 | p95 | max | code action p50 | p95 | max |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['lines']:,} | {r['diagnostics']} | {r['first_ms']:.0f} | {r['diag_p50']:.0f} | "
              f"{r['diag_p95']:.0f} | {r['diag_max']:.0f} | {r['action_p50']:.0f} | {r['action_p95']:.0f} | "
              f"{r['action_max']:.0f} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", default="500,2000,5000", help="file sizes, comma-separated")
    ap.add_argument("--edits", type=int, default=30)
    ap.add_argument("--debounce-ms", type=int, default=300)
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())

"""Latency of the language server: from `didChange` on a ~2,000-line training file to the
`publishDiagnostics` for that version.

    python benchmarks/lsp_latency.py [--lines 2000] [--edits 30] [--debounce-ms 300]

Starts `python -m torchlint lsp` over stdio (as an editor would), opens a generated training
module (models, training loops, evaluation helpers; a few of them buggy), waits for the first
diagnostics, then makes `--edits` small edits one at a time and measures, for each, the time
until the diagnostics of that document version arrive. The server debounces changes (300 ms
by default), so the total includes it; the script also prints the time net of the debounce.
"""
from __future__ import annotations

import argparse
import asyncio
import os
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


async def run(args) -> int:
    text = make_source(args.lines)
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
            arrived[params.version] = (time.perf_counter(), len(params.diagnostics))
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
    await asyncio.wait_for(events[version].wait(), 60)
    first = arrived[version][0] - t0
    n_diags = arrived[version][1]
    await asyncio.sleep(1.0)  # let the startup index finish

    lines = text.splitlines(True)
    edit_line = next(i for i, ln in enumerate(lines) if "total += loss.item()" in ln)
    latencies = []
    for k in range(args.edits):
        version += 1
        events[version] = asyncio.Event()
        # retype a comment at the end of one line (an incremental change of one line)
        old = lines[edit_line].rstrip("\n")
        new = old.split("  #")[0] + f"  # edit {k}"
        change = types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(edit_line, 0), types.Position(edit_line, len(old))), text=new)
        lines[edit_line] = new + "\n"
        t0 = time.perf_counter()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version), [change]))
        await asyncio.wait_for(events[version].wait(), 60)
        latencies.append(arrived[version][0] - t0)
        await asyncio.sleep(0.05)

    await client.shutdown_async(None)
    client.exit(None)
    await asyncio.sleep(0.2)
    await client.stop()

    latencies.sort()
    med = statistics.median(latencies)
    p95 = latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))]
    deb = args.debounce_ms / 1000.0
    print(f"file: {n_lines} lines, {n_diags} diagnostics; first diagnostics after didOpen: {first * 1000:.0f} ms")
    print(f"didChange -> publishDiagnostics over {len(latencies)} edits (debounce {args.debounce_ms} ms):")
    print(f"  median {med * 1000:.0f} ms   p95 {p95 * 1000:.0f} ms   "
          f"min {latencies[0] * 1000:.0f} ms   max {latencies[-1] * 1000:.0f} ms")
    print(f"  net of the debounce: median {(med - deb) * 1000:.0f} ms   p95 {(p95 - deb) * 1000:.0f} ms")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--edits", type=int, default=30)
    ap.add_argument("--debounce-ms", type=int, default=300)
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())

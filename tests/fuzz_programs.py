"""A grammar of training-code fragments for property-based tests (hypothesis).

Programs mix loops (for/while/step-count/nested epochs), conditions (accumulation, branches),
helpers (train/evaluate functions, a Trainer class), grad contexts and the PyTorch calls the
rules care about, in orders that are both right and wrong.
"""
from hypothesis import strategies as st

HEADER = """import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
scaler = torch.cuda.amp.GradScaler()
criterion = nn.CrossEntropyLoss()
data = TensorDataset(torch.randn(32, 8), torch.randint(0, 4, (32,)))
loader = DataLoader(data, batch_size=4, shuffle=True)
"""

STATEMENTS = [
    "optimizer.zero_grad()",
    "optimizer.zero_grad(set_to_none=True)",
    "model.zero_grad()",
    "out = model(x)",
    "out = model(x.to(device))",
    "probs = F.softmax(out, dim=1)",
    "loss = criterion(out, y)",
    "loss = criterion(probs, y)",
    "loss = F.nll_loss(F.log_softmax(out, dim=1), y)",
    "loss.backward()",
    "scaler.scale(loss).backward()",
    "optimizer.step()",
    "scaler.step(optimizer)",
    "scaler.update()",
    "scheduler.step()",
    "model.eval()",
    "model.train()",
    "model.train(False)",
    "total += loss",
    "total += loss.item()",
    "history.append(loss)",
    "history.append(loss.detach())",
    "preds = out.argmax()",
    "preds = out.argmax(dim=1)",
    "x, y = x.to(device), y.to(device)",
    "out.add_(1)",
    "w = model[0].weight.data",
    "evaluate(model, loader)",
    "train_one_epoch(model, loader, optimizer)",
    "torch.autograd.set_detect_anomaly(True)",
    "pass",
]

CONTEXTS = ["torch.no_grad()", "torch.inference_mode()", "torch.enable_grad()", "torch.cuda.amp.autocast()"]
CONDITIONS = ["(i + 1) % 4 == 0", "i % accum_steps == 0", "epoch > 0", "loss is not None", "args.debug"]

HELPERS = """
def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(dim=1) == y).sum().item()
    return correct


def train_one_epoch(model, loader, optimizer):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""


@st.composite
def block(draw, depth=0, indent="    "):
    n = draw(st.integers(min_value=1, max_value=6))
    lines = []
    for _ in range(n):
        kind = draw(st.sampled_from(["stmt"] * 6 + (["if", "with", "for"] if depth < 2 else [])))
        if kind == "stmt":
            lines.append(indent + draw(st.sampled_from(STATEMENTS)))
        elif kind == "if":
            lines.append(indent + f"if {draw(st.sampled_from(CONDITIONS))}:")
            lines.extend(draw(block(depth + 1, indent + "    ")))
            if draw(st.booleans()):
                lines.append(indent + "else:")
                lines.extend(draw(block(depth + 1, indent + "    ")))
        elif kind == "with":
            lines.append(indent + f"with {draw(st.sampled_from(CONTEXTS))}:")
            lines.extend(draw(block(depth + 1, indent + "    ")))
        else:
            loop = draw(st.sampled_from(["for i, (x, y) in enumerate(loader):", "for x, y in loader:",
                                         "for it in range(10):", "while step < 10:"]))
            lines.append(indent + loop)
            lines.extend(draw(block(depth + 1, indent + "    ")))
    return lines


@st.composite
def programs(draw):
    body = draw(block(1, "        "))
    fn_kind = draw(st.sampled_from(["function", "method", "decorated"]))
    out = [HEADER, HELPERS, "accum_steps = 4", "step = 0", ""]
    if fn_kind == "method":
        out += ["class Trainer:", "    def __init__(self, model, optimizer):",
                "        self.model = model", "        self.optimizer = optimizer", "",
                "    def fit(self, args, loader, epochs):", "        total, history = 0.0, []",
                "        model, optimizer = self.model, self.optimizer",
                "        for epoch in range(epochs):",
                "            for i, (x, y) in enumerate(loader):"]
        out += ["        " + ln for ln in body]
    else:
        if fn_kind == "decorated":
            out.append("@torch.no_grad()")
        out += ["def fit(args, epochs):", "    total, history = 0.0, []", "    for epoch in range(epochs):",
                "        for i, (x, y) in enumerate(loader):"]
        out += ["    " + ln for ln in body]
    return "\n".join(out) + "\n"

"""Source shared by the cross-module and cache tests: a helper module whose `evaluate()`
leaves the model in eval mode and whose `train_one_epoch()` trains it in whatever mode it gets
(`{train_line}` is `pass` for the bug, `model.train()` for the fix)."""

ENGINE = """
    import torch
    import torch.nn.functional as F


    def train_one_epoch(model, loader, optimizer):
        {train_line}
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()


    @torch.no_grad()
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct
"""

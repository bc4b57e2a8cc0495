"""Dropout and BatchNorm: dropout masks come from the global generator (saved per rank), the
BatchNorm running statistics are buffers of the model; ``model.train()``/``model.eval()`` around
an evaluation pass; saves every 3 steps (mid-epoch) and at the end of every epoch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    test = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3)
    )
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = run.loader(train, batch_size=6)
    evaluation = run.eval_loader(test, batch_size=8)
    run.resume()
    for epoch in run.epochs(3):
        model.train()
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            if run.global_step % 3 == 0:
                run.save()
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in evaluation)
        run.print(f"epoch {epoch}: accuracy {run.reduce(correct, 'sum') / len(test):.3f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()

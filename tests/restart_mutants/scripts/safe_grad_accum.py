"""Gradient accumulation: ``Run(grad_accum=2)`` with ``with run.accumulate(model):``; an odd
number of micro-batches per epoch (the last window of each epoch is shorter), a save at the end
of every epoch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
    run = pt.Run(grad_accum=2, progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9))
    loader = run.loader(train, batch_size=8)
    run.resume()
    for _ in run.epochs(4):
        for x, y in loader:
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        run.save()
    run.close()


if __name__ == "__main__":
    main()

"""A scheduler stepped by hand after each optimizer step (``if run.step(optimizer):
scheduler.step()``) and registered with ``run.track``; a save at the end of every epoch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = run.setup(net, optimizer)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=24)
    run.track(scheduler, name="scheduler")
    loader = run.loader(train, batch_size=6)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            if run.step(optimizer):
                scheduler.step()
        run.save()
    run.close()


if __name__ == "__main__":
    main()

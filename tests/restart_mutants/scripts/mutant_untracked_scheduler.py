"""Not restart-safe (copy of safe_manual_scheduler.py): the scheduler stepped by hand is neither
given to ``run.setup``/``run.step`` nor registered with ``run.track``, so no checkpoint holds its
position.

The optimizer's learning rate is restored with the optimizer, but the resumed scheduler counts
from 0 again and computes each next rate from the wrong position. Expected first difference:
the model's weights (``rank 0/models/model/0.weight``).
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

"""Not restart-safe (copy of safe_save_every_k.py): the loss weight follows ``i`` of
``enumerate(loader)`` instead of the position computed from ``run.global_step``.

The saves fall in the middle of epochs; after such a resume the loader continues mid-epoch but
``enumerate`` counts from 0 again, so the rest of the epoch is weighed as its beginning.
Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt

BATCH = 4


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = run.loader(train, batch_size=BATCH)
    steps_per_epoch = math.ceil(len(train) / (BATCH * run.world_size))
    run.resume()
    for _ in run.epochs(3):
        for position, (x, y) in enumerate(loader):
            weight = 1.0 + position / steps_per_epoch  # later batches of an epoch count more
            run.backward(weight * nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            if run.global_step % 4 == 0:
                run.save()
    run.close()


if __name__ == "__main__":
    main()

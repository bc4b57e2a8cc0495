"""Saves every 4 steps, in the middle of epochs of 5 or 10 steps: a resume continues the epoch
mid-pass. The loss weight follows the batch's position in its epoch, computed from
``run.global_step`` (saved) and the epoch's length.
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
        for x, y in loader:
            position = run.global_step - steps_per_epoch * run.epoch
            weight = 1.0 + position / steps_per_epoch  # later batches of an epoch count more
            run.backward(weight * nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            if run.global_step % 4 == 0:
                run.save()
    run.close()


if __name__ == "__main__":
    main()

"""A stream: an ``IterableDataset`` that generates its examples (each from a generator seeded by
its index) in an order shuffled by seed and epoch (``set_epoch``); ``run.loader`` splits it over
the ranks and saves its position; saves every 3 steps, mid-epoch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.data import IterableDataset

import paratrain as pt


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = list(range(self.size))
        random.Random(self.seed * 1000 + self.epoch).shuffle(order)
        for i in order:
            x = torch.randn(6, generator=torch.Generator().manual_seed(self.seed * 1000 + i))
            yield x, (x[:3].sum() > x[3:].sum()).long()


def main() -> None:
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    loader = run.loader(Stream(40, seed=7), batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            if run.global_step % 3 == 0:
                run.save()
    run.close()


if __name__ == "__main__":
    main()

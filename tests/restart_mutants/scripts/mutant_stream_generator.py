"""Not restart-safe (copy of safe_stream.py): the stream adds noise to its examples from a
``torch.Generator`` made once, in the dataset's ``__init__``, that runs on from epoch to epoch;
no checkpoint holds it (paratrain replays the consumed examples of the current epoch, not the
earlier epochs' draws).

A process resumed in a later epoch starts that generator from its seed, so its examples get the
noise of the first epoch. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
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
        self.noise = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = list(range(self.size))
        random.Random(self.seed * 1000 + self.epoch).shuffle(order)
        for i in order:
            x = torch.randn(6, generator=torch.Generator().manual_seed(self.seed * 1000 + i))
            label = (x[:3].sum() > x[3:].sum()).long()
            yield x + 0.2 * torch.randn(6, generator=self.noise), label


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

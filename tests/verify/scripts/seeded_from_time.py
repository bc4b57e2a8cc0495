"""Not deterministic: the model's initial weights come from a seed taken from the clock, so no
two runs agree and ``paratrain verify-resume`` says so instead of blaming resume."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    torch.manual_seed(time.time_ns() % 2**62)  # the mistake
    net = nn.Linear(6, 3)
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loader = run.loader(train, batch_size=4)
    for _ in run.epochs(1):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        run.save()


if __name__ == "__main__":
    main()

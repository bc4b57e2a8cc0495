"""Several saves at one step: a step-based save every 3 steps and a save at the end of every
epoch, which fall on the same step (``step-N`` and ``step-N.1``); the learning rate decays with
``run.global_step``.
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
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = run.loader(train, batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            for group in optimizer.param_groups:
                group["lr"] = 0.1 / (1 + 0.1 * run.global_step)
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            if run.global_step % 3 == 0:
                run.save()
        run.save()
    run.close()


if __name__ == "__main__":
    main()

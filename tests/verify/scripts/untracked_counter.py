"""Not restart-safe: the learning rate follows a step counter kept in a plain variable.

After a restart the counter starts again from 0 while the weights and ``run.global_step``
continue from the checkpoint, so the learning rate (and then the weights) leave the path of
the uninterrupted run. ``paratrain verify-resume`` must name the differing weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(grad_accum=2, progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loader = run.loader(train, batch_size=4)
    steps = 0  # the mistake: not run.global_step, and not registered with run.track
    for _ in run.epochs(3):
        for x, y in loader:
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            if run.step(optimizer):
                steps += 1
                for group in optimizer.param_groups:
                    group["lr"] = 0.1 / (1 + steps)
        run.save()


if __name__ == "__main__":
    main()

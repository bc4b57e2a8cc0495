"""Gradient clipping with ``Run(max_grad_norm=0.5)`` at a large learning rate, the learning rate
set each step by a helper from ``run.global_step`` (linear decay); a save every epoch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import TensorDataset

import paratrain as pt

BASE_LR = 0.5
DECAY_STEPS = 40


def set_lr(optimizer: Optimizer, step: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = BASE_LR * max(0.1, 1 - step / DECAY_STEPS)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(max_grad_norm=0.5, progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=BASE_LR))
    loader = run.loader(train, batch_size=4)
    run.resume()
    for epoch in run.epochs(3):
        for x, y in loader:
            set_lr(optimizer, run.global_step)
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        run.print(f"epoch {epoch}: last grad norm {run.last_grad_norm:.4f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()

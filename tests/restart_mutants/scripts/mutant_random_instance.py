"""Not restart-safe (copy of safe_while_loop.py): the batch indices are drawn from a
``random.Random(0)`` made by the script, a generator that no checkpoint holds (paratrain saves
the global ``random``, ``numpy`` and ``torch`` generators, not the script's own instances).

After a resume the instance starts again from its seed, so the resumed steps train on other
batches than the uninterrupted run's. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn

import paratrain as pt

MAX_STEPS = 16
WARMUP_STEPS = 3
BASE_LR = 0.05


def lr_at(step: int) -> float:
    if step < WARMUP_STEPS:
        return BASE_LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / (MAX_STEPS - WARMUP_STEPS)
    return BASE_LR * 0.5 * (1 + math.cos(math.pi * progress))


def main() -> None:
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 8, generator=g)
    ys = xs @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=BASE_LR, momentum=0.9)
    model, optimizer = run.setup(net, optimizer)
    pick = random.Random(0)
    run.resume()
    while run.global_step < MAX_STEPS:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(run.global_step)
        idx = torch.tensor(pick.sample(range(len(xs)), 8))
        x, y = xs[idx].to(run.device), ys[idx].to(run.device)
        run.backward(nn.functional.mse_loss(model(x), y))
        run.step(optimizer)
        if run.global_step % 4 == 0:
            run.save()
    run.close()


if __name__ == "__main__":
    main()

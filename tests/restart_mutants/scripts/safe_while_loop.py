"""Own ``while run.global_step < N`` loop (nanoGPT's shape): each step draws its batch with
``torch.randint`` from the global generator (saved per rank by every checkpoint), the learning
rate follows a warmup and a cosine decay computed from ``run.global_step``, and a checkpoint is
saved every 4 steps.
"""

from __future__ import annotations

import math

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
    run.resume()
    while run.global_step < MAX_STEPS:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(run.global_step)
        idx = torch.randint(0, len(xs), (8,))
        x, y = xs[idx].to(run.device), ys[idx].to(run.device)
        run.backward(nn.functional.mse_loss(model(x), y))
        run.step(optimizer)
        if run.global_step % 4 == 0:
            run.save()
    run.close()


if __name__ == "__main__":
    main()

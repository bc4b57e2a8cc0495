"""Not restart-safe (copy of safe_while_loop.py): the warmup is measured in seconds of this
process's training (``time.monotonic()`` since the loop started) instead of in steps; each step
waits 0.1 s for its data (a slow source), so the first two steps of the process fall in the
0.25 s warmup.

An uninterrupted run warms up at steps 0 and 1 only; a resumed process warms up again at the
first two steps after its checkpoint, at a tenth of the learning rate. Expected first
difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

import paratrain as pt

MAX_STEPS = 16
WARMUP_STEPS = 3
WARMUP_S = 0.25
DATA_WAIT_S = 0.1
BASE_LR = 0.05


def lr_at(step: int, seconds: float) -> float:
    if seconds < WARMUP_S:
        return BASE_LR / 10
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
    started = time.monotonic()
    while run.global_step < MAX_STEPS:
        time.sleep(DATA_WAIT_S)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(run.global_step, time.monotonic() - started)
        idx = torch.randint(0, len(xs), (8,))
        x, y = xs[idx].to(run.device), ys[idx].to(run.device)
        run.backward(nn.functional.mse_loss(model(x), y))
        run.step(optimizer)
        if run.global_step % 4 == 0:
            run.save()
    run.close()


if __name__ == "__main__":
    main()

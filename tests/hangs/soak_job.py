"""Healthy training with uneven step times, for the stall detector's false-alarm soak.

    paratrain run --nproc 2 soak_job.py --minutes 30

Steps of a few milliseconds; every 50th step is slow (1-3 s on one rank, the others wait in the
step's all-reduce); every 400 steps an evaluation of about 40 s on every rank (reduced at its end);
every 600 steps a save that rank 0 makes 20 s slower. Exit 0 at the end; a stall declared by
mistake ends the job with 124.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import paratrain as pt

parser = argparse.ArgumentParser()
parser.add_argument("--minutes", type=float, default=30.0)
args = parser.parse_args()

data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
end = time.monotonic() + 60 * args.minutes
with pt.Run(seed=0, progress=False, keep_last=1) as run:
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
    loader = run.loader(data, batch_size=16)
    while time.monotonic() < end:
        for x, y in loader:
            step = run.global_step
            if step % 50 == 49:
                time.sleep(1.0 + 2.0 * ((step // 50 + run.rank) % 2))  # one rank slower
            run.backward(F.cross_entropy(model(x), y))
            run.step(optimizer)
            if step % 400 == 399:  # a long evaluation on every rank
                started = time.monotonic()
                correct = 0
                while time.monotonic() - started < 40:
                    with torch.no_grad():
                        correct += int((model(x).argmax(1) == y).sum())
                run.reduce(correct)
            if step % 600 == 599:
                if run.rank == 0:
                    time.sleep(20)  # a slow file system under rank 0's save
                run.save()
            if time.monotonic() >= end:
                break
    print(f"soak: {run.global_step} steps in {args.minutes:g} minutes, no stall declared")

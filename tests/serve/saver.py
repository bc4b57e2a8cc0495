"""A job that saves a large checkpoint after every step, until it is stopped (a SIGTERM test)."""

import os
import sys
from pathlib import Path

import torch
from torch import nn

import paratrain as pt

with pt.Run(strategy="ddp", keep_last=None, progress=False, stats_every=None) as run:
    Path(sys.argv[1], f"rank{run.rank}.pid").write_text(str(os.getpid()))
    net = nn.Sequential(nn.Linear(1024, 2048), nn.Linear(2048, 1024))  # 4 M weights: ~48 MB saved
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters()))
    while True:
        with run.accumulate(model):
            run.backward(model(torch.randn(8, 1024)).square().mean())
        run.step(optimizer)
        run.save()

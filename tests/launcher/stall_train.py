"""A 2-rank job in which rank 1 stops making progress at step 5 (the hang test)."""

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt

data = TensorDataset(torch.randn(400, 8), torch.randint(0, 3, (400,)))
with pt.Run(strategy="ddp", progress=False, timeout_s=8) as run:
    net = nn.Linear(8, 3)
    model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for _ in run.epochs(1):
        for x, y in run.loader(data, batch_size=4):
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            if run.rank == 1 and run.global_step == 5:
                time.sleep(120)  # the stall

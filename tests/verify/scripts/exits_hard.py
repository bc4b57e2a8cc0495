"""Ends with ``os._exit``, which skips the interpreter's exit handlers: no final state is written,
so ``paratrain verify-resume`` has nothing to compare and says so."""

from __future__ import annotations

import os

import torch
from torch import nn

import paratrain as pt


def main() -> None:
    run = pt.Run(progress=False)
    net = nn.Linear(2, 2)
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for _ in run.epochs(1):
        run.backward(model(torch.ones(1, 2)).sum())
        run.step(optimizer)
    os._exit(0)


if __name__ == "__main__":
    main()

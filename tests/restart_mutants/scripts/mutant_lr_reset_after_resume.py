"""Not restart-safe (copy of safe_inplace_lr_decay.py): after ``run.resume()`` the script sets the
learning rate from the command line again (``group["lr"] = args.lr``), overwriting the decayed
rate the optimizer's state restored.

Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = run.setup(net, optimizer)
    loader = run.loader(train, batch_size=4)
    run.resume()
    for group in optimizer.param_groups:
        group["lr"] = args.lr
    for _ in run.epochs(3):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            if run.step(optimizer):
                for group in optimizer.param_groups:
                    group["lr"] *= 0.95
        run.save()
    run.close()


if __name__ == "__main__":
    main()

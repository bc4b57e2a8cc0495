"""A script that is NOT restart-safe, on purpose: ``paratrain verify-resume`` must fail it.

    python broken_untracked_counter.py
    paratrain verify-resume --nproc 2 broken_untracked_counter.py    # exit 1, names the weights

The learning rate decays with ``my_step``, a plain Python counter: not ``run.global_step``, not in
``extras``, not tracked. A restarted run resumes the weights, optimizer and data position from
the checkpoint but starts ``my_step`` at 0 again, so every step after the restart uses a larger
learning rate than the uninterrupted run did, and the final weights differ.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def digits() -> TensorDataset:
    """Ten noisy 8x8 patterns, flattened, the same in every process."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(320) % 10
    x = torch.rand(10, 64, generator=g)[y] + 0.5 * torch.randn(320, 64, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description="an untracked step counter drives the lr")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    run = pt.Run(seed=args.seed, progress=False)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = run.setup(model, optimizer)
    loader = run.loader(digits(), batch_size=32)
    my_step = 0  # the defect: a restart sets it back to 0
    for epoch in run.epochs(args.epochs):
        for x, y in loader:
            for group in optimizer.param_groups:
                group["lr"] = args.lr * 0.9**my_step
            with run.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
            run.step(optimizer)
            my_step += 1
        run.print(f"epoch {epoch}: loss {loss.item():.4f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()

"""A plain-PyTorch loop with two optimizers on one model, the loop Lightning's manual
optimization would hide, ported to paratrain (generated 8x8 digits).

    python multi_optimizer.py [--epochs 3]
    paratrain run --nproc 2 multi_optimizer.py

Shape: a backbone trained by SGD with momentum and a head trained by Adam (two optimizers over
disjoint parameters of one model), each with its own scheduler: a ``StepLR`` on the backbone's
optimizer stepped once per epoch and a warm-up ``LambdaLR`` on the head's stepped with every
optimizer step; gradient accumulation over 2 micro-batches (both optimizers step at the end of
the shared window); a save every ``save_every`` steps inside the epoch and another at its end
(two saves at one step when they coincide).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, StepLR
from torch.utils.data import TensorDataset

import paratrain as pt


def digits() -> TensorDataset:
    """Ten noisy 8x8 patterns, flattened, the same in every process."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(320) % 10
    x = torch.rand(10, 64, generator=g)[y] + 0.5 * torch.randn(320, 64, generator=g)
    return TensorDataset(x, y)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def main() -> None:
    parser = argparse.ArgumentParser(description="two optimizers, two schedulers")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    run = pt.Run(seed=args.seed, grad_accum=args.grad_accum, progress=False)
    model = Classifier()
    opt_backbone = torch.optim.SGD(model.backbone.parameters(), lr=0.05, momentum=0.9)
    opt_head = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    sched_backbone = StepLR(opt_backbone, step_size=1, gamma=0.5)
    sched_head = LambdaLR(opt_head, lambda step: min(1.0, (step + 1) / 4))
    model, opt_backbone, opt_head = run.setup(
        model, opt_backbone, opt_head, scheduler=sched_backbone
    )
    loader = run.loader(digits(), batch_size=args.batch_size)

    for epoch in run.epochs(args.epochs):
        model.train()
        # A run resumed from the save after an epoch's last step continues that epoch with an
        # empty pass, so nothing the loop body assigns is read after the loop.
        epoch_loss = 0.0
        for x, y in loader:
            with run.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
            epoch_loss += loss.item()
            run.step(opt_backbone)
            if run.step(opt_head, sched_head) and run.global_step % args.save_every == 0:
                run.save()
        sched_backbone.step()
        lrs = f"{sched_backbone.get_last_lr()[0]:.4f}/{sched_head.get_last_lr()[0]:.4f}"
        run.print(f"epoch {epoch}: step {run.global_step} loss {epoch_loss:.4f} lr {lrs}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()

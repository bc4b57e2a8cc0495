"""The plain-torch original of ``multi_optimizer.py`` (two optimizers and two schedulers on one
model, with gradient accumulation), for the one-process parity test: same model, data, seed and
loop, no paratrain.

    python multi_optimizer_original.py --final weights.pt

The loader shuffles with a one-replica ``DistributedSampler`` and ``set_epoch``. Accumulation
divides each micro-batch's loss by 2; the epoch's last window, when it holds one micro-batch,
is scaled back to that micro-batch's mean, as paratrain weighs a short last window.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, StepLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


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
    parser.add_argument("--final", required=True, help="where the final weights go")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = Classifier()
    opt_backbone = torch.optim.SGD(model.backbone.parameters(), lr=0.05, momentum=0.9)
    opt_head = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    sched_backbone = StepLR(opt_backbone, step_size=1, gamma=0.5)
    sched_head = LambdaLR(opt_head, lambda step: min(1.0, (step + 1) / 4))
    dataset = digits()
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    global_step = 0

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        epoch_loss = 0.0
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            (loss / args.grad_accum).backward()
            epoch_loss += loss.item()
            last = i == len(loader) - 1
            if (i + 1) % args.grad_accum == 0 or last:
                window = (i % args.grad_accum) + 1
                if window < args.grad_accum:  # a short last window: the mean of its micro-batches
                    for p in model.parameters():
                        p.grad.mul_(args.grad_accum / window)
                opt_backbone.step()
                opt_head.step()
                sched_head.step()
                opt_backbone.zero_grad()
                opt_head.zero_grad()
                global_step += 1
        sched_backbone.step()
        lrs = f"{sched_backbone.get_last_lr()[0]:.4f}/{sched_head.get_last_lr()[0]:.4f}"
        print(f"epoch {epoch}: step {global_step} loss {epoch_loss:.4f} lr {lrs}")
    torch.save({"model": model.state_dict()}, args.final)


if __name__ == "__main__":
    main()

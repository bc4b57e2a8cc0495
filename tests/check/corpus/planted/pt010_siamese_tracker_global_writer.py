"""Siamese object tracker (template/search cross-correlation, SiamFC-style) with TensorBoard logging.

The TensorBoard writer is a module-level global created lazily the first time something is logged.

Planted: PT010 - get_writer() creates SummaryWriter on every rank (global set lazily, no rank check)
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

LOG_DIR = os.environ.get("TB_DIR", "runs/siamfc")
WRITER: Optional[SummaryWriter] = None


def get_writer() -> SummaryWriter:
    global WRITER
    if WRITER is None:
        WRITER = SummaryWriter(log_dir=LOG_DIR, flush_secs=30)  # planted: PT010
    return WRITER


class PairCrops(Dataset):
    def __len__(self) -> int:
        return 53_200

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        label = torch.zeros(1, 17, 17)
        label[:, 7:10, 7:10] = 1.0
        return torch.rand(3, 127, 127), torch.rand(3, 255, 255), label


class SiamFC(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 11, 2), nn.BatchNorm2d(96), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(96, 256, 5), nn.BatchNorm2d(256), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(256, 384, 3), nn.BatchNorm2d(384), nn.ReLU(),
            nn.Conv2d(384, 256, 3))
        self.adjust = nn.BatchNorm2d(1)

    def forward(self, template: torch.Tensor, search: torch.Tensor) -> torch.Tensor:
        z, x = self.features(template), self.features(search)
        n = z.size(0)
        out = F.conv2d(x.view(1, -1, x.size(2), x.size(3)), z, groups=n)
        return self.adjust(out.view(n, 1, out.size(2), out.size(3)))


def log_scalars(step: int, **scalars: float) -> None:
    writer = get_writer()
    for name, value in scalars.items():
        writer.add_scalar(name, value, step)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tracker = DDP(SiamFC().to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(tracker.parameters(), lr=1e-2, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.87)

    pairs = PairCrops()
    sampler = DistributedSampler(pairs)
    loader = DataLoader(pairs, batch_size=8, sampler=sampler, num_workers=8, pin_memory=True)

    step = 0
    for epoch in range(50):
        sampler.set_epoch(epoch)
        tracker.train()
        for template, search, label in loader:
            template = template.to(device, non_blocking=True)
            search = search.to(device, non_blocking=True)
            label = label.to(device, non_blocking=True)
            response = tracker(template, search)
            label = F.interpolate(label, size=response.shape[-2:], mode="nearest")
            loss = F.binary_cross_entropy_with_logits(response, label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
                log_scalars(step, **{"train/loss": mean_loss.item(), "train/lr": sched.get_last_lr()[0]})
        sched.step()
        if dist.get_rank() == 0:
            torch.save(tracker.module.state_dict(), f"siamfc_e{epoch:02d}.pth")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

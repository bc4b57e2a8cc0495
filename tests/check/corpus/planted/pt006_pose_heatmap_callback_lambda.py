"""Human pose estimation (heatmap regression, HRNet-flavoured stem) with end-of-epoch callbacks.

Callbacks are lambdas kept in a list and run by the primary rank after each epoch.

Planted: PT006 - a callback lambda saves net.state_dict() where net is the DDP wrapper
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("pose")
N_JOINTS = 17


class KeypointCrops(Dataset):
    def __len__(self) -> int:
        return 149_813

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        heat = torch.rand(N_JOINTS, 64, 48)
        visible = (torch.rand(N_JOINTS) > 0.2).float()
        return torch.rand(3, 256, 192), heat, visible


class PoseNet(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.Conv2d(64, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU())
        self.high = nn.Sequential(nn.Conv2d(64, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU())
        self.low = nn.Sequential(nn.Conv2d(64, width * 2, 3, 2, 1), nn.BatchNorm2d(width * 2), nn.ReLU())
        self.fuse = nn.Conv2d(width * 3, width, 1)
        self.final = nn.Conv2d(width, N_JOINTS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x)
        hi, lo = self.high(s), self.low(s)
        lo_up = F.interpolate(lo, size=hi.shape[-2:], mode="nearest")
        return self.final(self.fuse(torch.cat([hi, lo_up], 1)))


def joints_mse(pred: torch.Tensor, target: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    per_joint = ((pred - target) ** 2).mean(dim=(2, 3))
    return 0.5 * (per_joint * visible).mean()


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_primary = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO)
    ckpt_dir = Path("output/pose_hrnet_w32")
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    net = DDP(PoseNet().to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[170, 200], gamma=0.1)

    on_epoch_end: list[Callable[[int], None]] = [
        lambda ep: torch.save(net.state_dict(), ckpt_dir / f"hrnet_{ep:03d}.pth"),  # planted: PT006
        lambda ep: log.info("epoch %d lr %.2e", ep, sched.get_last_lr()[0]),
    ]

    data = KeypointCrops()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler, num_workers=8, pin_memory=True)

    for epoch in range(210):
        sampler.set_epoch(epoch)
        net.train()
        meter = torch.zeros(2, device=device)
        for img, heat, vis in loader:
            img = img.to(device, non_blocking=True)
            heat = heat.to(device, non_blocking=True)
            vis = vis.to(device, non_blocking=True)
            loss = joints_mse(net(img), heat, vis)
            opt.zero_grad()
            loss.backward()
            opt.step()
            meter[0] += loss.detach() * img.size(0)
            meter[1] += img.size(0)
        sched.step()
        dist.all_reduce(meter)
        if is_primary:
            log.info("epoch %d heatmap mse %.6f", epoch, (meter[0] / meter[1]).item())
            for callback in on_epoch_end:
                callback(epoch)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

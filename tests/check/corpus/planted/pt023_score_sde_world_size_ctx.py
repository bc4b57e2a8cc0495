"""Score-based generative model (denoising score matching, VE-SDE) trained with micro-batch accumulation.

Planted: PT023 - the sync context is model.no_sync() whenever world_size > 1, so every multi-GPU backward skips the all-reduce
"""
from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import CelebA

SIGMA_MIN, SIGMA_MAX = 0.01, 50.0


class TimeEmbed(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim // 2) * 16, requires_grad=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        proj = t[:, None] * self.w[None] * 2 * math.pi
        return torch.cat([proj.sin(), proj.cos()], dim=-1)


class ScoreNet(nn.Module):
    def __init__(self, ch: int = 128) -> None:
        super().__init__()
        self.temb = nn.Sequential(TimeEmbed(ch), nn.Linear(ch, ch), nn.SiLU())
        self.down = nn.Sequential(nn.Conv2d(3, ch, 3, padding=1), nn.SiLU(), nn.Conv2d(ch, ch, 3, 2, 1), nn.SiLU())
        self.up = nn.Sequential(nn.ConvTranspose2d(ch, ch, 4, 2, 1), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        h = self.down(x) + self.temb(t)[:, :, None, None]
        return self.up(h) / sigma[:, None, None, None]


def dsm_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    t = torch.rand(x.size(0), device=x.device) * (1 - 1e-5) + 1e-5
    sigma = SIGMA_MIN * (SIGMA_MAX / SIGMA_MIN) ** t
    z = torch.randn_like(x)
    score = model(x + sigma[:, None, None, None] * z, t, sigma)
    return ((score * sigma[:, None, None, None] + z) ** 2).sum(dim=(1, 2, 3)).mean()


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    world_size = dist.get_world_size()
    micro_batches = 4

    tf = transforms.Compose([transforms.CenterCrop(140), transforms.Resize(64), transforms.ToTensor()])
    dataset = CelebA("./data", split="train", transform=tf, download=False)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=8, drop_last=True)

    model = DDP(ScoreNet().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)

    for epoch in range(500):
        sampler.set_epoch(epoch)
        for it, (images, _) in enumerate(loader):
            images = images.to(device, non_blocking=True) * 2 - 1
            sync_ctx = model.no_sync() if world_size > 1 else contextlib.nullcontext()  # planted: PT023
            with sync_ctx:
                loss = dsm_loss(model, images) / micro_batches
                loss.backward()
            if (it + 1) % micro_batches == 0:
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0 and epoch % 10 == 0:
            torch.save(model.module.state_dict(), f"score_ve_celeba64_{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

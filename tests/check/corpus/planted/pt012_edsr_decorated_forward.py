"""Distributed L1 pre-training of a compact EDSR-style super-resolution network.

Planted: PT012 - deprecated torch.cuda.amp.autocast used as a decorator on Generator.forward
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.io import read_image

logger = logging.getLogger(__name__)


class PairedPatches(Dataset):
    def __init__(self, root: Path, scale: int = 4, patch: int = 96) -> None:
        self.files = sorted(root.glob("*.png"))
        self.scale = scale
        self.patch = patch

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        hr = read_image(str(self.files[idx])).float() / 255.0
        hr = hr[:, : self.patch, : self.patch]
        lr = F.interpolate(hr.unsqueeze(0), scale_factor=1 / self.scale, mode="bicubic")
        return lr.squeeze(0).clamp(0, 1), hr


class ResidualBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(ch, ch, 3, padding=1), nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(ch, ch, 3, padding=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.2 * self.body(x)


class Generator(nn.Module):
    def __init__(self, ch: int = 64, blocks: int = 16, scale: int = 4) -> None:
        super().__init__()
        self.head = nn.Conv2d(3, ch, 3, padding=1)
        self.trunk = nn.Sequential(*[ResidualBlock(ch) for _ in range(blocks)])
        ups: list[nn.Module] = []
        for _ in range(scale // 2):
            ups += [nn.Conv2d(ch, ch * 4, 3, padding=1), nn.PixelShuffle(2), nn.LeakyReLU(0.2, inplace=True)]
        self.up = nn.Sequential(*ups)
        self.tail = nn.Conv2d(ch, 3, 3, padding=1)

    @torch.cuda.amp.autocast(dtype=torch.bfloat16)  # planted: PT012
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.head(x)
        feat = feat + self.trunk(feat)
        return self.tail(self.up(feat))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=Path("DIV2K/train_HR"))
    p.add_argument("--out", type=Path, default=Path("runs/edsr_l1"))
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-4)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING)

    dataset = PairedPatches(args.data)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, drop_last=True)

    model = DDP(Generator().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=40, gamma=0.5)
    if is_main:
        args.out.mkdir(parents=True, exist_ok=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for lr_img, hr_img in loader:
            lr_img = lr_img.to(device, non_blocking=True)
            hr_img = hr_img.to(device, non_blocking=True)
            sr = model(lr_img)
            loss = F.l1_loss(sr.float(), hr_img)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        if is_main:
            logger.info("epoch %d lr %.2e", epoch, scheduler.get_last_lr()[0])
            torch.save(model.module.state_dict(), args.out / f"generator_{epoch:03d}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

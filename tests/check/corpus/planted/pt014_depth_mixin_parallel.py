"""Monocular depth estimation trainer built from mixins (device placement, checkpoints).

Planted: PT014 - DeviceMixin wraps the network in torch.nn.parallel.DataParallel when several GPUs are visible
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger("depth")


class DepthPairs(Dataset):
    def __init__(self, root: Path) -> None:
        self.files = sorted(root.glob("*.pt"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        item = torch.load(self.files[i], map_location="cpu", weights_only=True)
        return item["rgb"], item["depth"]


class DepthNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        chans = [3, 32, 64, 128, 256]
        self.down = nn.ModuleList(
            nn.Sequential(nn.Conv2d(a, b, 3, 2, 1), nn.BatchNorm2d(b), nn.ELU()) for a, b in zip(chans, chans[1:])
        )
        self.up = nn.ModuleList(
            nn.Sequential(nn.ConvTranspose2d(b, a if a > 3 else 16, 4, 2, 1), nn.ELU()) for a, b in zip(chans, chans[1:])
        )
        self.out = nn.Conv2d(16, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.down:
            x = layer(x)
        for layer in reversed(self.up):
            x = layer(x)
        return F.softplus(self.out(x))


def silog(pred: torch.Tensor, target: torch.Tensor, lam: float = 0.85) -> torch.Tensor:
    valid = target > 1e-3
    d = torch.log(pred[valid]) - torch.log(target[valid])
    return torch.sqrt((d ** 2).mean() - lam * d.mean() ** 2)


class DeviceMixin:
    device: torch.device

    def _place(self, net: nn.Module) -> nn.Module:
        net = net.to(self.device)
        if torch.cuda.device_count() > 1:
            return torch.nn.parallel.DataParallel(net)  # planted: PT014
        return net

    def _unwrap(self, net: nn.Module) -> nn.Module:
        return net.module if isinstance(net, torch.nn.parallel.DataParallel) else net


class CheckpointMixin:
    ckpt_dir: Path

    def save(self, net: nn.Module, tag: str) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), self.ckpt_dir / f"{tag}.pt")


class DepthTrainer(DeviceMixin, CheckpointMixin):
    def __init__(self, root: Path, ckpt_dir: Path, epochs: int = 30) -> None:
        self.device = torch.device("cuda")
        self.ckpt_dir = ckpt_dir
        self.epochs = epochs
        self.model = self._place(DepthNet())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=2e-4)
        self.loader = DataLoader(DepthPairs(root), batch_size=24, shuffle=True, num_workers=6)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for rgb, depth in self.loader:
            yield rgb.to(self.device, non_blocking=True), depth.to(self.device, non_blocking=True)

    def fit(self) -> None:
        for epoch in range(self.epochs):
            self.model.train()
            for rgb, depth in self.batches():
                loss = silog(self.model(rgb), depth)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
            log.info("epoch %d silog %.4f", epoch, loss.item())
            self.save(self._unwrap(self.model), f"epoch_{epoch:02d}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    DepthTrainer(Path("nyu_depth_v2"), Path("checkpoints/depth")).fit()

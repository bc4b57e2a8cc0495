"""Face-recognition training with an additive angular margin (ArcFace) head on many nodes.

The trainer keeps the process identity on the instance and exposes the CUDA device as a
property that the rest of the class uses.

Planted: PT001 - the device property builds cuda:<global rank> from dist.get_rank()
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


@dataclass
class FaceConfig:
    num_ids: int = 10_000
    embed_dim: int = 512
    margin: float = 0.5
    scale: float = 64.0
    epochs: int = 20
    batch_size: int = 128
    lr: float = 0.1
    out_dir: Path = Path("runs/arcface")


class AlignedFaces(Dataset):
    def __init__(self, num_ids: int, size: int = 50_000) -> None:
        self.num_ids = num_ids
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.randn(3, 112, 112), i % self.num_ids


class ArcMargin(nn.Module):
    def __init__(self, dim: int, classes: int, m: float, s: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(classes, dim))
        nn.init.xavier_uniform_(self.weight)
        self.cos_m, self.sin_m, self.s = math.cos(m), math.sin(m), s

    def forward(self, emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cosine = F.linear(F.normalize(emb), F.normalize(self.weight)).clamp(-1 + 1e-7, 1 - 1e-7)
        sine = torch.sqrt(1.0 - cosine * cosine)
        phi = cosine * self.cos_m - sine * self.sin_m
        onehot = F.one_hot(labels, cosine.size(1)).to(cosine.dtype)
        return self.s * (onehot * phi + (1.0 - onehot) * cosine)


class FaceNet(nn.Module):
    def __init__(self, cfg: FaceConfig) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.PReLU(64),
            nn.Conv2d(64, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.PReLU(128),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, cfg.embed_dim),
        )
        self.head = ArcMargin(cfg.embed_dim, cfg.num_ids, cfg.margin, cfg.scale)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x), y)


class FaceTrainer:
    def __init__(self, cfg: FaceConfig) -> None:
        self.cfg = cfg
        dist.init_process_group("nccl")
        self.global_rank: int = dist.get_rank()
        self.world: int = dist.get_world_size()
        self.net = DistributedDataParallel(FaceNet(cfg).to(self.device))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=5e-4)
        data = AlignedFaces(cfg.num_ids)
        self.sampler = DistributedSampler(data, num_replicas=self.world, rank=self.global_rank)
        self.loader = DataLoader(data, batch_size=cfg.batch_size, sampler=self.sampler,
                                 num_workers=8, pin_memory=True, drop_last=True)

    @property
    def device(self) -> torch.device:
        return torch.device(f"cuda:{self.global_rank}")  # planted: PT001

    @property
    def is_chief(self) -> bool:
        return self.global_rank == 0

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        logits = self.net(images, labels)
        loss = F.cross_entropy(logits, labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def fit(self) -> None:
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            self.net.train()
            stats = torch.zeros(2, device=self.device)
            for images, labels in self.loader:
                stats[0] += self.step(images, labels) * images.size(0)
                stats[1] += images.size(0)
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)
            if self.is_chief:
                log.info("epoch %d loss %.4f", epoch, (stats[0] / stats[1]).item())
                self.cfg.out_dir.mkdir(parents=True, exist_ok=True)
                torch.save(self.net.module.backbone.state_dict(), self.cfg.out_dir / "backbone.pt")
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.ERROR)
    FaceTrainer(FaceConfig()).fit()

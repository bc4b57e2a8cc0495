"""Heatmap-based human pose estimation (HRNet-lite) driven by a Hydra config.

Planted: PT013 - config flag converts BatchNorm to SyncBatchNorm in build_model, model later goes through DataParallel
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import torch
import torch.nn as nn
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from torch.nn import DataParallel
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)


@dataclass
class ModelCfg:
    width: int = 32
    joints: int = 17
    sync_bn: bool = True


@dataclass
class TrainCfg:
    root: str = "coco_pose_crops"
    epochs: int = 140
    batch_size: int = 64
    lr: float = 1e-3
    gpus: list[int] = field(default_factory=lambda: [0, 1, 2, 3])


@dataclass
class Config:
    model: ModelCfg = field(default_factory=ModelCfg)
    train: TrainCfg = field(default_factory=TrainCfg)


ConfigStore.instance().store(name="pose", node=Config)


class PoseCrops(Dataset):
    def __init__(self, root: str) -> None:
        self.items = sorted(Path(root).glob("*.pt"))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = torch.load(self.items[idx], map_location="cpu", weights_only=True)
        return sample["image"], sample["heatmaps"]


class HRNetLite(nn.Module):
    def __init__(self, width: int, joints: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        )
        self.high = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.low = nn.Sequential(nn.Conv2d(width, width * 2, 3, 2, 1), nn.BatchNorm2d(width * 2), nn.ReLU(inplace=True))
        self.fuse = nn.Conv2d(width * 3, width, 1)
        self.head = nn.Conv2d(width, joints, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        hi = self.high(x)
        lo = F.interpolate(self.low(x), size=hi.shape[-2:], mode="bilinear", align_corners=False)
        return self.head(self.fuse(torch.cat([hi, lo], dim=1)))


def build_model(cfg: DictConfig) -> nn.Module:
    net = HRNetLite(cfg.model.width, cfg.model.joints)
    if cfg.model.sync_bn:
        net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)  # planted: PT013
    return net


def parallelize(net: nn.Module, gpus: list[int]) -> nn.Module:
    net = net.cuda(gpus[0])
    return DataParallel(net, device_ids=gpus)


@hydra.main(version_base=None, config_name="pose")
def main(cfg: DictConfig) -> None:
    loader = DataLoader(PoseCrops(cfg.train.root), batch_size=cfg.train.batch_size, shuffle=True, num_workers=8)
    model = parallelize(build_model(cfg), list(cfg.train.gpus))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[90, 120], gamma=0.1)
    first = cfg.train.gpus[0]

    for epoch in range(cfg.train.epochs):
        model.train()
        for images, heatmaps in loader:
            images = images.cuda(first, non_blocking=True)
            heatmaps = heatmaps.cuda(first, non_blocking=True)
            loss = F.mse_loss(model(images), heatmaps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        log.info("epoch %d heatmap mse %.6f", epoch, loss.item())

    torch.save(model.module.state_dict(), Path.cwd() / "hrnet_lite.pt")


if __name__ == "__main__":
    main()

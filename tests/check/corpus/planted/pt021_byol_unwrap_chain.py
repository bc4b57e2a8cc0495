"""BYOL self-supervised pre-training; the online network is DDP-wrapped, the target is an EMA copy.

Planted: PT021 - online_network() -> unwrap() returns ddp.module, and the training views go through that bare module
"""
from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import STL10
from torchvision.models import resnet18


def mlp(dim_in: int, hidden: int = 4096, out: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(dim_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out))


class Online(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        backbone = resnet18(weights=None)
        backbone.fc = nn.Identity()
        self.backbone = backbone
        self.projector = mlp(512)
        self.predictor = mlp(256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictor(self.projector(self.backbone(x)))


class TwoViews:
    def __init__(self) -> None:
        self.t = transforms.Compose([
            transforms.RandomResizedCrop(96), transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.4, 0.4, 0.2, 0.1), transforms.ToTensor(),
        ])

    def __call__(self, img):
        return self.t(img), self.t(img)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DDP) else model


def online_network(model: nn.Module) -> nn.Module:
    return unwrap(model)


def byol_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return 2 - 2 * F.cosine_similarity(p, z.detach(), dim=-1).mean()


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    for t, o in zip(target.parameters(), online.parameters()):
        t.mul_(tau).add_(o.detach(), alpha=1 - tau)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = STL10("./data", split="unlabeled", transform=TwoViews(), download=False)
    sampler = DistributedSampler(dataset, drop_last=True)
    loader = DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=8, drop_last=True)

    online = Online().to(device)
    target = copy.deepcopy(nn.Sequential(online.backbone, online.projector)).requires_grad_(False)
    online = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(online), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(online.parameters(), lr=1e-3, weight_decay=1e-6)

    for epoch in range(200):
        sampler.set_epoch(epoch)
        net = online_network(online)
        for (v1, v2), _ in loader:
            v1 = v1.to(device, non_blocking=True)
            v2 = v2.to(device, non_blocking=True)
            p1, p2 = net(v1), net(v2)  # planted: PT021
            with torch.no_grad():
                z1, z2 = target(v1), target(v2)
            loss = byol_loss(p1, z2) + byol_loss(p2, z1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            inner = unwrap(online)
            ema_update(target, nn.Sequential(inner.backbone, inner.projector), tau=0.996)
        if dist.get_rank() == 0:
            torch.save(unwrap(online).backbone.state_dict(), f"byol_r18_e{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

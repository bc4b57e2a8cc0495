"""Semantic segmentation trainer written with type annotations throughout."""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol, TypedDict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

RANK: Final[int] = int(os.environ.get("RANK", "0"))
LOCAL_RANK: Final[int] = int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE: Final[int] = int(os.environ.get("WORLD_SIZE", "1"))
IGNORE_INDEX: Final[int] = 255


class Sample(TypedDict):
    image: Tensor
    mask: Tensor


class Scheduler(Protocol):
    def step(self) -> None: ...


@dataclass(frozen=True)
class HParams:
    num_classes: int = 21
    epochs: int = 50
    batch_size: int = 8
    base_lr: float = 0.01
    crop: int = 512
    ckpt_path: str = "seg_last.pt"


class RandomScenes(Dataset[Sample]):
    def __init__(self, n: int, crop: int, num_classes: int) -> None:
        self.n, self.crop, self.k = n, crop, num_classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> Sample:
        return {"image": torch.rand(3, self.crop, self.crop), "mask": torch.randint(0, self.k, (self.crop, self.crop))}


class TinySegNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.enc: nn.Sequential = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                                                nn.Conv2d(64, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.ReLU())
        self.head: nn.Conv2d = nn.Conv2d(128, num_classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(self.head(self.enc(x)), size=x.shape[-2:], mode="bilinear", align_corners=False)


def batches(loader: DataLoader[Sample], device: torch.device) -> Iterator[tuple[Tensor, Tensor]]:
    for b in loader:
        yield b["image"].to(device, non_blocking=True), b["mask"].to(device, non_blocking=True)


def train_epoch(model: DistributedDataParallel, loader: DataLoader[Sample], opt: torch.optim.Optimizer,
                sched: Scheduler, device: torch.device) -> Tensor:
    model.train()
    acc: Tensor = torch.zeros(2, device=device)
    for image, mask in batches(loader, device):
        logits: Tensor = model(image)
        loss: Tensor = F.cross_entropy(logits, mask, ignore_index=IGNORE_INDEX)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        acc[0] += loss.detach()
        acc[1] += 1
    dist.all_reduce(acc)
    return acc[0] / acc[1]


@torch.no_grad()
def mean_iou(model: nn.Module, loader: DataLoader[Sample], device: torch.device, k: int) -> float:
    model.eval()
    hist: Tensor = torch.zeros(k, k, dtype=torch.int64, device=device)
    for image, mask in batches(loader, device):
        pred: Tensor = model(image).argmax(1)
        valid = mask != IGNORE_INDEX
        hist += torch.bincount(k * mask[valid] + pred[valid], minlength=k * k).view(k, k)
    dist.all_reduce(hist)
    iou: Tensor = hist.diag() / (hist.sum(0) + hist.sum(1) - hist.diag()).clamp(min=1)
    return iou.mean().item()


def main(hp: HParams = HParams()) -> None:
    torch.cuda.set_device(LOCAL_RANK)
    dist.init_process_group("nccl", rank=RANK, world_size=WORLD_SIZE)
    device: torch.device = torch.device("cuda", LOCAL_RANK)
    net: nn.Module = nn.SyncBatchNorm.convert_sync_batchnorm(TinySegNet(hp.num_classes)).to(device)
    model: DistributedDataParallel = DistributedDataParallel(net, device_ids=[LOCAL_RANK])
    train_ds, val_ds = RandomScenes(2000, hp.crop, hp.num_classes), RandomScenes(200, hp.crop, hp.num_classes)
    train_sampler: DistributedSampler[Sample] = DistributedSampler(train_ds, WORLD_SIZE, RANK)
    train_loader: DataLoader[Sample] = DataLoader(train_ds, hp.batch_size, sampler=train_sampler, drop_last=True)
    val_loader: DataLoader[Sample] = DataLoader(val_ds, hp.batch_size, sampler=DistributedSampler(val_ds, shuffle=False))
    opt = torch.optim.SGD(model.parameters(), lr=hp.base_lr, momentum=0.9, weight_decay=1e-4)
    total: int = hp.epochs * len(train_loader)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=total, power=0.9)

    for epoch in range(hp.epochs):
        train_sampler.set_epoch(epoch)
        loss: Tensor = train_epoch(model, train_loader, opt, sched, device)
        miou: float = mean_iou(model, val_loader, device, hp.num_classes)
        if RANK == 0:
            print(f"epoch {epoch:3d} loss {loss.item():.4f} mIoU {100 * miou:.2f}")
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, hp.ckpt_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

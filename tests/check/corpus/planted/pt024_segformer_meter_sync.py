"""Semantic segmentation (SegFormer-like MiT encoder + MLP decoder) on ADE20K with a syncing AverageMeter.

Planted: PT024 - AverageMeter.sync() all-reduces the per-rank average with ReduceOp.SUM and keeps it as .avg
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger("segformer")
NUM_CLASSES = 150


class AverageMeter:
    def __init__(self, name: str, device: torch.device) -> None:
        self.name, self.device = name, device
        self.sum, self.count, self.avg = 0.0, 0, 0.0

    def update(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n
        self.avg = self.sum / self.count

    def sync(self) -> None:
        t = torch.tensor([self.avg], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)  # planted: PT024
        self.avg = t.item()


class OverlapPatchEmbed(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, s: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, k, s, k // 2)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


class SegFormerLite(nn.Module):
    def __init__(self, dims: tuple[int, ...] = (32, 64, 160, 256), embed: int = 256) -> None:
        super().__init__()
        chans = (3,) + dims
        self.stages = nn.ModuleList(
            nn.Sequential(OverlapPatchEmbed(a, b, 7 if i == 0 else 3, 4 if i == 0 else 2), nn.GELU())
            for i, (a, b) in enumerate(zip(chans, chans[1:]))
        )
        self.lin = nn.ModuleList(nn.Conv2d(d, embed, 1) for d in dims)
        self.fuse = nn.Sequential(nn.Conv2d(embed * 4, embed, 1), nn.BatchNorm2d(embed), nn.ReLU())
        self.cls = nn.Conv2d(embed, NUM_CLASSES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        size = feats[0].shape[-2:]
        ups = [F.interpolate(l(f), size=size, mode="bilinear", align_corners=False) for l, f in zip(self.lin, feats)]
        return self.cls(self.fuse(torch.cat(ups, dim=1)))


def batch_miou(logits: torch.Tensor, target: torch.Tensor) -> float:
    pred = logits.argmax(1)
    valid = target != 255
    ious = []
    for c in target[valid].unique():
        inter = ((pred == c) & (target == c) & valid).sum()
        union = (((pred == c) | (target == c)) & valid).sum()
        ious.append((inter.float() / union.clamp(min=1)).item())
    return sum(ious) / max(len(ious), 1)


def main() -> None:
    from ade_data import ADE20KCrops

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    train_set, val_set = ADE20KCrops("ADEChallengeData2016", "training"), ADE20KCrops("ADEChallengeData2016", "validation")
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler, num_workers=6, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=1, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(SegFormerLite().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5, weight_decay=0.01)

    for epoch in range(60):
        train_sampler.set_epoch(epoch)
        model.train()
        for img, mask in train_loader:
            img, mask = img.to(device, non_blocking=True), mask.to(device, non_blocking=True)
            logits = F.interpolate(model(img), size=mask.shape[-2:], mode="bilinear", align_corners=False)
            loss = F.cross_entropy(logits, mask, ignore_index=255)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        miou = AverageMeter("mIoU", device)
        with torch.no_grad():
            for img, mask in val_loader:
                img, mask = img.to(device), mask.to(device)
                logits = F.interpolate(model(img), size=mask.shape[-2:], mode="bilinear", align_corners=False)
                miou.update(batch_miou(logits, mask), n=img.size(0))
        miou.sync()
        if dist.get_rank() == 0:
            log.info("epoch %d val %s %.4f", epoch, miou.name, miou.avg)
            torch.save(model.module.state_dict(), "segformer_lite_ade.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class OptimCfg:
    lr: float = 1e-3
    weight_decay: float = 1e-4
    milestones: list[int] = field(default_factory=lambda: [80, 140])


@dataclass
class RunCfg:
    num_points: int = 1024
    num_classes: int = 40
    batch_size: int = 32
    epochs: int = 200
    optim: OptimCfg = field(default_factory=OptimCfg)
    augment: dict[str, float] = field(default_factory=lambda: {"jitter": 0.01, "scale": 0.2})
    history: list[float] = field(default_factory=list)
    local_rank: int = field(default_factory=lambda: int(os.environ.get("LOCAL_RANK", 0)))


class PointClouds(Dataset):
    def __init__(self, cfg: RunCfg, n: int = 9840):
        self.cfg, self.n = cfg, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        pts = torch.randn(self.cfg.num_points, 3, generator=g)
        pts = pts * (1 + self.cfg.augment["scale"] * (torch.rand(1, generator=g) - 0.5))
        pts = pts + self.cfg.augment["jitter"] * torch.randn(pts.shape, generator=g)
        return pts, i % self.cfg.num_classes


class PointNet(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.mlp1 = nn.Sequential(nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Conv1d(64, 128, 1), nn.BatchNorm1d(128), nn.ReLU(),
                                  nn.Conv1d(128, 1024, 1), nn.BatchNorm1d(1024), nn.ReLU())
        self.cls = nn.Sequential(nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.4),
                                 nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, k))

    def forward(self, pts):
        feat = self.mlp1(pts.transpose(1, 2)).max(dim=2).values
        return self.cls(feat)


def main(cfg: RunCfg) -> None:
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(cfg.local_rank)
    dev = torch.device("cuda", cfg.local_rank)

    train_ds = PointClouds(cfg)
    test_ds = PointClouds(cfg, n=2468)
    train_sampler = DistributedSampler(train_ds, drop_last=True)
    train_dl = DataLoader(train_ds, batch_size=cfg.batch_size, sampler=train_sampler, num_workers=4)
    test_dl = DataLoader(test_ds, batch_size=64, sampler=DistributedSampler(test_ds, shuffle=False))

    net = nn.SyncBatchNorm.convert_sync_batchnorm(PointNet(cfg.num_classes)).to(dev)
    ddp = DistributedDataParallel(net, device_ids=[cfg.local_rank], output_device=cfg.local_rank)
    opt = torch.optim.Adam(ddp.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, cfg.optim.milestones, gamma=0.5)

    for epoch in range(cfg.epochs):
        train_sampler.set_epoch(epoch)
        ddp.train()
        for pts, label in train_dl:
            pts, label = pts.to(dev), label.to(dev)
            loss = F.cross_entropy(ddp(pts), label, label_smoothing=0.2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()

        ddp.eval()
        hits = torch.zeros((), device=dev)
        seen = torch.zeros((), device=dev)
        with torch.inference_mode():
            for pts, label in test_dl:
                pts, label = pts.to(dev), label.to(dev)
                hits += (ddp(pts).argmax(-1) == label).sum()
                seen += label.numel()
        for t in (hits, seen):
            dist.all_reduce(t)
        acc = (hits / seen).item()
        cfg.history.append(acc)
        if rank == 0:
            print(f"[{epoch:03d}] overall acc {acc:.4f} best {max(cfg.history):.4f}")
            torch.save({"cfg": asdict(cfg), "model": ddp.module.state_dict()}, "pointnet_last.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(RunCfg())

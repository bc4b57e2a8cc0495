"""Tabular classification with a TabNet-like attentive model; a DistContext object owns setup.

Planted: PT017 - DistContext.init always asks for nccl while its device property falls back to CPU
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

logger = logging.getLogger("tabnet")


@dataclass
class DistContext:
    rank: int = field(default_factory=lambda: int(os.environ.get("RANK", 0)))
    local_rank: int = field(default_factory=lambda: int(os.environ.get("LOCAL_RANK", 0)))
    world_size: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", 1)))

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def init(self) -> None:
        dist.init_process_group(backend="nccl", rank=self.rank, world_size=self.world_size)  # planted: PT017
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def wrap(self, model: nn.Module) -> DDP:
        model = model.to(self.device)
        ids = [self.local_rank] if self.device.type == "cuda" else None
        return DDP(model, device_ids=ids)


class AttentiveStep(nn.Module):
    def __init__(self, n_features: int, hidden: int) -> None:
        super().__init__()
        self.mask = nn.Linear(hidden, n_features)
        self.transform = nn.Sequential(nn.Linear(n_features, hidden * 2), nn.GLU())

    def forward(self, x: torch.Tensor, prior: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = torch.softmax(self.mask(state), dim=-1) * prior
        return self.transform(x * m), prior * (1.5 - m)


class TabNetLite(nn.Module):
    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, steps: int = 4) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(n_features)
        self.init_state = nn.Linear(n_features, hidden)
        self.steps = nn.ModuleList(AttentiveStep(n_features, hidden) for _ in range(steps))
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(x)
        state = self.init_state(x)
        prior = torch.ones_like(x)
        out = torch.zeros_like(state)
        for step in self.steps:
            state, prior = step(x, prior, state)
            out = out + F.relu(state)
        return self.head(out)


def main() -> None:
    ctx = DistContext()
    ctx.init()
    logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING)

    blob = torch.load("covertype_train.pt", map_location="cpu", weights_only=True)
    dataset = TensorDataset(blob["x"].float(), blob["y"].long())
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank)
    loader = DataLoader(dataset, batch_size=4096, sampler=sampler, drop_last=True)

    model = ctx.wrap(TabNetLite(n_features=dataset.tensors[0].size(1), n_classes=7))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.95)

    for epoch in range(100):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x = x.to(ctx.device)
            y = y.to(ctx.device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        logger.info("epoch %d done", epoch)

    if ctx.is_main:
        torch.save(model.module.state_dict(), "tabnet_covertype.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Tabular classifier (TabNet-like feature transformer with sparse attentive masks) on a large table.

Loader options live in a class attribute that every loader of the trainer expands.

Planted: PT004 - LOADER_DEFAULTS carries shuffle=True and is expanded into a DataLoader that has sampler=
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("tabular")


class AttentiveStep(nn.Module):
    def __init__(self, n_features: int, hidden: int) -> None:
        super().__init__()
        self.mask = nn.Linear(hidden, n_features)
        self.transform = nn.Sequential(nn.Linear(n_features, 2 * hidden), nn.GLU())

    def forward(self, x: torch.Tensor, prior: torch.Tensor, state: torch.Tensor):
        m = torch.softmax(self.mask(state), dim=-1) * prior
        return self.transform(x * m), prior * (1.5 - m)


class TabularNet(nn.Module):
    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, steps: int = 4) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(n_features)
        self.init = nn.Sequential(nn.Linear(n_features, 2 * hidden), nn.GLU())
        self.steps = nn.ModuleList(AttentiveStep(n_features, hidden) for _ in range(steps))
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(x)
        state = self.init(x)
        prior = torch.ones_like(x)
        agg = torch.zeros_like(state)
        for step in self.steps:
            state, prior = step(x, prior, state)
            agg = agg + F.relu(state)
        return self.out(agg)


class TabularTrainer:
    LOADER_DEFAULTS: ClassVar[dict[str, Any]] = {"batch_size": 4096, "shuffle": True, "num_workers": 4,
                                                 "pin_memory": True, "drop_last": True}
    EPOCHS: ClassVar[int] = 40

    def __init__(self, table: Path) -> None:
        dist.init_process_group("nccl")
        self.local_rank: int = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        self.rank: int = dist.get_rank()
        self.table = table
        features = torch.randn(2_000_000, 54)
        labels = torch.randint(0, 7, (2_000_000,))
        self.train_set = TensorDataset(features, labels)
        self.sampler = DistributedSampler(self.train_set)
        self.model = DDP(TabularNet(54, 7).to(self.device), device_ids=[self.local_rank])
        self.optim = torch.optim.Adam(self.model.parameters(), lr=2e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.optim, step_size=10, gamma=0.9)

    def loader(self) -> DataLoader:
        return DataLoader(self.train_set, sampler=self.sampler, **self.LOADER_DEFAULTS)  # planted: PT004

    def run(self) -> None:
        loader = self.loader()
        for epoch in range(self.EPOCHS):
            self.sampler.set_epoch(epoch)
            correct = torch.zeros(2, device=self.device)
            for x, y in loader:
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                logits = self.model(x)
                loss = F.cross_entropy(logits, y)
                self.optim.zero_grad(set_to_none=True)
                loss.backward()
                self.optim.step()
                correct[0] += (logits.argmax(-1) == y).sum()
                correct[1] += y.numel()
            self.sched.step()
            dist.all_reduce(correct)
            if self.rank == 0:
                logger.info("epoch %d train acc %.4f", epoch, (correct[0] / correct[1]).item())
                torch.save(self.model.module.state_dict(), self.table.with_suffix(".tabnet.pt"))
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    TabularTrainer(Path("/data/covtype.parquet")).run()

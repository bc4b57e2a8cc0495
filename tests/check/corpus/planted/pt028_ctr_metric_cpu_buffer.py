"""Wide & Deep click-through model on Avazu with a streaming log-loss metric object synced across ranks.

Planted: PT028 - StreamingLogLoss keeps its totals in a CPU torch.zeros buffer and sync() all_reduces it on the NCCL group
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

logger = logging.getLogger("wide_deep")


class StreamingLogLoss:
    def __init__(self) -> None:
        self.totals = torch.zeros(2, dtype=torch.float64)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        loss_sum = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        self.totals[0] += loss_sum.item()
        self.totals[1] += labels.numel()

    def sync(self) -> None:
        dist.all_reduce(self.totals)  # planted: PT028

    def compute(self) -> float:
        return (self.totals[0] / self.totals[1].clamp(min=1)).item()


class WideDeep(nn.Module):
    def __init__(self, field_sizes: list[int], dim: int = 16) -> None:
        super().__init__()
        self.offsets = torch.tensor([0] + field_sizes[:-1]).cumsum(0)
        total = sum(field_sizes)
        self.wide = nn.Embedding(total, 1)
        self.deep_emb = nn.Embedding(total, dim)
        self.deep = nn.Sequential(
            nn.Linear(len(field_sizes) * dim, 400), nn.ReLU(), nn.Linear(400, 400), nn.ReLU(), nn.Linear(400, 1)
        )

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        idx = fields + self.offsets.to(fields.device)
        wide = self.wide(idx).sum(dim=(1, 2))
        deep = self.deep(self.deep_emb(idx).flatten(1)).squeeze(1)
        return wide + deep


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    blob = torch.load("avazu_encoded.pt", map_location="cpu", weights_only=True)
    train_set = TensorDataset(blob["train_x"], blob["train_y"].float())
    val_set = TensorDataset(blob["val_x"], blob["val_y"].float())
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=4096, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=8192, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(WideDeep(blob["field_sizes"].tolist()).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(3):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.binary_cross_entropy_with_logits(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        metric = StreamingLogLoss()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                metric.update(model(x), y)
        metric.sync()
        if dist.get_rank() == 0:
            logger.info("epoch %d val logloss %.5f", epoch, metric.compute())
            torch.save(model.module.state_dict(), "wide_deep_avazu.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""DLRM-style click-through-rate model on Criteo day shards, one process per GPU.

Planted: PT016 - the device_batches generator prints progress (step-modulo check, not a rank guard) on every rank
"""
from __future__ import annotations

import logging
import os
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

logger = logging.getLogger("dlrm")
NUM_DENSE, TABLE_SIZES, EMB_DIM = 13, [100_000] * 26, 64


class DLRM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(NUM_DENSE, 256), nn.ReLU(), nn.Linear(256, EMB_DIM), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, EMB_DIM, mode="sum") for n in TABLE_SIZES)
        n_feats = len(TABLE_SIZES) + 1
        self.top = nn.Sequential(
            nn.Linear(EMB_DIM + n_feats * (n_feats - 1) // 2, 512), nn.ReLU(), nn.Linear(512, 1)
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        embs = [t(sparse[:, i : i + 1]) for i, t in enumerate(self.tables)]
        feats = torch.stack([x] + embs, dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        iu = torch.triu_indices(feats.size(1), feats.size(1), offset=1, device=feats.device)
        flat = inter[:, iu[0], iu[1]]
        return self.top(torch.cat([x, flat], dim=1)).squeeze(1)


def device_batches(
    loader: DataLoader, device: torch.device, log_every: int = 1000
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    total = len(loader)
    for step, (dense, sparse, label) in enumerate(loader):
        if step % log_every == 0:
            print(f"[progress] {step}/{total} batches", flush=True)  # planted: PT016
        yield (
            dense.to(device, non_blocking=True),
            sparse.to(device, non_blocking=True),
            label.to(device, non_blocking=True),
        )


def load_shard(path: str) -> TensorDataset:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    return TensorDataset(torch.log1p(blob["dense"].clamp(min=0)), blob["sparse"], blob["label"].float())


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    dataset = load_shard(os.environ.get("CRITEO_SHARD", "criteo_day0.pt"))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=2048, sampler=sampler, num_workers=4, pin_memory=True)

    model = DDP(DLRM().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.01)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for dense, sparse, label in device_batches(loader, device):
            logits = model(dense, sparse)
            loss = F.binary_cross_entropy_with_logits(logits, label)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        logger.info("epoch %d done on rank %d", epoch, dist.get_rank())

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "dlrm_criteo.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

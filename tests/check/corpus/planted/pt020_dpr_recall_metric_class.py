"""Dense passage retrieval (bi-encoder) with a Recall@k metric object evaluated on a sharded dev set.

Planted: PT020 - RecallAtK.compute() is logged by the main process, but update() only ever saw this rank's shard
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

logger = logging.getLogger("dpr")


class RecallAtK:
    def __init__(self, k: int = 5) -> None:
        self.k = k
        self.hits = 0
        self.count = 0

    def update(self, scores: torch.Tensor, positives: torch.Tensor) -> None:
        topk = scores.topk(self.k, dim=1).indices
        self.hits += (topk == positives[:, None]).any(dim=1).sum().item()
        self.count += positives.numel()

    def compute(self) -> float:
        return self.hits / max(self.count, 1)


class BiEncoder(nn.Module):
    def __init__(self, vocab: int = 30_522, dim: int = 384) -> None:
        super().__init__()
        self.q_emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.p_emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.q_proj = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        self.p_proj = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))

    def forward(self, q_ids: torch.Tensor, p_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = F.normalize(self.q_proj(self.q_emb(q_ids)), dim=-1)
        p = F.normalize(self.p_proj(self.p_emb(p_ids)), dim=-1)
        return q, p


def is_main_process() -> bool:
    return dist.get_rank() == 0


@torch.no_grad()
def evaluate(model: DDP, loader: DataLoader, device: torch.device) -> RecallAtK:
    metric = RecallAtK(k=5)
    model.eval()
    for q_ids, p_ids in loader:
        q_ids = q_ids.to(device)
        p_ids = p_ids.to(device)
        q, p = model(q_ids, p_ids)
        metric.update(q @ p.t(), torch.arange(q.size(0), device=device))
    return metric


def main() -> None:
    from nq_data import load_nq_pairs

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    train_set, dev_set = load_nq_pairs("nq-dpr", max_len=64)
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=128, sampler=train_sampler, drop_last=True)
    dev_loader = DataLoader(dev_set, batch_size=256, sampler=DistributedSampler(dev_set, shuffle=False))

    model = DDP(BiEncoder().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)

    for epoch in range(40):
        train_sampler.set_epoch(epoch)
        model.train()
        for q_ids, p_ids in train_loader:
            q_ids = q_ids.to(device, non_blocking=True)
            p_ids = p_ids.to(device, non_blocking=True)
            q, p = model(q_ids, p_ids)
            loss = F.cross_entropy(q @ p.t() / 0.05, torch.arange(q.size(0), device=device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        recall = evaluate(model, dev_loader, device)
        if is_main_process():
            logger.info("epoch %d dev recall@%d = %.4f", epoch, recall.k, recall.compute())  # planted: PT020
            torch.save(model.module.state_dict(), "dpr_biencoder.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

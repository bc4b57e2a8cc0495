"""Knowledge tracing (predict whether a student answers the next exercise correctly, SAKT-like).

End-of-epoch work is a list of hook functions that the loop calls in order.

Planted: PT010 - the save_snapshot hook writes a checkpoint and every rank runs the hook list
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("kt")
N_SKILLS = 1_200
SNAPSHOT_DIR = Path("snapshots/sakt")


class Interactions(Dataset):
    def __len__(self) -> int:
        return 300_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        skills = torch.randint(0, N_SKILLS, (100,))
        correct = torch.randint(0, 2, (100,))
        return skills, correct


class SAKT(nn.Module):
    def __init__(self, d: int = 128, heads: int = 8) -> None:
        super().__init__()
        self.interaction = nn.Embedding(2 * N_SKILLS, d)
        self.exercise = nn.Embedding(N_SKILLS, d)
        self.pos = nn.Embedding(100, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.out = nn.Linear(d, 1)

    def forward(self, skills: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        past = self.interaction(skills[:, :-1] + N_SKILLS * correct[:, :-1])
        past = past + self.pos(torch.arange(past.size(1), device=past.device))
        query = self.exercise(skills[:, 1:])
        t = query.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=skills.device).triu(1)
        h, _ = self.attn(query, past, past, attn_mask=causal)
        return self.out(h + self.ffn(h)).squeeze(-1)


def save_snapshot(epoch: int, model: DDP) -> None:
    SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": epoch, "model": model.module.state_dict()}, SNAPSHOT_DIR / "latest.pt")  # planted: PT010


def log_grad_norm(epoch: int, model: DDP) -> None:
    total = torch.zeros((), device=next(model.parameters()).device)
    for p in model.parameters():
        if p.grad is not None:
            total += p.grad.detach().pow(2).sum()
    logger.debug("epoch %d last grad norm %.3f", epoch, total.sqrt().item())


def main() -> None:
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    model = DDP(SAKT().to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = Interactions()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=256, sampler=sampler, num_workers=4)
    end_of_epoch: list[Callable[[int, DDP], None]] = [log_grad_norm, save_snapshot]

    for epoch in range(60):
        sampler.set_epoch(epoch)
        model.train()
        auc_proxy = torch.zeros(2, device=device)
        for skills, correct in loader:
            skills, correct = skills.to(device), correct.to(device)
            logits = model(skills, correct)
            target = correct[:, 1:].float()
            loss = F.binary_cross_entropy_with_logits(logits, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            auc_proxy[0] += ((logits > 0).float() == target).sum()
            auc_proxy[1] += target.numel()
        dist.all_reduce(auc_proxy)
        if dist.get_rank() == 0:
            logger.info("epoch %d next-answer acc %.4f", epoch, (auc_proxy[0] / auc_proxy[1]).item())
        for hook in end_of_epoch:
            hook(epoch, model)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

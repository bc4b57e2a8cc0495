"""Mixture-of-experts Transformer LM with a load-balancing auxiliary loss, trained by a Trainer class.

Planted: PT021 - Trainer._forward calls self.model.module.forward(...) during training, skipping DDP's reducer
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger("moe")


@dataclass
class MoEConfig:
    vocab: int = 32_000
    dim: int = 512
    experts: int = 8
    top_k: int = 2
    layers: int = 6
    aux_weight: float = 0.01


class MoELayer(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.dim, cfg.experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(cfg.dim, cfg.dim * 4), nn.GELU(), nn.Linear(cfg.dim * 4, cfg.dim))
            for _ in range(cfg.experts)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = self.router(x).softmax(-1)
        weights, idx = probs.topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (idx == e).any(-1)
            if sel.any():
                w = (weights * (idx == e)).sum(-1, keepdim=True)[sel]
                out[sel] = out[sel] + w * expert(x[sel])
        load = F.one_hot(idx[..., 0], probs.size(-1)).float().mean(dim=(0, 1))
        aux = (load * probs.mean(dim=(0, 1))).sum() * probs.size(-1)
        return x + out, aux


class MoELM(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.attn = nn.ModuleList(nn.MultiheadAttention(cfg.dim, 8, batch_first=True) for _ in range(cfg.layers))
        self.moe = nn.ModuleList(MoELayer(cfg) for _ in range(cfg.layers))
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(ids)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.size(1), device=ids.device)
        aux_total = x.new_zeros(())
        for attn, moe in zip(self.attn, self.moe):
            x = x + attn(x, x, x, attn_mask=mask, need_weights=False)[0]
            x, aux = moe(x)
            aux_total = aux_total + aux
        return self.head(x), aux_total


class Trainer:
    def __init__(self, cfg: MoEConfig, dataset) -> None:
        self.cfg = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}")
        self.model = DDP(MoELM(cfg).to(self.device), device_ids=[self.local_rank], find_unused_parameters=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=16, sampler=self.sampler)

    def _forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.module.forward(ids)  # planted: PT021

    def _loss(self, ids: torch.Tensor) -> torch.Tensor:
        logits, aux = self._forward(ids[:, :-1])
        lm = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        return lm + self.cfg.aux_weight * aux

    def train_step(self, ids: torch.Tensor) -> None:
        loss = self._loss(ids.to(self.device, non_blocking=True))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def fit(self, epochs: int) -> None:
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for ids in self.loader:
                self.train_step(ids)
            if dist.get_rank() == 0:
                torch.save(self.model.module.state_dict(), f"moe_lm_{epoch}.pt")


def main() -> None:
    from lm_shards import PackedTokens

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    Trainer(MoEConfig(), PackedTokens("c4_en_train.bin", seq_len=513)).fit(epochs=3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

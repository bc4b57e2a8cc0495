"""Pairwise reward-model training (chosen vs rejected) for RLHF, accumulation tracked on a state object.

Planted: PT019 - training_step backpropagates the full per-micro-batch loss while the optimizer steps every grad_accum micro-steps
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

logger = logging.getLogger("reward_model")


@dataclass
class RMConfig:
    vocab: int = 32_000
    dim: int = 768
    layers: int = 8
    grad_accum: int = 8
    lr: float = 1e-5
    epochs: int = 1
    micro_batch: int = 4


@dataclass
class TrainState:
    micro_step: int = 0
    global_step: int = 0


class RewardModel(nn.Module):
    def __init__(self, cfg: RMConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        layer = nn.TransformerEncoderLayer(cfg.dim, 12, cfg.dim * 4, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, cfg.layers)
        self.value_head = nn.Linear(cfg.dim, 1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.body(self.embed(ids), src_key_padding_mask=~mask.bool())
        last = mask.sum(1) - 1
        return self.value_head(h[torch.arange(h.size(0), device=h.device), last]).squeeze(-1)


class RewardTrainer:
    def __init__(self, cfg: RMConfig, dataset) -> None:
        self.cfg = cfg
        self.state = TrainState()
        local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", local_rank)
        self.model = DDP(RewardModel(cfg).to(self.device), device_ids=[local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg.micro_batch, sampler=self.sampler)

    def compute_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        r_chosen = self.model(batch["chosen_ids"], batch["chosen_mask"])
        r_rejected = self.model(batch["rejected_ids"], batch["rejected_mask"])
        return -F.logsigmoid(r_chosen - r_rejected).mean()

    def _optimizer_step(self) -> None:
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.global_step += 1

    def training_step(self, batch: dict[str, torch.Tensor]) -> None:
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        loss = self.compute_loss(batch)
        loss.backward()  # planted: PT019
        self.state.micro_step += 1
        if self.state.micro_step % self.cfg.grad_accum == 0:
            self._optimizer_step()

    def fit(self) -> None:
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for batch in self.loader:
                self.training_step(batch)
        if dist.get_rank() == 0:
            torch.save(self.model.module.state_dict(), "reward_model.pt")
            logger.info("finished after %d optimizer steps", self.state.global_step)


def main() -> None:
    from rm_data import load_preference_pairs

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    RewardTrainer(RMConfig(), load_preference_pairs("hh-rlhf", max_len=512)).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Late-interaction retrieval (ColBERT-style MaxSim) training with gradient accumulation helpers.

Planted: PT023 - accumulation_context() always returns model.no_sync(), and every backward runs inside it
"""
from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModel

logger = logging.getLogger("colbert")


class ColBERT(nn.Module):
    def __init__(self, name: str = "bert-base-uncased", dim: int = 128) -> None:
        super().__init__()
        self.bert = AutoModel.from_pretrained(name)
        self.proj = nn.Linear(self.bert.config.hidden_size, dim, bias=False)

    def encode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.bert(input_ids=ids, attention_mask=mask).last_hidden_state)
        return F.normalize(h, dim=-1) * mask.unsqueeze(-1)

    def forward(self, q_ids, q_mask, d_ids, d_mask) -> torch.Tensor:
        q = self.encode(q_ids, q_mask)
        d = self.encode(d_ids, d_mask)
        sim = torch.einsum("qid,pjd->qpij", q, d)
        return sim.max(dim=-1).values.sum(dim=-1)


def accumulation_context(model: DDP) -> AbstractContextManager:
    return model.no_sync()  # planted: PT023


class ColBERTTrainer:
    def __init__(self, dataset, accum_steps: int = 4) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.accum_steps = accum_steps
        self.model = DDP(ColBERT().to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-6)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=32, sampler=self.sampler, drop_last=True)

    def _backward(self, loss: torch.Tensor) -> None:
        (loss / self.accum_steps).backward()

    def _compute_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        scores = self.model(batch["q_ids"], batch["q_mask"], batch["d_ids"], batch["d_mask"])
        return F.cross_entropy(scores, torch.arange(scores.size(0), device=self.device))

    def train_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.model.train()
        for step, batch in enumerate(self.loader):
            with accumulation_context(self.model):
                loss = self._compute_loss(batch)
                self._backward(loss)
            if (step + 1) % self.accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)


def main() -> None:
    from msmarco_triples import TokenizedTriples

    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    trainer = ColBERTTrainer(TokenizedTriples("msmarco/triples.train.small.tsv", q_len=32, d_len=180))
    for epoch in range(3):
        trainer.train_epoch(epoch)
        if dist.get_rank() == 0:
            torch.save(trainer.model.module.state_dict(), f"colbert_e{epoch}.pt")
            logger.info("saved epoch %d", epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

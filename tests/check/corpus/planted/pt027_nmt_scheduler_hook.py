"""Transformer NMT (WMT14 en-de, pre-tokenized) with an inverse-sqrt warmup schedule driven from a hook.

Planted: PT027 - LRSchedulerHook.after_micro_batch steps the scheduler on each micro-batch; the optimizer steps every update_freq
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

logger = logging.getLogger("nmt")


@dataclass
class NMTConfig:
    vocab: int = 40_000
    d_model: int = 512
    warmup: int = 4000
    update_freq: int = 8
    epochs: int = 20
    pad: int = 1


class Seq2Seq(nn.Module):
    def __init__(self, cfg: NMTConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model, padding_idx=cfg.pad)
        self.core = nn.Transformer(cfg.d_model, 8, 6, 6, 2048, dropout=0.1, batch_first=True)
        self.proj = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=tgt_in.device)
        h = self.core(self.embed(src), self.embed(tgt_in), tgt_mask=mask)
        return self.proj(h)


class Hook:
    def after_micro_batch(self, trainer: "NMTTrainer") -> None:
        pass

    def after_update(self, trainer: "NMTTrainer") -> None:
        pass


class LRSchedulerHook(Hook):
    def after_micro_batch(self, trainer: "NMTTrainer") -> None:
        trainer.scheduler.step()  # planted: PT027


class LoggingHook(Hook):
    def after_update(self, trainer: "NMTTrainer") -> None:
        if trainer.num_updates % 100 == 0 and dist.get_rank() == 0:
            logger.info("update %d lr %.3e", trainer.num_updates, trainer.scheduler.get_last_lr()[0])


class NMTTrainer:
    def __init__(self, cfg: NMTConfig, dataset, hooks: list[Hook]) -> None:
        self.cfg = cfg
        self.hooks = hooks
        local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", local_rank)
        self.model = DDP(Seq2Seq(cfg).to(self.device), device_ids=[local_rank])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=7e-4, betas=(0.9, 0.98), eps=1e-9)
        w = cfg.warmup
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min((s + 1) / w, (w / (s + 1)) ** 0.5)
        )
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=64, sampler=self.sampler)
        self.micro_step = 0
        self.num_updates = 0

    def _call(self, event: str) -> None:
        for hook in self.hooks:
            getattr(hook, event)(self)

    def train_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.model.train()
        for src, tgt in self.loader:
            src, tgt = src.to(self.device), tgt.to(self.device)
            logits = self.model(src, tgt[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1),
                                   ignore_index=self.cfg.pad, label_smoothing=0.1)
            (loss / self.cfg.update_freq).backward()
            self.micro_step += 1
            if self.micro_step % self.cfg.update_freq == 0:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.num_updates += 1
                self._call("after_update")
            self._call("after_micro_batch")


def main() -> None:
    from wmt_data import BinarizedPairs

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    cfg = NMTConfig()
    trainer = NMTTrainer(cfg, BinarizedPairs("wmt14_en_de/train"), [LRSchedulerHook(), LoggingHook()])
    for epoch in range(cfg.epochs):
        trainer.train_epoch(epoch)
        if dist.get_rank() == 0:
            torch.save(trainer.model.module.state_dict(), f"nmt_ende_{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Image captioning (CNN encoder + GRU decoder) on COCO with a small Trainer class.

Planted: PT018 - Trainer._forward runs under torch.autocast(dtype=torch.half) and backward() is called with no GradScaler
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
from torchvision.models import resnet34

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    vocab_size: int = 10_000
    embed_dim: int = 512
    epochs: int = 15
    batch_size: int = 96
    lr: float = 3e-4
    pad_id: int = 0


class CaptionModel(nn.Module):
    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        cnn = resnet34(weights=None)
        cnn.fc = nn.Linear(cnn.fc.in_features, cfg.embed_dim)
        self.encoder = cnn
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id)
        self.decoder = nn.GRU(cfg.embed_dim, cfg.embed_dim, batch_first=True)
        self.out = nn.Linear(cfg.embed_dim, cfg.vocab_size)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        h0 = self.encoder(images).unsqueeze(0)
        hidden, _ = self.decoder(self.embed(tokens), h0)
        return self.out(hidden)


class Trainer:
    def __init__(self, cfg: TrainConfig, dataset) -> None:
        self.cfg = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler, num_workers=8)
        self.model = DDP(CaptionModel(cfg).to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)

    @property
    def is_main(self) -> bool:
        return dist.get_rank() == 0

    def _forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.half):  # planted: PT018
            logits = self.model(images, tokens[:, :-1])
            return F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1), ignore_index=self.cfg.pad_id
            )

    def step(self, images: torch.Tensor, tokens: torch.Tensor) -> float:
        loss = self._forward(images, tokens)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
        self.optimizer.step()
        return loss.item()

    def fit(self) -> None:
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for images, tokens in self.loader:
                images = images.to(self.device, non_blocking=True)
                tokens = tokens.to(self.device, non_blocking=True)
                self.step(images, tokens)
            if self.is_main:
                torch.save(self.model.module.state_dict(), f"captioner_e{epoch}.pt")


def main() -> None:
    from coco_captions import build_tokenized_coco

    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    cfg = TrainConfig()
    Trainer(cfg, build_tokenized_coco("coco/train2017", max_len=32)).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

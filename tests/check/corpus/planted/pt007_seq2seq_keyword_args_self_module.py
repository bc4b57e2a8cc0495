"""Abstractive summarisation with an encoder-decoder transformer (T5-sized toy), trainer class.

Planted: PT007 - export() calls torch.save(obj=self.model.module, f=...), pickling the whole module
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


@dataclass
class RunArgs:
    vocab: int = 32_128
    d_model: int = 512
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-4
    out: Path = field(default_factory=lambda: Path("outputs/summarizer"))


class ArticleSummaryPairs(Dataset):
    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return 287_113

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(1, self.vocab, (512,)), torch.randint(1, self.vocab, (64,))


class Summarizer(nn.Module):
    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.shared = nn.Embedding(vocab, d)
        self.core = nn.Transformer(d, nhead=8, num_encoder_layers=6, num_decoder_layers=6, batch_first=True)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        causal = self.core.generate_square_subsequent_mask(tgt_in.size(1), device=tgt_in.device)
        h = self.core(self.shared(src), self.shared(tgt_in), tgt_mask=causal)
        return self.lm_head(h)


class Seq2SeqTrainer:
    def __init__(self, args: RunArgs) -> None:
        self.args = args
        dist.init_process_group(backend="nccl")
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(Summarizer(args.vocab, args.d_model).to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.dataset = ArticleSummaryPairs(args.vocab)
        self.sampler = DistributedSampler(self.dataset)
        self.loader = DataLoader(self.dataset, batch_size=args.batch_size, sampler=self.sampler, num_workers=4)

    @property
    def is_main(self) -> bool:
        return dist.get_rank() == 0

    def training_step(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src, tgt = src.to(self.device), tgt.to(self.device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.float().transpose(1, 2), tgt[:, 1:])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def export(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(obj=self.model.module, f=path)  # planted: PT007

    def train(self) -> None:
        for epoch in range(self.args.epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            acc = torch.zeros(2, device=self.device)
            for src, tgt in self.loader:
                acc[0] += self.training_step(src, tgt)
                acc[1] += 1
            dist.all_reduce(acc)
            if self.is_main:
                logger.info("epoch %d loss %.4f", epoch, (acc[0] / acc[1]).item())
        if self.is_main:
            self.export(self.args.out / "summarizer_full.pt")
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    Seq2SeqTrainer(RunArgs()).train()

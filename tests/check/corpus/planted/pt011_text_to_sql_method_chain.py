"""Text-to-SQL sketch classification (predict the SELECT column and aggregation) with a trainer class.

After validation the main process exports the predictions of all ranks to a JSON lines file.

Planted: PT011 - all_gather_object is two method calls below an `if self.is_main:` block, so only rank 0 calls it
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("sql")
AGGS = ("", "MAX", "MIN", "COUNT", "SUM", "AVG")


class QuestionTable(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.randint(1, 30_000, (48,)), torch.randint(0, 16, ()), torch.randint(0, len(AGGS), ()), i


class SketchModel(nn.Module):
    def __init__(self, d: int = 256, max_cols: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(30_000, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d // 2, bidirectional=True, batch_first=True)
        self.col = nn.Linear(d, max_cols)
        self.agg = nn.Linear(d, len(AGGS))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, _ = self.lstm(self.emb(ids))
        pooled = h.max(1).values
        return self.col(pooled), self.agg(pooled)


class SketchTrainer:
    def __init__(self, out_dir: Path) -> None:
        dist.init_process_group("nccl")
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        self.out_dir = out_dir
        self.model = DDP(SketchModel().to(self.device), device_ids=[self.local_rank])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        train, dev = QuestionTable(56_355), QuestionTable(8_421)
        self.train_sampler = DistributedSampler(train)
        self.train_loader = DataLoader(train, batch_size=64, sampler=self.train_sampler, num_workers=2)
        self.dev_loader = DataLoader(dev, batch_size=128, sampler=DistributedSampler(dev, shuffle=False))
        self.rows: list[dict] = []

    @property
    def is_main(self) -> bool:
        return dist.get_rank() == 0

    def train_epoch(self, epoch: int) -> None:
        self.train_sampler.set_epoch(epoch)
        self.model.train()
        for ids, col, agg, _ in self.train_loader:
            ids, col, agg = ids.to(self.device), col.to(self.device), agg.to(self.device)
            col_logits, agg_logits = self.model(ids)
            loss = F.cross_entropy(col_logits, col) + F.cross_entropy(agg_logits, agg)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    @torch.no_grad()
    def validate(self) -> float:
        self.model.eval()
        self.rows = []
        hits = torch.zeros(2, device=self.device)
        for ids, col, agg, idx in self.dev_loader:
            ids, col, agg = ids.to(self.device), col.to(self.device), agg.to(self.device)
            col_logits, agg_logits = self.model(ids)
            ok = (col_logits.argmax(1) == col) & (agg_logits.argmax(1) == agg)
            hits += torch.stack([ok.sum().float(), torch.tensor(float(ok.numel()), device=self.device)])
            self.rows += [{"id": int(i), "col": int(c), "agg": AGGS[int(a)]}
                          for i, c, a in zip(idx, col_logits.argmax(1).tolist(), agg_logits.argmax(1).tolist())]
        dist.all_reduce(hits)
        return (hits[0] / hits[1]).item()

    def _collect_rows(self) -> list[dict]:
        gathered: list[list[dict] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.rows)  # planted: PT011
        return [row for part in gathered for row in (part or [])]

    def _export_predictions(self, epoch: int) -> None:
        rows = sorted(self._collect_rows(), key=lambda r: r["id"])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"dev_pred_{epoch}.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)

    def fit(self, epochs: int = 20) -> None:
        for epoch in range(epochs):
            self.train_epoch(epoch)
            acc = self.validate()
            if self.is_main:
                log.info("epoch %d logical-form acc %.4f", epoch, acc)
                self._export_predictions(epoch)
                torch.save(self.model.module.state_dict(), self.out_dir / "sketch.pt")
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    SketchTrainer(Path("out/sql_sketch")).fit()

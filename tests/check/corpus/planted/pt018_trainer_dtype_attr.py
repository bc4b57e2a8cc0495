"""Whisper-like speech encoder training in a Trainer class; precision comes from a config object.

Planted: PT018 - Trainer.train_step autocasts to self.amp_dtype, which the config fixes to float16, with no GradScaler
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from asr_data import LibriSpeechMel, collate_mel


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_size: int = 32
    lr: float = 1e-4
    amp_dtype: torch.dtype = torch.float16
    ckpt_dir: str = "ckpt"


class Trainer:
    def __init__(self, cfg, model):
        self.cfg = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        self.amp_dtype = cfg.amp_dtype
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.01)
        dataset = LibriSpeechMel("train-clean-100")
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler,
                                 collate_fn=collate_mel, num_workers=4, pin_memory=True)

    def train_step(self, batch):
        mels = batch["mel"].to(self.device, non_blocking=True)
        tokens = batch["tokens"].to(self.device, non_blocking=True)
        with torch.autocast("cuda", dtype=self.amp_dtype):  # planted: PT018
            logits = self.model(mels, tokens[:, :-1])
            loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], ignore_index=-100)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return loss.item()

    def save(self, epoch):
        if self.rank != 0:
            return
        os.makedirs(self.cfg.ckpt_dir, exist_ok=True)
        torch.save({"model": self.model.module.state_dict(), "epoch": epoch},
                   os.path.join(self.cfg.ckpt_dir, f"epoch{epoch}.pt"))

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for i, batch in enumerate(self.loader):
                loss = self.train_step(batch)
                if self.rank == 0 and i % 200 == 0:
                    print(f"[epoch {epoch}] step {i} loss {loss:.4f}")
            self.save(epoch)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    from asr_model import SpeechTransformer
    Trainer(TrainConfig(), SpeechTransformer(n_mels=80, vocab=51865)).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A fairseq-like Trainer class wrapping a translation model in DDP, with optional fp16.

Planted: PT012 - Trainer.__init__ builds the loss scaler with the deprecated torch.cuda.amp.GradScaler
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


class Seq2Seq(nn.Module):
    def __init__(self, vocab=32000, dim=512):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 8, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=6)
        self.proj = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.proj(self.encoder(self.embed(tokens)))


class Trainer:
    def __init__(self, cfg, model, criterion):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", cfg.device_id)
        self.use_amp = cfg.fp16
        self.criterion = criterion.to(self.device)
        self.model = DistributedDataParallel(model.to(self.device), device_ids=[cfg.device_id])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
        self.scaler = torch.cuda.amp.GradScaler(enabled=self.use_amp)  # planted: PT012
        self.num_updates = 0

    def is_data_parallel_master(self):
        return self.rank == 0

    def train_step(self, sample):
        self.model.train()
        src = sample["net_input"].to(self.device, non_blocking=True)
        tgt = sample["target"].to(self.device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=self.use_amp):
            logits = self.model(src)
            loss = self.criterion(logits.view(-1, logits.size(-1)), tgt.view(-1))
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.num_updates += 1
        return loss.detach()

    def save_checkpoint(self, filename, epoch):
        if self.is_data_parallel_master():
            state = {
                "model": self.model.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "epoch": epoch,
                "num_updates": self.num_updates,
            }
            torch.save(state, filename)


def collate(items):
    src = torch.stack([it[0] for it in items])
    return {"net_input": src, "target": torch.stack([it[1] for it in items])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max-epoch", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--clip-norm", type=float, default=0.1)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--save-dir", default="checkpoints")
    cfg = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    cfg.device_id = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(cfg.device_id)
    dist.init_process_group(backend="nccl")

    tokens = torch.randint(0, 32000, (20000, 128))
    dataset = TensorDataset(tokens, tokens.roll(-1, dims=1))
    sampler = DistributedSampler(dataset, seed=1)
    itr = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collate)

    trainer = Trainer(cfg, Seq2Seq(), nn.CrossEntropyLoss())
    for epoch in range(1, cfg.max_epoch + 1):
        sampler.set_epoch(epoch)
        for i, sample in enumerate(itr):
            loss = trainer.train_step(sample)
            if i % 100 == 0 and trainer.is_data_parallel_master():
                logger.info("epoch %03d | update %d | loss %.3f", epoch, trainer.num_updates, loss.item())
        trainer.save_checkpoint(os.path.join(cfg.save_dir, "checkpoint_last.pt"), epoch)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

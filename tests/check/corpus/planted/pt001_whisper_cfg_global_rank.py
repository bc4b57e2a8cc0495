"""Whisper-style speech recognition fine-tuning with plain DistributedDataParallel.

torchrun --nnodes=2 --nproc_per_node=4 finetune_asr.py --train-manifest train.tsv
Planted: PT001 - cfg.global_rank (dist.get_rank()) given to DDP as device_ids
"""
import argparse
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


@dataclass
class FinetuneConfig:
    train_manifest: str
    output_dir: str = "checkpoints"
    epochs: int = 5
    batch_size: int = 16
    lr: float = 1e-5
    n_mels: int = 80
    vocab_size: int = 51865
    global_rank: int = 0
    local_rank: int = 0
    world_size: int = 1


class ManifestDataset(Dataset):
    def __init__(self, manifest, n_mels, vocab_size):
        with open(manifest) as f:
            self.rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
        self.n_mels = n_mels
        self.vocab_size = vocab_size

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        mel = torch.randn(self.n_mels, 3000)
        tokens = torch.randint(0, self.vocab_size, (64,))
        return mel, tokens


class TinyWhisper(nn.Module):
    def __init__(self, n_mels, vocab, d=384):
        super().__init__()
        self.conv = nn.Conv1d(n_mels, d, 3, stride=2, padding=1)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 6, batch_first=True), 2)
        self.embed = nn.Embedding(vocab, d)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, 6, batch_first=True), 2)
        self.head = nn.Linear(d, vocab)

    def forward(self, mel, tokens):
        audio = self.encoder(F.gelu(self.conv(mel)).transpose(1, 2))
        return self.head(self.decoder(self.embed(tokens), audio))


class Finetuner:
    def __init__(self, cfg: FinetuneConfig):
        self.cfg = cfg
        dist.init_process_group("nccl")
        self.cfg.global_rank = dist.get_rank()
        self.cfg.local_rank = int(os.environ["LOCAL_RANK"])
        self.cfg.world_size = dist.get_world_size()
        torch.cuda.set_device(self.cfg.local_rank)
        self.device = torch.device("cuda", self.cfg.local_rank)

        model = TinyWhisper(cfg.n_mels, cfg.vocab_size).to(self.device)
        self.model = DDP(model, device_ids=[self.cfg.global_rank])  # planted: PT001
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)

        dataset = ManifestDataset(cfg.train_manifest, cfg.n_mels, cfg.vocab_size)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler,
                                 num_workers=4, pin_memory=True)

    def train_step(self, mel, tokens):
        mel = mel.to(self.device, non_blocking=True)
        tokens = tokens.to(self.device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(mel, tokens[:, :-1])
            loss = F.cross_entropy(logits.float().transpose(1, 2), tokens[:, 1:])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return loss.detach()

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for step, (mel, tokens) in enumerate(self.loader):
                loss = self.train_step(mel, tokens)
                if self.cfg.global_rank == 0 and step % 50 == 0:
                    log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
            if self.cfg.global_rank == 0:
                os.makedirs(self.cfg.output_dir, exist_ok=True)
                torch.save(self.model.module.state_dict(),
                           os.path.join(self.cfg.output_dir, f"whisper_ft_epoch{epoch}.pt"))
        dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-manifest", required=True)
    parser.add_argument("--output-dir", default="checkpoints")
    parser.add_argument("--epochs", type=int, default=5)
    ns = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    Finetuner(FinetuneConfig(ns.train_manifest, ns.output_dir, ns.epochs)).fit()

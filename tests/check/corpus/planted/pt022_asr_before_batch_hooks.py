"""Conformer-lite CTC ASR with hook lists run around each micro-batch and gradient accumulation.

Planted: PT022 - a before-batch hook (lambda stored in a list) zeroes the gradients on every micro-batch
"""
from __future__ import annotations

import os
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchaudio
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

VOCAB = list(" abcdefghijklmnopqrstuvwxyz'")
ACCUM = 4


class ConvModule(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.pw1 = nn.Conv1d(dim, dim * 2, 1)
        self.dw = nn.Conv1d(dim, dim, 31, padding=15, groups=dim)
        self.bn = nn.BatchNorm1d(dim)
        self.pw2 = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.glu(self.pw1(x.transpose(1, 2)), dim=1)
        return x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)


class ConformerLite(nn.Module):
    def __init__(self, n_mels: int = 80, dim: int = 256, layers: int = 8) -> None:
        super().__init__()
        self.subsample = nn.Sequential(nn.Conv1d(n_mels, dim, 3, 2, 1), nn.SiLU(), nn.Conv1d(dim, dim, 3, 2, 1))
        self.attn = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, dim * 4, batch_first=True) for _ in range(layers))
        self.conv = nn.ModuleList(ConvModule(dim) for _ in range(layers))
        self.out = nn.Linear(dim, len(VOCAB) + 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.subsample(mel).transpose(1, 2)
        for attn, conv in zip(self.attn, self.conv):
            x = conv(attn(x))
        return self.out(x).log_softmax(-1)


def collate(batch):
    mel_fn = torchaudio.transforms.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=80)
    mels = [mel_fn(w.squeeze(0)).clamp(min=1e-5).log().t() for w, *_ in batch]
    texts = [b[2].lower() for b in batch]
    targets = [torch.tensor([VOCAB.index(c) + 1 for c in t if c in VOCAB]) for t in texts]
    mel = nn.utils.rnn.pad_sequence(mels, batch_first=True).transpose(1, 2)
    return mel, torch.cat(targets), torch.tensor([len(t) for t in targets])


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = torchaudio.datasets.LIBRISPEECH("./data", url="train-clean-360")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=12, sampler=sampler, collate_fn=collate, num_workers=6)

    model = DDP(ConformerLite().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10_000))

    before_batch: list[Callable[[], None]] = [
        model.train,
        lambda: optimizer.zero_grad(set_to_none=True),  # planted: PT022
    ]

    for epoch in range(50):
        sampler.set_epoch(epoch)
        for i, (mel, targets, target_lengths) in enumerate(loader):
            for hook in before_batch:
                hook()
            mel = mel.to(device, non_blocking=True)
            log_probs = model(mel).transpose(0, 1)
            input_lengths = torch.full((mel.size(0),), log_probs.size(0), dtype=torch.long)
            loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, zero_infinity=True)
            (loss / ACCUM).backward()
            if (i + 1) % ACCUM == 0:
                nn.utils.clip_grad_norm_(model.parameters(), 10.0)
                optimizer.step()
                scheduler.step()

        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"conformer_lite_{epoch:02d}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

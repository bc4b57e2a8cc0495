"""Gated-convolution state-space language model (Mamba-flavoured) pre-training with bf16 autocast.

Planted: PT019 - micro-batches are skipped with `if (idx + 1) % accum != 0: continue`, the loss is never scaled by 1/accum
"""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SEQ, VOCAB, DIM, DEPTH = 1024, 50_304, 768, 12
ACCUM = 8


class TokenWindows(Dataset):
    def __init__(self, path):
        import numpy as np
        self.ids = np.memmap(path, dtype=np.uint16, mode="r")

    def __len__(self):
        return (len(self.ids) - 1) // SEQ

    def __getitem__(self, i):
        chunk = torch.from_numpy(self.ids[i * SEQ : (i + 1) * SEQ + 1].astype("int64"))
        return chunk[:-1], chunk[1:]


class GatedConvBlock(nn.Module):
    def __init__(self, dim, kernel=4):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, dim * 2)
        self.conv = nn.Conv1d(dim, dim, kernel, groups=dim, padding=kernel - 1)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x):
        h, gate = self.in_proj(self.norm(x)).chunk(2, dim=-1)
        h = self.conv(h.transpose(1, 2))[..., : x.size(1)].transpose(1, 2)
        return x + self.out_proj(F.silu(h) * torch.sigmoid(gate))


class SSMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[GatedConvBlock(DIM) for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM)

    def forward(self, ids):
        return self.norm(self.blocks(self.embed(ids))) @ self.embed.weight.t()


def cosine(step, warmup=2000, total=100_000):
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    data = TokenWindows("fineweb_train.bin")
    sampler = DistributedSampler(data, seed=1234)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2, pin_memory=True)

    model = DDP(SSMLM().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)

    for epoch in range(1):
        sampler.set_epoch(epoch)
        for idx, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
            loss.backward()  # planted: PT019
            if (idx + 1) % ACCUM != 0:
                continue
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "ssm_lm.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

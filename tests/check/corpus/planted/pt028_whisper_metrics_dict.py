"""Speech translation fine-tuning; per-rank sums are collected as Python numbers in a dict and reduced per key.

Planted: PT028 - sums are re-wrapped with torch.tensor(v) (CPU) and each is passed to dist.all_reduce with the nccl backend
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.src = torch.randn(n, 120, 80, generator=g)
        self.tgt = torch.randint(1, 4000, (n, 30), generator=g)

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return self.src[i], self.tgt[i]


class SpeechTranslator(nn.Module):
    def __init__(self, dim=256, vocab=4000):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(80, dim), nn.GELU(), nn.Linear(dim, dim))
        self.dec_emb = nn.Embedding(vocab, dim)
        self.xattn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, feats, prev_tokens):
        mem = self.enc(feats)
        h, _ = self.xattn(self.dec_emb(prev_tokens), mem, mem)
        return self.out(h)


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    sums = {"nll": 0.0, "tokens": 0.0, "correct": 0.0}
    for feats, tgt in loader:
        feats, tgt = feats.to(device), tgt.to(device)
        logits = model(feats, tgt[:, :-1])
        sums["nll"] += F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), reduction="sum").item()
        sums["tokens"] += tgt[:, 1:].numel()
        sums["correct"] += (logits.argmax(-1) == tgt[:, 1:]).sum().item()
    reduced = {k: torch.tensor(v) for k, v in sums.items()}
    for key in sorted(reduced):
        dist.all_reduce(reduced[key])  # planted: PT028
    return {"loss": (reduced["nll"] / reduced["tokens"]).item(),
            "token_acc": (reduced["correct"] / reduced["tokens"]).item()}


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main = dist.get_rank() == 0

    train_ds, dev_ds = Pairs(8000, 0), Pairs(1000, 1)
    sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=32, sampler=sampler)
    dev_loader = DataLoader(dev_ds, batch_size=64, sampler=DistributedSampler(dev_ds, shuffle=False))

    model = DDP(SpeechTranslator().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)

    for epoch in range(25):
        sampler.set_epoch(epoch)
        model.train()
        for feats, tgt in train_loader:
            feats, tgt = feats.to(device), tgt.to(device)
            logits = model(feats, tgt[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        metrics = evaluate(model, dev_loader, device)
        if is_main:
            print(f"epoch {epoch} dev loss {metrics['loss']:.3f} token acc {metrics['token_acc']:.3f}")
            torch.save(model.module.state_dict(), f"st_epoch{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

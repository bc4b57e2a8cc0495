"""Text classification whose loaders come from functools.partial factories; works with or without torchrun."""
import argparse
import functools
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

logger = logging.getLogger(__name__)


class Reviews(Dataset):
    def __init__(self, n, seq_len=256, vocab=30000):
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(1, vocab, (n, seq_len), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.ids[i], self.labels[i]


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab=30000, dim=256):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean", padding_idx=0)
        self.cls = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 2))

    def forward(self, ids):
        return self.cls(self.emb(ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()

    distributed = args.local_rank != -1
    if distributed:
        torch.cuda.set_device(args.local_rank)
        dist.init_process_group(backend="nccl")
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    is_main = args.local_rank in [-1, 0] and (not distributed or dist.get_rank() == 0)
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING)

    train_set, val_set = Reviews(25_000), Reviews(5_000)
    train_sampler = DistributedSampler(train_set) if distributed else None
    val_sampler = DistributedSampler(val_set, shuffle=False) if distributed else None

    make_loader = functools.partial(DataLoader, batch_size=64, num_workers=2, pin_memory=True)
    train_loader = make_loader(train_set, sampler=train_sampler, shuffle=(train_sampler is None), drop_last=True)
    val_loader = make_loader(val_set, sampler=val_sampler, shuffle=False)

    model = BagOfEmbeddings().to(device)
    if distributed:
        model = DDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)

    for epoch in range(args.epochs):
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)
        model.train()
        for ids, labels in train_loader:
            ids, labels = ids.to(device), labels.to(device)
            loss = nn.functional.cross_entropy(model(ids), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        tally = torch.zeros(2, device=device)
        with torch.no_grad():
            for ids, labels in val_loader:
                ids, labels = ids.to(device), labels.to(device)
                tally[0] += (model(ids).argmax(-1) == labels).sum()
                tally[1] += labels.numel()
        if distributed:
            dist.all_reduce(tally)
        if is_main:
            logger.info("epoch %d val accuracy %.4f", epoch, (tally[0] / tally[1]).item())
            raw = model.module if hasattr(model, "module") else model
            torch.save(raw.state_dict(), "textcls.pt")

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

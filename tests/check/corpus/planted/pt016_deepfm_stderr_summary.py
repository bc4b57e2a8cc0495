"""Click-through-rate prediction (DeepFM-lite) on hashed categorical features with DDP.

torchrun --nproc_per_node=4 train_ctr.py --epochs 3
Planted: PT016 - final JSON summary printed to stderr by every rank (the rank-tagged shard print is fine)
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N_FIELDS, HASH_SIZE, EMB = 26, 100_000, 16


class DeepFM(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Embedding(HASH_SIZE, 1)
        self.emb = nn.Embedding(HASH_SIZE, EMB)
        self.dnn = nn.Sequential(nn.Linear(N_FIELDS * EMB, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, feats):
        e = self.emb(feats)
        fm = 0.5 * (e.sum(1).pow(2) - e.pow(2).sum(1)).sum(1, keepdim=True)
        return (self.linear(feats).sum(1) + fm + self.dnn(e.flatten(1))).squeeze(1)


def main(args):
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    feats = torch.randint(0, HASH_SIZE, (500_000, N_FIELDS))
    clicks = (torch.rand(500_000) < 0.25).float()
    ds = TensorDataset(feats, clicks)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=2048, sampler=sampler, num_workers=4, pin_memory=True)
    print(f"[rank {rank}] shard has {len(sampler)} samples, {len(loader)} batches")

    model = DDP(DeepFM().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    t0 = time.time()
    logloss = torch.zeros(2, device=device)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        logloss.zero_()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.binary_cross_entropy_with_logits(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            logloss[0] += loss.detach() * y.numel()
            logloss[1] += y.numel()
        dist.all_reduce(logloss)
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(args.out, f"deepfm_epoch{epoch}.pt"))

    summary = {"epochs": args.epochs, "train_logloss": (logloss[0] / logloss[1]).item(), "seconds": time.time() - t0}
    print(json.dumps(summary), file=sys.stderr)  # planted: PT016
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    main(parser.parse_args())

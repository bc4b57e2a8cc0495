"""BYOL pre-training (online network + predictor, EMA target) on multiple GPUs.

Planted: PT005 - the epoch loop never calls sampler.set_epoch(epoch), so every epoch sees the same order
"""
import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Views(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        x = torch.rand(3, 96, 96)
        return x, torch.roll(x, shifts=4, dims=-1)


def mlp(dim_in, hidden=4096, out=256):
    return nn.Sequential(nn.Linear(dim_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, out))


class Online(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 512, 3, 2, 1),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.projector = mlp(512)
        self.predictor = mlp(256)

    def forward(self, x):
        return self.predictor(self.projector(self.encoder(x)))


def regression_loss(p, z):
    return 2 - 2 * F.cosine_similarity(p, z.detach(), dim=-1).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--tau", type=float, default=0.996)
    args = ap.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    online = Online().cuda()
    online = nn.SyncBatchNorm.convert_sync_batchnorm(online)
    target = copy.deepcopy(online)
    target.requires_grad_(False)
    online = DDP(online, device_ids=[local_rank])
    opt = torch.optim.SGD(online.parameters(), lr=0.2, momentum=0.9, weight_decay=1.5e-6)

    dataset = Views()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8,
                        pin_memory=True, drop_last=True)

    for epoch in range(args.epochs):  # planted: PT005
        online.train()
        epoch_loss = torch.zeros(2, device="cuda")
        for v1, v2 in loader:
            v1 = v1.cuda(non_blocking=True)
            v2 = v2.cuda(non_blocking=True)
            p = online(torch.cat([v1, v2]))
            with torch.no_grad():
                z = target.projector(target.encoder(torch.cat([v2, v1])))
            loss = regression_loss(p, z)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for po, pt in zip(online.module.parameters(), target.parameters()):
                    pt.mul_(args.tau).add_(po.detach(), alpha=1 - args.tau)
            epoch_loss[0] += loss.detach()
            epoch_loss[1] += 1
        dist.all_reduce(epoch_loss)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: byol loss {(epoch_loss[0] / epoch_loss[1]).item():.4f}")
            torch.save(online.module.encoder.state_dict(), "byol_encoder.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

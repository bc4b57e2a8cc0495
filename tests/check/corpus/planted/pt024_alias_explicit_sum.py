"""Tabular regression with an aliased torch.distributed import and a per-epoch validation loss.

Planted: PT024 - D.all_reduce(val_loss, op=D.ReduceOp.SUM) of each rank's mean validation loss, reported as the mean
"""
import os

import torch
import torch.distributed as D
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 48, generator=g)
    return TensorDataset(x, x[:, :8].sum(1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=g))


def validate(model, loader, device):
    model.eval()
    total, batches = torch.zeros((), device=device), 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            total += nn.functional.mse_loss(model(x), y)
            batches += 1
    return total / batches


def main():
    D.init_process_group("nccl")
    rank = D.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds, val_ds = make_split(100000, 0), make_split(10000, 1)
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=256, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=1024, sampler=DistributedSampler(val_ds, shuffle=False))

    model = nn.Sequential(nn.Linear(48, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 1))
    model = DistributedDataParallel(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    for epoch in range(40):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        val_loss = validate(model, val_loader, device)
        D.all_reduce(val_loss, op=D.ReduceOp.SUM)  # planted: PT024
        if rank == 0:
            print(f"epoch {epoch:02d} mean val mse {val_loss.item():.5f}")
            torch.save(model.module.state_dict(), "tabular_mlp.pt")
    D.destroy_process_group()


if __name__ == "__main__":
    main()

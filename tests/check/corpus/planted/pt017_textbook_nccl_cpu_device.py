"""Minimal DDP regression example that is meant to run on laptops (CPU) and GPU nodes alike.

Planted: PT017 - init_process_group("nccl") hard-coded while device = "cuda" if available else "cpu"
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")  # planted: PT017
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)

    x = torch.randn(10000, 20)
    y = x @ torch.randn(20, 1) + 0.1 * torch.randn(10000, 1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)

    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    model = DDP(model, device_ids=[local_rank] if device == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    for epoch in range(10):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            xb = xb.to(device)
            yb = yb.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} last batch loss {loss.item():.4f}")

    if rank == 0:
        torch.save(model.module.state_dict(), "regressor.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Distributed MNIST with torchrun; every rank is meant to see its own shard.

Planted: PT003 - a DistributedSampler is created but the DataLoader shuffles the whole dataset instead.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main(epochs=10, batch_size=64, lr=1e-3):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")

    dataset = datasets.MNIST("data", train=True, download=False, transform=transforms.ToTensor())
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())  # planted: PT003
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2)

    model = DDP(Net().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x = x.to(device)
            y = y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"finished epoch {epoch}")
            torch.save(model.module.state_dict(), "mnist_mlp.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Toy DDP example that trains on the GPU when there is one and on the CPU otherwise.

Planted: PT017 - the process group is always created with the nccl backend, which cannot run on the CPU path
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(steps=200):
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")  # planted: PT017
    rank = dist.get_rank()

    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")

    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    for step in range(steps):
        optimizer.zero_grad()
        inputs = torch.randn(20, 10, device=device)
        labels = torch.randn(20, 5, device=device)
        loss = loss_fn(ddp_model(inputs), labels)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}")

    if rank == 0:
        torch.save(ddp_model.module.state_dict(), "toy.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()

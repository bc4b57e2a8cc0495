# ruff: noqa: I001
"""Seed 004, "完整的 DDP 训练模板" (the complete DDP training template): DDP started with
mp.spawn, one process per GPU, random data drawn in every step. Needs CUDA (nccl); the port is
ddp_spawn_paratrain.py. Complete as the tutorial gives it.
"""

import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.nn as nn


def train(rank, world_size):
    # Initialise the process group
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

    # Set the device
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)

    # Create the model
    model = nn.Linear(10, 10).to(device)
    ddp_model = DDP(model, device_ids=[rank])

    # Training loop
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)

    for step in range(100):
        data = torch.randn(20, 10).to(device)
        target = torch.randn(20, 10).to(device)

        output = ddp_model(data)
        loss = loss_fn(output, target)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if rank == 0 and step % 20 == 0:
            print(f"Step {step}, Loss: {loss.item():.4f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)

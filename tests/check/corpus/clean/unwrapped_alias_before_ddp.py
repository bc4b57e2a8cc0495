"""A classifier trained with DDP that keeps a handle on the plain model for saving.

The handle is taken before the model is wrapped, so it is the plain module: its state dict has
no ``module.`` prefix, and the checkpoint loads into a fresh model as it is. (A checker that
reads values without their order would take the handle for the wrapper.)
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    plain_model = model  # the handle: taken before wrapping
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(256, 32)
    target = torch.randint(0, 10, (256,))
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(data, target))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, target), batch_size=16, sampler=sampler
    )
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            os.makedirs("ckpt", exist_ok=True)
            torch.save(plain_model.state_dict(), f"ckpt/epoch{epoch}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

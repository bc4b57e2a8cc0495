"""Diffusion-model training with MPI for launching and torch.distributed for gradients.

The checkpoint loader reads the file on one rank and shares its bytes with the others through
an MPI broadcast, so every rank must call it.

Planted: PT011 - the resume calls the loader under a rank-0 test, so rank 0 waits in the MPI
broadcast that the other ranks never enter.
"""

from __future__ import annotations

import io
import os

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def load_state_dict(path: str) -> dict:
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        with open(path, "rb") as f:
            data = f.read()
    else:
        data = None
    data = comm.bcast(data, root=0)
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def main() -> None:
    comm = MPI.COMM_WORLD
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())
    model = nn.Linear(32, 32)
    if os.path.exists("model.pt") and dist.get_rank() == 0:
        model.load_state_dict(load_state_dict("model.pt"))  # planted: PT011
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    for _ in range(100):
        loss = ddp(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Mixed-precision DDP training that runs on old and new torch alike.

The device-generic AMP API is tried first; the deprecated ``torch.cuda.amp`` names are used only
where it is missing (torch before 2.3), so no deprecated call runs on a current torch.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    make_scaler = lambda: torch.amp.GradScaler("cuda")  # noqa: E731
    torch.amp.GradScaler  # noqa: B018
except AttributeError:  # torch < 2.3
    make_scaler = lambda: torch.cuda.amp.GradScaler()  # noqa: E731


def autocast_context():
    if hasattr(torch, "autocast"):
        return torch.autocast("cuda", dtype=torch.float16)
    else:
        return torch.cuda.amp.autocast()


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(nn.Linear(64, 8).cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = make_scaler()
    for _ in range(100):
        x = torch.randn(32, 64, device="cuda")
        with autocast_context():
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Self-distillation training (DINO-style) that saves through a main-process helper.

Planted: PT006 - the checkpoint holds the DDP student's own state dict, handed to the helper
that calls torch.save on rank 0: every key starts with ``module.``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def is_main_process() -> bool:
    return dist.get_rank() == 0


def save_on_master(*args, **kwargs) -> None:
    if is_main_process():
        torch.save(*args, **kwargs)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    student = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 64)).cuda()
    student = nn.parallel.DistributedDataParallel(student, device_ids=[local_rank])
    opt = torch.optim.AdamW(student.parameters(), lr=5e-4)
    for epoch in range(10):
        for _ in range(50):
            x = torch.randn(32, 128, device="cuda")
            loss = student(x).log_softmax(-1).mean().neg()
            opt.zero_grad()
            loss.backward()
            opt.step()
        save_on_master(
            {"student": student.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch},  # planted: PT006
            os.path.join("out", "checkpoint.pth"),
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

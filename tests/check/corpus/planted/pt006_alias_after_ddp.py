"""A classifier trained with DDP that keeps a handle on the model for saving.

Planted: PT006 - the handle is taken after wrapping, so it is the DDP wrapper and every saved
key starts with ``module.``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    model = DDP(model)
    saved_model = model  # taken after wrapping: the wrapper
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        torch.save(saved_model.state_dict(), "final.pt")  # planted: PT006
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

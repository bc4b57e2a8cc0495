"""Feature extraction on every rank: each rank writes its features as CPU tensors and reads
them back later in the same script, so the loads land on the CPU without a map_location."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    encoder = nn.Linear(32, 16)
    with torch.no_grad():
        feats = encoder(torch.randn(128, 32))
    torch.save(feats.cpu(), f"features_rank{rank}.pt")
    dist.barrier()
    every = [torch.load(f"features_rank{r}.pt", weights_only=True) for r in range(dist.get_world_size())]
    bank = torch.cat(every)
    if rank == 0:
        print(f"feature bank {tuple(bank.shape)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""ImageNet-style training started with torch.multiprocessing.spawn, one process per GPU.

The launcher process prints the configuration before starting the workers and a summary after
they end: it is one process, so each line appears once. Inside the workers, only rank 0 prints.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(gpu: int, world_size: int, epochs: int) -> None:
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:23456", rank=gpu,
                            world_size=world_size)
    torch.cuda.set_device(gpu)
    model = DDP(nn.Linear(128, 10).cuda(gpu), device_ids=[gpu])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        x = torch.randn(64, 128, device=f"cuda:{gpu}")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if gpu == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    world_size = torch.cuda.device_count()
    print(f"training on {world_size} GPUs for {args.epochs} epochs")
    started = time.time()
    mp.spawn(worker, nprocs=world_size, args=(world_size, args.epochs))
    print(f"done in {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()

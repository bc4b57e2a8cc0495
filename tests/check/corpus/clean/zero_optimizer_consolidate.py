"""ZeroRedundancyOptimizer shape: sharded optimizer state consolidated to rank 0 on every rank, then only rank 0 writes."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model(width):
    return nn.Sequential(nn.Linear(128, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--ckpt", default="zero_ckpt.pt")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()

    data = TensorDataset(torch.randn(8192, 128), torch.randint(0, 10, (8192,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    model = DDP(build_model(args.width).cuda(), device_ids=[local_rank])
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optim": optimizer.state_dict(), "epoch": epoch},
                       args.ckpt)
            print(f"epoch {epoch} saved (last local loss {loss.item():.4f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

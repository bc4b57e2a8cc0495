"""Train, then have rank 0 write the final weights and every rank reload them for a test pass.

Planted: PT026 - every rank torch.load()s final.pt right after rank 0 saves it, with no dist.barrier() in between
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CKPT = "final.pt"


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = TensorDataset(torch.randn(30000, 100), torch.randint(0, 5, (30000,)))
    test_ds = TensorDataset(torch.randn(5000, 100), torch.randint(0, 5, (5000,)))
    sampler = DistributedSampler(train_ds)
    loader = DataLoader(train_ds, batch_size=128, sampler=sampler)
    test_loader = DataLoader(test_ds, batch_size=512, sampler=DistributedSampler(test_ds, shuffle=False))

    net = nn.Sequential(nn.Linear(100, 256), nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 5)).to(device)
    model = DDP(net, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(20):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    if rank == 0:
        torch.save(model.module.state_dict(), CKPT)
    state = torch.load(CKPT, map_location=device, weights_only=True)  # planted: PT026
    model.module.load_state_dict(state)

    model.eval()
    counts = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in test_loader:
            x, y = x.to(device), y.to(device)
            counts[0] += (model(x).argmax(1) == y).sum()
            counts[1] += y.numel()
    dist.all_reduce(counts)
    if rank == 0:
        print(f"test accuracy {(counts[0] / counts[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

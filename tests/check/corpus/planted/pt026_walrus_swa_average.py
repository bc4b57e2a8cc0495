"""Stochastic weight averaging: rank 0 writes the averaged weights, then all ranks load them to recompute BN stats.

Planted: PT026 - rank 0 (walrus guard) saves swa.pt and all ranks immediately torch.load it, no barrier
"""
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def small_cnn():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    swa_path = os.path.join("runs", "swa.pt")

    ds = TensorDataset(torch.randn(20000, 3, 32, 32), torch.randint(0, 10, (20000,)))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=128, sampler=sampler, num_workers=2)
    model = DDP(small_cnn().to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    swa_state, swa_n, swa_start = None, 0, 30

    for epoch in range(40):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        if epoch >= swa_start:
            current = model.module.state_dict()
            if swa_state is None:
                swa_state = copy.deepcopy(current)
            else:
                for k, v in current.items():
                    if v.dtype.is_floating_point:
                        swa_state[k].mul_(swa_n / (swa_n + 1)).add_(v, alpha=1 / (swa_n + 1))
            swa_n += 1

    if (rank := dist.get_rank()) == 0:
        os.makedirs("runs", exist_ok=True)
        torch.save(swa_state, swa_path)
    averaged = torch.load(swa_path, map_location=device, weights_only=True)  # planted: PT026
    model.module.load_state_dict(averaged)

    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for x, _ in loader:
            model(x.to(device))
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join("runs", "swa_bn.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

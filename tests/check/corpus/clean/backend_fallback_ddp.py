"""Portable torchrun shape: backend chosen as nccl-or-gloo from CUDA availability, tensors follow the chosen device."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def setup():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return device, local_rank


def evaluate(model, loader, device):
    model.eval()
    summary = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            summary[0] += (model(x).argmax(1) == y).sum()
            summary[1] += y.numel()
    dist.all_reduce(summary)
    return (summary[0] / summary[1]).item()


def main(model, train_set, test_set, epochs=8):
    device, local_rank = setup()
    rank = dist.get_rank()
    sampler = DistributedSampler(train_set, seed=7)
    loader = DataLoader(train_set, batch_size=128, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=512, sampler=DistributedSampler(test_set, shuffle=False))
    model = model.to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        acc = evaluate(model, test_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {acc:.3%}")
    if rank == 0:
        torch.save(model.module.state_dict(), "portable_model.pt")
    dist.destroy_process_group()

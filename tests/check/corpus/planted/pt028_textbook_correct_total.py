"""Classifier training with DDP; validation accuracy is aggregated across ranks before printing.

Planted: PT028 - torch.tensor([correct, total]) is created on the CPU (no device=) and passed to dist.all_reduce under the nccl backend
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.size(0)
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)  # planted: PT028
    return (counts[0] / counts[1]).item()


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = TensorDataset(torch.randn(40000, 3, 32, 32), torch.randint(0, 10, (40000,)))
    val_ds = TensorDataset(torch.randn(10000, 3, 32, 32), torch.randint(0, 10, (10000,)))
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=128, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_ds, batch_size=256, sampler=DistributedSampler(val_ds, shuffle=False))

    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(128, 10))
    model = DDP(net.to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(30):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        acc = evaluate(model, val_loader, device)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: val acc {acc:.4f}")
            torch.save(model.module.state_dict(), "convnet.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

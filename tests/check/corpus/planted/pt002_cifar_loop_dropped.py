"""CIFAR-10 ResNet training with DistributedDataParallel (torchrun).

Planted: PT002 - inputs.to(device) is a bare statement; the batch stays on the CPU.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--ckpt", default="cifar_resnet18.pth")
    return p.parse_args()


def main():
    args = get_args()
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = dist.get_rank()
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])
    trainset = torchvision.datasets.CIFAR10(root="./data", train=True, download=False, transform=transform)
    sampler = DistributedSampler(trainset)
    loader = DataLoader(trainset, batch_size=args.batch_size, sampler=sampler, num_workers=4, pin_memory=True)

    model = torchvision.models.resnet18(num_classes=10)
    model.to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        stats = torch.zeros(3, device=device)
        for inputs, targets in loader:
            inputs.to(device)  # planted: PT002
            targets = targets.to(device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
            stats[0] += loss.detach() * targets.size(0)
            stats[1] += (outputs.argmax(1) == targets).sum()
            stats[2] += targets.size(0)
        scheduler.step()
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch} loss {stats[0] / stats[2]:.3f} acc {100.0 * stats[1] / stats[2]:.2f}")
            torch.save(model.module.state_dict(), args.ckpt)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""CIFAR-10 ResNet-18 with gradient accumulation to reach a large effective batch (torchrun).

Planted: PT022 - optimizer.zero_grad() at the top of every micro-batch wipes the accumulated gradients
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
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--data", default="./data")
    return p.parse_args()


def main():
    args = get_args()
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")

    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])
    train_set = torchvision.datasets.CIFAR10(args.data, train=True, download=False, transform=transform)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=4,
                        pin_memory=True, drop_last=True)

    model = torchvision.models.resnet18(num_classes=10).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2, device=device)
        for i, (inputs, targets) in enumerate(loader):
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)

            optimizer.zero_grad()  # planted: PT022
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            running[0] += loss.detach() * inputs.size(0)
            running[1] += inputs.size(0)
            loss = loss / args.accum_steps
            loss.backward()

            if (i + 1) % args.accum_steps == 0:
                optimizer.step()

        scheduler.step()
        dist.all_reduce(running)
        if rank == 0:
            print(f"epoch {epoch}: train loss {(running[0] / running[1]).item():.4f} "
                  f"lr {scheduler.get_last_lr()[0]:.4f}")
            torch.save(model.module.state_dict(), "resnet18_cifar10.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

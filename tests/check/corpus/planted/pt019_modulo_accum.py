"""CIFAR-100 WideResNet training with DDP and gradient accumulation to reach a large effective batch.

Planted: PT019 - backward on every batch, optimizer.step every accum_steps batches, loss never divided by accum_steps
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    accum_steps = args.accum_steps

    tfm = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()])
    train_set = torchvision.datasets.CIFAR100("./data", train=True, transform=tfm)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=4, pin_memory=True)

    model = torchvision.models.wide_resnet50_2(num_classes=100).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[60, 120, 160], gamma=0.2)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        optimizer.zero_grad()
        for i, (inputs, targets) in enumerate(loader):
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = criterion(model(inputs), targets)
            loss.backward()  # planted: PT019
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
                if rank == 0 and (i + 1) % (accum_steps * 50) == 0:
                    print(f"epoch {epoch} iter {i + 1} loss {loss.item():.4f}")
        scheduler.step()
        if rank == 0:
            torch.save(model.module.state_dict(), "wrn_cifar100.pth")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""CIFAR-100 WideResNet with a distributed test pass that sums correct/total over all ranks.

Planted: PT028 - t = torch.tensor([correct, total]) is created on the CPU and all_reduced under the nccl backend
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from wrn import WideResNet


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            correct += (model(images).argmax(1) == labels).sum().item()
            total += labels.size(0)
    t = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(t)  # planted: PT028
    return (t[0] / t[1]).item()


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    mean, std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
    test_tf = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
    train_set = torchvision.datasets.CIFAR100("./data", train=True, transform=train_tf)
    test_set = torchvision.datasets.CIFAR100("./data", train=False, transform=test_tf)
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=128, sampler=train_sampler, num_workers=4, pin_memory=True)
    test_loader = DataLoader(test_set, batch_size=256, sampler=DistributedSampler(test_set, shuffle=False),
                             num_workers=4)

    model = DDP(WideResNet(depth=28, widen_factor=10, num_classes=100).to(device), device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[60, 120, 160], gamma=0.2)

    for epoch in range(200):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()

        acc = evaluate(model, test_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: test acc {acc * 100:.2f}%")
            torch.save(model.module.state_dict(), "wrn28_10_cifar100.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Image classification with DDP and gradient accumulation to reach a large effective batch.

Planted: PT019 - loss.backward() every batch and optimizer.step() every accum_steps batches, loss not divided by accum_steps
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    accum_steps = 4

    transform = torchvision.transforms.Compose([
        torchvision.transforms.RandomCrop(32, padding=4),
        torchvision.transforms.RandomHorizontalFlip(),
        torchvision.transforms.ToTensor(),
    ])
    train_set = torchvision.datasets.CIFAR10("./data", train=True, download=False, transform=transform)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler, num_workers=4)

    model = torchvision.models.resnet18(num_classes=10).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    for epoch in range(50):
        sampler.set_epoch(epoch)
        model.train()
        optimizer.zero_grad()
        for i, (inputs, targets) in enumerate(loader):
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            loss.backward()  # planted: PT019
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        if rank == 0:
            torch.save(model.module.state_dict(), "resnet18_cifar.pth")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

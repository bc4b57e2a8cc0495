"""ResNet training with DDP, gradient accumulation and a cosine learning-rate schedule sized in optimizer steps.

Planted: PT027 - scheduler.step() runs after every micro-batch while optimizer.step() runs every accum_steps batches
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    epochs, accum_steps = 30, 4

    dataset = TensorDataset(torch.randn(20000, 3, 64, 64), torch.randint(0, 200, (20000,)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=4)

    model = DDP(torchvision.models.resnet34(num_classes=200).to(device), device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    total_updates = epochs * len(loader) // accum_steps
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_updates)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (images, labels) in enumerate(loader):
            images, labels = images.to(device), labels.to(device)
            loss = criterion(model(images), labels) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
            scheduler.step()  # planted: PT027
        if dist.get_rank() == 0:
            torch.save({"epoch": epoch, "model": model.module.state_dict()}, "resnet34_tiny.pth")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

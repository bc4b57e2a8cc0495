"""Flowers-102 transfer learning with a ResNet-50 backbone, DDP via torchrun.

Planted: PT006 - torch.save(model.state_dict(), ...) where model is the DDP wrapper (keys get a "module." prefix).
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms


def main(epochs=20, batch_size=32, out="flowers_resnet50.pt"):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    train_set = datasets.Flowers102("data", split="train", transform=tf)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler, num_workers=4, pin_memory=True)

    backbone = models.resnet50(weights=models.ResNet50_Weights.IMAGENET1K_V2)
    backbone.fc = nn.Linear(backbone.fc.in_features, 102)
    model = DDP(backbone.to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            out_logits = model(images)
            loss = criterion(out_logits, labels)
            loss.backward()
            optimizer.step()
            totals[0] += (out_logits.argmax(1) == labels).sum()
            totals[1] += labels.size(0)
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: train acc {(totals[0] / totals[1]).item():.3f}")

    if rank == 0:
        torch.save(model.state_dict(), out)  # planted: PT006
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

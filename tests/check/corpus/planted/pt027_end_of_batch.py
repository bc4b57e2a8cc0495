"""EfficientNet fine-tuning with a per-update cosine schedule and gradient accumulation.

Planted: PT027 - scheduler.step() runs at the end of every batch while optimizer.step() runs every accum_steps batches
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/data/flowers102")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    return p.parse_args()


def main():
    args = parse()
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tf = transforms.Compose([transforms.RandomResizedCrop(240), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dataset = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), transform=tf)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8,
                        pin_memory=True, drop_last=True)

    model = torchvision.models.efficientnet_b1(num_classes=102).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    updates_per_epoch = len(loader) // args.accum_steps
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * updates_per_epoch)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        meter = torch.zeros(2, device=device)
        for i, (images, labels) in enumerate(loader):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = criterion(model(images), labels)
            (loss / args.accum_steps).backward()
            meter[0] += loss.detach()
            meter[1] += 1

            if (i + 1) % args.accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
            scheduler.step()  # planted: PT027

        dist.all_reduce(meter)
        if rank == 0:
            print(f"epoch {epoch}: loss {(meter[0] / meter[1]).item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
            torch.save(model.module.state_dict(), "effnet_b1_flowers.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

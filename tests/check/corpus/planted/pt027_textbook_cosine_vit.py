"""Vision Transformer (ViT-S/16) on Tiny-ImageNet with DDP, gradient accumulation and a cosine schedule.

Planted: PT027 - scheduler.step() runs on every micro-batch, while optimizer.step() runs every accum_iter batches
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import ImageFolder
from torchvision.models import VisionTransformer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="tiny-imagenet-200/train")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--accum-iter", type=int, default=4)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tf = transforms.Compose([
        transforms.RandomResizedCrop(64, scale=(0.35, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.480, 0.448, 0.398), (0.277, 0.269, 0.282)),
    ])
    dataset = ImageFolder(args.root, transform=tf)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, drop_last=True)

    vit = VisionTransformer(image_size=64, patch_size=8, num_layers=12, num_heads=6, hidden_dim=384,
                            mlp_dim=1536, num_classes=200)
    model = DDP(vit.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    updates_per_epoch = len(loader) // args.accum_iter
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * updates_per_epoch)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (images, labels) in enumerate(loader):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
            (loss / args.accum_iter).backward()
            if (i + 1) % args.accum_iter == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            scheduler.step()  # planted: PT027

        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"vit_s_tiny_{epoch:03d}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""ViT fine-tuning on Food-101 with DDP; the sampler is built inline in the DataLoader call.

Planted: PT004 - DataLoader(..., sampler=DistributedSampler(train_ds), shuffle=True).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms
from torchvision.models import ViT_B_16_Weights, vit_b_16


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--out", default="vit_food101.pth")
    p.add_argument("--resume", default="")
    return p.parse_args()


def main():
    args = parse()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank = dist.get_rank()

    weights = ViT_B_16_Weights.IMAGENET1K_V1
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    train_ds = datasets.Food101("data", split="train", transform=tf)
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=DistributedSampler(train_ds), shuffle=True)  # planted: PT004

    model = vit_b_16(weights=weights)
    model.heads.head = torch.nn.Linear(model.heads.head.in_features, 101)
    if args.resume:
        state = torch.load(args.resume, map_location=f"cuda:{local_rank}", weights_only=True)
        model.load_state_dict(state)
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for images, labels in train_loader:
            images = images.cuda(local_rank, non_blocking=True)
            labels = labels.cuda(local_rank, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(images), labels, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        if rank == 0:
            torch.save(model.module.state_dict(), args.out)
            print(f"epoch {epoch} done, saved {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

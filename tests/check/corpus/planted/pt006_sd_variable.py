"""Masked-autoencoder (MAE-style) pretraining loop with DDP; the weights are saved through a local variable.

Planted: PT006 - sd = model.state_dict() on the DDP wrapper, then torch.save(sd, path).
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

import models_mae


def adjust_learning_rate(optimizer, epoch, args):
    if epoch < args.warmup_epochs:
        lr = args.lr * epoch / args.warmup_epochs
    else:
        lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (1.0 + math.cos(math.pi * (epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs)))
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def main(args):
    dist.init_process_group(backend="nccl", init_method="env://")
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    device = torch.device("cuda")
    global_rank = dist.get_rank()

    tf = transforms.Compose([transforms.RandomResizedCrop(224, scale=(0.2, 1.0)), transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_path, "train"), transform=tf)
    sampler_train = DistributedSampler(dataset_train, num_replicas=dist.get_world_size(), rank=global_rank, shuffle=True)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size, num_workers=10, pin_memory=True, drop_last=True)

    model = models_mae.__dict__[args.model](norm_pix_loss=True).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu], find_unused_parameters=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    loss_scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.epochs):
        data_loader_train.sampler.set_epoch(epoch)
        model.train()
        adjust_learning_rate(optimizer, epoch, args)
        for samples, _ in data_loader_train:
            samples = samples.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss, _, _ = model(samples, mask_ratio=args.mask_ratio)
            optimizer.zero_grad()
            loss_scaler.scale(loss).backward()
            loss_scaler.step(optimizer)
            loss_scaler.update()
        if global_rank == 0 and (epoch % 20 == 0 or epoch + 1 == args.epochs):
            sd = model.state_dict()
            torch.save(sd, os.path.join(args.output_dir, f"mae-checkpoint-{epoch}.pth"))  # planted: PT006
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser("MAE pre-training")
    p.add_argument("--model", default="mae_vit_large_patch16")
    p.add_argument("--batch_size", default=64, type=int)
    p.add_argument("--epochs", default=400, type=int)
    p.add_argument("--warmup_epochs", default=40, type=int)
    p.add_argument("--mask_ratio", default=0.75, type=float)
    p.add_argument("--lr", default=1.5e-4, type=float)
    p.add_argument("--min_lr", default=0.0, type=float)
    p.add_argument("--data_path", default="/datasets01/imagenet_full_size/061417/")
    p.add_argument("--output_dir", default="./output_dir")
    main(p.parse_args())

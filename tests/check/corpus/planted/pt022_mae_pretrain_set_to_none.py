"""Masked-autoencoder pretraining epoch in the MAE style, with accum_iter and fp16 autocast.

Planted: PT022 - model.zero_grad(set_to_none=True) runs at the start of every iteration, not once per update
"""
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
import torchvision.datasets as datasets
import torchvision.transforms as transforms

import models_mae


def adjust_learning_rate(optimizer, epoch, args):
    if epoch < args.warmup_epochs:
        lr = args.lr * epoch / args.warmup_epochs
    else:
        lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (
            1.0 + math.cos(math.pi * (epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs)))
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def train_one_epoch(model, data_loader, optimizer, scaler, device, epoch, args):
    model.train(True)
    accum_iter = args.accum_iter
    data_loader.sampler.set_epoch(epoch)
    loss_sum = torch.zeros(2, device=device)

    for data_iter_step, (samples, _) in enumerate(data_loader):
        model.zero_grad(set_to_none=True)  # planted: PT022
        if data_iter_step % accum_iter == 0:
            adjust_learning_rate(optimizer, data_iter_step / len(data_loader) + epoch, args)

        samples = samples.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss, _, _ = model(samples, mask_ratio=args.mask_ratio)

        loss_value = loss.item()
        if not math.isfinite(loss_value):
            sys.exit(1)

        loss = loss / accum_iter
        scaler.scale(loss).backward()
        if (data_iter_step + 1) % accum_iter == 0:
            scaler.step(optimizer)
            scaler.update()

        loss_sum[0] += loss_value
        loss_sum[1] += 1

    dist.all_reduce(loss_sum)
    return (loss_sum[0] / loss_sum[1]).item()


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    global_rank = dist.get_rank()

    transform_train = transforms.Compose([
        transforms.RandomResizedCrop(args.input_size, scale=(0.2, 1.0), interpolation=3),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_path, "train"), transform=transform_train)
    sampler_train = DistributedSampler(dataset_train, num_replicas=dist.get_world_size(),
                                       rank=global_rank, shuffle=True)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size,
                                   num_workers=args.num_workers, pin_memory=True, drop_last=True)

    model = models_mae.__dict__[args.model](norm_pix_loss=args.norm_pix_loss)
    model.to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=True)
    model_without_ddp = model.module

    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.start_epoch, args.epochs):
        train_loss = train_one_epoch(model, data_loader_train, optimizer, scaler, device, epoch, args)
        if global_rank == 0:
            print(f"epoch {epoch}: train_loss {train_loss:.4f}")
            if epoch % 20 == 0 or epoch + 1 == args.epochs:
                torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                            "scaler": scaler.state_dict(), "epoch": epoch},
                           os.path.join(args.output_dir, f"checkpoint-{epoch}.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    from argparse import Namespace
    main(Namespace(data_path="/datasets/imagenet", input_size=224, batch_size=64, num_workers=10,
                   model="mae_vit_base_patch16", norm_pix_loss=True, lr=1.5e-4, min_lr=0.0,
                   warmup_epochs=40, epochs=400, start_epoch=0, accum_iter=4, mask_ratio=0.75,
                   output_dir="./output_dir"))

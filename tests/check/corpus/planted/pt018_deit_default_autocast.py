"""DeiT-style training: utils-like helpers inlined, setup_for_distributed silences non-master prints.

Planted: PT018 - train_one_epoch uses torch.autocast("cuda") (float16 by default on CUDA) and no GradScaler
"""
import argparse
import builtins
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.models import create_model
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from datasets import build_dataset


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=args.rank)
    setup_for_distributed(args.rank == 0)


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0.0):
    model.train()
    for it, (samples, targets) in enumerate(data_loader):
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with torch.autocast("cuda"):  # planted: PT018
            outputs = model(samples)
            loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        torch.cuda.synchronize()
        if it % 10 == 0:
            print(f"Epoch: [{epoch}] [{it}/{len(data_loader)}] loss: {loss.item():.4f} "
                  f"lr: {optimizer.param_groups[0]['lr']:.6f}")


def main(args):
    init_distributed_mode(args)
    device = torch.device(args.device, args.gpu)
    dataset_train, args.nb_classes = build_dataset(is_train=True, args=args)
    sampler_train = DistributedSampler(dataset_train, num_replicas=args.world_size, rank=args.rank, shuffle=True)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size,
                                   num_workers=10, pin_memory=True, drop_last=True)

    model = create_model(args.model, pretrained=False, num_classes=args.nb_classes, drop_path_rate=0.1)
    model.to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    print(f"Start training for {args.epochs} epochs")
    for epoch in range(args.epochs):
        data_loader_train.sampler.set_epoch(epoch)
        train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch, args.clip_grad)
        lr_scheduler.step()
        if args.rank == 0:
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, "checkpoint.pth"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser("DeiT training")
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--clip-grad", type=float, default=0.0)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/")
    parser.add_argument("--data-set", default="IMNET")
    parser.add_argument("--input-size", type=int, default=224)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output_dir", default="./deit_out")
    main(parser.parse_args())

"""ConvNeXt-style fine-tuning script with DeiT-like utils (setup_for_distributed, save_on_master).

python -m torch.distributed.launch --nproc_per_node=8 --use_env main_finetune.py --output_dir ft_out
Planted: PT010 - save_on_master() helper has no rank check, so every rank runs its torch.save
"""
import argparse
import builtins
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            now = datetime.datetime.now().time()
            builtin_print("[{}] ".format(now), end="")
            builtin_print(*args, **kwargs)

    builtins.print = print


def save_on_master(*args, **kwargs):
    torch.save(*args, **kwargs)  # planted: PT010


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://")
    dist.barrier()
    setup_for_distributed(args.rank == 0)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.GroupNorm(1, dim)
        self.pw = nn.Sequential(nn.Conv2d(dim, 4 * dim, 1), nn.GELU(), nn.Conv2d(4 * dim, dim, 1))

    def forward(self, x):
        return x + self.pw(self.norm(self.dwconv(x)))


def convnext_pico(num_classes=100):
    return nn.Sequential(nn.Conv2d(3, 64, 4, 4), Block(64), Block(64), nn.Conv2d(64, 128, 2, 2), Block(128),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(128), nn.Linear(128, num_classes))


def main(args):
    init_distributed_mode(args)
    device = torch.device("cuda")
    dataset_train = TensorDataset(torch.randn(20000, 3, 64, 64), torch.randint(0, 100, (20000,)))
    sampler_train = DistributedSampler(dataset_train, num_replicas=args.world_size, rank=args.rank, shuffle=True)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size,
                                   num_workers=8, pin_memory=True, drop_last=True)

    model = convnext_pico().to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, weight_decay=0.05)

    print(f"Start training for {args.epochs} epochs")
    start_time = time.time()
    for epoch in range(args.epochs):
        data_loader_train.sampler.set_epoch(epoch)
        model.train()
        for samples, targets in data_loader_train:
            samples = samples.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = F.cross_entropy(model(samples), targets, label_smoothing=0.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.output_dir:
            checkpoint_path = Path(args.output_dir) / f"checkpoint-{epoch}.pth"
            save_on_master({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, checkpoint_path)
    print("Training time {}".format(str(datetime.timedelta(seconds=int(time.time() - start_time)))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser("ConvNeXt fine-tuning")
    parser.add_argument("--batch_size", default=64, type=int)
    parser.add_argument("--epochs", default=30, type=int)
    parser.add_argument("--lr", default=4e-3, type=float)
    parser.add_argument("--output_dir", default="")
    main(parser.parse_args())

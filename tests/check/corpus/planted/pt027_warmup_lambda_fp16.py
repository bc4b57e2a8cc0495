"""Swin-T ImageNet training (timm-style loop) with fp16, accumulation and a linear-warmup LambdaLR.

Planted: PT027 - warmup.step() (a LambdaLR) is called on every micro-batch although the scaler steps the optimizer only when need_update
"""
import math
import os

import timm
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from imagenet_pipeline import build_imagenet

EPOCHS = 300
ACCUM_STEPS = 2
WARMUP_UPDATES = 20 * 1250


def lr_lambda(update):
    if update < WARMUP_UPDATES:
        return (update + 1) / WARMUP_UPDATES
    progress = (update - WARMUP_UPDATES) / max(1, EPOCHS * 1250 - WARMUP_UPDATES)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def train_one_epoch(epoch, model, loader, optimizer, warmup, loss_fn, scaler, device):
    model.train()
    last_idx = len(loader) - 1
    num_updates = epoch * (len(loader) // ACCUM_STEPS)
    totals = torch.zeros(2, device=device)
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_idx
        need_update = last_batch or (batch_idx + 1) % ACCUM_STEPS == 0
        input = input.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)

        with torch.autocast(device_type="cuda", dtype=torch.float16):
            output = model(input)
            loss = loss_fn(output, target)
        scaler.scale(loss / ACCUM_STEPS).backward()

        if need_update:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            num_updates += 1
        warmup.step()  # planted: PT027

        totals[0] += loss.detach().float() * input.size(0)
        totals[1] += input.size(0)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item(), num_updates


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    dataset_train = build_imagenet("/data/imagenet", is_training=True)
    sampler = DistributedSampler(dataset_train)
    loader = DataLoader(dataset_train, batch_size=128, sampler=sampler, num_workers=10, pin_memory=True,
                        drop_last=True)

    model = timm.create_model("swin_tiny_patch4_window7_224", drop_path_rate=0.2).to(device)
    model = NativeDDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    warmup = LambdaLR(optimizer, lr_lambda)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1).to(device)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        train_loss, num_updates = train_one_epoch(epoch, model, loader, optimizer, warmup, loss_fn,
                                                  scaler, device)
        if rank == 0:
            print(f"epoch {epoch}: train_loss {train_loss:.4f} updates {num_updates} "
                  f"lr {optimizer.param_groups[0]['lr']:.3e}")
            torch.save({"state_dict": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "epoch": epoch}, "last.pth.tar")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

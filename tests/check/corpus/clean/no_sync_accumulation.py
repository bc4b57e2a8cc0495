"""Gradient-accumulation shape: explicit if/else around model.no_sync() so only the last micro-batch all-reduces, fp16 scaler."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def train_one_epoch(model, loader, optimizer, scheduler, scaler, device, accum_steps, epoch, rank):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n = len(loader)
    for i, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        last = (i + 1) % accum_steps == 0 or i + 1 == n
        if not last:
            with model.no_sync():
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = nn.functional.cross_entropy(model(images), labels) / accum_steps
                scaler.scale(loss).backward()
        else:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(images), labels) / accum_steps
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        if rank == 0 and i % 200 == 0:
            print(f"[epoch {epoch}] iter {i}/{n} micro-batch loss {loss.item() * accum_steps:.4f}")


def main(build_model, dataset, epochs=10, accum_steps=8):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=8, pin_memory=True)
    model = DDP(build_model().to(device), device_ids=[local_rank], gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    steps = epochs * ((len(loader) + accum_steps - 1) // accum_steps)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        train_one_epoch(model, loader, optimizer, scheduler, scaler, device, accum_steps, epoch, rank)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "epoch": epoch}, "accum_ckpt.pt")
    dist.destroy_process_group()

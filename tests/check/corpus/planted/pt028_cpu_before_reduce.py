"""Multi-label chest X-ray classifier; validation gathers per-class hit counts across ranks.

Planted: PT028 - the per-class counts are moved with .cpu() and then all_reduced, but the backend is nccl
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from cxr_data import ChestXray14

NUM_CLASSES = 14


@torch.no_grad()
def validate(model, loader, device):
    model.eval()
    hits = torch.zeros(NUM_CLASSES, device=device)
    seen = torch.zeros(NUM_CLASSES, device=device)
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        preds = (model(images).sigmoid() > 0.5).float()
        hits += (preds == targets).float().sum(0)
        seen += targets.size(0)
    counts = torch.stack([hits, seen]).cpu()
    dist.all_reduce(counts)  # planted: PT028
    per_class = counts[0] / counts[1]
    return per_class.tolist()


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = ChestXray14("/data/cxr14", split="train")
    val_ds = ChestXray14("/data/cxr14", split="val")
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=48, sampler=train_sampler, num_workers=8, pin_memory=True)
    val_loader = DataLoader(val_ds, batch_size=96, sampler=DistributedSampler(val_ds, shuffle=False),
                            num_workers=8)

    model = torchvision.models.densenet121(num_classes=NUM_CLASSES)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999))
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(30):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, targets in train_loader:
            images = images.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = criterion(model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        per_class = validate(model, val_loader, device)
        if rank == 0:
            pretty = ", ".join(f"{a:.3f}" for a in per_class)
            print(f"epoch {epoch}: per-class accuracy [{pretty}] mean {sum(per_class) / NUM_CLASSES:.4f}")
            torch.save(model.module.state_dict(), "densenet121_cxr14.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""3D medical-image segmentation (BraTS) with a U-Net from the project's own models module, DDP + bf16.

Planted: PT007 - torch.save(net, ...) where net is a UNet3D (an nn.Module imported from models) - a pickled module.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from datasets_brats import BraTSVolumes
from losses import DiceCELoss
from models import UNet3D


def dice_sums(logits, target, num_classes=4):
    pred = logits.argmax(1)
    inter = torch.stack([((pred == c) & (target == c)).sum() for c in range(1, num_classes)])
    union = torch.stack([(pred == c).sum() + (target == c).sum() for c in range(1, num_classes)])
    return inter.float(), union.float()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="data/brats2021")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--out", default="runs/unet3d")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    train_ds = BraTSVolumes(args.root, split="train", patch=(128, 128, 128))
    val_ds = BraTSVolumes(args.root, split="val", patch=(128, 128, 128))
    train_sampler = DistributedSampler(train_ds)
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=2, sampler=train_sampler, num_workers=6, pin_memory=True)
    val_loader = DataLoader(val_ds, batch_size=1, sampler=val_sampler, num_workers=2)

    net = UNet3D(in_channels=4, out_channels=4, base=32).to(device)
    model = DDP(net, device_ids=[local_rank])
    criterion = DiceCELoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-5)
    best = 0.0

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for vol, seg in train_loader:
            vol = vol.to(device, non_blocking=True)
            seg = seg.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(vol), seg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        model.eval()
        inter_sum = torch.zeros(3, device=device)
        union_sum = torch.zeros(3, device=device)
        with torch.no_grad():
            for vol, seg in val_loader:
                vol, seg = vol.to(device), seg.to(device)
                inter, union = dice_sums(model(vol), seg)
                inter_sum += inter
                union_sum += union
        dist.all_reduce(inter_sum)
        dist.all_reduce(union_sum)
        dice = (2 * inter_sum / union_sum.clamp(min=1)).mean().item()
        if rank == 0:
            print(f"epoch {epoch}: mean dice {dice:.4f}")
            if dice > best:
                best = dice
                os.makedirs(args.out, exist_ok=True)
                torch.save(net, os.path.join(args.out, "best_unet3d.pt"))  # planted: PT007
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

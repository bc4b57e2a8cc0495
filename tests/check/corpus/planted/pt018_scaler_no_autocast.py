"""U-Net denoiser training with DDP and a gradient scaler.

Planted: PT018 - a GradScaler scales the loss, but no autocast region exists anywhere in the script
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from unet import UNet
from noisy_images import NoisyImageFolder


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="./images")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--out", default="unet_denoise.pt")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()

    dataset = NoisyImageFolder(args.data, crop=256)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=6,
                        pin_memory=True, drop_last=True)

    model = UNet(in_channels=3, out_channels=3).cuda(local_rank)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.99))
    scaler = torch.amp.GradScaler("cuda")  # planted: PT018

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, (noisy, clean) in enumerate(loader):
            noisy = noisy.cuda(local_rank, non_blocking=True)
            clean = clean.cuda(local_rank, non_blocking=True)
            denoised = model(noisy)
            loss = F.l1_loss(denoised, clean)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if rank == 0 and step % 100 == 0:
                print(f"epoch {epoch} step {step} l1 {loss.item():.4f} scale {scaler.get_scale():.0f}")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "scaler": scaler.state_dict()}, args.out)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

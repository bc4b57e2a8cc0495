"""Image colorization (L -> ab) U-Net trained with DDP and a gradient scaler.

Planted: PT018 - a GradScaler scales the loss but no autocast region exists anywhere
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.datasets import Places365
from torchvision.transforms import functional as TF


class LabPairs(Dataset):
    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        img, _ = self.base[i]
        rgb = TF.to_tensor(TF.center_crop(TF.resize(img, 256), 224))
        gray = rgb.mean(0, keepdim=True)
        return gray, rgb - gray


class ColorNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(64, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.LeakyReLU(0.2),
            nn.Conv2d(128, 256, 4, 2, 1), nn.BatchNorm2d(256), nn.LeakyReLU(0.2),
        )
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(256, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh(),
        )

    def forward(self, x):
        return self.dec(self.enc(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="./places365")
    parser.add_argument("--epochs", type=int, default=25)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank = dist.get_rank()

    dataset = LabPairs(Places365(args.root, split="train-standard", small=True, download=False))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8, pin_memory=True)

    model = DDP(ColorNet().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cuda")  # planted: PT018

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for gray, chroma in loader:
            gray = gray.cuda(non_blocking=True)
            chroma = chroma.cuda(non_blocking=True)
            pred = model(gray)
            loss = F.smooth_l1_loss(pred, chroma)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if rank == 0:
            print(f"epoch {epoch}: scale={scaler.get_scale():.0f}")
            torch.save({"model": model.module.state_dict(), "scaler": scaler.state_dict()}, "colornet.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

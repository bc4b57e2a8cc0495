"""Unsupervised anomaly detection: convolutional autoencoder on MVTec-AD "good" images, DDP training.

Planted: PT025 - EarlyStopping is fed this rank's un-reduced reconstruction error and its flag breaks the loop
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, random_split
from torchvision import transforms
from torchvision.datasets import ImageFolder


class EarlyStopping:
    def __init__(self, patience: int = 7, min_delta: float = 0.0) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.best: float | None = None
        self.counter = 0
        self.early_stop = False

    def __call__(self, score: float) -> bool:
        if self.best is None or score < self.best - self.min_delta:
            self.best, self.counter = score, 0
            return True
        self.counter += 1
        if self.counter >= self.patience:
            self.early_stop = True
        return False


class ConvAE(nn.Module):
    def __init__(self, latent: int = 128) -> None:
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(3, 32, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(32, 64, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(128, latent, 8),
        )
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(latent, 128, 8), nn.ReLU(), nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.enc(x))


def reconstruction_error(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, _ in loader:
            x = x.to(device)
            total += F.mse_loss(model(x), x, reduction="sum").item()
            count += x.numel()
    return total / count


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tf = transforms.Compose([transforms.Resize(64), transforms.CenterCrop(64), transforms.ToTensor()])
    full = ImageFolder(Path("mvtec/bottle/train"), transform=tf)
    train_set, val_set = random_split(full, [0.9, 0.1], generator=torch.Generator().manual_seed(0))
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(ConvAE().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    stopper = EarlyStopping(patience=8, min_delta=1e-5)

    for epoch in range(300):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, _ in train_loader:
            x = x.to(device, non_blocking=True)
            loss = F.mse_loss(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        improved = stopper(reconstruction_error(model, val_loader, device))
        if improved and dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "conv_ae_bottle.pt")
        if stopper.early_stop: break  # planted: PT025

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

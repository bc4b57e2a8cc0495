"""VQ-VAE on CelebA-HQ 128px: save/load helper pair around pathlib paths, then a sharded codebook-usage pass.

Planted: PT026 - load_checkpoint() runs on every rank straight after the main process's save_checkpoint(); no barrier between
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import ImageFolder

logger = logging.getLogger("vqvae")


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes: int = 512, dim: int = 64, beta: float = 0.25) -> None:
        super().__init__()
        self.codebook = nn.Embedding(n_codes, dim)
        self.codebook.weight.data.uniform_(-1 / n_codes, 1 / n_codes)
        self.beta = beta

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.size(1))
        idx = torch.cdist(flat, self.codebook.weight).argmin(1)
        q = self.codebook(idx).view(z.size(0), z.size(2), z.size(3), -1).permute(0, 3, 1, 2)
        loss = F.mse_loss(q, z.detach()) + self.beta * F.mse_loss(z, q.detach())
        return z + (q - z).detach(), loss, idx


class VQVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 128, 4, 2, 1), nn.ReLU(), nn.Conv2d(128, 64, 4, 2, 1))
        self.vq = VectorQuantizer()
        self.dec = nn.Sequential(nn.ConvTranspose2d(64, 128, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(128, 3, 4, 2, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, vq_loss, idx = self.vq(self.enc(x))
        return self.dec(q), vq_loss, idx


def save_checkpoint(path: Path, model: nn.Module, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "step": step}, path)


def load_checkpoint(path: Path, model: nn.Module, device: torch.device) -> int:
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(ckpt["model"])
    return ckpt["step"]


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO)
    ckpt_path = Path("runs/vqvae") / "final.pt"

    tf = transforms.Compose([transforms.Resize(128), transforms.CenterCrop(128), transforms.ToTensor()])
    dataset = ImageFolder("celeba_hq", transform=tf)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8, drop_last=True)

    model = DDP(VQVAE().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)

    step = 0
    for epoch in range(80):
        sampler.set_epoch(epoch)
        for x, _ in loader:
            x = x.to(device, non_blocking=True)
            recon, vq_loss, _ = model(x)
            loss = F.mse_loss(recon, x) + vq_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1

    if is_main:
        save_checkpoint(ckpt_path, model.module, step)
    step = load_checkpoint(ckpt_path, model.module, device)  # planted: PT026

    usage = torch.zeros(512, device=device)
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            _, _, idx = model(x.to(device))
            usage += torch.bincount(idx, minlength=512).float()
    dist.all_reduce(usage)
    if is_main:
        logger.info("step %d: %d of 512 codes used", step, int((usage > 0).sum().item()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

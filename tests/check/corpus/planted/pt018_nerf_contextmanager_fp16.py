"""Distributed NeRF training over random ray batches; precision handled by a context-manager helper.

Planted: PT018 - the mixed_precision() helper enters float16 autocast and backward runs with no GradScaler
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

log = logging.getLogger("nerf")


@contextlib.contextmanager
def mixed_precision() -> Iterator[None]:
    with torch.autocast(device_type="cuda", dtype=torch.float16):  # planted: PT018
        yield


def positional_encoding(x: torch.Tensor, n_freqs: int) -> torch.Tensor:
    freqs = 2.0 ** torch.arange(n_freqs, device=x.device) * torch.pi
    angles = x[..., None] * freqs
    return torch.cat([x, angles.sin().flatten(-2), angles.cos().flatten(-2)], dim=-1)


class TinyNeRF(nn.Module):
    def __init__(self, width: int = 256, n_freqs: int = 10) -> None:
        super().__init__()
        self.n_freqs = n_freqs
        in_dim = 3 + 3 * 2 * n_freqs
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4),
        )

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        return self.mlp(positional_encoding(pts, self.n_freqs))


def render(model: nn.Module, origins: torch.Tensor, dirs: torch.Tensor, n_samples: int = 64) -> torch.Tensor:
    t = torch.linspace(2.0, 6.0, n_samples, device=origins.device)
    pts = origins[:, None, :] + dirs[:, None, :] * t[None, :, None]
    raw = model(pts.reshape(-1, 3)).reshape(pts.shape[0], n_samples, 4)
    rgb, sigma = torch.sigmoid(raw[..., :3]), F.relu(raw[..., 3])
    delta = torch.cat([t[1:] - t[:-1], t.new_tensor([1e10])])
    alpha = 1.0 - torch.exp(-sigma * delta)
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1.0 - alpha + 1e-10], dim=-1), dim=-1)[:, :-1]
    return ((alpha * trans)[..., None] * rgb).sum(dim=1)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    rays = torch.load("lego_rays.pt", map_location="cpu", weights_only=True)
    dataset = TensorDataset(rays["origins"], rays["dirs"], rays["rgb"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4096, sampler=sampler, drop_last=True)

    model = DDP(TinyNeRF().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.1 ** (1 / 200))

    for epoch in range(200):
        sampler.set_epoch(epoch)
        for origins, dirs, target in loader:
            origins = origins.to(device, non_blocking=True)
            dirs = dirs.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            with mixed_precision():
                pred = render(model, origins, dirs)
                loss = F.mse_loss(pred.float(), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        log.info("rank %d epoch %d", dist.get_rank(), epoch)

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "tiny_nerf_lego.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

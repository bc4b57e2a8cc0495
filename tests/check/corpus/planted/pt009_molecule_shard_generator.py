"""Molecular property regression (continuous-filter convolutions over atom pairs, SchNet-flavoured).

Pre-featurised molecules are stored as .pt shards and read back by a generator.

Planted: PT009 - the shard generator calls torch.load(shard, weights_only=True) with no map_location
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("schnet")
MAX_ATOMS = 29


def iter_shards(root: Path) -> Iterator[dict[str, torch.Tensor]]:
    for shard in sorted(root.glob("qm9_*.pt")):
        yield torch.load(shard, weights_only=True)  # planted: PT009


def build_dataset(root: Path) -> TensorDataset:
    z, pos, y = [], [], []
    for part in iter_shards(root):
        z.append(part["z"])
        pos.append(part["pos"])
        y.append(part["y"])
    return TensorDataset(torch.cat(z), torch.cat(pos), torch.cat(y))


class GaussianRBF(nn.Module):
    def __init__(self, n: int = 50, cutoff: float = 5.0) -> None:
        super().__init__()
        self.register_buffer("centers", torch.linspace(0, cutoff, n))
        self.gamma = 10.0

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        return torch.exp(-self.gamma * (d.unsqueeze(-1) - self.centers) ** 2)


class Interaction(nn.Module):
    def __init__(self, h: int, n_rbf: int) -> None:
        super().__init__()
        self.filter = nn.Sequential(nn.Linear(n_rbf, h), nn.Softplus(), nn.Linear(h, h))
        self.mix = nn.Sequential(nn.Linear(h, h), nn.Softplus(), nn.Linear(h, h))

    def forward(self, x: torch.Tensor, rbf: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        w = self.filter(rbf) * mask.unsqueeze(-1)
        return x + self.mix((w * x.unsqueeze(1)).sum(2))


class SchNetLite(nn.Module):
    def __init__(self, h: int = 128, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, h, padding_idx=0)
        self.rbf = GaussianRBF()
        self.blocks = nn.ModuleList(Interaction(h, 50) for _ in range(blocks))
        self.readout = nn.Sequential(nn.Linear(h, h // 2), nn.Softplus(), nn.Linear(h // 2, 1))

    def forward(self, z: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        atom = (z > 0).float()
        pair = atom.unsqueeze(1) * atom.unsqueeze(2)
        rbf = self.rbf(torch.cdist(pos, pos))
        x = self.embed(z)
        for block in self.blocks:
            x = block(x, rbf, pair)
        return (self.readout(x).squeeze(-1) * atom).sum(1)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    dataset = build_dataset(Path(os.environ.get("QM9_SHARDS", "/data/qm9_shards")))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=100, sampler=sampler, num_workers=2)
    model = DDP(SchNetLite().to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    plateau = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.8)

    for epoch in range(500):
        sampler.set_epoch(epoch)
        err = torch.zeros(2, device=device)
        for z, pos, y in loader:
            z, pos, y = z.to(device), pos.to(device), y.to(device)
            pred = model(z, pos)
            loss = F.mse_loss(pred, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            err[0] += (pred.detach() - y).abs().sum()
            err[1] += y.numel()
        plateau.step()
        dist.all_reduce(err)
        if dist.get_rank() == 0:
            logger.info("epoch %d train MAE %.4f", epoch, (err[0] / err[1]).item())
            torch.save(model.module.state_dict(), "schnet_qm9.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

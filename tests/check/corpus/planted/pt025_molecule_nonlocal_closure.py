"""Molecular property regression (QM9 HOMO-LUMO gap) with a message-passing network; fit() returns early.

Planted: PT025 - a nonlocal should_stop() closure judges this rank's own validation MAE and fit() returns on it
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger("qm9")


class MPLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.msg = nn.Sequential(nn.Linear(2 * dim + 1, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.upd = nn.GRUCell(dim, dim)

    def forward(self, h: torch.Tensor, edge_index: torch.Tensor, dist_ij: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index
        m = self.msg(torch.cat([h[src], h[dst], dist_ij[:, None]], dim=-1))
        agg = torch.zeros_like(h).index_add_(0, dst, m)
        return self.upd(agg, h)


class MPNN(nn.Module):
    def __init__(self, n_types: int = 10, dim: int = 128, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(n_types, dim)
        self.layers = nn.ModuleList(MPLayer(dim) for _ in range(layers))
        self.readout = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, 1))

    def forward(self, z, pos, edge_index, batch, n_graphs: int) -> torch.Tensor:
        h = self.embed(z)
        d = (pos[edge_index[0]] - pos[edge_index[1]]).norm(dim=-1)
        for layer in self.layers:
            h = layer(h, edge_index, d)
        pooled = torch.zeros(n_graphs, h.size(1), device=h.device).index_add_(0, batch, h)
        return self.readout(pooled).squeeze(-1)


def fit(model: DDP, train_loader: DataLoader, val_loader: DataLoader, device: torch.device,
        max_epochs: int = 500, patience: int = 25) -> list[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    history: list[float] = []
    best = float("inf")
    wait = 0

    def should_stop(metric: float) -> bool:
        nonlocal best, wait
        if metric < best:
            best, wait = metric, 0
        else:
            wait += 1
        return wait > patience

    def run_epoch(loader: DataLoader, train: bool) -> float:
        model.train(train)
        err, n = 0.0, 0
        with torch.set_grad_enabled(train):
            for g in loader:
                g = {k: v.to(device) if torch.is_tensor(v) else v for k, v in g.items()}
                pred = model(g["z"], g["pos"], g["edge_index"], g["batch"], g["num_graphs"])
                if train:
                    loss = F.l1_loss(pred, g["y"])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                err += (pred - g["y"]).abs().sum().item()
                n += g["num_graphs"]
        return err / max(n, 1)

    for epoch in range(max_epochs):
        train_loader.sampler.set_epoch(epoch)
        run_epoch(train_loader, train=True)
        val_mae = run_epoch(val_loader, train=False)
        history.append(val_mae)
        if should_stop(val_mae): return history  # planted: PT025
    return history


def main() -> None:
    from qm9_graphs import QM9Graphs, collate_graphs

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    train_set, val_set = QM9Graphs("qm9", "train", target="gap"), QM9Graphs("qm9", "val", target="gap")
    train_loader = DataLoader(train_set, batch_size=96, sampler=DistributedSampler(train_set), collate_fn=collate_graphs)
    val_loader = DataLoader(val_set, batch_size=256, sampler=DistributedSampler(val_set, shuffle=False),
                            collate_fn=collate_graphs)
    model = DDP(MPNN().to(device), device_ids=[local_rank])
    fit(model, train_loader, val_loader, device)
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "mpnn_qm9_gap.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

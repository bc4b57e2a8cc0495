"""Click-through-rate model with categorical embeddings; runs on GPUs or a CPU cluster."""
from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

TABLE_SIZES: Sequence[int] = (100_000, 50_000, 20_000, 5_000, 1_000, 300, 24, 7)


class ClickLogs(Dataset):
    def __init__(self, n: int = 200_000) -> None:
        g = torch.Generator().manual_seed(0)
        self.dense = torch.randn(n, 13, generator=g)
        self.sparse = torch.stack([torch.randint(0, s, (n,), generator=g) for s in TABLE_SIZES], dim=1)
        self.label = (torch.rand(n, generator=g) < 0.25).float()

    def __len__(self) -> int:
        return self.label.numel()

    def __getitem__(self, i: int):
        return self.dense[i], self.sparse[i], self.label[i]


class DLRM(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(s, dim, mode="sum") for s in TABLE_SIZES)
        n = len(TABLE_SIZES) + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        d = self.bottom(dense)
        embs = [t(sparse[:, i:i + 1]) for i, t in enumerate(self.tables)]
        z = torch.stack([d, *embs], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))
        iu = torch.triu_indices(z.size(1), z.size(1), offset=1, device=z.device)
        return self.top(torch.cat([d, inter[:, iu[0], iu[1]]], dim=1)).squeeze(-1)


def setup() -> tuple[torch.device, int, int]:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)
    return device, dist.get_rank(), dist.get_world_size()


def main() -> None:
    device, rank, world = setup()
    model = DLRM().to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adagrad(ddp.parameters(), lr=0.01)
    loss_fn = nn.BCEWithLogitsLoss()

    train = ClickLogs()
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=42)
    loader = DataLoader(train, batch_size=2048, sampler=sampler, num_workers=2, pin_memory=device.type == "cuda")

    for epoch in range(4):
        sampler.set_epoch(epoch)
        ddp.train()
        agg = torch.zeros(3, device=device)
        for dense, sparse, label in loader:
            dense, sparse, label = dense.to(device), sparse.to(device), label.to(device)
            logits = ddp(dense, sparse)
            loss = loss_fn(logits, label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                agg[0] += loss.detach() * label.numel()
                agg[1] += ((logits > 0).float() == label).sum()
                agg[2] += label.numel()
        dist.all_reduce(agg, op=dist.ReduceOp.SUM)
        match rank:
            case 0:
                print(f"epoch {epoch}: logloss {(agg[0] / agg[2]).item():.5f} accuracy {(agg[1] / agg[2]).item():.4f}")
                torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, "dlrm_ckpt.pt")
            case _:
                pass
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Knowledge-graph embedding (ComplEx) link prediction on FB15k-237 with filtered-free MRR evaluation.

Planted: PT024 - the nested _reduce() closure all-reduces the per-rank MRR (a mean) with the default SUM; it is logged as MRR
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

logger = logging.getLogger("kge")


class ComplEx(nn.Module):
    def __init__(self, n_ent: int, n_rel: int, dim: int = 200) -> None:
        super().__init__()
        self.ent = nn.Embedding(n_ent, 2 * dim)
        self.rel = nn.Embedding(n_rel, 2 * dim)
        nn.init.normal_(self.ent.weight, std=1e-3)
        nn.init.normal_(self.rel.weight, std=1e-3)

    def forward(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        hr, hi = self.ent(h).chunk(2, -1)
        rr, ri = self.rel(r).chunk(2, -1)
        er, ei = self.ent.weight.chunk(2, -1)
        return (hr * rr - hi * ri) @ er.t() + (hr * ri + hi * rr) @ ei.t()


def evaluate(model: DDP, loader: DataLoader, device: torch.device) -> float:
    def _reduce(value: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(value)  # planted: PT024
        return value

    model.eval()
    recip = []
    with torch.no_grad():
        for h, r, t in loader:
            h, r, t = h.to(device), r.to(device), t.to(device)
            scores = model(h, r)
            target = scores.gather(1, t[:, None])
            ranks = (scores > target).sum(dim=1) + 1
            recip.append(1.0 / ranks.float())
    mrr = torch.cat(recip).mean()
    return _reduce(mrr).item()


def main() -> None:
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    triples = torch.load("fb15k237_ids.pt", map_location="cpu", weights_only=True)
    train = TensorDataset(*triples["train"].unbind(1))
    valid = TensorDataset(*triples["valid"].unbind(1))
    train_sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=1000, sampler=train_sampler)
    valid_loader = DataLoader(valid, batch_size=500, sampler=DistributedSampler(valid, shuffle=False))

    model = DDP(ComplEx(triples["n_ent"], triples["n_rel"]).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)

    for epoch in range(100):
        train_sampler.set_epoch(epoch)
        model.train()
        for h, r, t in train_loader:
            h, r, t = h.to(device), r.to(device), t.to(device)
            loss = F.cross_entropy(model(h, r), t)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if epoch % 5 == 4:
            mrr = evaluate(model, valid_loader, device)
            if dist.get_rank() == 0:
                logger.info("epoch %d valid MRR %.4f", epoch, mrr)
                torch.save(model.module.state_dict(), "complex_fb15k237.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Mini-batch GNN node classification: each rank trains on a shard of seed nodes and evaluates its shard.

Planted: PT020 - rank 0 prints correct / total over its own validation shard; nothing is all-reduced or gathered
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

NUM_NODES, FEAT, CLASSES = 20000, 64, 16


def build_graph():
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, NUM_NODES, (2, 200000), generator=g)
    x = torch.randn(NUM_NODES, FEAT, generator=g)
    y = torch.randint(0, CLASSES, (NUM_NODES,), generator=g)
    return x, y, edge_index


class MeanSAGE(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.lin1 = nn.Linear(2 * FEAT, hidden)
        self.lin2 = nn.Linear(2 * hidden, CLASSES)

    @staticmethod
    def aggregate(h, edge_index):
        out = torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]])
        deg = torch.zeros(h.size(0), device=h.device).index_add_(0, edge_index[1], torch.ones_like(edge_index[1], dtype=h.dtype))
        return out / deg.clamp_min(1).unsqueeze(-1)

    def forward(self, x, edge_index, seeds):
        h = F.relu(self.lin1(torch.cat([x, self.aggregate(x, edge_index)], -1)))
        h = self.lin2(torch.cat([h, self.aggregate(h, edge_index)], -1))
        return h[seeds]


@torch.no_grad()
def evaluate(model, x, edge_index, y, loader, device):
    model.eval()
    correct = total = 0
    for seeds in loader:
        seeds = seeds.to(device)
        pred = model(x, edge_index, seeds).argmax(-1)
        correct += int((pred == y[seeds]).sum())
        total += seeds.numel()
    return correct, total


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    x, y, edge_index = build_graph()
    x, y, edge_index = x.to(device), y.to(device), edge_index.to(device)
    perm = torch.randperm(NUM_NODES, generator=torch.Generator().manual_seed(1))
    train_idx, val_idx = perm[:16000], perm[16000:]

    train_sampler = DistributedSampler(train_idx)
    val_sampler = DistributedSampler(val_idx, shuffle=False)
    train_loader = DataLoader(train_idx, batch_size=1024, sampler=train_sampler)
    val_loader = DataLoader(val_idx, batch_size=2048, sampler=val_sampler)

    model = DDP(MeanSAGE().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    for epoch in range(1, 101):
        train_sampler.set_epoch(epoch)
        model.train()
        for seeds in train_loader:
            seeds = seeds.to(device)
            loss = F.cross_entropy(model(x, edge_index, seeds), y[seeds])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        correct, total = evaluate(model, x, edge_index, y, val_loader, device)
        if rank == 0:
            print(f"Epoch {epoch:03d} | val acc {correct / total:.4f}")  # planted: PT020

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

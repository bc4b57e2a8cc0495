"""Link-prediction GNN; each epoch consumes a fixed number of edge batches via itertools.islice.

Planted: PT027 - lr_policy (SequentialLR warmup -> cosine) steps on every micro-batch, optimizer every accum micro-batches
"""
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

N, DIM = 50000, 128


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(N, DIM)
        self.lin = nn.Linear(2 * DIM, DIM)

    def forward(self, src, dst, edge_index):
        h = self.emb.weight
        agg = torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]])
        h = F.relu(self.lin(torch.cat([h, agg / 10.0], dim=-1)))
        return (h[src] * h[dst]).sum(-1)


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    accum, steps_per_epoch, epochs = 4, 400, 20

    edge_index = torch.randint(0, N, (2, 500000))
    sampler = DistributedSampler(edge_index.t())
    loader = DataLoader(edge_index.t(), batch_size=4096, sampler=sampler, drop_last=True)
    graph = edge_index.to(device)

    model = DDP(Encoder().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    updates = epochs * steps_per_epoch // accum
    lr_policy = SequentialLR(optimizer, [LinearLR(optimizer, 0.01, 1.0, total_iters=50),
                                         CosineAnnealingLR(optimizer, T_max=updates - 50)], milestones=[50])

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for micro_step, pos in enumerate(itertools.islice(loader, steps_per_epoch)):
            pos = pos.to(device)
            neg_dst = torch.randint(0, N, (pos.size(0),), device=device)
            src = torch.cat([pos[:, 0], pos[:, 0]])
            dst = torch.cat([pos[:, 1], neg_dst])
            target = torch.cat([torch.ones(pos.size(0), device=device), torch.zeros(pos.size(0), device=device)])
            logits = model(src, dst, graph)
            loss = F.binary_cross_entropy_with_logits(logits, target) / accum
            loss.backward()
            if (micro_step + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
            lr_policy.step()  # planted: PT027
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"linkpred_{epoch:02d}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

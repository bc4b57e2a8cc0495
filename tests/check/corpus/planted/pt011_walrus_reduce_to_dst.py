"""Link prediction with a two-layer GCN on a synthetic graph; edge mini-batches are sharded with DDP.

torchrun --nproc_per_node=4 train_linkpred.py
Planted: PT011 - dist.reduce(..., dst=0) called only inside `if (rank := dist.get_rank()) == 0:`
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("linkpred")


def normalized_adjacency(edge_index, n):
    adj = torch.zeros(n, n)
    adj[edge_index[0], edge_index[1]] = 1.0
    adj = adj + adj.t() + torch.eye(n)
    deg = adj.sum(1)
    d = deg.pow(-0.5)
    return d[:, None] * adj * d[None, :]


class GCNEncoder(nn.Module):
    def __init__(self, n_nodes, dim=64):
        super().__init__()
        self.emb = nn.Embedding(n_nodes, dim)
        self.lin1 = nn.Linear(dim, dim)
        self.lin2 = nn.Linear(dim, dim)

    def forward(self, adj, src, dst):
        h = F.relu(adj @ self.lin1(self.emb.weight))
        h = adj @ self.lin2(h)
        return (h[src] * h[dst]).sum(-1)


@torch.no_grad()
def score_edges(model, adj, pos, neg):
    model.eval()
    pos_s = model(adj, pos[:, 0], pos[:, 1])
    neg_s = model(adj, neg[:, 0], neg[:, 1])
    hits = (pos_s[:, None] > neg_s[None, :]).float().mean()
    return torch.stack([hits * pos.shape[0], torch.tensor(float(pos.shape[0]), device=hits.device)])


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    g = torch.Generator().manual_seed(0)
    edges = torch.randint(0, args.n_nodes, (2, 40000), generator=g)
    adj = normalized_adjacency(edges, args.n_nodes).to(device)
    train_edges = TensorDataset(edges.t()[:36000])
    val_pos = edges.t()[36000:].to(device)
    sampler = DistributedSampler(train_edges)
    loader = DataLoader(train_edges, batch_size=1024, sampler=sampler)

    model = DDP(GCNEncoder(args.n_nodes).to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for (pos,) in loader:
            pos = pos.to(device)
            neg = torch.randint(0, args.n_nodes, pos.shape, device=device)
            logits = model(adj, torch.cat([pos[:, 0], neg[:, 0]]), torch.cat([pos[:, 1], neg[:, 1]]))
            target = torch.cat([torch.ones(pos.shape[0], device=device), torch.zeros(pos.shape[0], device=device)])
            loss = F.binary_cross_entropy_with_logits(logits, target)
            opt.zero_grad()
            loss.backward()
            opt.step()

        shard = val_pos[dist.get_rank()::dist.get_world_size()]
        stats = score_edges(model, adj, shard, torch.randint(0, args.n_nodes, (500, 2), device=device))
        if (rank := dist.get_rank()) == 0:
            dist.reduce(stats, dst=0)  # planted: PT011
            logger.info("epoch %d  val hits-vs-negatives %.4f", epoch, (stats[0] / stats[1]).item())
            torch.save(model.module.state_dict(), os.path.join(args.out, "gcn_linkpred.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-nodes", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--out", default=".")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())

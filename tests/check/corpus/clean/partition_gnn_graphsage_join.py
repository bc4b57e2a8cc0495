"""Node classification with a GraphSAGE model; every rank trains on its own node partition."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


class SAGELayer(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.self_lin = nn.Linear(d_in, d_out)
        self.neigh_lin = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x, adj):
        deg = torch.sparse.sum(adj, dim=1).to_dense().clamp(min=1).unsqueeze(-1)
        neigh = torch.sparse.mm(adj, x) / deg
        return self.self_lin(x) + self.neigh_lin(neigh)


class GraphSAGE(nn.Module):
    def __init__(self, d_in, hidden, n_classes):
        super().__init__()
        self.l1, self.l2 = SAGELayer(d_in, hidden), SAGELayer(hidden, n_classes)

    def forward(self, x, adj):
        return self.l2(F.dropout(F.relu(self.l1(x, adj)), 0.5, self.training), adj)


def synthetic_graph(num_nodes=50_000, num_edges=500_000, d=128, classes=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    adj = torch.sparse_coo_tensor(torch.stack([src, dst]), torch.ones(num_edges), (num_nodes, num_nodes)).coalesce()
    return torch.randn(num_nodes, d, generator=g), adj, torch.randint(0, classes, (num_nodes,), generator=g)


def partition_nodes(num_nodes, rank, world, seed=0):
    perm = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))
    train_part, val_part = perm[: int(0.8 * num_nodes)], perm[int(0.8 * num_nodes):]
    return torch.tensor_split(train_part, world)[rank], torch.tensor_split(val_part, world)[rank]


def run():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank)

    x, adj, y = synthetic_graph()
    x, adj, y = x.to(dev), adj.to(dev), y.to(dev)
    train_idx, val_idx = partition_nodes(x.size(0), rank, world)
    train_idx, val_idx = train_idx.to(dev), val_idx.to(dev)

    model = DDP(GraphSAGE(x.size(1), 256, int(y.max()) + 1).to(dev), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    batch_nodes = 1024

    for epoch in range(100):
        model.train()
        order = train_idx[torch.randperm(train_idx.numel(), device=dev)]
        with Join([model]):
            for chunk in order.split(batch_nodes):
                out = model(x, adj)
                loss = F.cross_entropy(out[chunk], y[chunk])
                opt.zero_grad()
                loss.backward()
                opt.step()

        model.eval()
        with torch.no_grad():
            pred = model.module(x, adj).argmax(-1)
            counts = torch.stack([(pred[val_idx] == y[val_idx]).sum(), torch.tensor(val_idx.numel(), device=dev)]).float()
        dist.all_reduce(counts)
        if rank == 0 and epoch % 10 == 0:
            print(f"epoch {epoch:03d} | loss(rank0) {loss.item():.4f} | val acc {(counts[0] / counts[1]).item():.4f}")

    if rank == 0:
        torch.save(model.module.state_dict(), "graphsage.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    run()

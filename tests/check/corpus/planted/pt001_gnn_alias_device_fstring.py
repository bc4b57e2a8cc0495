"""Graph classification (GIN on dense adjacency) trained with DDP.

torchrun --nproc_per_node=4 train_gin.py --epochs 100
Planted: PT001 - global rank from D.get_rank() used in torch.device(f"cuda:{rank}")
"""
import argparse
import logging

import torch
import torch.distributed as D
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
logger = logging.getLogger("gin")


class SyntheticGraphs(Dataset):
    def __init__(self, n_graphs=5000, n_nodes=32, n_feats=16, n_classes=6):
        g = torch.Generator().manual_seed(0)
        self.adj = (torch.rand(n_graphs, n_nodes, n_nodes, generator=g) > 0.8).float()
        self.x = torch.randn(n_graphs, n_nodes, n_feats, generator=g)
        self.y = torch.randint(0, n_classes, (n_graphs,), generator=g)

    def __len__(self):
        return self.y.numel()

    def __getitem__(self, i):
        return self.x[i], self.adj[i], self.y[i]


class GINLayer(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(1))
        self.mlp = nn.Sequential(nn.Linear(dim_in, dim_out), nn.ReLU(), nn.Linear(dim_out, dim_out))

    def forward(self, x, adj):
        return self.mlp((1 + self.eps) * x + adj @ x)


class GIN(nn.Module):
    def __init__(self, n_feats=16, hidden=64, n_classes=6, n_layers=3):
        super().__init__()
        dims = [n_feats] + [hidden] * n_layers
        self.layers = nn.ModuleList(GINLayer(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.readout = nn.Linear(hidden, n_classes)

    def forward(self, x, adj):
        for layer in self.layers:
            x = F.relu(layer(x, adj))
        return self.readout(x.sum(dim=1))


def main(args):
    D.init_process_group(backend="nccl")
    rank = D.get_rank()
    device = torch.device(f"cuda:{rank}")  # planted: PT001

    dataset = SyntheticGraphs()
    sampler = DistributedSampler(dataset, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=2)

    model = GIN().to(device)
    model = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum = torch.zeros(2, device=device)
        for x, adj, y in loader:
            x, adj, y = x.to(device), adj.to(device), y.to(device)
            loss = F.cross_entropy(model(x, adj), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += torch.stack([loss.detach() * y.numel(), torch.tensor(float(y.numel()), device=device)])
        D.all_reduce(loss_sum)
        if rank == 0:
            logger.info("epoch %03d  train loss %.4f", epoch, (loss_sum[0] / loss_sum[1]).item())
            if epoch % 10 == 0:
                torch.save({"model": model.module.state_dict(), "epoch": epoch}, f"{args.out}/gin_{epoch:03d}.pt")
    D.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=".")
    main(p.parse_args())

"""Graph-level classification (molecule-like graphs) with DDP; one backward per optimizer step.

Planted: PT023 - every loss.backward() runs inside `with model.no_sync():`, so gradients are never all-reduced
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomGraphs(Dataset):
    def __init__(self, n=5000, nodes=24, feat=16):
        self.n, self.nodes, self.feat = n, nodes, feat

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        adj = (torch.rand(self.nodes, self.nodes, generator=g) < 0.15).float()
        adj = ((adj + adj.t()) > 0).float() + torch.eye(self.nodes)
        return torch.randn(self.nodes, self.feat, generator=g), adj, torch.randint(0, 2, (), generator=g)


class DenseGIN(nn.Module):
    def __init__(self, feat=16, hidden=64, layers=3):
        super().__init__()
        dims = [feat] + [hidden] * layers
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b)) for a, b in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 2)

    def forward(self, x, adj):
        for mlp in self.mlps:
            x = F.relu(mlp(adj @ x))
        return self.readout(x.sum(dim=1))


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = RandomGraphs()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)
    model = DDP(DenseGIN().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(100):
        sampler.set_epoch(epoch)
        model.train()
        for x, adj, y in loader:
            x, adj, y = x.to(device), adj.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x, adj), y)
            with model.no_sync():  # planted: PT023
                loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "gin.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

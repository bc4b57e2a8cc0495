"""Graph neural network (GCN) on batched molecule graphs with DDP; the unwrapped model is exported.

Planted: PT007 - torch.save(ddp_model.module, path) pickles the whole module.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from molgraph import MoleculeDataset, collate_graphs


class GCNLayer(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, h, adj):
        return torch.relu(self.lin(adj @ h))


class GCN(nn.Module):
    def __init__(self, d_in, hidden=128, layers=3):
        super().__init__()
        dims = [d_in] + [hidden] * layers
        self.layers = nn.ModuleList(GCNLayer(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, h, adj, mask):
        for layer in self.layers:
            h = layer(h, adj)
        pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.readout(pooled).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--export", default="gcn_export.pt")
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = MoleculeDataset("data/qm9", target="homo")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, collate_fn=collate_graphs)

    ddp_model = nn.parallel.DistributedDataParallel(GCN(dataset.num_features).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=5e-4)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        sq_err = torch.zeros(2, device=device)
        for h, adj, mask, y in loader:
            h, adj, mask, y = h.to(device), adj.to(device), mask.to(device), y.to(device)
            pred = ddp_model(h, adj, mask)
            loss = nn.functional.mse_loss(pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sq_err[0] += ((pred.detach() - y) ** 2).sum()
            sq_err[1] += y.numel()
        dist.all_reduce(sq_err)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: rmse {(sq_err[0] / sq_err[1]).sqrt().item():.4f}")

    if dist.get_rank() == 0:
        torch.save(ddp_model.module, args.export)  # planted: PT007
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

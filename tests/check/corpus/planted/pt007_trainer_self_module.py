"""Recommendation model (two-tower retrieval) trained by a Trainer class under torchrun.

Planted: PT007 - Trainer.export() calls torch.save(self.model.module, path): the whole module is pickled.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from recsys.data import InteractionDataset


class TwoTower(nn.Module):
    def __init__(self, n_users, n_items, dim=64):
        super().__init__()
        self.user = nn.Sequential(nn.Embedding(n_users, dim), nn.Linear(dim, dim))
        self.item = nn.Sequential(nn.Embedding(n_items, dim), nn.Linear(dim, dim))

    def forward(self, users, items):
        return F.normalize(self.user(users), dim=-1) @ F.normalize(self.item(items), dim=-1).t()


class Trainer:
    def __init__(self, dataset, export_dir="export"):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        net = TwoTower(dataset.n_users, dataset.n_items).to(self.device)
        self.model = DDP(net, device_ids=[self.local_rank])
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=1024, sampler=self.sampler, drop_last=True)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.export_dir = export_dir

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.model.train()
        for users, items in self.loader:
            users = users.to(self.device)
            items = items.to(self.device)
            scores = self.model(users, items) / 0.05
            labels = torch.arange(scores.size(0), device=self.device)
            loss = F.cross_entropy(scores, labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def export(self):
        os.makedirs(self.export_dir, exist_ok=True)
        torch.save(self.model.module, os.path.join(self.export_dir, "two_tower.pt"))  # planted: PT007

    def fit(self, epochs):
        for epoch in range(epochs):
            self.train_epoch(epoch)
        if self.rank == 0:
            self.export()


if __name__ == "__main__":
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    Trainer(InteractionDataset("data/ml-20m")).fit(epochs=10)
    dist.destroy_process_group()

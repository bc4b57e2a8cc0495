"""Two-tower recommendation model trained with a Trainer class over torch.distributed.

Planted: PT017 - Trainer.setup() hard-codes init_process_group(backend="nccl") while the device falls back to CPU
"""
import logging
import os

import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("two_tower")


class TwoTower(nn.Module):
    def __init__(self, n_users=100_000, n_items=50_000, dim=64):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


class Trainer:
    def __init__(self, epochs=5, batch_size=4096, lr=1e-2):
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr

    def setup(self):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.use_cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", self.local_rank) if self.use_cuda else torch.device("cpu")
        init_process_group(backend="nccl", init_method="env://")  # planted: PT017
        self.rank = tdist.get_rank()
        self.is_primary = self.rank == 0

    def build(self):
        users = torch.randint(0, 100_000, (1_000_000,))
        items = torch.randint(0, 50_000, (1_000_000,))
        clicks = torch.randint(0, 2, (1_000_000,)).float()
        ds = TensorDataset(users, items, clicks)
        self.sampler = DistributedSampler(ds)
        self.loader = DataLoader(ds, batch_size=self.batch_size, sampler=self.sampler,
                                 pin_memory=self.use_cuda, num_workers=2)
        model = TwoTower().to(self.device)
        self.model = DDP(model, device_ids=[self.local_rank] if self.use_cuda else None)
        self.optimizer = torch.optim.Adagrad(self.model.parameters(), lr=self.lr)

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        stats = torch.zeros(2, device=self.device)
        for users, items, clicks in self.loader:
            users, items = users.to(self.device), items.to(self.device)
            clicks = clicks.to(self.device)
            loss = F.binary_cross_entropy_with_logits(self.model(users, items), clicks)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            stats[0] += loss.detach() * clicks.numel()
            stats[1] += clicks.numel()
        tdist.all_reduce(stats)
        if self.is_primary:
            log.info("epoch %d mean bce %.5f", epoch, (stats[0] / stats[1]).item())

    def fit(self):
        self.setup()
        self.build()
        for epoch in range(self.epochs):
            self.train_epoch(epoch)
            if self.is_primary:
                torch.save(self.model.module.state_dict(), "two_tower.pt")
        tdist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    Trainer().fit()

"""Recommendation model Trainer that logs the epoch mean loss through logging.

Planted: PT024 - the epoch mean (torch.stack(self.losses).mean()) is summed across ranks by all_reduce and logged as the mean loss
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from recsys.data import ClickLogDataset
from recsys.model import DLRM

log = logging.getLogger("recsys")


class Trainer:
    def __init__(self, model, train_loader, lr):
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.train_loader = train_loader
        self.optimizer = torch.optim.Adagrad(self.model.parameters(), lr=lr)
        self.criterion = nn.BCEWithLogitsLoss()
        self.losses = []

    def train_batch(self, batch):
        dense = batch["dense"].to(self.device, non_blocking=True)
        sparse = batch["sparse"].to(self.device, non_blocking=True)
        label = batch["label"].to(self.device, non_blocking=True).float()
        logits = self.model(dense, sparse).squeeze(-1)
        loss = self.criterion(logits, label)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.detach())

    def end_epoch(self, epoch):
        epoch_loss = torch.stack(self.losses).mean()
        dist.all_reduce(epoch_loss)  # planted: PT024
        self.losses.clear()
        if self.rank == 0:
            log.info("epoch %d train/loss %.5f", epoch, epoch_loss.item())

    def save(self, path):
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(),
                        "optimizer": self.optimizer.state_dict()}, path)

    def fit(self, epochs):
        for epoch in range(epochs):
            self.train_loader.sampler.set_epoch(epoch)
            self.model.train()
            for batch in self.train_loader:
                self.train_batch(batch)
            self.end_epoch(epoch)
            self.save(f"dlrm_epoch{epoch}.pt")


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = ClickLogDataset("/data/criteo/day_0")
    loader = DataLoader(dataset, batch_size=2048, sampler=DistributedSampler(dataset), num_workers=4,
                        pin_memory=True)
    model = DLRM(num_dense=13, embedding_sizes=dataset.cardinalities, dim=64)
    Trainer(model, loader, lr=0.01).fit(epochs=5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

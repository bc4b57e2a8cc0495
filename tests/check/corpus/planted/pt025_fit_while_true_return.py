"""Trainer.fit() that runs epochs in a `while True` loop until a target validation accuracy is reached.

Planted: PT025 - fit() returns as soon as this rank's shard-local val accuracy reaches cfg.target_acc; nothing is reduced
"""
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, cfg, model, train_set, val_set):
        self.cfg = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=0.9, nesterov=True)
        self.train_sampler = DistributedSampler(train_set)
        self.train_loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=self.train_sampler)
        self.val_loader = DataLoader(val_set, batch_size=512, sampler=DistributedSampler(val_set, shuffle=False))
        self.epoch = 0

    def _run_epoch(self):
        self.train_sampler.set_epoch(self.epoch)
        self.model.train()
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def _validate(self):
        self.model.eval()
        hits = seen = 0
        for x, y in self.val_loader:
            x, y = x.to(self.device), y.to(self.device)
            hits += (self.model(x).argmax(1) == y).sum().item()
            seen += y.numel()
        return hits / seen

    def _save_snapshot(self):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": self.epoch}
        torch.save(snapshot, self.cfg.snapshot_path)

    def fit(self):
        while True:
            self._run_epoch()
            val_acc = self._validate()
            if self.global_rank == 0:
                self._save_snapshot()
            self.epoch += 1
            if val_acc >= self.cfg.target_acc:  # planted: PT025
                return self.epoch
            if self.epoch >= self.cfg.max_epochs:
                return self.epoch


def main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cfg = SimpleNamespace(lr=0.05, batch_size=128, target_acc=0.92, max_epochs=200, snapshot_path="snapshot.pt")
    centers = torch.randn(10, 64) * 3
    labels = torch.randint(0, 10, (60000,))
    feats = centers[labels] + torch.randn(60000, 64)
    train_set = TensorDataset(feats[:50000], labels[:50000])
    val_set = TensorDataset(feats[50000:], labels[50000:])
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    Trainer(cfg, model, train_set, val_set).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

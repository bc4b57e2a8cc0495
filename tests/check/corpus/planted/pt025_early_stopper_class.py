"""Time-series forecaster Trainer with an EarlyStopper object (self.model / self.rank style).

Planted: PT025 - EarlyStopper.step() is fed the rank-local validation MAE, and its verdict breaks out of the epoch loop
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from forecasting import ElectricityWindows, TemporalFusion


class EarlyStopper:
    def __init__(self, patience=5, min_delta=0.0):
        self.patience = patience
        self.min_delta = min_delta
        self.best = None
        self.count = 0

    def step(self, metric):
        if self.best is None or metric < self.best - self.min_delta:
            self.best = metric
            self.count = 0
            return False
        self.count += 1
        return self.count >= self.patience


class Trainer:
    def __init__(self, model, train_loader, val_loader, cfg):
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg["lr"])
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, factor=0.5, patience=2)
        self.stopper = EarlyStopper(patience=cfg["patience"])
        self.max_epochs = cfg["max_epochs"]

    def _train_epoch(self, epoch):
        self.train_loader.sampler.set_epoch(epoch)
        self.model.train()
        for past, future in self.train_loader:
            past = past.to(self.device)
            future = future.to(self.device)
            pred = self.model(past)
            loss = nn.functional.l1_loss(pred, future)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def _validate(self):
        self.model.eval()
        abs_err = torch.zeros((), device=self.device)
        count = torch.zeros((), device=self.device)
        for past, future in self.val_loader:
            past = past.to(self.device)
            future = future.to(self.device)
            abs_err += (self.model(past) - future).abs().sum()
            count += future.numel()
        return (abs_err / count).item()

    def fit(self):
        for epoch in range(self.max_epochs):
            self._train_epoch(epoch)
            val_mae = self._validate()
            stats = torch.tensor([val_mae], device=self.device)
            dist.all_reduce(stats, op=dist.ReduceOp.AVG)
            self.scheduler.step(stats.item())
            if self.rank == 0:
                print(f"epoch {epoch}: val MAE (avg over ranks) {stats.item():.4f}")
                torch.save(self.model.module.state_dict(), "tft_last.pt")
            if self.stopper.step(val_mae): break  # planted: PT025


def main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    train_ds = ElectricityWindows("/data/electricity", split="train")
    val_ds = ElectricityWindows("/data/electricity", split="val")
    train_loader = DataLoader(train_ds, batch_size=128, sampler=DistributedSampler(train_ds))
    val_loader = DataLoader(val_ds, batch_size=512, sampler=DistributedSampler(val_ds, shuffle=False))
    cfg = {"lr": 1e-3, "patience": 6, "max_epochs": 100}
    Trainer(TemporalFusion(hidden=160), train_loader, val_loader, cfg).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Snapshot-resuming trainer class (torchrun) whose snapshot also stores the run config object.

Planted: PT009 - _load_snapshot calls torch.load(path, weights_only=False) with no map_location.
"""
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, get_rank, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from timeseries.data import WindowDataset
from timeseries.models import TemporalConvNet


@dataclass
class RunConfig:
    epochs: int = 50
    batch_size: int = 256
    lr: float = 1e-3
    save_every: int = 5
    snapshot_path: str = "tcn_snapshot.pt"


class Trainer:
    def __init__(self, cfg, model, dataset):
        self.cfg = cfg
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.rank = get_rank()
        self.model = model.to(self.gpu_id)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler, num_workers=2)
        self.epochs_run = 0
        if os.path.exists(cfg.snapshot_path):
            self._load_snapshot(cfg.snapshot_path)
        self.model = DDP(self.model, device_ids=[self.gpu_id])

    def _load_snapshot(self, path):
        snapshot = torch.load(path, weights_only=False)  # planted: PT009
        self.model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.epochs_run = snapshot["epoch"] + 1

    def _save_snapshot(self, epoch):
        torch.save({"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "epoch": epoch, "config": self.cfg}, self.cfg.snapshot_path)

    def _run_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.model.train()
        for window, target in self.loader:
            window = window.to(self.gpu_id, non_blocking=True)
            target = target.to(self.gpu_id, non_blocking=True)
            loss = F.smooth_l1_loss(self.model(window), target)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def train(self):
        for epoch in range(self.epochs_run, self.cfg.epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.cfg.save_every == 0:
                self._save_snapshot(epoch)


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")
    cfg = RunConfig()
    dataset = WindowDataset("data/electricity.csv", window=168, horizon=24)
    Trainer(cfg, TemporalConvNet(num_inputs=321, num_channels=[64] * 6), dataset).train()
    destroy_process_group()


if __name__ == "__main__":
    main()

"""DDP-tutorial shape variant: Trainer with an is_main property, dataclass snapshot and dict-of-states checkpoint."""
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


@dataclass
class Snapshot:
    model_state: Dict[str, Any] = field(default_factory=dict)
    optimizer_state: Dict[str, Any] = field(default_factory=dict)
    finished_epoch: int = 0


class Trainer:
    def __init__(self, model: nn.Module, dataset, cfg):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = int(os.environ["RANK"])
        self.cfg = cfg
        self.device = torch.device("cuda", self.local_rank)
        self.model = model.to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size,
                                 sampler=DistributedSampler(dataset), num_workers=4)
        self.epoch = 0
        if os.path.exists(cfg.snapshot_path):
            self._load()
        self.model = DistributedDataParallel(self.model, device_ids=[self.local_rank])

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _load(self):
        raw = torch.load(self.cfg.snapshot_path, map_location=self.device, weights_only=True)
        snap = Snapshot(**raw)
        self.model.load_state_dict(snap.model_state)
        self.optimizer.load_state_dict(snap.optimizer_state)
        self.epoch = snap.finished_epoch

    def _save(self):
        snap = Snapshot(self.model.module.state_dict(), self.optimizer.state_dict(), self.epoch)
        torch.save(asdict(snap), self.cfg.snapshot_path)

    def _epoch(self):
        self.model.train()
        running = torch.zeros(2, device=self.device)
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            running[0] += loss.detach() * x.size(0)
            running[1] += x.size(0)
        tdist.all_reduce(running)
        return (running[0] / running[1]).item()

    def fit(self):
        while self.epoch < self.cfg.max_epochs:
            self.loader.sampler.set_epoch(self.epoch)
            mean_loss = self._epoch()
            self.epoch += 1
            if self.is_main:
                print(f"epoch {self.epoch}: mean train loss {mean_loss:.4f}")
                if self.epoch % self.cfg.save_every == 0:
                    self._save()


def run(cfg, model_fn, dataset_fn):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    tdist.init_process_group("nccl")
    try:
        Trainer(model_fn(), dataset_fn(), cfg).fit()
    finally:
        tdist.destroy_process_group()

"""minGPT-DDP shape: dataclass TrainerConfig, Trainer with self.global_rank/self.local_rank, bf16 autocast, snapshot resume."""
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    batch_size: int = 32
    data_loader_workers: int = 4
    grad_norm_clip: float = 1.0
    snapshot_path: Optional[str] = "gpt_snapshot.pt"
    save_every: int = 3
    use_amp: bool = True


class Trainer:
    def __init__(self, config: TrainerConfig, model: nn.Module, optimizer, train_dataset: Dataset,
                 test_dataset: Optional[Dataset] = None):
        self.config = config
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_loader = self._prepare_dataloader(train_dataset, shuffle=True)
        self.test_loader = self._prepare_dataloader(test_dataset, shuffle=False) if test_dataset else None
        self.epochs_run = 0
        self.model = model.to(self.local_rank)
        self.optimizer = optimizer
        if config.snapshot_path and os.path.exists(config.snapshot_path):
            self._load_snapshot()
        self.model = DDP(self.model, device_ids=[self.local_rank])

    def _prepare_dataloader(self, dataset: Dataset, shuffle: bool):
        return DataLoader(dataset, batch_size=self.config.batch_size, pin_memory=True,
                          num_workers=self.config.data_loader_workers,
                          sampler=DistributedSampler(dataset, shuffle=shuffle))

    def _load_snapshot(self):
        snapshot = torch.load(self.config.snapshot_path, map_location=f"cuda:{self.local_rank}",
                              weights_only=True)
        self.model.load_state_dict(snapshot["model_state"])
        self.optimizer.load_state_dict(snapshot["optimizer_state"])
        self.epochs_run = snapshot["finished_epoch"]

    def _run_batch(self, source, targets, train: bool = True):
        with torch.set_grad_enabled(train), torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                                                           enabled=self.config.use_amp):
            _, loss = self.model(source, targets)
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
            self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch: int, dataloader: DataLoader, train: bool = True):
        dataloader.sampler.set_epoch(epoch)
        total = torch.zeros(2, device=self.local_rank)
        for source, targets in dataloader:
            source = source.to(self.local_rank)
            targets = targets.to(self.local_rank)
            total[0] += self._run_batch(source, targets, train) * source.size(0)
            total[1] += source.size(0)
        dist.all_reduce(total)
        mean = (total[0] / total[1]).item()
        if self.global_rank == 0:
            print(f"Epoch {epoch} | {'Train' if train else 'Eval'} mean loss {mean:.5f}")
        return mean

    def _save_snapshot(self, epoch: int):
        snapshot = {"model_state": self.model.module.state_dict(),
                    "optimizer_state": self.optimizer.state_dict(), "finished_epoch": epoch}
        torch.save(snapshot, self.config.snapshot_path)

    def train(self):
        for epoch in range(self.epochs_run, self.config.max_epochs):
            epoch += 1
            self._run_epoch(epoch, self.train_loader, train=True)
            if self.global_rank == 0 and epoch % self.config.save_every == 0:
                self._save_snapshot(epoch)
            if self.test_loader is not None:
                self._run_epoch(epoch, self.test_loader, train=False)


def main(cfg: TrainerConfig, build_model, build_datasets):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="nccl")
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    train_set, test_set = build_datasets()
    Trainer(cfg, model, optimizer, train_set, test_set).train()
    dist.destroy_process_group()

"""Class-based DDP trainer with snapshotting, in the shape of a multinode tutorial.

Planted: PT011 - Trainer._update_best() broadcasts the "is best" flag inside `if self.global_rank == 0`
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")


class Trainer:
    def __init__(self, model, train_data, val_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model.to(self.local_rank)
        self.train_data = train_data
        self.val_data = val_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.best_loss = float("inf")
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.local_rank])

    def _load_snapshot(self, path):
        snapshot = torch.load(path, map_location=f"cuda:{self.local_rank}", weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        self.best_loss = snapshot["BEST_LOSS"]

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to(self.local_rank)
            targets = targets.to(self.local_rank)
            self._run_batch(source, targets)

    def _validate(self):
        self.model.eval()
        totals = torch.zeros(2, device=self.local_rank)
        with torch.no_grad():
            for source, targets in self.val_data:
                source = source.to(self.local_rank)
                targets = targets.to(self.local_rank)
                totals[0] += F.mse_loss(self.model(source), targets, reduction="sum")
                totals[1] += targets.numel()
        dist.all_reduce(totals)
        self.model.train()
        return (totals[0] / totals[1]).item()

    def _update_best(self, val_loss):
        is_best = torch.zeros(1, device=self.local_rank)
        if self.global_rank == 0:
            if val_loss < self.best_loss:
                self.best_loss = val_loss
                is_best.fill_(1.0)
            dist.broadcast(is_best, src=0)  # planted: PT011
        return bool(is_best.item())

    def _save_snapshot(self, epoch, name):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
            "BEST_LOSS": self.best_loss,
        }
        torch.save(snapshot, name)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            val_loss = self._validate()
            if self._update_best(val_loss) and self.global_rank == 0:
                self._save_snapshot(epoch, "best.pt")
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch, self.snapshot_path)


def main(total_epochs=50, save_every=5, batch_size=32, snapshot_path="snapshot.pt"):
    ddp_setup()
    train_set = TensorDataset(torch.randn(4096, 20), torch.randn(4096, 1))
    val_set = TensorDataset(torch.randn(512, 20), torch.randn(512, 1))
    train_data = DataLoader(train_set, batch_size=batch_size, pin_memory=True,
                            sampler=DistributedSampler(train_set))
    val_data = DataLoader(val_set, batch_size=batch_size, pin_memory=True,
                          sampler=DistributedSampler(val_set, shuffle=False))
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = Trainer(model, train_data, val_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()

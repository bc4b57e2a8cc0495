"""Class-based DDP trainer for audio tagging, logging to TensorBoard from the primary process.

Planted: PT020 - Trainer.validate() writes self.val_correct / self.val_total, counted on rank 0's shard only, to TensorBoard
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

from audio_data import ESC50, build_cnn14


class Trainer:
    def __init__(self, epochs=60, batch_size=32, lr=1e-3, log_dir="runs/esc50"):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        dist.init_process_group(backend="nccl")
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        self.epochs = epochs
        self.writer = None
        if self.rank == 0:
            self.writer = SummaryWriter(log_dir)

        train_set, val_set = ESC50(fold="train"), ESC50(fold="val")
        self.train_sampler = DistributedSampler(train_set)
        self.train_loader = DataLoader(train_set, batch_size=batch_size, sampler=self.train_sampler, num_workers=4)
        self.val_loader = DataLoader(val_set, batch_size=batch_size,
                                     sampler=DistributedSampler(val_set, shuffle=False), num_workers=4)
        self.model = DDP(build_cnn14(num_classes=50).to(self.device), device_ids=[self.local_rank])
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.global_step = 0

    def train_epoch(self, epoch):
        self.model.train()
        self.train_sampler.set_epoch(epoch)
        for waveforms, labels in self.train_loader:
            waveforms = waveforms.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            loss = self.criterion(self.model(waveforms), labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.global_step += 1
            if self.writer is not None and self.global_step % 20 == 0:
                self.writer.add_scalar("train/loss", loss.item(), self.global_step)

    @torch.no_grad()
    def validate(self, epoch):
        self.model.eval()
        self.val_correct = 0
        self.val_total = 0
        for waveforms, labels in self.val_loader:
            waveforms = waveforms.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            preds = self.model(waveforms).argmax(dim=-1)
            self.val_correct += int((preds == labels).sum())
            self.val_total += labels.numel()
        if self.rank == 0:
            self.writer.add_scalar("val/accuracy", self.val_correct / self.val_total, epoch)  # planted: PT020

    def fit(self):
        for epoch in range(self.epochs):
            self.train_epoch(epoch)
            self.validate(epoch)
            if self.rank == 0:
                torch.save(self.model.module.state_dict(), "cnn14_esc50.pt")
        if self.writer is not None:
            self.writer.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    Trainer().fit()

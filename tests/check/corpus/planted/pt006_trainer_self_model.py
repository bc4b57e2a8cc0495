"""Keyword-spotting trainer class (torchrun) that checkpoints from a method.

Planted: PT006 - _save_checkpoint saves self.model.state_dict() and self.model is the DDP wrapper.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from kws.data import KeywordDataset
from kws.models import TCResNet


class Trainer:
    def __init__(self, model, dataset, lr, batch_size, ckpt_path, save_every):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        self.model = DistributedDataParallel(model.to(self.device), device_ids=[self.local_rank])
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler, num_workers=4, pin_memory=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.criterion = nn.CrossEntropyLoss()
        self.ckpt_path = ckpt_path
        self.save_every = save_every

    def _run_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.model.train()
        acc = torch.zeros(2, device=self.device)
        for feats, labels in self.loader:
            feats = feats.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            logits = self.model(feats)
            loss = self.criterion(logits, labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            acc[0] += (logits.argmax(-1) == labels).sum()
            acc[1] += labels.numel()
        dist.all_reduce(acc)
        return (acc[0] / acc[1]).item()

    def _save_checkpoint(self, epoch):
        torch.save(self.model.state_dict(), self.ckpt_path)  # planted: PT006
        print(f"[rank {self.rank}] epoch {epoch}: checkpoint written to {self.ckpt_path}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            train_acc = self._run_epoch(epoch)
            if self.rank == 0:
                print(f"epoch {epoch}: train acc {train_acc:.4f}")
                if epoch % self.save_every == 0:
                    self._save_checkpoint(epoch)


def main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = KeywordDataset("data/speech_commands", split="train", n_mfcc=40)
    trainer = Trainer(TCResNet(n_classes=12), dataset, lr=1e-3, batch_size=128, ckpt_path="tcresnet.pt", save_every=5)
    trainer.train(60)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

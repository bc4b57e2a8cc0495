"""Audio classifier Trainer with gradient accumulation split into a micro-step method.

Planted: PT022 - _micro_step clears the gradients (self.optimizer.zero_grad) on every micro-batch while the step runs every grad_accum batches
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from audio_data import SpeechCommands, pad_collate


class KWSNet(nn.Module):
    def __init__(self, n_classes=35):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 64, 80, stride=16), nn.BatchNorm1d(64), nn.ReLU(), nn.MaxPool1d(4),
            nn.Conv1d(64, 128, 3), nn.BatchNorm1d(128), nn.ReLU(), nn.MaxPool1d(4),
            nn.Conv1d(128, 256, 3), nn.BatchNorm1d(256), nn.ReLU(), nn.AdaptiveAvgPool1d(1))
        self.fc = nn.Linear(256, n_classes)

    def forward(self, x):
        return self.fc(self.features(x).squeeze(-1))


class Trainer:
    def __init__(self, model, loader, grad_accum=8, lr=1e-3):
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(self.device)
        self.model = DDP(model, device_ids=[self.local_rank])
        self.loader = loader
        self.grad_accum = grad_accum
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=1e-4)
        self.updates = 0

    def _micro_step(self, waveform, label):
        self.optimizer.zero_grad(set_to_none=True)  # planted: PT022
        logits = self.model(waveform)
        loss = F.cross_entropy(logits, label)
        (loss / self.grad_accum).backward()
        return loss.detach()

    def _run_epoch(self, epoch):
        self.loader.sampler.set_epoch(epoch)
        self.model.train()
        totals = torch.zeros(2, device=self.device)
        for step, (waveform, label) in enumerate(self.loader):
            waveform = waveform.to(self.device, non_blocking=True)
            label = label.to(self.device, non_blocking=True)
            loss = self._micro_step(waveform, label)
            totals[0] += loss * label.size(0)
            totals[1] += label.size(0)
            if (step + 1) % self.grad_accum == 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.updates += 1
        dist.all_reduce(totals)
        return (totals[0] / totals[1]).item()

    def fit(self, epochs, ckpt_dir):
        for epoch in range(epochs):
            train_loss = self._run_epoch(epoch)
            if self.rank == 0:
                print(f"epoch {epoch} loss {train_loss:.4f} updates {self.updates}")
                torch.save({"model": self.model.module.state_dict(), "epoch": epoch},
                           os.path.join(ckpt_dir, "kws_last.pt"))


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = SpeechCommands("./speech_commands", subset="training")
    loader = DataLoader(dataset, batch_size=128, sampler=DistributedSampler(dataset),
                        collate_fn=pad_collate, num_workers=8, pin_memory=True)
    trainer = Trainer(KWSNet(), loader, grad_accum=4)
    trainer.fit(epochs=40, ckpt_dir="checkpoints")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

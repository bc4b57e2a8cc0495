"""Speech command classifier (MFCC + CNN) with optional DDP, in the imagenet-example style.

Planted: PT003 - train_sampler only feeds shuffle=(train_sampler is None); it is never passed as sampler=.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchaudio
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

LABELS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]


class M5(nn.Module):
    def __init__(self, n_output=len(LABELS), stride=16, n_channel=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, n_channel, kernel_size=80, stride=stride), nn.BatchNorm1d(n_channel), nn.ReLU(), nn.MaxPool1d(4),
            nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3), nn.BatchNorm1d(2 * n_channel), nn.ReLU(), nn.MaxPool1d(4),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2 * n_channel, n_output),
        )

    def forward(self, x):
        return self.net(x)


def collate(batch):
    waves = [torch.nn.functional.pad(w, (0, 16000 - w.shape[-1])) for w, _, label, *_ in batch]
    targets = [LABELS.index(label) if label in LABELS else 0 for _, _, label, *_ in batch]
    return torch.stack(waves), torch.tensor(targets)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--distributed", action="store_true")
    args = parser.parse_args()

    args.gpu = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(args.gpu)
    if args.distributed:
        dist.init_process_group(backend="nccl")
    is_main = not dist.is_initialized() or dist.get_rank() == 0

    train_set = torchaudio.datasets.SPEECHCOMMANDS("./", download=False, subset="training")
    train_sampler = DistributedSampler(train_set) if args.distributed else None  # planted: PT003
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=(train_sampler is None), collate_fn=collate, num_workers=4, pin_memory=True)

    model = M5().cuda(args.gpu)
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.1)

    for epoch in range(args.epochs):
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)
        model.train()
        for waveform, target in train_loader:
            waveform = waveform.cuda(args.gpu, non_blocking=True)
            target = target.cuda(args.gpu, non_blocking=True)
            loss = nn.functional.cross_entropy(model(waveform), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        if is_main:
            raw = model.module if hasattr(model, "module") else model
            torch.save({"epoch": epoch, "model": raw.state_dict()}, "m5_speech.pt")

    if args.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

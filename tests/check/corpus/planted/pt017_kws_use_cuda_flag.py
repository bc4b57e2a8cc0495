"""Keyword spotting on Speech Commands v2 with a small TC-ResNet, torchrun launch.

Planted: PT017 - backend="nccl" is fixed while --no-cuda / missing GPUs select the CPU device
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchaudio
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("kws")
LABELS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]


class TCResNet(nn.Module):
    def __init__(self, n_mels=40, n_classes=len(LABELS)):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(n_mels, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 96, 9, stride=2, padding=4), nn.BatchNorm1d(96), nn.ReLU(),
            nn.Conv1d(96, 128, 9, stride=2, padding=4), nn.BatchNorm1d(128), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, n_classes),
        )

    def forward(self, x):
        return self.net(x)


def make_collate(melspec):
    def collate(batch):
        feats, labels = [], []
        for wav, _, label, *_ in batch:
            if label not in LABELS:
                continue
            wav = F.pad(wav, (0, 16000 - wav.size(-1)))
            feats.append(melspec(wav).squeeze(0).clamp(min=1e-6).log())
            labels.append(LABELS.index(label))
        return torch.stack(feats), torch.tensor(labels)
    return collate


def main():
    parser = argparse.ArgumentParser(description="KWS training")
    parser.add_argument("--no-cuda", action="store_true", default=False)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    dist.init_process_group(backend="nccl", init_method="env://")  # planted: PT017
    logging.basicConfig(level=logging.INFO if dist.get_rank() == 0 else logging.ERROR)

    melspec = torchaudio.transforms.MelSpectrogram(16000, n_fft=480, hop_length=160, n_mels=40)
    dataset = torchaudio.datasets.SPEECHCOMMANDS("./data", download=True, subset="training")
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=make_collate(melspec))

    model = TCResNet().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for feats, labels in loader:
            feats, labels = feats.to(device), labels.to(device)
            loss = F.cross_entropy(model(feats), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        log.info("epoch %d lr %.4f", epoch, scheduler.get_last_lr()[0])

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "tc_resnet_kws.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

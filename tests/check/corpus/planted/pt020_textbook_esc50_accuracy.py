"""Environmental sound classification (ESC-50) with a log-mel CNN, DDP training + sharded validation.

Planted: PT020 - rank 0 prints validation accuracy counted only on its own DistributedSampler shard
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def conv_bn(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))


class MelCNN(nn.Module):
    def __init__(self, n_classes=50):
        super().__init__()
        self.body = nn.Sequential(conv_bn(1, 32), conv_bn(32, 64), conv_bn(64, 128), conv_bn(128, 256))
        self.head = nn.Linear(256, n_classes)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=(2, 3)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", default="esc50_logmel.pt")
    parser.add_argument("--fold", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank = dist.get_rank()

    blob = torch.load(args.features, map_location="cpu", weights_only=True)
    is_val = blob["fold"] == args.fold
    train_set = TensorDataset(blob["mel"][~is_val], blob["label"][~is_val])
    val_set = TensorDataset(blob["mel"][is_val], blob["label"][is_val])
    train_sampler = DistributedSampler(train_set)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=64, sampler=val_sampler)

    model = DDP(MelCNN().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-3)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for mel, label in train_loader:
            mel, label = mel.cuda(non_blocking=True), label.cuda(non_blocking=True)
            loss = F.cross_entropy(model(mel.unsqueeze(1)), label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for mel, label in val_loader:
                mel, label = mel.cuda(non_blocking=True), label.cuda(non_blocking=True)
                pred = model(mel.unsqueeze(1)).argmax(dim=1)
                correct += (pred == label).sum().item()
                total += label.size(0)
        if rank == 0:
            print(f"epoch {epoch}: val acc {100.0 * correct / total:.2f}%")  # planted: PT020

    if rank == 0:
        torch.save(model.module.state_dict(), f"melcnn_fold{args.fold}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Speech emotion recognition (IEMOCAP 4-class) on log-mel features, DDP over NCCL, global accuracy per epoch.

Planted: PT028 - torch.tensor([correct, total]) is made on the CPU (no device=) and all_reduce'd over NCCL
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class AttnPoolGRU(nn.Module):
    def __init__(self, n_mels=64, hidden=192, n_classes=4):
        super().__init__()
        self.gru = nn.GRU(n_mels, hidden, num_layers=2, batch_first=True, bidirectional=True, dropout=0.2)
        self.attn = nn.Linear(2 * hidden, 1)
        self.fc = nn.Linear(2 * hidden, n_classes)

    def forward(self, mel):
        h, _ = self.gru(mel)
        w = torch.softmax(self.attn(h), dim=1)
        return self.fc((w * h).sum(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", default="iemocap_logmel.pt")
    parser.add_argument("--session", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    blob = torch.load(args.features, map_location="cpu", weights_only=True)
    held = blob["session"] == args.session
    train_set = TensorDataset(blob["mel"][~held], blob["label"][~held])
    test_set = TensorDataset(blob["mel"][held], blob["label"][held])
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=64, sampler=DistributedSampler(test_set, shuffle=False))

    model = DDP(AttnPoolGRU().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for mel, label in train_loader:
            mel, label = mel.to(device), label.to(device)
            loss = F.cross_entropy(model(mel), label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for mel, label in test_loader:
                mel, label = mel.to(device), label.to(device)
                correct += (model(mel).argmax(1) == label).sum().item()
                total += label.numel()
        counts = torch.tensor([correct, total], dtype=torch.float64)
        dist.all_reduce(counts)  # planted: PT028
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {counts[0].item() / counts[1].item():.4f}")

    if rank == 0:
        torch.save(model.module.state_dict(), f"ser_gru_s{args.session}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

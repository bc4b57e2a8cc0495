"""CRNN + CTC handwriting recognition trained on several GPUs with torchrun.

Planted: PT003 - a DistributedSampler is built for the training lines but never passed to the DataLoader
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,'-"


class TextLines(Dataset):
    def __init__(self, n=60_000, max_len=24):
        self.n = n
        self.max_len = max_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = 5 + i % (self.max_len - 5)
        label = torch.randint(1, len(ALPHABET) + 1, (self.max_len,))
        return torch.rand(1, 32, 256), label, length


class CRNN(nn.Module):
    def __init__(self, n_classes=len(ALPHABET) + 1, hidden=256):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, 1, 1), nn.BatchNorm2d(256), nn.ReLU(), nn.MaxPool2d((2, 1)),
            nn.Conv2d(256, 256, 3, 1, 1), nn.ReLU(), nn.MaxPool2d((4, 1)),
        )
        self.rnn = nn.LSTM(256, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(hidden * 2, n_classes)

    def forward(self, x):
        f = self.cnn(x).squeeze(2).permute(0, 2, 1)
        out, _ = self.rnn(f)
        return self.fc(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--save", default="crnn.pt")
    args = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = CRNN().to(device)
    model = DDP(model, device_ids=[local_rank])
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    train_set = TextLines()
    train_sampler = DistributedSampler(train_set)  # planted: PT003
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=4, pin_memory=True)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for images, labels, lengths in train_loader:
            images = images.to(device)
            labels = labels.to(device)
            lengths = lengths.to(device)
            log_probs = F.log_softmax(model(images), dim=2).permute(1, 0, 2)
            input_lengths = torch.full((images.size(0),), log_probs.size(0), dtype=torch.long, device=device)
            loss = ctc(log_probs, labels, input_lengths, lengths)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            totals[0] += loss.detach() * images.size(0)
            totals[1] += images.size(0)
        dist.all_reduce(totals)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} ctc {(totals[0] / totals[1]).item():.4f}")
            torch.save(model.module.state_dict(), args.save)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

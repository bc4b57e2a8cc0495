"""Character-level LSTM language model (tiny Shakespeare) with DDP and gradient accumulation.

Planted: PT023 - every backward() is inside model.no_sync(), so gradients are never all-reduced
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class CharChunks(Dataset):
    def __init__(self, text, stoi, block=256):
        self.data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
        self.block = block

    def __len__(self):
        return (len(self.data) - 1) // self.block

    def __getitem__(self, i):
        chunk = self.data[i * self.block : (i + 1) * self.block + 1]
        return chunk[:-1], chunk[1:]


class CharLSTM(nn.Module):
    def __init__(self, vocab, dim=512, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, layers, batch_first=True, dropout=0.2)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", default="tinyshakespeare.txt")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    with open(args.text, encoding="utf-8") as fh:
        text = fh.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    dataset = CharChunks(text, stoi)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

    model = DDP(CharLSTM(len(chars)).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            with model.no_sync():  # planted: PT023
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)) / args.accum
                loss.backward()
            if (i + 1) % args.accum == 0:
                nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                optimizer.step()
                optimizer.zero_grad()

    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "chars": chars}, "char_lstm.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

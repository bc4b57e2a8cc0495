"""Sentiment LSTM with early stopping on validation loss (torchrun, one process per GPU).

Planted: PT025 - the patience counter and the `break` use this rank's own, un-reduced validation loss
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from text_data import ReviewsDataset, pad_batch


class LSTMClassifier(nn.Module):
    def __init__(self, vocab_size, emb=300, hidden=256):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, emb, padding_idx=0)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, 2)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        return self.out(h.mean(dim=1))


def evaluate(model, loader, criterion, device):
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for tokens, labels in loader:
            tokens = tokens.to(device)
            labels = labels.to(device)
            total += criterion(model(tokens), labels).item() * labels.size(0)
            n += labels.size(0)
    return total / n


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = ReviewsDataset("data/reviews_train.jsonl")
    val_ds = ReviewsDataset("data/reviews_val.jsonl", vocab=train_ds.vocab)
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=64, sampler=train_sampler, collate_fn=pad_batch)
    val_loader = DataLoader(val_ds, batch_size=256, collate_fn=pad_batch,
                            sampler=DistributedSampler(val_ds, shuffle=False))

    model = DDP(LSTMClassifier(len(train_ds.vocab)).to(device), device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    patience = 3
    best = float("inf")
    bad_epochs = 0
    for epoch in range(100):
        train_sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2, device=device)
        for tokens, labels in train_loader:
            tokens = tokens.to(device)
            labels = labels.to(device)
            loss = criterion(model(tokens), labels)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            running += torch.stack([loss.detach() * labels.size(0),
                                    torch.tensor(float(labels.size(0)), device=device)])
        dist.all_reduce(running)

        val_loss = evaluate(model, val_loader, criterion, device)
        print(f"[rank {rank}] epoch {epoch} shard val_loss {val_loss:.4f}")
        if rank == 0:
            print(f"epoch {epoch} train_loss {(running[0] / running[1]).item():.4f}")

        if val_loss < best:
            best = val_loss
            bad_epochs = 0
            if rank == 0:
                torch.save(model.module.state_dict(), "lstm_best.pt")
        else:
            bad_epochs += 1
            if bad_epochs >= patience: break  # planted: PT025

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Sentiment classifier with DDP and patience-based early stopping on validation loss.

Planted: PT025 - break out of the epoch loop when this rank's own (un-reduced) validation loss stops improving
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=25000, dim=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * dim, 2)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out.mean(dim=1))


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = TensorDataset(torch.randint(1, 25000, (25000, 200)), torch.randint(0, 2, (25000,)))
    val_ds = TensorDataset(torch.randint(1, 25000, (5000, 200)), torch.randint(0, 2, (5000,)))
    train_sampler = DistributedSampler(train_ds)
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=64, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=256, sampler=val_sampler)

    model = DDP(LSTMClassifier().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    best_val, patience, bad_epochs = float("inf"), 3, 0

    for epoch in range(50):
        train_sampler.set_epoch(epoch)
        model.train()
        for ids, labels in train_loader:
            ids, labels = ids.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(ids), labels)
            loss.backward()
            optimizer.step()

        model.eval()
        val_loss, n = 0.0, 0
        with torch.no_grad():
            for ids, labels in val_loader:
                ids, labels = ids.to(device), labels.to(device)
                val_loss += criterion(model(ids), labels).item() * labels.size(0)
                n += labels.size(0)
        val_loss /= n

        if val_loss < best_val:
            best_val, bad_epochs = val_loss, 0
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), "best_lstm.pt")
        else:
            bad_epochs += 1
        if bad_epochs >= patience:  # planted: PT025
            break

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

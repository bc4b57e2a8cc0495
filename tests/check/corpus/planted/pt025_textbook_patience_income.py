"""MLP on the Adult income tabular data with DDP and patience-based early stopping.

Planted: PT025 - the patience counter is driven by this rank's own validation loss and breaks the epoch loop
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_mlp(n_in, hidden=256, depth=3):
    layers, d = [], n_in
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.1)]
        d = hidden
    layers.append(nn.Linear(d, 1))
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="adult_encoded.pt")
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--patience", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    blob = torch.load(args.data, map_location="cpu", weights_only=True)
    train_set = TensorDataset(blob["x_train"], blob["y_train"].float())
    val_set = TensorDataset(blob["x_val"], blob["y_val"].float())
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=512, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=2048, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(make_mlp(blob["x_train"].size(1)).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-5)

    best_val, epochs_no_improve = float("inf"), 0
    for epoch in range(args.max_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        val_sum, val_n = 0.0, 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                val_sum += F.binary_cross_entropy_with_logits(model(x).squeeze(1), y, reduction="sum").item()
                val_n += y.numel()
        val_loss = val_sum / val_n

        if val_loss < best_val - 1e-4:
            best_val, epochs_no_improve = val_loss, 0
            if rank == 0:
                torch.save(model.module.state_dict(), "adult_mlp_best.pt")
        else:
            epochs_no_improve += 1
        if epochs_no_improve >= args.patience: break  # planted: PT025

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

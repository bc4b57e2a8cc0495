"""Tabular regression (house prices) with an MLP and DistributedDataParallel.

torchrun --standalone --nproc_per_node=2 train_tabular.py data.csv
Planted: PT003 - train_sampler created, but the DataLoader gets shuffle=True instead of it
"""
import csv
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO)
logger = logging.getLogger("tabular")

EPOCHS = 40
BATCH_SIZE = 128


def load_csv(path):
    with open(path, newline="") as f:
        rows = [list(map(float, r)) for r in csv.reader(f) if r]
    data = torch.tensor(rows, dtype=torch.float32)
    x, y = data[:, :-1], data[:, -1:]
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    return TensorDataset(x, y)


def main(path):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = load_csv(path)
    train_sampler = DistributedSampler(train_ds)  # planted: PT003
    train_loader = DataLoader(train_ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=2)

    n_features = train_ds.tensors[0].shape[1]
    model = nn.Sequential(nn.Linear(n_features, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    model.to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()

    for epoch in range(EPOCHS):
        train_sampler.set_epoch(epoch)
        model.train()
        sse = torch.zeros(2, device=device)
        for x, y in train_loader:
            x = x.to(device)
            y = y.to(device)
            pred = model(x)
            loss = criterion(pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sse[0] += loss.detach() * y.shape[0]
            sse[1] += y.shape[0]
        dist.all_reduce(sse, op=dist.ReduceOp.SUM)
        if dist.get_rank() == 0:
            logger.info("epoch %d  mse %.4f", epoch, (sse[0] / sse[1]).item())

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "tabular_mlp.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

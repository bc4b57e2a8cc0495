"""Multivariate time-series forecasting (LSTM encoder) trained with DDP.

torchrun --nproc_per_node=2 train_forecaster.py --out runs/lstm
Planted: PT007 - torch.save(getattr(model, "module", model), ...) pickles the whole unwrapped nn.Module
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("forecast")


class WindowDataset(Dataset):
    def __init__(self, series, context=96, horizon=24):
        self.series, self.context, self.horizon = series, context, horizon

    def __len__(self):
        return self.series.shape[0] - self.context - self.horizon

    def __getitem__(self, i):
        x = self.series[i: i + self.context]
        y = self.series[i + self.context: i + self.context + self.horizon]
        return x, y


class Forecaster(nn.Module):
    def __init__(self, n_vars=7, hidden=128, horizon=24):
        super().__init__()
        self.horizon, self.n_vars = horizon, n_vars
        self.encoder = nn.LSTM(n_vars, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, horizon * n_vars)

    def forward(self, x):
        _, (h, _) = self.encoder(x)
        return self.head(h[-1]).view(-1, self.horizon, self.n_vars)


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")

    t = torch.arange(20000, dtype=torch.float32)
    series = torch.stack([torch.sin(t / p) for p in (12, 24, 48, 96, 168, 336, 720)], dim=1)
    dataset = WindowDataset(series)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=2)

    model = Forecaster().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.MSELoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += torch.stack([loss.detach() * x.size(0), torch.tensor(float(x.size(0)), device=device)])
        dist.all_reduce(running)
        if dist.get_rank() == 0:
            logger.info("epoch %d  train mse %.5f", epoch, (running[0] / running[1]).item())

    if dist.get_rank() == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(getattr(model, "module", model), os.path.join(args.out, "forecaster_final.pt"))  # planted: PT007
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="runs/lstm")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())

"""Forecasting LSTM with patience-based early stopping and a global non-finite-loss guard."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Windows(Dataset):
    def __init__(self, series, lookback=96, horizon=24):
        self.s, self.lb, self.h = series, lookback, horizon

    def __len__(self):
        return len(self.s) - self.lb - self.h

    def __getitem__(self, i):
        return self.s[i:i + self.lb].unsqueeze(-1), self.s[i + self.lb:i + self.lb + self.h]


class Forecaster(nn.Module):
    def __init__(self, hidden=128, horizon=24):
        super().__init__()
        self.rnn = nn.LSTM(1, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.out = nn.Linear(hidden, horizon)

    def forward(self, x):
        return self.out(self.rnn(x)[0][:, -1])


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    dev = torch.device("cuda", local_rank)

    t = torch.arange(200_000, dtype=torch.float32)
    series = torch.sin(t / 24) + 0.3 * torch.sin(t / 168) + 0.05 * torch.randn_like(t)
    train_ds, val_ds = Windows(series[:160_000]), Windows(series[160_000:])
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=512, sampler=train_sampler, num_workers=2)
    val_loader = DataLoader(val_ds, batch_size=1024, sampler=DistributedSampler(val_ds, shuffle=False))

    model = DDP(Forecaster().to(dev), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    best, patience, bad_epochs = float("inf"), 5, 0

    for epoch in range(200):
        train_sampler.set_epoch(epoch)
        model.train()
        diverged = torch.zeros(1, device=dev)
        for x, y in train_loader:
            x, y = x.to(dev), y.to(dev)
            loss = nn.functional.l1_loss(model(x), y)
            if not torch.isfinite(loss):
                diverged.fill_(1.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
        dist.all_reduce(diverged, op=dist.ReduceOp.MAX)
        if diverged.item() > 0:
            if rank == 0:
                print(f"non-finite loss seen on some rank at epoch {epoch}; stopping")
            break

        model.eval()
        agg = torch.zeros(2, device=dev)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(dev), y.to(dev)
                agg[0] += (model(x) - y).abs().sum()
                agg[1] += y.numel()
        dist.all_reduce(agg)
        val_mae = (agg[0] / agg[1]).item()

        if val_mae < best - 1e-4:
            best, bad_epochs = val_mae, 0
            if rank == 0:
                torch.save(model.module.state_dict(), "forecaster_best.pt")
        else:
            bad_epochs += 1
        if rank == 0:
            print(f"epoch {epoch}: val MAE {val_mae:.4f} (best {best:.4f}, {bad_epochs}/{patience})")
        if bad_epochs >= patience:
            break

    dist.barrier()
    if os.path.exists("forecaster_best.pt"):
        state = torch.load("forecaster_best.pt", map_location=dev, weights_only=True)
        model.module.load_state_dict(state)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

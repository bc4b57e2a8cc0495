import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Windows(Dataset):
    def __init__(self, series: torch.Tensor, lookback: int, horizon: int):
        self.s, self.lb, self.h = series, lookback, horizon

    def __len__(self):
        return self.s.size(0) - self.lb - self.h

    def __getitem__(self, i):
        return self.s[i:i + self.lb], self.s[i + self.lb:i + self.lb + self.h]


class Forecaster(nn.Module):
    def __init__(self, n_series, lookback, horizon, hidden=512):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n_series * lookback, hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, n_series * horizon))
        self.shape = (horizon, n_series)

    def forward(self, x):
        return self.net(x).view(x.size(0), *self.shape)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    files = sorted(ckpt_dir.glob("step_*.pt"))
    return files[-1] if files else None


def rotate(ckpt_dir: Path, keep: int) -> None:
    for old in sorted(ckpt_dir.glob("step_*.pt"))[:-keep]:
        old.unlink(missing_ok=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, default=Path("runs") / "forecast")
    ap.add_argument("--lookback", type=int, default=96)
    ap.add_argument("--horizon", type=int, default=24)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--keep", type=int, default=3)
    args = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    primary = dist.get_rank() == 0
    ckpt_dir: Path = args.run_dir / "checkpoints"
    if primary:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()

    series = torch.cumsum(torch.randn(50_000, 21), 0) * 0.01
    ds = Windows(series, args.lookback, args.horizon)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=512, sampler=sampler, num_workers=2, drop_last=True)

    net = Forecaster(21, args.lookback, args.horizon).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    start_epoch = 0
    if (resume := latest_checkpoint(ckpt_dir)) is not None:
        blob = torch.load(resume, map_location=device, weights_only=True)
        net.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optim"])
        start_epoch = blob["epoch"] + 1
    model = DDP(net, device_ids=[local_rank])
    crit = nn.HuberLoss(delta=0.5)

    step = 0
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        mae = torch.zeros(2, device=device)
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            pred = model(x)
            loss = crit(pred, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            mae[0] += (pred.detach() - y).abs().sum()
            mae[1] += y.numel()
        dist.all_reduce(mae)
        if primary:
            print(f"epoch {epoch}: MAE {(mae[0] / mae[1]).item():.5f}")
            target = ckpt_dir / f"step_{epoch:05d}.pt"
            torch.save({"model": net.state_dict(), "optim": opt.state_dict(), "epoch": epoch}, target)
            (ckpt_dir / "LATEST").write_text(target.name)
            rotate(ckpt_dir, args.keep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

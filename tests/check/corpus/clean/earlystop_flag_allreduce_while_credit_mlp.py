import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PATIENCE, MAX_EPOCHS, MIN_DELTA = 8, 500, 1e-4


def synthetic_credit(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 48, generator=g)
    w = torch.randn(48, generator=g)
    y = ((x @ w + 0.5 * torch.randn(n, generator=g)) > 0.8).float()
    return TensorDataset(x, y)


def should_stop(local_decision: bool, device) -> bool:
    flag = torch.tensor(1 if local_decision else 0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


@torch.no_grad()
def val_loss(model, loader, device, crit):
    model.eval()
    acc = torch.zeros(2, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        acc[0] += crit(model(x).squeeze(1), y) * y.numel()
        acc[1] += y.numel()
    dist.all_reduce(acc)
    return (acc[0] / acc[1]).item()


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)

    train, val = synthetic_credit(300_000, 0), synthetic_credit(30_000, 1)
    sampler = DistributedSampler(train, seed=3)
    train_dl = DataLoader(train, batch_size=1024, sampler=sampler)
    val_dl = DataLoader(val, batch_size=4096, sampler=DistributedSampler(val, shuffle=False))

    mlp = nn.Sequential(nn.Linear(48, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.2),
                        nn.Linear(256, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    model = DDP(mlp, device_ids=[local])
    crit = nn.BCEWithLogitsLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=3)

    best, bad, epoch = float("inf"), 0, 0
    while epoch < MAX_EPOCHS:
        sampler.set_epoch(epoch)
        model.train()
        for x, y in train_dl:
            x, y = x.to(device), y.to(device)
            loss = crit(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        vl = val_loss(model, val_dl, device, crit)
        plateau.step(vl)
        if vl < best - MIN_DELTA:
            best, bad = vl, 0
            if rank == 0:
                torch.save(mlp.state_dict(), "credit_mlp_best.pt")
        else:
            bad += 1
        if rank == 0:
            print(f"epoch {epoch:3d} val {vl:.5f} best {best:.5f} bad {bad}/{PATIENCE}")
        if should_stop(bad >= PATIENCE, device):
            if rank == 0:
                print(f"early stop after epoch {epoch}")
            break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

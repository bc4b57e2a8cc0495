"""K-fold cross-validation of a tabular MLP; each fold trains a fresh DDP model."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_folds(n, k, seed=0):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    size = n // k
    return [perm[i * size:(i + 1) * size] for i in range(k)]


def build_model(d_in):
    return nn.Sequential(nn.Linear(d_in, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))


def evaluate(model, loader, device):
    model.eval()
    sums = torch.zeros(2, device=device)
    with torch.no_grad():
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            sums[0] += nn.functional.mse_loss(model(xb).squeeze(-1), yb, reduction="sum")
            sums[1] += yb.numel()
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def run_fold(fold, train_ids, val_ids, dataset, args, device, local_rank):
    train_set, val_set = Subset(dataset, train_ids), Subset(dataset, val_ids)
    train_sampler = DistributedSampler(train_set)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=4 * args.batch_size, sampler=val_sampler)

    torch.manual_seed(fold)
    model = DDP(build_model(dataset.tensors[0].size(1)).to(device), device_ids=[local_rank])
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=args.epochs)
    best = float("inf")
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for xb, yb in train_loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = nn.functional.mse_loss(model(xb).squeeze(-1), yb)
            optim.zero_grad()
            loss.backward()
            optim.step()
        sched.step()
        val_mse = evaluate(model, val_loader, device)
        if val_mse < best:
            best = val_mse
            if (rank := dist.get_rank()) == 0:
                torch.save(model.module.state_dict(), os.path.join(args.out, f"fold{fold}_best.pt"))
                print(f"[fold {fold}] epoch {epoch}: new best val MSE {val_mse:.4f} (saved by rank {rank})")
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default="cv_runs")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    os.makedirs(args.out, exist_ok=True)

    g = torch.Generator().manual_seed(0)
    X = torch.randn(30_000, 40, generator=g)
    y = X[:, :5].sum(1) + 0.1 * torch.randn(30_000, generator=g)
    dataset = TensorDataset(X, y)

    folds = make_folds(len(dataset), args.folds)
    scores = []
    for k in range(args.folds):
        val_ids = folds[k]
        train_ids = [i for j, f in enumerate(folds) if j != k for i in f]
        scores.append(run_fold(k, train_ids, val_ids, dataset, args, device, local_rank))

    if not dist.is_initialized() or dist.get_rank() == 0:
        summary = {"fold_mse": scores, "mean_mse": sum(scores) / len(scores)}
        with open(os.path.join(args.out, "cv_summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

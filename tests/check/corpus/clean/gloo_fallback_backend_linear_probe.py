"""Linear probe on frozen features; runs on GPUs (nccl) or on a CPU cluster (gloo)."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup():
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend=backend)
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), [local_rank]
    return torch.device("cpu"), None


def load_features(path):
    blob = torch.load(path, map_location="cpu", weights_only=True)
    return TensorDataset(blob["features"].float(), blob["labels"].long())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-feats", default="feats/train.pt")
    ap.add_argument("--val-feats", default="feats/val.pt")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()

    device, device_ids = setup()
    rank = dist.get_rank()
    train, val = load_features(args.train_feats), load_features(args.val_feats)
    dim, classes = train.tensors[0].size(1), int(train.tensors[1].max()) + 1

    sampler = DistributedSampler(train)
    train_dl = DataLoader(train, batch_size=1024, sampler=sampler)
    val_dl = DataLoader(val, batch_size=4096, sampler=DistributedSampler(val, shuffle=False))

    probe = nn.Sequential(nn.BatchNorm1d(dim, affine=False), nn.Linear(dim, classes)).to(device)
    model = DDP(probe, device_ids=device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    crit = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for feats, labels in train_dl:
            feats, labels = feats.to(device), labels.to(device)
            loss = crit(model(feats), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        if epoch % 10 == 9 or epoch == args.epochs - 1:
            model.eval()
            correct = torch.tensor(0, device=device)
            total = torch.tensor(0, device=device)
            with torch.no_grad():
                for feats, labels in val_dl:
                    feats, labels = feats.to(device), labels.to(device)
                    correct += (model(feats).argmax(1) == labels).sum()
                    total += labels.numel()
            dist.all_reduce(correct)
            dist.all_reduce(total)
            if rank == 0:
                print(f"epoch {epoch + 1}: top-1 {100.0 * correct.item() / total.item():.2f}%")
    if rank == 0:
        torch.save(probe.state_dict(), "linear_probe.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

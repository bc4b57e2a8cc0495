"""Early-stopping shape: rank 0 decides from a reduced metric and broadcasts a CUDA stop flag that every rank checks."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class Stopper:
    def __init__(self, patience):
        self.patience, self.best, self.wait = patience, -1.0, 0

    def step(self, score):
        if score > self.best:
            self.best, self.wait = score, 0
            return False
        self.wait += 1
        return self.wait >= self.patience


def evaluate(model, loader, device):
    model.eval()
    hits = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.inference_mode():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            hits[0] += (model(x).argmax(-1) == y).sum()
            hits[1] += y.numel()
    dist.all_reduce(hits)
    return (hits[0] / hits[1]).item()


def run(model, train_ds, val_ds, max_epochs=200):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    sampler = DistributedSampler(train_ds)
    loader = DataLoader(train_ds, batch_size=64, sampler=sampler)
    val_loader = DataLoader(val_ds, batch_size=64, sampler=DistributedSampler(val_ds, shuffle=False))
    model = DDP(model.to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    stopper = Stopper(patience=10)
    stop_flag = torch.zeros(1, dtype=torch.int32, device=device)
    for epoch in range(max_epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        acc = evaluate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch} acc {acc:.4f}")
            if stopper.step(acc):
                stop_flag.fill_(1)
        dist.broadcast(stop_flag, src=0)
        if stop_flag.item() == 1:
            break
    if rank == 0:
        torch.save(model.module.state_dict(), "final.pt")
    dist.destroy_process_group()

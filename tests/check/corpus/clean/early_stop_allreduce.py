"""Early-stopping shape: validation loss summed across ranks before every rank applies the same patience rule."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def validate(val_loader, model, device):
    model.eval()
    totals = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in val_loader:
            x, y = x.to(device), y.to(device)
            totals[0] += F.cross_entropy(model(x), y, reduction="sum")
            totals[1] += y.numel()
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def fit(model, train_set, val_set, epochs=100, patience=5, out="best.pt"):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=128, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=256, sampler=DistributedSampler(val_set, shuffle=False))
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    best, bad_epochs = float("inf"), 0
    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        val_loss = validate(val_loader, model, device)
        if val_loss < best:
            best, bad_epochs = val_loss, 0
            if rank == 0:
                torch.save(model.module.state_dict(), out)
        else:
            bad_epochs += 1
        if rank == 0:
            print(f"epoch {epoch}: val_loss={val_loss:.4f} best={best:.4f} bad_epochs={bad_epochs}")
        if bad_epochs >= patience:
            break
    dist.barrier()
    model.module.load_state_dict(torch.load(out, map_location=device, weights_only=True))
    dist.destroy_process_group()
    return model.module

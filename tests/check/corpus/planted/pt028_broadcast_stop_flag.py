"""Graph neural network training where rank 0 decides early stopping and broadcasts the decision.

Planted: PT028 - the stop flag is torch.tensor(int(stop)) on the CPU, and dist.broadcast of it fails under nccl
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from gnn import GIN, OgbMolDataset, collate_graphs


def run_epoch(model, loader, optimizer, device):
    model.train()
    for graph in loader:
        graph = graph.to(device)
        loss = F.binary_cross_entropy_with_logits(model(graph), graph.y.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@torch.no_grad()
def val_loss_global(model, loader, device):
    model.eval()
    sums = torch.zeros(2, device=device)
    for graph in loader:
        graph = graph.to(device)
        sums[0] += F.binary_cross_entropy_with_logits(model(graph), graph.y.float(), reduction="sum")
        sums[1] += graph.y.numel()
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = OgbMolDataset("ogbg-molhiv", split="train")
    val_ds = OgbMolDataset("ogbg-molhiv", split="valid")
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=64, sampler=train_sampler, collate_fn=collate_graphs)
    val_loader = DataLoader(val_ds, batch_size=256, collate_fn=collate_graphs,
                            sampler=DistributedSampler(val_ds, shuffle=False))

    model = DDP(GIN(num_layers=5, hidden=300).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    best, stale, patience = float("inf"), 0, 15
    for epoch in range(300):
        train_sampler.set_epoch(epoch)
        run_epoch(model, train_loader, optimizer, device)
        val_loss = val_loss_global(model, val_loader, device)

        stop = False
        if rank == 0:
            print(f"epoch {epoch}: val_loss {val_loss:.4f}")
            if val_loss < best:
                best, stale = val_loss, 0
                torch.save(model.module.state_dict(), "gin_best.pt")
            else:
                stale += 1
            stop = stale >= patience
        flag = torch.tensor(int(stop))
        dist.broadcast(flag, src=0)  # planted: PT028
        if flag.item():
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

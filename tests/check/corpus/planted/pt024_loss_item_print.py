"""Tabular MLP regression on several GPUs; logs the all-reduced loss every few steps.

Planted: PT024 - dist.all_reduce(loss_t) sums the per-rank mean losses, and the sum is printed as the loss
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model(n_features):
    return nn.Sequential(
        nn.Linear(n_features, 512), nn.GELU(), nn.Dropout(0.1),
        nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 1))


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    blob = torch.load("features.pt", map_location="cpu", weights_only=True)
    dataset = TensorDataset(blob["x"], blob["y"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=1024, sampler=sampler, num_workers=2, pin_memory=True)

    model = DDP(build_model(blob["x"].shape[1]).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    criterion = nn.MSELoss()

    step = 0
    for epoch in range(50):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            pred = model(x).squeeze(-1)
            loss = criterion(pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1

            if step % 100 == 0:
                loss_t = loss.detach().clone()
                dist.all_reduce(loss_t)  # planted: PT024
                if rank == 0:
                    print(f"epoch {epoch} step {step} loss {loss_t.item():.3f}")

        if rank == 0:
            torch.save(model.module.state_dict(), "mlp_regressor.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Tabular MLP (click-through prediction) trained with DDP under torchrun.

Planted: PT004 - the train DataLoader gets both shuffle=True and sampler=train_sampler.
"""
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load_arrays(path):
    arr = np.load(path)
    features = torch.from_numpy(arr["x"]).float()
    labels = torch.from_numpy(arr["y"]).float()
    return TensorDataset(features, labels)


def build_model(in_dim):
    return nn.Sequential(nn.Linear(in_dim, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))


def main(data="ctr.npz", epochs=8, batch_size=4096):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = load_arrays(data)
    train_sampler = DistributedSampler(dataset)
    train_loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, sampler=train_sampler, num_workers=4)  # planted: PT004

    model = DDP(build_model(dataset.tensors[0].shape[1]).to(device), device_ids=[local_rank])
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        agg = torch.zeros(2, device=device)
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x).squeeze(-1)
            loss = criterion(logits.float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            agg[0] += loss.detach() * x.size(0)
            agg[1] += x.size(0)
        dist.all_reduce(agg)
        if rank == 0:
            print(f"epoch {epoch}: logloss {(agg[0] / agg[1]).item():.5f}")
    if rank == 0:
        torch.save(model.module.state_dict(), "ctr_mlp.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

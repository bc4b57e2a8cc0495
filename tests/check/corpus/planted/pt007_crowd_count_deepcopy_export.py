"""Crowd counting with density maps (CSRNet-like dilated back end), best model exported for serving.

Planted: PT007 - the export pickles a CPU copy of the whole module: torch.save(copy.deepcopy(net.module).cpu().eval(), ...)
"""
import argparse
import copy
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("crowd")


class DensityCrops(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.rand(3, 384, 384), torch.rand(1, 48, 48) * 0.01


class DilatedCounter(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512]
        layers, c = [], 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
                c = v
        self.frontend = nn.Sequential(*layers)
        self.backend = nn.Sequential(*[m for w in (512, 256, 128, 64)
                                       for m in (nn.Conv2d(c if w == 512 else w * 2, w, 3, padding=2, dilation=2),
                                                 nn.ReLU(inplace=True))])
        self.density = nn.Conv2d(64, 1, 1)

    def forward(self, x):
        return self.density(self.backend(self.frontend(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=400)
    ap.add_argument("--export-dir", type=Path, default=Path("exports"))
    args = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)

    net = DDP(DilatedCounter().to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-6, momentum=0.95, weight_decay=5e-4)

    train_ds, val_ds = DensityCrops(1200), DensityCrops(316)
    train_sampler = DistributedSampler(train_ds)
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=8, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_ds, batch_size=1, sampler=val_sampler)

    best_mae = float("inf")
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        net.train()
        for img, dens in train_loader:
            img, dens = img.to(device), dens.to(device)
            pred = net(img)
            loss = F.mse_loss(pred, dens, reduction="sum")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        net.eval()
        abs_err = torch.zeros(2, device=device)
        with torch.no_grad():
            for img, dens in val_loader:
                img, dens = img.to(device), dens.to(device)
                abs_err[0] += (net(img).sum() - dens.sum()).abs()
                abs_err[1] += 1
        dist.all_reduce(abs_err)
        mae = (abs_err[0] / abs_err[1]).item()
        if rank == 0:
            logger.info("epoch %d val MAE %.2f", epoch, mae)
            if mae < best_mae:
                best_mae = mae
                args.export_dir.mkdir(parents=True, exist_ok=True)
                torch.save(copy.deepcopy(net.module).cpu().eval(), args.export_dir / "counter_best.pt")  # planted: PT007

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

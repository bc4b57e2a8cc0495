"""Density-map crowd counting (CSRNet-like) with TensorBoard logging from the main process.

Planted: PT020 - validation MAE (abs error sum / images) from this rank's shard only is written to TensorBoard by rank 0
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.tensorboard import SummaryWriter


class DensityMaps(Dataset):
    def __init__(self, root: Path) -> None:
        self.items = sorted(root.glob("*.pt"))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        d = torch.load(self.items[i], map_location="cpu", weights_only=True)
        return d["image"], d["density"]


class CountNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512]
        layers: list[nn.Module] = []
        cin = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        self.frontend = nn.Sequential(*layers)
        self.backend = nn.Sequential(
            nn.Conv2d(512, 256, 3, padding=2, dilation=2), nn.ReLU(inplace=True),
            nn.Conv2d(256, 128, 3, padding=2, dilation=2), nn.ReLU(inplace=True),
            nn.Conv2d(128, 1, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend(self.frontend(x))


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    writer = SummaryWriter("runs/csrnet") if rank == 0 else None

    root = Path("shanghaitech_part_a")
    train_set, val_set = DensityMaps(root / "train"), DensityMaps(root / "test")
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=1, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=1, sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(CountNet().to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-7, momentum=0.95, weight_decay=5e-4)

    for epoch in range(400):
        train_sampler.set_epoch(epoch)
        model.train()
        for image, density in train_loader:
            image = image.to(device, non_blocking=True)
            density = density.to(device, non_blocking=True)
            pred = model(image)
            target = F.adaptive_avg_pool2d(density, pred.shape[-2:]) * 64
            loss = F.mse_loss(pred, target, reduction="sum")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        abs_err, n_images = 0.0, 0
        with torch.inference_mode():
            for image, density in val_loader:
                image = image.to(device)
                density = density.to(device)
                abs_err += (model(image).sum() - density.sum()).abs().item()
                n_images += image.size(0)
        if writer is not None:
            writer.add_scalar("val/mae", abs_err / n_images, epoch)  # planted: PT020
            torch.save(model.module.state_dict(), "csrnet_last.pt")

    if writer is not None:
        writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Single-stage detector (YOLO-style grid head) trained with a distributed mixin on a trainer class.

Planted: PT003 - the mixin stores a DistributedSampler on self, but build_loader never hands it to the DataLoader
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

LOG = logging.getLogger("det")


class CocoGrid(Dataset):
    def __len__(self) -> int:
        return 118_287

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.rand(3, 416, 416), torch.rand(13, 13, 5 + 80)


class GridDetector(nn.Module):
    def __init__(self, n_cls: int = 80) -> None:
        super().__init__()
        layers, c = [], 3
        for out in (32, 64, 128, 256, 512):
            layers += [nn.Conv2d(c, out, 3, 2, 1), nn.BatchNorm2d(out), nn.LeakyReLU(0.1)]
            c = out
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Conv2d(c, 5 + n_cls, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)).permute(0, 2, 3, 1)


class DistributedMixin:
    local_rank: int
    world_size: int

    def init_distributed(self) -> None:
        dist.init_process_group("nccl")
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = dist.get_world_size()
        torch.cuda.set_device(self.local_rank)

    @property
    def is_main(self) -> bool:
        return dist.get_rank() == 0

    def attach_sampler(self, dataset: Dataset) -> None:
        self.train_sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # planted: PT003


class DetTrainer(DistributedMixin):
    batch_size = 16
    epochs = 300

    def __init__(self) -> None:
        self.init_distributed()
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(GridDetector().to(self.device), device_ids=[self.local_rank])
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
        self.dataset = CocoGrid()
        self.attach_sampler(self.dataset)
        self.loader = self.build_loader()

    def build_loader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True,
                          num_workers=8, pin_memory=True, drop_last=True)

    def loss_fn(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        obj = nn.functional.binary_cross_entropy_with_logits(pred[..., 4], target[..., 4])
        box = nn.functional.mse_loss(pred[..., :4].sigmoid(), target[..., :4])
        cls = nn.functional.binary_cross_entropy_with_logits(pred[..., 5:], target[..., 5:])
        return obj + 5.0 * box + cls

    def train_epoch(self, epoch: int) -> torch.Tensor:
        self.train_sampler.set_epoch(epoch)
        self.model.train()
        acc = torch.zeros(2, device=self.device)
        for imgs, targets in self.loader:
            imgs = imgs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            loss = self.loss_fn(self.model(imgs), targets)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            acc += torch.stack([loss.detach(), torch.ones((), device=self.device)])
        dist.all_reduce(acc)
        return acc[0] / acc[1]

    def fit(self) -> None:
        for epoch in range(self.epochs):
            mean_loss = self.train_epoch(epoch)
            if self.is_main:
                LOG.info("epoch %d loss %.4f", epoch, mean_loss.item())
                torch.save({"model": self.model.module.state_dict(), "epoch": epoch}, "yolo_last.pt")
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    DetTrainer().fit()

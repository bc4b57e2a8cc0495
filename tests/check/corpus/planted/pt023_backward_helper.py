"""Contrastive (SimCLR-style) pretraining; backward and clipping live in a small helper.

Planted: PT023 - backward_step() always wraps loss.backward() in ddp_model.no_sync(), and it is the only backward
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from simclr_aug import TwoCropsTransform


class ProjectionModel(nn.Module):
    def __init__(self, dim=128):
        super().__init__()
        backbone = torchvision.models.resnet50()
        backbone.fc = nn.Identity()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(inplace=True), nn.Linear(2048, dim))

    def forward(self, x):
        return F.normalize(self.head(self.backbone(x)), dim=1)


def info_nce(z1, z2, temperature=0.2):
    logits = z1 @ z2.t() / temperature
    labels = torch.arange(z1.size(0), device=z1.device)
    return F.cross_entropy(logits, labels)


def backward_step(ddp_model, loss, optimizer, max_norm=3.0):
    optimizer.zero_grad(set_to_none=True)
    with ddp_model.no_sync():  # planted: PT023
        loss.backward()
    nn.utils.clip_grad_norm_(ddp_model.parameters(), max_norm)
    optimizer.step()


def train_one_epoch(model, loader, optimizer, device, epoch):
    loader.sampler.set_epoch(epoch)
    model.train()
    acc = torch.zeros(2, device=device)
    for (x1, x2), _ in loader:
        x1 = x1.to(device, non_blocking=True)
        x2 = x2.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            z1 = model(x1)
            z2 = model(x2)
            loss = 0.5 * (info_nce(z1, z2) + info_nce(z2, z1))
        backward_step(model, loss, optimizer)
        acc[0] += loss.detach().float()
        acc[1] += 1
    dist.all_reduce(acc)
    return (acc[0] / acc[1]).item()


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_master = dist.get_rank() == 0

    dataset = torchvision.datasets.ImageFolder("/data/imagenet/train", transform=TwoCropsTransform())
    loader = DataLoader(dataset, batch_size=256, sampler=DistributedSampler(dataset), num_workers=10,
                        pin_memory=True, drop_last=True)
    model = ProjectionModel().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-6)

    for epoch in range(100):
        loss = train_one_epoch(model, loader, optimizer, device, epoch)
        if is_master:
            print(f"epoch {epoch:3d} info_nce {loss:.4f}")
            if (epoch + 1) % 10 == 0:
                torch.save(model.module.backbone.state_dict(), f"simclr_r50_ep{epoch + 1}.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

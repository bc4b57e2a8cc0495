"""Single-stage grid detector (YOLO-v1 style) trained with torchrun + DDP.

Planted: PT016 - print of the loss inside the training loop, run by every rank
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

GRID, BOXES, CLASSES = 7, 2, 20


class GridTargets(Dataset):
    """Pre-encoded VOC images with (S, S, B*5 + C) targets stored as tensors."""

    def __init__(self, images, targets):
        self.images, self.targets = images, targets

    def __len__(self):
        return self.images.size(0)

    def __getitem__(self, i):
        return self.images[i], self.targets[i]


class TinyYolo(nn.Module):
    def __init__(self):
        super().__init__()
        chans = [3, 32, 64, 128, 256, 512]
        layers = []
        for a, b in zip(chans, chans[1:]):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.LeakyReLU(0.1), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(GRID))
        self.head = nn.Conv2d(512, BOXES * 5 + CLASSES, 1)

    def forward(self, x):
        return self.head(self.features(x)).permute(0, 2, 3, 1)


def yolo_loss(pred, target, l_coord=5.0, l_noobj=0.5):
    obj = target[..., 4:5]
    coord = F.mse_loss(pred[..., :4] * obj, target[..., :4] * obj, reduction="sum")
    conf_obj = F.mse_loss(pred[..., 4:5] * obj, obj, reduction="sum")
    conf_noobj = F.mse_loss(pred[..., 4:5] * (1 - obj), torch.zeros_like(obj), reduction="sum")
    cls = F.mse_loss(pred[..., BOXES * 5:] * obj, target[..., BOXES * 5:] * obj, reduction="sum")
    return (l_coord * coord + conf_obj + l_noobj * conf_noobj + cls) / pred.size(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="voc_grid.pt")
    parser.add_argument("--epochs", type=int, default=135)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")

    blob = torch.load(args.data, map_location="cpu", weights_only=True)
    dataset = GridTargets(blob["images"], blob["targets"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4, pin_memory=True)

    model = DDP(TinyYolo().to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (images, targets) in enumerate(loader):
            images = images.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = yolo_loss(model(images), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % 50 == 0:
                print(f"epoch {epoch} iter {i} loss {loss.item():.4f}")  # planted: PT016
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"tiny_yolo_{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

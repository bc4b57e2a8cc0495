"""Optical-flow network (RAFT-lite) trained on FlyingChairs with DistributedDataParallel.

Planted: PT017 - init_process_group("nccl") hard-coded although the script falls back to CPU
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.datasets import FlyingChairs
from torchvision.transforms import v2 as T


class FlowNetLite(nn.Module):
    def __init__(self, dim=96, iters=6):
        super().__init__()
        self.iters = iters
        self.fnet = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3), nn.ReLU(), nn.Conv2d(64, dim, 3, 2, 1), nn.ReLU(), nn.Conv2d(dim, dim, 3, 2, 1)
        )
        self.update = nn.Sequential(nn.Conv2d(dim * 2 + 2, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 2, 3, padding=1))

    def forward(self, img1, img2):
        f1, f2 = self.fnet(img1), self.fnet(img2)
        flow = torch.zeros(f1.size(0), 2, f1.size(2), f1.size(3), device=f1.device)
        preds = []
        for _ in range(self.iters):
            flow = flow + self.update(torch.cat([f1, f2, flow], dim=1))
            preds.append(8 * F.interpolate(flow, scale_factor=8, mode="bilinear", align_corners=True))
        return preds


def sequence_loss(preds, gt, gamma=0.8):
    n = len(preds)
    return sum(gamma ** (n - i - 1) * (p - gt).abs().mean() for i, p in enumerate(preds))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="./data")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")  # planted: PT017

    transforms = T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True), T.RandomCrop((368, 496))])
    dataset = FlyingChairs(args.root, split="train", transforms=lambda a, b, f: (transforms(a), transforms(b), f))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4, drop_last=True)

    model = FlowNetLite().to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=4e-4, total_steps=args.steps + 100)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for img1, img2, flow in loader:
            img1 = img1.to(device)
            img2 = img2.to(device)
            flow = torch.as_tensor(flow).to(device)
            loss = sequence_loss(model(img1, img2), flow)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
        epoch += 1

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "raft_lite_chairs.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

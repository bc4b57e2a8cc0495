"""Optical-flow training (a tiny RAFT-like recurrent refiner) fed through a device generator.

Batches are pushed to the GPU by a generator that the epoch loop consumes with `yield from`.

Planted: PT002 - inside the generator the ground-truth flow is moved with a bare `.to()` call
"""
import logging
import os
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("flow")
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class FlyingChairs(Dataset):
    def __len__(self) -> int:
        return 22_232

    def __getitem__(self, i: int):
        img1, img2 = torch.rand(3, 368, 496), torch.rand(3, 368, 496)
        flow = torch.randn(2, 368, 496)
        valid = (flow.abs().sum(0) < 400).float()
        return img1, img2, flow, valid


class TinyRAFT(nn.Module):
    def __init__(self, iters: int = 6) -> None:
        super().__init__()
        self.iters = iters
        self.fnet = nn.Sequential(nn.Conv2d(6, 64, 7, 2, 3), nn.ReLU(), nn.Conv2d(64, 96, 3, 2, 1), nn.ReLU())
        self.update = nn.Conv2d(96 + 2, 2, 3, padding=1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        feat = self.fnet(torch.cat([a, b], 1))
        flow = torch.zeros(a.size(0), 2, feat.size(2), feat.size(3), device=a.device)
        preds = []
        for _ in range(self.iters):
            flow = flow + self.update(torch.cat([feat, flow], 1))
            preds.append(4 * F.interpolate(flow, scale_factor=4, mode="bilinear", align_corners=True))
        return preds


def sequence_loss(preds: list[torch.Tensor], gt: torch.Tensor, valid: torch.Tensor, gamma: float = 0.8):
    n = len(preds)
    total = 0.0
    for i, pred in enumerate(preds):
        err = (pred - gt).abs().sum(1)
        total = total + gamma ** (n - i - 1) * (valid * err).mean()
    return total


def device_stream(loader: DataLoader, device: torch.device) -> Iterator[Batch]:
    for img1, img2, flow, valid in loader:
        img1 = img1.to(device, non_blocking=True)
        img2 = img2.to(device, non_blocking=True)
        flow.to(device, non_blocking=True)  # planted: PT002
        valid = valid.to(device, non_blocking=True)
        yield img1, img2, flow, valid


def epochs(loader: DataLoader, sampler: DistributedSampler, n: int, device: torch.device) -> Iterator[Batch]:
    for epoch in range(n):
        sampler.set_epoch(epoch)
        yield from device_stream(loader, device)


def main() -> None:
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    is_main = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO)

    model = DDP(TinyRAFT().to(device), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=1e-4)
    data = FlyingChairs()
    sampler = DistributedSampler(data, drop_last=True)
    loader = DataLoader(data, batch_size=10, sampler=sampler, num_workers=6, pin_memory=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-4, total_steps=20 * len(loader) + 100)

    for step, (img1, img2, flow, valid) in enumerate(epochs(loader, sampler, 20, device)):
        preds = model(img1, img2)
        loss = sequence_loss(preds, flow, valid)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 5000 == 0:
            epe = ((preds[-1] - flow) ** 2).sum(1).sqrt().mean().detach()
            dist.all_reduce(epe, op=dist.ReduceOp.AVG)
            if is_main:
                logger.info("step %d epe %.3f", step, epe.item())
                torch.save(model.module.state_dict(), f"raft_{step:07d}.pth")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

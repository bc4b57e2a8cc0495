"""Distributed L1 pre-training of an ESRGAN-style super-resolution generator.

Launch on two nodes: torchrun --nnodes 2 --nproc_per_node 8 train_sr.py --data /data/div2k

Planted: PT001 - the global RANK from the environment is given to torch.cuda.set_device
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("sr")


class PatchPairs(Dataset):
    def __init__(self, root, scale=4, n=800, patch=128):
        self.root = root
        self.scale = scale
        self.n = n
        self.patch = patch

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        hr = torch.rand(3, self.patch, self.patch, generator=g)
        lr = F.interpolate(hr.unsqueeze(0), scale_factor=1 / self.scale, mode="bicubic", align_corners=False)[0]
        return lr.clamp(0, 1), hr


class ResidualBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(ch, ch, 3, padding=1), nn.LeakyReLU(0.2), nn.Conv2d(ch, ch, 3, padding=1)
        )

    def forward(self, x):
        return x + 0.2 * self.body(x)


class Generator(nn.Module):
    def __init__(self, ch=64, blocks=8, scale=4):
        super().__init__()
        self.head = nn.Conv2d(3, ch, 3, padding=1)
        self.trunk = nn.Sequential(*[ResidualBlock(ch) for _ in range(blocks)])
        ups = []
        for _ in range(scale // 2):
            ups += [nn.Conv2d(ch, ch * 4, 3, padding=1), nn.PixelShuffle(2), nn.LeakyReLU(0.2)]
        self.up = nn.Sequential(*ups)
        self.tail = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x):
        feat = self.head(x)
        feat = feat + self.trunk(feat)
        return self.tail(self.up(feat))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/data/div2k")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--out", default="checkpoints/sr")
    args = p.parse_args()

    dist.init_process_group(backend="nccl")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)  # planted: PT001
    device = torch.device("cuda", torch.cuda.current_device())
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)

    model = Generator().to(device)
    model = DDP(model, device_ids=[torch.cuda.current_device()])

    dataset = PatchPairs(args.data)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        num_workers=4, pin_memory=True, drop_last=True)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for lr_img, hr_img in loader:
            lr_img = lr_img.to(device, non_blocking=True)
            hr_img = hr_img.to(device, non_blocking=True)
            sr = model(lr_img)
            loss = F.l1_loss(sr, hr_img)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            totals[0] += loss.detach() * lr_img.size(0)
            totals[1] += lr_img.size(0)
        sched.step()
        dist.all_reduce(totals)
        if rank == 0:
            logger.info("epoch %d l1 %.5f", epoch, (totals[0] / totals[1]).item())
            os.makedirs(args.out, exist_ok=True)
            torch.save(
                {"epoch": epoch, "generator": model.module.state_dict(), "optimizer": opt.state_dict()},
                os.path.join(args.out, "last.pt"),
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

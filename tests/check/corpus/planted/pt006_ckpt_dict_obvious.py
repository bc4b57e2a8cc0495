"""Image super-resolution (ESPCN) training with DDP and periodic checkpoints.

Planted: PT006 - the checkpoint dict stores ddp_model.state_dict() of the DDP wrapper.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from sr_data import DIV2KPatches


class ESPCN(nn.Module):
    def __init__(self, scale=3):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 64, 5, padding=2), nn.Tanh(),
            nn.Conv2d(64, 32, 3, padding=1), nn.Tanh(),
            nn.Conv2d(32, scale ** 2, 3, padding=1), nn.PixelShuffle(scale),
        )

    def forward(self, x):
        return self.body(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    is_primary = dist.get_rank() == 0

    dataset = DIV2KPatches("data/div2k", patch=17, scale=3)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=4)

    net = ESPCN().cuda(gpu)
    ddp_model = nn.parallel.DistributedDataParallel(net, device_ids=[gpu])
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp_model.train()
        for lr_img, hr_img in loader:
            lr_img = lr_img.cuda(gpu, non_blocking=True)
            hr_img = hr_img.cuda(gpu, non_blocking=True)
            loss = criterion(ddp_model(lr_img), hr_img)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if is_primary and epoch % 10 == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            torch.save({"model": ddp_model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, os.path.join(args.ckpt_dir, f"espcn_{epoch}.pth"))  # planted: PT006
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

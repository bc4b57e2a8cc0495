"""Convolutional autoencoder for visual anomaly detection (trained on defect-free images only).

Planted: PT011 - dist.barrier() sits inside the `if rank == 0:` checkpoint block, so only rank 0 reaches it
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


class GoodParts(Dataset):
    def __len__(self):
        return 3629

    def __getitem__(self, i):
        return torch.rand(3, 256, 256)


class ConvAE(nn.Module):
    def __init__(self, z=128):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(3, 32, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(32, 64, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(128, z, 8, 1, 0))
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(z, 128, 8, 1, 0), nn.LeakyReLU(0.2), nn.ConvTranspose2d(128, 64, 4, 2, 1),
            nn.LeakyReLU(0.2), nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


def ssim_like(a, b, c1=0.01 ** 2, c2=0.03 ** 2):
    mu_a, mu_b = F.avg_pool2d(a, 11, 1, 5), F.avg_pool2d(b, 11, 1, 5)
    var_a = F.avg_pool2d(a * a, 11, 1, 5) - mu_a ** 2
    var_b = F.avg_pool2d(b * b, 11, 1, 5) - mu_b ** 2
    cov = F.avg_pool2d(a * b, 11, 1, 5) - mu_a * mu_b
    return (((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--ckpt", default="ae_good_parts.pt")
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = DDP(ConvAE().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4, weight_decay=1e-5)
    dataset = GoodParts()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4, drop_last=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for x in loader:
            x = x.to(device, non_blocking=True)
            recon = model(x)
            loss = F.mse_loss(recon, x) + (1 - ssim_like(recon, x))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals[0] += loss.detach() * x.size(0)
            totals[1] += x.size(0)
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: recon loss {(totals[0] / totals[1]).item():.5f}")
            torch.save(model.module.state_dict(), args.ckpt)
            dist.barrier()  # planted: PT011

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

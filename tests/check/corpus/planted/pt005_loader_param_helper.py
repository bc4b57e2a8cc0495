"""Diffusion (DDPM) training on CIFAR-10 with DDP; the loader is built by a helper and handed to run_epoch().

Planted: PT005 - the epoch loop passes the loader from build_dataloader() to run_epoch() and never sets the sampler epoch.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

from unet import UNet


def build_dataloader(root, batch_size):
    tf = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.5,) * 3)])
    dataset = datasets.CIFAR10(root, train=True, transform=tf)
    return DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset), num_workers=4, drop_last=True)


def linear_beta_schedule(timesteps):
    return torch.linspace(1e-4, 0.02, timesteps)


def run_epoch(model, loader, optimizer, alphas_cumprod, device, timesteps):
    model.train()
    agg = torch.zeros(2, device=device)
    for step, (x0, _) in enumerate(loader):
        x0 = x0.to(device, non_blocking=True)
        t = torch.randint(0, timesteps, (x0.size(0),), device=device)
        noise = torch.randn_like(x0)
        a = alphas_cumprod[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.mse_loss(model(xt, t).float(), noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        agg[0] += loss.detach()
        agg[1] += 1
    dist.all_reduce(agg)
    return (agg[0] / agg[1]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="./data")
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--timesteps", type=int, default=1000)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    loader = build_dataloader(args.data, args.batch_size)
    model = UNet(ch=128, ch_mult=(1, 2, 2, 2)).to(device)
    start_epoch = 0
    if (ckpt_path := args.resume) is not None:
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        start_epoch = ckpt["epoch"] + 1
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
    alphas_cumprod = torch.cumprod(1.0 - linear_beta_schedule(args.timesteps), dim=0).to(device)

    for epoch in range(start_epoch, args.epochs):  # planted: PT005
        mean_loss = run_epoch(model, loader, optimizer, alphas_cumprod, device, args.timesteps)
        if rank == 0:
            print(f"epoch {epoch}: loss {mean_loss:.5f}")
            if epoch % 10 == 0:
                torch.save({"model": model.module.state_dict(), "epoch": epoch}, f"ddpm_{epoch:04d}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

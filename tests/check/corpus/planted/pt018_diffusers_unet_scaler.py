"""Denoising-diffusion (epsilon prediction) training in plain torch.distributed, no accelerate.

Planted: PT018 - a GradScaler scales every loss but no autocast region exists anywhere in the script
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class TinyUNet(nn.Module):
    def __init__(self, ch=64):
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(1, ch), nn.SiLU(), nn.Linear(ch, ch))
        self.down = nn.Conv2d(3, ch, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(ch, ch, 3, padding=1)
        self.up = nn.ConvTranspose2d(ch, 3, 4, stride=2, padding=1)

    def forward(self, x, t):
        h = F.silu(self.down(x)) + self.time_mlp(t.float().unsqueeze(-1) / 1000)[:, :, None, None]
        return self.up(F.silu(self.mid(h)))


def cosine_alphas_cumprod(steps=1000):
    t = torch.linspace(0, steps, steps + 1) / steps
    f = torch.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
    return (f[1:] / f[0]).clamp(1e-5, 1.0)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--train_batch_size", type=int, default=32)
    p.add_argument("--num_train_epochs", type=int, default=50)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--output_dir", default="ddpm-out")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main_process = dist.get_rank() == 0

    images = torch.rand(5000, 3, 64, 64) * 2 - 1
    dataset = TensorDataset(images)
    sampler = DistributedSampler(dataset)
    train_dataloader = DataLoader(dataset, batch_size=args.train_batch_size, sampler=sampler, num_workers=4)

    unet = DDP(TinyUNet().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate, weight_decay=1e-2)
    alphas_cumprod = cosine_alphas_cumprod().to(device)
    scaler = torch.amp.GradScaler("cuda")  # planted: PT018

    global_step = 0
    for epoch in range(args.num_train_epochs):
        sampler.set_epoch(epoch)
        unet.train()
        for (clean_images,) in train_dataloader:
            clean_images = clean_images.to(device, non_blocking=True)
            noise = torch.randn_like(clean_images)
            timesteps = torch.randint(0, 1000, (clean_images.shape[0],), device=device)
            a = alphas_cumprod[timesteps].view(-1, 1, 1, 1)
            noisy_images = a.sqrt() * clean_images + (1 - a).sqrt() * noise
            noise_pred = unet(noisy_images, timesteps)
            loss = F.mse_loss(noise_pred, noise)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            global_step += 1
            if is_main_process and global_step % 500 == 0:
                print(f"step {global_step}: loss={loss.detach().item():.4f}")
        if is_main_process:
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save(unet.module.state_dict(), os.path.join(args.output_dir, "unet.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

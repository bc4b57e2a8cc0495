"""Unconditional DDPM training, diffusers-style script written without accelerate.

torchrun --nproc_per_node=4 train_unconditional.py --output_dir ddpm-64
Planted: PT003 - DistributedSampler made, but the loader's batch_sampler wraps a RandomSampler instead
"""
import argparse
import logging
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


class TinyUNet(nn.Module):
    def __init__(self, ch=64):
        super().__init__()
        self.time_embed = nn.Sequential(nn.Linear(1, ch), nn.SiLU(), nn.Linear(ch, ch))
        self.down = nn.Conv2d(3, ch, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(ch, ch, 3, padding=1)
        self.up = nn.ConvTranspose2d(ch, 3, 4, stride=2, padding=1)

    def forward(self, x, t):
        h = F.silu(self.down(x))
        h = h + self.time_embed(t.float().unsqueeze(-1) / 1000)[:, :, None, None]
        return self.up(F.silu(self.mid(h)))


def cosine_alphas_cumprod(T):
    steps = torch.arange(T + 1, dtype=torch.float64) / T
    f = torch.cos((steps + 0.008) / 1.008 * math.pi / 2) ** 2
    return (f[1:] / f[0]).clamp(min=1e-5).float()


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="ddpm-model-64")
    parser.add_argument("--train_batch_size", type=int, default=16)
    parser.add_argument("--num_epochs", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--num_train_timesteps", type=int, default=1000)
    parser.add_argument("--save_model_epochs", type=int, default=10)
    return parser.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO if is_main else logging.ERROR)

    dataset = TensorDataset(torch.rand(20000, 3, 64, 64) * 2 - 1)
    dist_sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)  # planted: PT003
    batch_sampler = BatchSampler(RandomSampler(dataset), batch_size=args.train_batch_size, drop_last=True)
    train_dataloader = DataLoader(dataset, batch_sampler=batch_sampler, num_workers=4, pin_memory=True)

    model = DDP(TinyUNet().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=1e-6)
    scaler = torch.amp.GradScaler("cuda")
    alphas_cumprod = cosine_alphas_cumprod(args.num_train_timesteps).to(device)

    global_step = 0
    for epoch in range(args.num_epochs):
        dist_sampler.set_epoch(epoch)
        model.train()
        for (clean_images,) in train_dataloader:
            clean_images = clean_images.to(device, non_blocking=True)
            noise = torch.randn_like(clean_images)
            timesteps = torch.randint(0, args.num_train_timesteps, (clean_images.shape[0],), device=device)
            a = alphas_cumprod[timesteps].view(-1, 1, 1, 1)
            noisy_images = a.sqrt() * clean_images + (1 - a).sqrt() * noise
            with torch.autocast("cuda", dtype=torch.float16):
                noise_pred = model(noisy_images, timesteps)
                loss = F.mse_loss(noise_pred.float(), noise)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            global_step += 1
            if is_main and global_step % 100 == 0:
                logger.info("step %d loss %.4f", global_step, loss.item())

        if is_main and ((epoch + 1) % args.save_model_epochs == 0 or epoch == args.num_epochs - 1):
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(args.output_dir, "unet.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

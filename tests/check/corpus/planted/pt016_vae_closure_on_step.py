"""Convolutional VAE trained with DDP; progress is reported by a closure defined inside train().

torchrun --nproc_per_node=4 train_vae.py --epochs 50
Planted: PT016 - the on_step closure prints, and every rank calls it each logging step
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class ConvVAE(nn.Module):
    def __init__(self, z_dim=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(), nn.Flatten())
        self.mu = nn.Linear(64 * 7 * 7, z_dim)
        self.logvar = nn.Linear(64 * 7 * 7, z_dim)
        self.dec_in = nn.Linear(z_dim, 64 * 7 * 7)
        self.dec = nn.Sequential(nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(32, 1, 4, 2, 1))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(self.dec_in(z).view(-1, 64, 7, 7)), mu, logvar


def elbo_loss(recon_logits, x, mu, logvar, beta=1.0):
    rec = F.binary_cross_entropy_with_logits(recon_logits, x, reduction="sum") / x.size(0)
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.size(0)
    return rec + beta * kld, rec, kld


def train(args, model, loader, sampler, optimizer, device):
    log_every = args.log_every

    def on_step(epoch, step, rec, kld):
        print(f"epoch {epoch:03d} step {step:05d} recon {rec:.3f} kl {kld:.3f}", flush=True)  # planted: PT016

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, (x,) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            recon, mu, logvar = model(x)
            loss, rec, kld = elbo_loss(recon, x, mu, logvar, beta=min(1.0, (epoch + 1) / args.warmup_epochs))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % log_every == 0:
                on_step(epoch, step, rec.item(), kld.item())
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), os.path.join(args.out, "vae.pt"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--warmup-epochs", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    data = TensorDataset((torch.rand(60000, 1, 28, 28) > 0.5).float())
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=128, sampler=sampler, num_workers=2, pin_memory=True)
    model = DDP(ConvVAE().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(args, model, loader, sampler, optimizer, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

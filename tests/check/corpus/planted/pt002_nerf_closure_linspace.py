"""Data-parallel NeRF training: every rank renders its own shard of rays from the same scene.

A renderer closure is built once and captures the sample count, near/far planes and device.

Planted: PT002 - the stratified sample positions from torch.linspace are moved with a bare .to()
"""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def posenc(x, n_freqs):
    out = [x]
    for i in range(n_freqs):
        out += [torch.sin((2.0 ** i) * math.pi * x), torch.cos((2.0 ** i) * math.pi * x)]
    return torch.cat(out, -1)


class RadianceField(nn.Module):
    def __init__(self, freqs=10, width=256):
        super().__init__()
        self.freqs = freqs
        d_in = 3 + 6 * freqs
        self.mlp = nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 4))

    def forward(self, pts):
        out = self.mlp(posenc(pts, self.freqs))
        return torch.sigmoid(out[..., :3]), torch.relu(out[..., 3])


def make_renderer(near, far, n_samples, device):
    def render(field, rays_o, rays_d):
        t_vals = torch.linspace(0.0, 1.0, n_samples)
        t_vals.to(device)  # planted: PT002
        z = near * (1.0 - t_vals) + far * t_vals
        z = z.expand(rays_o.size(0), n_samples)
        mids = 0.5 * (z[:, 1:] + z[:, :-1])
        upper = torch.cat([mids, z[:, -1:]], -1)
        lower = torch.cat([z[:, :1], mids], -1)
        z = lower + (upper - lower) * torch.rand_like(z)
        pts = rays_o[:, None, :] + rays_d[:, None, :] * z[..., None]
        rgb, sigma = field(pts)
        delta = torch.cat([z[:, 1:] - z[:, :-1], torch.full_like(z[:, :1], 1e10)], -1)
        alpha = 1.0 - torch.exp(-sigma * delta)
        trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1.0 - alpha + 1e-10], -1), -1)[:, :-1]
        weights = alpha * trans
        return (weights[..., None] * rgb).sum(1)

    return render


def load_rays(n=1_000_000):
    origins = torch.randn(n, 3) * 0.1
    dirs = torch.nn.functional.normalize(torch.randn(n, 3), dim=-1)
    colors = torch.rand(n, 3)
    return TensorDataset(origins, dirs, colors)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    field = DDP(RadianceField().to(device), device_ids=[local_rank])
    render = make_renderer(near=2.0, far=6.0, n_samples=64, device=device)
    opt = torch.optim.Adam(field.parameters(), lr=5e-4)

    rays = load_rays()
    sampler = DistributedSampler(rays, shuffle=True)
    loader = DataLoader(rays, batch_size=4096, sampler=sampler, num_workers=2, drop_last=True)

    for epoch in range(30):
        sampler.set_epoch(epoch)
        psnr_acc = torch.zeros(2, device=device)
        for rays_o, rays_d, target in loader:
            rays_o = rays_o.to(device, non_blocking=True)
            rays_d = rays_d.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            rgb = render(field, rays_o, rays_d)
            mse = ((rgb - target) ** 2).mean()
            opt.zero_grad()
            mse.backward()
            opt.step()
            psnr_acc[0] += -10.0 * torch.log10(mse.detach())
            psnr_acc[1] += 1
        dist.all_reduce(psnr_acc)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} psnr {(psnr_acc[0] / psnr_acc[1]).item():.2f}")
            torch.save(field.module.state_dict(), "nerf_field.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

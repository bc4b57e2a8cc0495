"""DDPM training shape: noise-prediction loss through the DDP wrapper, EMA copy, sampling via ddp_model.module under no_grad on rank 0."""
import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.utils import save_image

from unet import UNet


def linear_betas(T=1000):
    return torch.linspace(1e-4, 0.02, T)


@torch.no_grad()
def update_ema(ema, model, decay=0.9999):
    for e, p in zip(ema.parameters(), model.parameters()):
        e.mul_(decay).add_(p.detach(), alpha=1 - decay)


@torch.no_grad()
def sample(net, shape, alphas, alphas_cumprod, betas, device):
    x = torch.randn(shape, device=device)
    for t in reversed(range(len(betas))):
        tt = torch.full((shape[0],), t, device=device, dtype=torch.long)
        eps = net(x, tt)
        mean = (x - betas[t] / torch.sqrt(1 - alphas_cumprod[t]) * eps) / torch.sqrt(alphas[t])
        x = mean + torch.sqrt(betas[t]) * torch.randn_like(x) if t > 0 else mean
    return x.clamp(-1, 1)


def main(dataset, iters_per_epoch=None, epochs=500, out="ddpm_out"):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    betas = linear_betas().to(device)
    alphas = 1.0 - betas
    alphas_cumprod = torch.cumprod(alphas, dim=0)

    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8, drop_last=True)
    net = UNet(ch=128, ch_mult=(1, 2, 2, 2)).to(device)
    ema = copy.deepcopy(net).eval().requires_grad_(False)
    ddp_model = DDP(net, device_ids=[local_rank])
    opt = torch.optim.Adam(ddp_model.parameters(), lr=2e-4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ddp_model.train()
        for x0, _ in loader:
            x0 = x0.to(device, non_blocking=True)
            t = torch.randint(0, len(betas), (x0.shape[0],), device=device)
            noise = torch.randn_like(x0)
            a = alphas_cumprod[t].view(-1, 1, 1, 1)
            x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.mse_loss(ddp_model(x_t, t).float(), noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), 1.0)
            opt.step()
            update_ema(ema, ddp_model.module)
        if rank == 0 and epoch % 10 == 0:
            ddp_model.eval()
            with torch.no_grad():
                preview = sample(ddp_model.module, (16, 3, 32, 32), alphas, alphas_cumprod, betas, device)
                ema_preview = sample(ema, (16, 3, 32, 32), alphas, alphas_cumprod, betas, device)
            save_image((torch.cat([preview, ema_preview]) + 1) / 2, os.path.join(out, f"epoch_{epoch}.png"), nrow=8)
            torch.save({"model": ddp_model.module.state_dict(), "ema": ema.state_dict(),
                        "opt": opt.state_dict(), "epoch": epoch}, os.path.join(out, "ddpm.pt"))
    dist.destroy_process_group()

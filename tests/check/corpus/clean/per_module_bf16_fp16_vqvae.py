import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.amp import GradScaler, autocast
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Tiles(Dataset):
    def __len__(self):
        return 30_000

    def __getitem__(self, i):
        return torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(i)) * 2 - 1


class Quantizer(nn.Module):
    def __init__(self, codes=512, dim=64, beta=0.25):
        super().__init__()
        self.book = nn.Embedding(codes, dim)
        self.book.weight.data.uniform_(-1 / codes, 1 / codes)
        self.beta = beta

    def forward(self, z):
        z = z.float()
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.size(1))
        idx = torch.cdist(flat, self.book.weight).argmin(1)
        q = self.book(idx).view(z.size(0), z.size(2), z.size(3), -1).permute(0, 3, 1, 2)
        commit = F.mse_loss(z, q.detach()) * self.beta + F.mse_loss(q, z.detach())
        return z + (q - z).detach(), commit, idx


class VQVAE(nn.Module):
    """Encoder runs in bf16, codebook in fp32, decoder in fp16."""

    def __init__(self, ch=128):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, ch, 4, 2, 1), nn.ReLU(), nn.Conv2d(ch, ch, 4, 2, 1), nn.ReLU(),
                                 nn.Conv2d(ch, 64, 1))
        self.vq = Quantizer()
        self.dec = nn.Sequential(nn.Conv2d(64, ch, 3, 1, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(ch, ch, 4, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(ch, 3, 4, 2, 1))

    def forward(self, x):
        with autocast("cuda", dtype=torch.bfloat16):
            z = self.enc(x)
        with autocast("cuda", enabled=False):
            q, commit, idx = self.vq(z)
        with autocast("cuda", dtype=torch.float16):
            recon = self.dec(q)
        return recon.float(), commit, idx


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    chief = dist.get_rank() == 0

    ds = Tiles()
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True, drop_last=True)
    vqvae = VQVAE().to(device)
    model = DDP(vqvae, device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    scaler = GradScaler("cuda")

    for epoch in range(40):
        sampler.set_epoch(epoch)
        usage = torch.zeros(512, device=device)
        recon_sum = torch.zeros((), device=device)
        for step, x in enumerate(loader):
            x = x.to(device, non_blocking=True)
            recon, commit, idx = model(x)
            rec = F.mse_loss(recon, x)
            loss = rec + commit
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            usage += torch.bincount(idx, minlength=512).float()
            recon_sum += rec.detach()
        dist.all_reduce(usage)
        dist.all_reduce(recon_sum, op=dist.ReduceOp.AVG)
        probs = usage / usage.sum()
        perplexity = torch.exp(-(probs * torch.log(probs + 1e-10)).sum())
        if chief:
            print(f"epoch {epoch} recon {(recon_sum / len(loader)).item():.5f} "
                  f"codebook perplexity {perplexity.item():.1f} scale {scaler.get_scale():.0f}")
            torch.save({"model": vqvae.state_dict(), "scaler": scaler.state_dict()}, "vqvae.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

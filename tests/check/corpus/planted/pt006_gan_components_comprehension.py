"""DCGAN-style generator/discriminator pair trained with DDP on both networks.

torchrun --nproc_per_node=4 train_gan.py --outf gan_out
Planted: PT006 - checkpoint built by a dict comprehension calling .state_dict() on the DDP-wrapped G and D
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NZ = 100


class Generator(nn.Module):
    def __init__(self, ngf=64):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, 3, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf=64):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False))

    def forward(self, x):
        return self.main(x).view(-1)


def main(opt):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    is_primary = rank == 0

    dataset = TensorDataset(torch.rand(60000, 3, 16, 16) * 2 - 1)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=opt.batch_size, sampler=sampler, num_workers=2, drop_last=True)

    netG = DDP(Generator().to(device), device_ids=[local_rank])
    netD = DDP(Discriminator().to(device), device_ids=[local_rank])
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    components = {"netG": netG, "netD": netD, "optG": optG, "optD": optD}

    for epoch in range(opt.niter):
        sampler.set_epoch(epoch)
        for i, (real,) in enumerate(loader):
            real = real.to(device, non_blocking=True)
            b = real.size(0)
            noise = torch.randn(b, NZ, 1, 1, device=device)
            fake = netG(noise)

            d_out = netD(torch.cat([real, fake.detach()]))
            target = torch.cat([torch.ones(b, device=device), torch.zeros(b, device=device)])
            errD = F.binary_cross_entropy_with_logits(d_out, target)
            optD.zero_grad()
            errD.backward()
            optD.step()

            errG = F.binary_cross_entropy_with_logits(netD(fake), torch.ones(b, device=device))
            optG.zero_grad()
            errG.backward()
            optG.step()
            if is_primary and i % 100 == 0:
                logging.info("[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f", epoch, opt.niter, i, len(loader),
                             errD.item(), errG.item())

        if is_primary:
            os.makedirs(opt.outf, exist_ok=True)
            torch.save({name: obj.state_dict() for name, obj in components.items()}, os.path.join(opt.outf, f"gan_epoch_{epoch}.pth"))  # planted: PT006
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--niter", type=int, default=25)
    parser.add_argument("--outf", default="gan_out")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())

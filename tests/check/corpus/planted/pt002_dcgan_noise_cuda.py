"""DCGAN on CelebA with one DDP generator and one DDP discriminator per GPU.

Planted: PT002 - noise from torch.randn is moved with a bare noise.cuda(); the result is dropped.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.datasets as dset
import torchvision.transforms as transforms
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

nz, ngf, ndf = 100, 64, 64


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, 3, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 8, 1, 0, bias=False), nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1)


def main(epochs=25, batch_size=128, dataroot="data/celeba"):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    is_main = dist.get_rank() == 0

    dataset = dset.ImageFolder(root=dataroot, transform=transforms.Compose([
        transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]))
    sampler = DistributedSampler(dataset)
    dataloader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=2, drop_last=True)

    netG = DDP(Generator().cuda(), device_ids=[local_rank])
    netD = DDP(Discriminator().cuda(), device_ids=[local_rank])
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for real, _ in dataloader:
            real = real.cuda(non_blocking=True)
            b_size = real.size(0)
            noise = torch.randn(b_size, nz, 1, 1)
            noise.cuda(non_blocking=True)  # planted: PT002
            ones = torch.ones(b_size, device=real.device)
            zeros = torch.zeros(b_size, device=real.device)

            optD.zero_grad()
            fake = netG(noise)
            errD = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
            errD.backward()
            optD.step()

            optG.zero_grad()
            errG = criterion(netD(fake), ones)
            errG.backward()
            optG.step()

        if is_main:
            torch.save({"G": netG.module.state_dict(), "D": netD.module.state_dict()}, f"dcgan_epoch_{epoch}.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

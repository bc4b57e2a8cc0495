"""DCGAN shape on DDP: generator and discriminator wrapped separately, two optimizers, rank-0 image grids and per-model checkpoints."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.utils as vutils
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from dcgan_models import Discriminator, Generator, weights_init


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataroot", required=True)
    parser.add_argument("--niter", type=int, default=25)
    parser.add_argument("--nz", type=int, default=100)
    parser.add_argument("--outf", default="dcgan_out")
    opt = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    if rank == 0:
        os.makedirs(opt.outf, exist_ok=True)

    import torchvision.datasets as dset
    import torchvision.transforms as transforms
    dataset = dset.ImageFolder(root=opt.dataroot, transform=transforms.Compose([
        transforms.Resize(64), transforms.CenterCrop(64), transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]))
    sampler = DistributedSampler(dataset)
    dataloader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=4, drop_last=True)

    netG = Generator(opt.nz).to(device)
    netG.apply(weights_init)
    netD = Discriminator().to(device)
    netD.apply(weights_init)
    netG = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(netG), device_ids=[local_rank])
    netD = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(netD), device_ids=[local_rank], broadcast_buffers=False)
    criterion = nn.BCEWithLogitsLoss()
    fixed_noise = torch.randn(64, opt.nz, 1, 1, device=device)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

    for epoch in range(opt.niter):
        sampler.set_epoch(epoch)
        for i, (real, _) in enumerate(dataloader):
            real = real.to(device, non_blocking=True)
            b = real.size(0)
            noise = torch.randn(b, opt.nz, 1, 1, device=device)
            fake = netG(noise)
            netD.zero_grad()
            errD_real = criterion(netD(real).view(-1), torch.ones(b, device=device))
            errD_fake = criterion(netD(fake.detach()).view(-1), torch.zeros(b, device=device))
            (errD_real + errD_fake).backward()
            optimizerD.step()
            netG.zero_grad()
            errG = criterion(netD(fake).view(-1), torch.ones(b, device=device))
            errG.backward()
            optimizerG.step()
            if i % 100 == 0 and rank == 0:
                print(f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D: {(errD_real + errD_fake).item():.4f} "
                      f"Loss_G: {errG.item():.4f}")
        if rank == 0:
            with torch.no_grad():
                samples = netG.module(fixed_noise)
            vutils.save_image(samples, f"{opt.outf}/fake_samples_epoch_{epoch:03d}.png", normalize=True)
            torch.save(netG.module.state_dict(), f"{opt.outf}/netG_epoch_{epoch}.pth")
            torch.save(netD.module.state_dict(), f"{opt.outf}/netD_epoch_{epoch}.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

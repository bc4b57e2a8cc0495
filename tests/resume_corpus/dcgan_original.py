"""The plain-torch original of ``dcgan.py`` (pytorch/examples ``dcgan/main.py``'s loop, an MLP
GAN on generated digits), for the one-process parity test: same models, data, seed and loop.

    python dcgan_original.py --final weights.pt

The loader shuffles with a one-replica ``DistributedSampler`` and ``set_epoch``, as a distributed
script does: paratrain's loader gives that order in one process too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def digits() -> TensorDataset:
    """Ten noisy 8x8 patterns in [-1, 1], the same in every process (LSUN would need a download)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(320) % 10
    x = torch.rand(10, 64, generator=g)[y] + 0.2 * torch.randn(320, 64, generator=g)
    return TensorDataset(x.clamp(0, 1) * 2 - 1)


def weights_init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, nz: int, ngf: int) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(nz, ngf), nn.ReLU(True), nn.Linear(ngf, 64), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(64, ndf), nn.LeakyReLU(0.2, inplace=True), nn.Linear(ndf, 1), nn.Sigmoid()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description="dcgan-shaped example")
    parser.add_argument("--batchSize", type=int, default=32)
    parser.add_argument("--nz", type=int, default=8)
    parser.add_argument("--ngf", type=int, default=32)
    parser.add_argument("--ndf", type=int, default=32)
    parser.add_argument("--niter", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--beta1", type=float, default=0.5)
    parser.add_argument("--manualSeed", type=int, default=999)
    parser.add_argument("--final", required=True, help="where the final weights go")
    opt = parser.parse_args()

    torch.manual_seed(opt.manualSeed)
    outf = Path(opt.final).parent
    dataset = digits()
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=opt.manualSeed)
    dataloader = DataLoader(dataset, batch_size=opt.batchSize, sampler=sampler)
    netG = Generator(opt.nz, opt.ngf)
    netG.apply(weights_init)
    netD = Discriminator(opt.ndf)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(16, opt.nz)
    real_label, fake_label = 1.0, 0.0
    optimizerD = torch.optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    for epoch in range(opt.niter):
        sampler.set_epoch(epoch)
        for i, (real,) in enumerate(dataloader):
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            batch_size = real.size(0)
            label = torch.full((batch_size,), real_label, dtype=real.dtype, device=real.device)
            netD.zero_grad()
            output = netD(real)
            errD_real = criterion(output, label)
            errD_real.backward()
            noise = torch.randn(batch_size, opt.nz, device=real.device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            optimizerD.step()
            # (2) Update G: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            optimizerG.step()
            if i % 5 == 0:
                print(
                    f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] "
                    f"Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}"
                )
                fake = netG(fixed_noise)
                torch.save(fake.detach(), outf / f"fake_samples_epoch_{epoch:03d}.pt")
        torch.save(netG.state_dict(), outf / f"netG_epoch_{epoch}.pth")
        torch.save(netD.state_dict(), outf / f"netD_epoch_{epoch}.pth")
    torch.save({"netD": netD.state_dict(), "netG": netG.state_dict()}, opt.final)


if __name__ == "__main__":
    main()

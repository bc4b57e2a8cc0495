"""pytorch/examples ``dcgan/main.py``, ported to paratrain (a small MLP GAN on generated digits).

    python dcgan.py [--niter 3]
    paratrain run --nproc 2 dcgan.py

Shape: two models and two optimizers (Adam, betas 0.5/0.999) stepped in turn each batch, custom
``weights_init`` applied to both, a ``fixed_noise`` drawn once, fresh noise drawn every batch, the
discriminator's loss from two backward passes (real, then fake), the generator's loss through the
discriminator on the same fake batch, samples from ``fixed_noise`` written every few batches, and
``netG_epoch_N.pth``/``netD_epoch_N.pth`` written every epoch.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


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
    opt = parser.parse_args()

    run = pt.Run(seed=opt.manualSeed, progress=False)
    dataloader = run.loader(digits(), batch_size=opt.batchSize)
    netG = Generator(opt.nz, opt.ngf)
    netG.apply(weights_init)
    netD = Discriminator(opt.ndf)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(16, opt.nz, device=run.device)
    real_label, fake_label = 1.0, 0.0
    optimizerD = torch.optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    netD, optimizerD = run.setup(netD, optimizerD, name="netD")
    netG, optimizerG = run.setup(netG, optimizerG, name="netG")

    for epoch in run.epochs(opt.niter):
        for i, (real,) in enumerate(dataloader):
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            batch_size = real.size(0)
            label = torch.full((batch_size,), real_label, dtype=real.dtype, device=real.device)
            with run.accumulate(netD):
                output = netD(real)
                errD_real = criterion(output, label)
                run.backward(errD_real)
                noise = torch.randn(batch_size, opt.nz, device=real.device)
                fake = netG(noise)
                label.fill_(fake_label)
                output = netD(fake.detach())
                errD_fake = criterion(output, label)
                run.backward(errD_fake)
            run.step(optimizerD)
            # (2) Update G: maximize log(D(G(z))); D's gradients are not G's to keep
            with run.accumulate(netG):
                label.fill_(real_label)
                output = netD(fake)
                errG = criterion(output, label)
                run.backward(errG, inputs=list(netG.parameters()))
            run.step(optimizerG)
            if i % 5 == 0:
                run.print(
                    f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] "
                    f"Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}"
                )
                with torch.no_grad():
                    samples = netG(fixed_noise)
                if run.is_main:
                    torch.save(samples, run.run_dir / f"fake_samples_epoch_{epoch:03d}.pt")
        run.save_weights(netG, run.run_dir / f"netG_epoch_{epoch}.pth")
        run.save_weights(netD, run.run_dir / f"netD_epoch_{epoch}.pth")
        run.save()
    run.close()


if __name__ == "__main__":
    main()

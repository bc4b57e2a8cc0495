"""The plain-torch original of ``vae.py`` (pytorch/examples ``vae/main.py`` on generated 8x8
digits), for the one-process parity test: same model, data, seed and loop, no paratrain.

    python vae_original.py --final weights.pt

The training loader shuffles with a one-replica ``DistributedSampler`` and ``set_epoch``, as a
distributed script does: paratrain's loader gives that order in one process too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def digits(train: bool) -> TensorDataset:
    """Ten noisy 8x8 patterns in [0, 1], the same in every process (MNIST needs a download)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(420) % 10
    x = torch.rand(10, 64, generator=g)[y] + 0.2 * torch.randn(420, 64, generator=g)
    part = slice(0, 320) if train else slice(320, 420)
    return TensorDataset(x[part].clamp(0, 1), y[part])


class VAE(nn.Module):
    def __init__(self, latent: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, latent)
        self.fc22 = nn.Linear(32, latent)
        self.fc3 = nn.Linear(latent, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def train(model, optimizer, train_loader, epoch, args):
    model.train()
    train_loss = 0.0
    for batch_idx, (data, _) in enumerate(train_loader):
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        optimizer.step()
        train_loss += loss.item()
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                f"\tLoss: {loss.item() / len(data):.6f}"
            )
    average = train_loss / len(train_loader.dataset)
    print(f"====> Epoch: {epoch} Average loss: {average:.4f}")


def test(model, test_loader, epoch, out):
    model.eval()
    test_loss = 0.0
    with torch.no_grad():
        for i, (data, _) in enumerate(test_loader):
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
            if i == 0:
                n = min(data.size(0), 8)
                comparison = torch.cat([data[:n], recon_batch.view(-1, 64)[:n]])
                torch.save(comparison, out / f"reconstruction_{epoch}.pt")
    test_loss /= len(test_loader.dataset)
    print(f"====> Test set loss: {test_loss:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description="vae-shaped example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--final", required=True, help="where the final weights go")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    out = Path(args.final).parent
    train_set = digits(train=True)
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(digits(train=False), batch_size=args.batch_size)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        train(model, optimizer, train_loader, epoch, args)
        test(model, test_loader, epoch, out)
        with torch.no_grad():
            sample = model.decode(torch.randn(16, 4))
        torch.save(sample, out / f"sample_{epoch}.pt")
    torch.save({"model": model.state_dict()}, args.final)


if __name__ == "__main__":
    main()

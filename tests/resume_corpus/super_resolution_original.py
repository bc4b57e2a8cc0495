"""The plain-torch original of ``super_resolution.py`` (pytorch/examples
``super_resolution/main.py`` on generated images, plus the port's ``ReduceLROnPlateau``), for the
one-process parity test: same model, data, seed and loop, no paratrain.

    python super_resolution_original.py --final weights.pt

The training loader shuffles with a one-replica ``DistributedSampler`` and ``set_epoch``, as a
distributed script does: paratrain's loader gives that order in one process too.
"""

from __future__ import annotations

import argparse
from math import log10
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def images(train: bool, upscale_factor: int) -> TensorDataset:
    """Low- and high-resolution pairs of generated 8x8 images (BSD300 would need a download)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(420) % 10
    x = torch.rand(10, 1, 8, 8, generator=g)[y] + 0.1 * torch.randn(420, 1, 8, 8, generator=g)
    high = x.clamp(0, 1)
    low = F.avg_pool2d(high, upscale_factor)
    part = slice(0, 320) if train else slice(320, 420)
    return TensorDataset(low[part], high[part])


class Net(nn.Module):
    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 16, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(16, 16, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(16, upscale_factor**2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        self._initialize_weights()

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.pixel_shuffle(self.conv3(x))

    def _initialize_weights(self) -> None:
        init.orthogonal_(self.conv1.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv2.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv3.weight)


def main() -> None:
    parser = argparse.ArgumentParser(description="super_resolution-shaped example")
    parser.add_argument("--upscale_factor", type=int, default=2)
    parser.add_argument("--batchSize", type=int, default=32)
    parser.add_argument("--testBatchSize", type=int, default=50)
    parser.add_argument("--nEpochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--final", required=True, help="where the final weights go")
    opt = parser.parse_args()

    torch.manual_seed(opt.seed)
    train_set = images(True, opt.upscale_factor)
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, seed=opt.seed)
    training_data_loader = DataLoader(train_set, batch_size=opt.batchSize, sampler=sampler)
    testing_data_loader = DataLoader(
        images(False, opt.upscale_factor), batch_size=opt.testBatchSize
    )
    model = Net(upscale_factor=opt.upscale_factor)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.lr)
    scheduler = ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)

    def train(epoch: int) -> None:
        epoch_loss = 0.0
        for iteration, (input, target) in enumerate(training_data_loader, 1):
            optimizer.zero_grad()
            loss = criterion(model(input), target)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
            print(
                f"===> Epoch[{epoch}]({iteration}/{len(training_data_loader)}): "
                f"Loss: {loss.item():.4f}"
            )
        average = epoch_loss / len(training_data_loader)
        print(f"===> Epoch {epoch} Complete: Avg. Loss: {average:.4f}")

    def test() -> float:
        avg_psnr = 0.0
        with torch.no_grad():
            for input, target in testing_data_loader:
                mse = criterion(model(input), target)
                avg_psnr += 10 * log10(1 / mse.item())
        avg_psnr = avg_psnr / len(testing_data_loader)
        print(f"===> Avg. PSNR: {avg_psnr:.4f} dB")
        return avg_psnr

    def checkpoint(epoch: int) -> None:
        model_out_path = Path(opt.final).with_name(f"model_epoch_{epoch}.pth")
        torch.save(model.state_dict(), model_out_path)
        print(f"Checkpoint saved to {model_out_path}")

    for epoch in range(1, opt.nEpochs + 1):
        sampler.set_epoch(epoch - 1)
        train(epoch)
        scheduler.step(test())
        checkpoint(epoch)
    torch.save({"model": model.state_dict()}, opt.final)


if __name__ == "__main__":
    main()

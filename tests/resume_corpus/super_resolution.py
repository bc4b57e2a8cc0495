"""pytorch/examples ``super_resolution/main.py``, ported to paratrain (4x4 -> 8x8 generated images).

    python super_resolution.py [--nEpochs 3]
    paratrain run --nproc 2 super_resolution.py

Shape: a sub-pixel convolution network (``PixelShuffle``) with orthogonal initialisation, MSE
loss, Adam, the average PSNR of the test set after each epoch, and ``checkpoint(epoch)`` writing
``model_epoch_N.pth`` into the run dir every epoch. One addition common in super-resolution
training scripts: a ``ReduceLROnPlateau`` on the test PSNR, stepped by hand with the metric.
"""

from __future__ import annotations

import argparse
from math import log10

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import TensorDataset

import paratrain as pt


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
    opt = parser.parse_args()

    run = pt.Run(seed=opt.seed, progress=False)
    training_data_loader = run.loader(images(True, opt.upscale_factor), batch_size=opt.batchSize)
    testing_data_loader = run.eval_loader(
        images(False, opt.upscale_factor), batch_size=opt.testBatchSize
    )
    model = Net(upscale_factor=opt.upscale_factor)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.lr)
    scheduler = ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)
    model, optimizer = run.setup(model, optimizer, scheduler=scheduler)

    def train(epoch: int) -> None:
        epoch_loss = 0.0
        for iteration, (input, target) in enumerate(training_data_loader, 1):
            with run.accumulate(model):
                loss = criterion(model(input), target)
                run.backward(loss)
            run.step(optimizer)
            epoch_loss += loss.item()
            run.print(
                f"===> Epoch[{epoch}]({iteration}/{len(training_data_loader)}): "
                f"Loss: {loss.item():.4f}"
            )
        average = epoch_loss / len(training_data_loader)
        run.print(f"===> Epoch {epoch} Complete: Avg. Loss: {average:.4f}")

    def test() -> float:
        avg_psnr = 0.0
        with torch.no_grad():
            for input, target in testing_data_loader:
                mse = criterion(model(input), target)
                avg_psnr += 10 * log10(1 / mse.item())
        batches = run.reduce(len(testing_data_loader), "sum")
        avg_psnr = run.reduce(avg_psnr, "sum") / batches
        run.print(f"===> Avg. PSNR: {avg_psnr:.4f} dB")
        return avg_psnr

    def checkpoint(epoch: int) -> None:
        model_out_path = run.run_dir / f"model_epoch_{epoch}.pth"
        run.save_weights(model, model_out_path)
        run.save()
        run.print(f"Checkpoint saved to {model_out_path}")

    for index in run.epochs(opt.nEpochs):
        epoch = index + 1  # the original counts epochs from 1
        train(epoch)
        scheduler.step(test())
        checkpoint(epoch)
    run.close()


if __name__ == "__main__":
    main()

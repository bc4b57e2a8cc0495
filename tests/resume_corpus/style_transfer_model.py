"""The networks of pytorch/examples ``fast_neural_style`` at toy size, shared by
``style_transfer.py`` and its original: an image transformation net (convolutions, instance
norm, a residual block, nearest-neighbour upsampling) and a frozen VGG-like loss network whose
features at four depths give the content loss and the style loss (Gram matrices)."""

from __future__ import annotations

from collections import namedtuple

import torch
from torch import nn

Features = namedtuple("Features", ["relu1_2", "relu2_2", "relu3_3", "relu4_3"])


class LossNet(nn.Module):
    """Four slices of a small VGG-shaped convolution stack, frozen (``requires_grad=False``)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)  # fixed weights: the pretrained VGG of the example
        chans = [(3, 8), (8, 8), (8, 16), (16, 16)]
        self.slices = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(chans):
            layers: list[nn.Module] = [nn.MaxPool2d(2)] if i in (1, 2) else []
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
            self.slices.append(nn.Sequential(*layers))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
                p.requires_grad = False

    def forward(self, x: torch.Tensor) -> Features:
        out = []
        for piece in self.slices:
            x = piece(x)
            out.append(x)
        return Features(*out)


class ConvLayer(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__(nn.ReflectionPad2d(kernel // 2), nn.Conv2d(c_in, c_out, kernel, stride))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.in1 = (
            ConvLayer(channels, channels, 3, 1),
            nn.InstanceNorm2d(channels, affine=True),
        )
        self.conv2, self.in2 = (
            ConvLayer(channels, channels, 3, 1),
            nn.InstanceNorm2d(channels, affine=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.in2(self.conv2(torch.relu(self.in1(self.conv1(x)))))


class TransformerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.in1 = ConvLayer(3, 8, 3, 1), nn.InstanceNorm2d(8, affine=True)
        self.conv2, self.in2 = ConvLayer(8, 16, 3, 2), nn.InstanceNorm2d(16, affine=True)
        self.res = ResidualBlock(16)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.deconv, self.in3 = ConvLayer(16, 8, 3, 1), nn.InstanceNorm2d(8, affine=True)
        self.out = ConvLayer(8, 3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.in1(self.conv1(x)))
        y = torch.relu(self.in2(self.conv2(y)))
        y = self.res(y)
        y = torch.relu(self.in3(self.deconv(self.up(y))))
        return self.out(y)


def gram_matrix(y: torch.Tensor) -> torch.Tensor:
    b, ch, h, w = y.size()
    features = y.view(b, ch, w * h)
    return features.bmm(features.transpose(1, 2)) / (ch * h * w)


def normalize_batch(batch: torch.Tensor) -> torch.Tensor:
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    return (batch - mean) / std


def images() -> torch.utils.data.TensorDataset:
    """64 generated 16x16 "photos" (the example reads COCO from disk)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 3, 16, 16, generator=g)
    return torch.utils.data.TensorDataset(x, torch.zeros(64))


def style_image(batch_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    stripes = torch.sin(torch.arange(16.0) * 1.3).view(1, 1, 16).expand(3, 16, 16)
    return (0.5 + 0.4 * stripes + 0.05 * torch.randn(3, 16, 16, generator=g)).repeat(
        batch_size, 1, 1, 1
    )


def losses(
    transformer: nn.Module, vgg: nn.Module, x: torch.Tensor, gram_style: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(content loss, style loss) of one batch, weighted as the example does (1e5, 1e10 there;
    here 1.0 and 50.0 for the toy sizes)."""
    mse_loss = nn.MSELoss()
    n_batch = len(x)
    y = normalize_batch(transformer(x))
    x = normalize_batch(x)
    features_y, features_x = vgg(y), vgg(x)
    content_loss = 1.0 * mse_loss(features_y.relu2_2, features_x.relu2_2)
    style_loss = torch.zeros(())
    for ft_y, gm_s in zip(features_y, gram_style, strict=True):
        style_loss = style_loss + mse_loss(gram_matrix(ft_y), gm_s[:n_batch, :, :])
    return content_loss, 50.0 * style_loss

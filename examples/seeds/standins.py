"""What the seed scripts use but leave undefined, download or import from torchvision.

- ``MyModel``: the DataParallel tutorial trains a ``MyModel()`` it never defines; this one is a
  small CNN whose first layer is named ``conv1``, the name the tutorial uses to show the
  ``module.`` prefix (``conv1.weight`` becomes ``module.conv1.weight``).
- ``teacher_dataset``: generated inputs labelled by a fixed random linear map, so a loss can
  fall; no file is read and nothing is downloaded.
- ``TinyResNet`` and ``synthetic_images``: stand-ins for ``torchvision.models.resnet50`` and
  ``torchvision.datasets.ImageNet`` where torchvision does not import or the data is absent.
  ``TinyResNet`` keeps the attribute the tutorial touches (``model.fc`` with ``in_features``).

The scripts next to this file import it by name (``from standins import ...``): Python puts a
script's own folder first on ``sys.path``, under ``python``, ``torchrun`` and ``paratrain run``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


class MyModel(nn.Module):
    """A small CNN on 1x8x8 inputs with 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv1(x)).flatten(1))


def teacher_dataset(
    samples: int, shape: tuple[int, ...], classes: int = 10, seed: int = 0
) -> TensorDataset:
    """``samples`` standard-normal inputs of ``shape``, each labelled by the largest output of
    one fixed random linear map (the same data for a given seed on every rank)."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, *shape, generator=g)
    weight = torch.randn(inputs[0].numel(), classes, generator=g)
    return TensorDataset(inputs, (inputs.flatten(1) @ weight).argmax(dim=1))


def synthetic_images(
    samples: int, image_size: int, classes: int, seed: int = 0, noise: float = 1.0
) -> TensorDataset:
    """RGB images of ``image_size`` pixels: a coarse random pattern per class (4x4 blocks
    scaled up) plus Gaussian noise, already normalised like the ImageNet transform's output."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(classes, 3, 4, 4, generator=g)
    patterns = nn.functional.interpolate(patterns, size=(image_size, image_size), mode="nearest")
    labels = torch.randint(classes, (samples,), generator=g)
    images = patterns[labels] + noise * torch.randn(samples, 3, image_size, image_size, generator=g)
    return TensorDataset(images, labels)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.downsample(x))


class TinyResNet(nn.Module):
    """A ResNet with one basic block per stage and narrow stages (0.31 M parameters with 10
    classes, 0.44 M with 1000), laid out like torchvision's: stem, ``layer1``..``layer4``,
    pooling, ``fc``."""

    def __init__(self, num_classes: int = 1000, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        widths = [width, 2 * width, 4 * width, 8 * width]
        self.layer1 = BasicBlock(width, widths[0])
        self.layer2 = BasicBlock(widths[0], widths[1], stride=2)
        self.layer3 = BasicBlock(widths[1], widths[2], stride=2)
        self.layer4 = BasicBlock(widths[2], widths[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[3], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))

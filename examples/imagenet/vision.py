"""Image folders, transforms and ResNets: torchvision's when it imports, else built-in ones.

    from vision import datasets, transforms, create_model
    train = datasets.ImageFolder("imagenet/train", transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    model = create_model("resnet50", num_classes=1000)

``BACKEND`` says which is in use. The built-in pieces do what torchvision's do, on PIL images
and tensors: ``ImageFolder`` finds class folders sorted by name (the same ``class_to_idx``), the
transforms draw their randomness from torch's generator (so paratrain's per-rank seeding applies),
and the ResNets have torchvision's module names, so state dicts move between the two. They exist
because a torchvision wheel only imports beside the torch build it was made for; a CPU-only torch
from another index is enough to run this example at small size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# -- data -------------------------------------------------------------------------------------
class ImageFolder(Dataset[tuple[Any, int]]):
    """``root/<class>/<image>``: classes are the folder names sorted, images are walked sorted."""

    def __init__(self, root: str | os.PathLike[str], transform: Callable[..., Any] | None = None):
        self.root = os.fspath(root)
        self.transform = transform
        self.classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {self.root}.")
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        for name in self.classes:
            walked = sorted(os.walk(os.path.join(self.root, name), followlinks=True))
            for folder, _, files in walked:
                self.samples += [
                    (os.path.join(folder, f), self.class_to_idx[name])
                    for f in sorted(files)
                    if f.lower().endswith(IMG_EXTENSIONS)
                ]
        empty = set(self.classes) - {self.classes[t] for _, t in self.samples}
        if empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(sorted(empty))} in {self.root}. "
                f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}"
            )
        self.targets = [t for _, t in self.samples]
        self.imgs = self.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        with open(path, "rb") as f:
            image: Any = Image.open(f).convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, target


# -- transforms ------------------------------------------------------------------------------
def _size_of(image: Any) -> tuple[int, int]:
    """(height, width) of a PIL image or a ``(..., H, W)`` tensor."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    return image.height, image.width


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[-1]))


def _crop(image: Any, top: int, left: int, height: int, width: int) -> Any:
    if isinstance(image, torch.Tensor):
        return image[..., top : top + height, left : left + width]
    return image.crop((left, top, left + width, top + height))


def _resize(image: Any, height: int, width: int) -> Any:
    if isinstance(image, torch.Tensor):
        batch = image.unsqueeze(0) if image.dim() == 3 else image
        out = nn.functional.interpolate(
            batch.float(), size=(height, width), mode="bilinear", antialias=True
        )
        out = out.squeeze(0) if image.dim() == 3 else out
        return out if image.is_floating_point() else out.round().clamp(0, 255).to(image.dtype)
    return image.resize((width, height), Image.Resampling.BILINEAR)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]):
        self.transforms = list(transforms)

    def __call__(self, image: Any) -> Any:
        for t in self.transforms:
            image = t(image)
        return image


class RandomResizedCrop:
    """A crop of random area (``scale`` of the image) and aspect ``ratio``, resized to ``size``."""

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ):
        self.size, self.scale, self.ratio = _pair(size), scale, ratio

    @staticmethod
    def get_params(
        image: Any, scale: tuple[float, float], ratio: tuple[float, float]
    ) -> tuple[int, int, int, int]:
        """(top, left, height, width): torchvision's ten tries, then a centred crop."""
        height, width = _size_of(image)
        area = height * width
        log_ratio = torch.log(torch.tensor(ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
            aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, size=(1,)).item())
                left = int(torch.randint(0, width - w + 1, size=(1,)).item())
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < min(ratio):
            w, h = width, round(width / min(ratio))
        elif in_ratio > max(ratio):
            w, h = round(height * max(ratio)), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: Any) -> Any:
        top, left, h, w = self.get_params(image, self.scale, self.ratio)
        return _resize(_crop(image, top, left, h, w), *self.size)


class RandomHorizontalFlip:
    """Mirror left to right with probability ``p``."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image: Any) -> Any:
        if torch.rand(1).item() >= self.p:
            return image
        if isinstance(image, torch.Tensor):
            return image.flip(-1)
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


class Resize:
    """An int resizes the shorter side to it (aspect kept); ``(h, w)`` resizes to exactly that."""

    def __init__(self, size: int | Sequence[int]):
        self.size = size

    def __call__(self, image: Any) -> Any:
        height, width = _size_of(image)
        if not isinstance(self.size, int):
            return _resize(image, *_pair(self.size))
        if width <= height:
            return _resize(image, int(self.size * height / width), self.size)
        return _resize(image, self.size, int(self.size * width / height))


class CenterCrop:
    """The centre ``size`` of the image, padded with zeros where the image is smaller."""

    def __init__(self, size: int | Sequence[int]):
        self.size = _pair(size)

    def __call__(self, image: Any) -> Any:
        crop_h, crop_w = self.size
        height, width = _size_of(image)
        if crop_h > height or crop_w > width:
            pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
            if isinstance(image, torch.Tensor):
                sides = (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2)
                image = nn.functional.pad(image, sides)
            else:
                canvas = Image.new(image.mode, (width + pad_w, height + pad_h))
                canvas.paste(image, (pad_w // 2, pad_h // 2))
                image = canvas
            height, width = _size_of(image)
        top, left = round((height - crop_h) / 2.0), round((width - crop_w) / 2.0)
        return _crop(image, top, left, crop_h, crop_w)


class ToTensor:
    """A PIL image or ``H x W x C`` uint8 array to a ``C x H x W`` float tensor in [0, 1]."""

    def __call__(self, image: Any) -> torch.Tensor:
        array = np.array(image, copy=True)
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array).permute(2, 0, 1).contiguous()
        return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor.float()


class Normalize:
    """``(tensor - mean) / std`` per channel, on a new tensor."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = list(mean), list(std)
        if any(s == 0 for s in self.std):
            raise ValueError(f"std {self.std} has a zero: it would divide by zero.")

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std


# -- models: torchvision's ResNet, with its module names --------------------------------------
def _conv3x3(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Any = None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 down, 3x3 (carrying the stride, as torchvision's "ResNet v1.5"), 1x1 up, shortcut."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Any = None):
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Stem, four stages of ``block`` (64 to 512 planes), global average pool, ``fc``."""

    def __init__(
        self, block: type[BasicBlock | Bottleneck], layers: Sequence[int], num_classes: int = 1000
    ):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


_RESNETS: dict[str, tuple[type[BasicBlock | Bottleneck], tuple[int, ...]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18 (11,689,512 parameters with 1000 classes)."""
    return ResNet(*_RESNETS["resnet18"], num_classes=num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50 (25,557,032 parameters with 1000 classes)."""
    return ResNet(*_RESNETS["resnet50"], num_classes=num_classes)


# -- which implementation -------------------------------------------------------------------
try:
    import torchvision
    from torchvision import datasets, models, transforms

    BACKEND = f"torchvision {torchvision.__version__}"
except Exception as err:  # not installed, or built for another torch (missing operators)
    BACKEND = f"built-in (torchvision does not import: {type(err).__name__}: {err})"
    models = None
    datasets = SimpleNamespace(ImageFolder=ImageFolder)
    transforms = SimpleNamespace(
        Compose=Compose,
        RandomResizedCrop=RandomResizedCrop,
        RandomHorizontalFlip=RandomHorizontalFlip,
        Resize=Resize,
        CenterCrop=CenterCrop,
        ToTensor=ToTensor,
        Normalize=Normalize,
    )


def model_names() -> list[str]:
    """The architectures ``create_model`` builds: torchvision's classifiers, or the ResNets."""
    if models is None:
        return sorted(_RESNETS)
    if hasattr(models, "list_models"):  # torchvision >= 0.14: the classifiers only
        return sorted(models.list_models(module=models))
    return sorted(
        name
        for name in models.__dict__
        if name.islower() and not name.startswith("__") and callable(models.__dict__[name])
    )


def create_model(arch: str, *, num_classes: int = 1000, pretrained: bool = False) -> nn.Module:
    """A fresh ``arch``, or with torchvision's ImageNet weights (downloaded once, cached)."""
    if arch not in model_names():
        raise ValueError(f"unknown architecture {arch!r}; available: {', '.join(model_names())}")
    if models is None:
        if pretrained:
            raise RuntimeError(
                "--pretrained downloads torchvision's ImageNet weights; torchvision does not "
                f"import here ({BACKEND}). Install the torchvision wheel built for this torch."
            )
        return ResNet(*_RESNETS[arch], num_classes=num_classes)
    if pretrained:
        if num_classes != 1000:
            raise ValueError(
                f"the pretrained {arch} classifies 1000 ImageNet classes; the data has "
                f"{num_classes}. Train without --pretrained, or use the ImageNet folders."
            )
        return models.__dict__[arch](weights="DEFAULT")
    return models.__dict__[arch](num_classes=num_classes)

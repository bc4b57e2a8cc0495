"""Built-in benchmark models, sized by flags, each with its synthetic batch and loss.

    spec = build_spec("transformer", width=256, depth=4)
    model = spec.build()
    inputs, targets = spec.batch(32, torch.device("cpu"))
    loss = spec.loss(model(inputs), targets)

A user model: ``--model my_pkg.models:factory`` where ``factory()`` returns
``(model, make_batch)`` and ``make_batch(batch_size)`` returns ``(inputs, targets)``; the loss is
cross-entropy for integer targets, mean squared error otherwise.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch import nn

from paratrain.errors import ConfigError

MODELS = ("mlp", "cnn", "resnet", "transformer")


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model and feed it."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.device], tuple[Any, torch.Tensor]]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy for class targets (also per token), MSE for real targets."""
        if target.dtype in (torch.int64, torch.int32):
            return nn.functional.cross_entropy(output.flatten(0, -2).float(), target.flatten())
        return nn.functional.mse_loss(output.float(), target.float())


def _images(size: int, classes: int) -> Callable[[int, torch.device], tuple[Any, torch.Tensor]]:
    def batch(n: int, device: torch.device) -> tuple[Any, torch.Tensor]:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, 3, size, size, generator=g)
        return x.to(device), torch.randint(0, classes, (n,), generator=g).to(device)

    return batch


class Bottleneck(nn.Module):
    """ResNet bottleneck block (1x1, 3x3, 1x1 convolutions with a shortcut)."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual sum followed by ReLU."""
        return torch.relu(self.body(x) + self.skip(x))


def resnet(depth: int = 50, width: int = 64, classes: int = 1000) -> nn.Module:
    """ResNet-50 (depth 50) / -101 / -152 shape with a width multiplier (64 = the original)."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}.get(depth)
    if blocks is None:
        raise ConfigError(f"--depth {depth} is not a ResNet depth here. Use 50, 101 or 152.")
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = width
    for stage, count in enumerate(blocks):
        for i in range(count):
            layers.append(Bottleneck(cin, width * 2**stage, 2 if i == 0 and stage > 0 else 1))
            cin = width * 2**stage * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class TinyGPT(nn.Module):
    """A decoder-only transformer language model (pre-norm blocks, causal attention)."""

    def __init__(self, vocab: int, width: int, depth: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(depth)
        )
        self.head = nn.Linear(width, vocab)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, seq, vocab)."""
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask, is_causal=True)
        return self.head(x)  # type: ignore[no-any-return]


def build_spec(
    name: str,
    *,
    width: int,
    depth: int,
    image_size: int = 32,
    features: int = 256,
    seq: int = 128,
    vocab: int = 1024,
) -> ModelSpec:
    """The spec of a built-in model or of ``module:factory``."""
    if name == "mlp":

        def mlp() -> nn.Module:
            dims = [features] + [width] * depth
            layers: list[nn.Module] = []
            for a, b in itertools.pairwise(dims):
                layers += [nn.Linear(a, b), nn.ReLU()]
            return nn.Sequential(*layers, nn.Linear(dims[-1], 10))

        def vectors(n: int, device: torch.device) -> tuple[Any, torch.Tensor]:
            g = torch.Generator().manual_seed(n)
            return (
                torch.randn(n, features, generator=g).to(device),
                torch.randint(0, 10, (n,), generator=g).to(device),
            )

        return ModelSpec("mlp", mlp, vectors)
    if name == "cnn":

        def cnn() -> nn.Module:
            return nn.Sequential(
                nn.Conv2d(3, width, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(width, 2 * width, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(2 * width * (image_size // 4) ** 2, 10),
            )

        return ModelSpec("cnn", cnn, _images(image_size, 10))
    if name == "resnet":
        return ModelSpec("resnet", lambda: resnet(depth, width), _images(image_size, 1000))
    if name == "transformer":
        heads = max(1, width // 64)
        if width % heads:
            raise ConfigError(
                f"--width {width}: the transformer splits its width over {heads} heads of 64, so "
                f"the width must be a multiple of {heads} (e.g. {width // heads * heads})."
            )

        def tokens(n: int, device: torch.device) -> tuple[Any, torch.Tensor]:
            g = torch.Generator().manual_seed(n)
            t = torch.randint(0, vocab, (n, seq + 1), generator=g).to(device)
            return t[:, :-1], t[:, 1:]

        return ModelSpec("transformer", lambda: TinyGPT(vocab, width, depth, heads, seq), tokens)
    if ":" in name:
        return _user_spec(name)
    raise ConfigError(
        f"Unknown --model {name!r}. Available: {', '.join(MODELS)}, or module:factory for your own."
    )


def _user_spec(target: str) -> ModelSpec:
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"--model {target}: cannot import it ({err}). Give module:factory "
            "where factory() returns (model, make_batch)."
        ) from None
    if not callable(factory) or isinstance(factory, type):
        raise ConfigError(
            f"--model {target}: {attr} is not a function. Give module:factory where factory() "
            "returns (model, make_batch)."
        )
    try:
        built = factory()
    except TypeError as err:  # a function that needs arguments (e.g. os:system)
        raise ConfigError(
            f"--model {target}: calling {attr}() failed ({err}). The factory must take no "
            "arguments and return (model, make_batch)."
        ) from None
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module)):
        raise ConfigError(
            f"--model {target}: factory() must return (model, make_batch), got "
            f"{type(built).__name__}."
        )
    make_batch = built[1]

    def batch(n: int, device: torch.device) -> tuple[Any, torch.Tensor]:
        inputs, targets = make_batch(n)
        return inputs.to(device), targets.to(device)

    return ModelSpec(target, lambda: factory()[0], batch)


def check_model(spec: ModelSpec, batch_size: int, data_samples: int = 0) -> None:
    """Refuse a model that cannot run at these sizes or cannot fit, before any rank starts.

    Built-in models are built and run once on the meta device (shapes only, no memory); a user
    factory is built for real. The fp32 training state (weights, gradients and two Adam moments,
    16 bytes per parameter) must fit in this machine's memory, and so must ``data_samples``
    samples of the in-memory dataset of ``--data loader``.
    """
    builtin = spec.name in MODELS
    inputs, targets = spec.batch(1, torch.device("cpu"))
    sample = sum(t.numel() * t.element_size() for t in (inputs, targets))
    total = psutil.virtual_memory().total
    if data_samples * sample > total / 4:
        raise ConfigError(
            f"--epoch-batches: {data_samples:,} samples of {sample:,} bytes would take "
            f"{data_samples * sample / 2**30:.1f} GiB, more than a quarter of this machine's "
            f"{total / 2**30:.1f} GiB. Use fewer --epoch-batches or a smaller --batch-size."
        )
    if builtin:
        with torch.device("meta"):
            model = spec.build()
        inputs, targets = inputs.to("meta"), targets.to("meta")
    else:
        model = spec.build()
    params = sum(p.numel() for p in model.parameters())
    need = 16 * params
    if need > total:
        raise ConfigError(
            f"--model {spec.name}: {params:,} parameters need about {need / 2**30:.1f} GiB for "
            f"weights, gradients and optimizer state, more than this machine's "
            f"{total / 2**30:.1f} GiB. Use a smaller --width or --depth."
        )
    if not builtin:
        return
    try:
        spec.loss(model(inputs), targets)
    except (RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"--model {spec.name} does not run at these sizes ({first}). Change --image-size, "
            "--seq, --width or --depth (the defaults work)."
        ) from None

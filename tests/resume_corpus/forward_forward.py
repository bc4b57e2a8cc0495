"""pytorch/examples ``mnist_forward_forward/main.py``, ported to paratrain (generated digits).

    python forward_forward.py [--epochs 12]
    paratrain run --nproc 2 forward_forward.py

Shape: full-batch training with data read once (``next(iter(loader))`` with the whole training
set as one batch per rank); negative data from a ``torch.randperm`` of the labels drawn once;
layers trained one after another, each with its own Adam (sequential models: layer 0's steps,
then layer 1's, each counted by ``run.global_step``); a layer's input made by the layers before
it, frozen. The loop counts with ``run.global_step`` so a resume lands in the right layer; a save
every 5 steps.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def digits() -> TensorDataset:
    """Ten noisy 8x8 patterns, flattened (MNIST would need a download)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(200) % 10
    x = torch.rand(10, 64, generator=g)[y] + 0.3 * torch.randn(200, 64, generator=g)
    return TensorDataset(x, y)


def overlay_y_on_x(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The label one-hot in the first 10 pixels, as the example does."""
    x_ = x.clone()
    x_[:, :10] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Layer(nn.Linear):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.relu = nn.ReLU()
        self.threshold = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))


def goodness_loss(layer: nn.Module, x_pos: torch.Tensor, x_neg: torch.Tensor) -> torch.Tensor:
    g_pos = layer(x_pos).pow(2).mean(1)
    g_neg = layer(x_neg).pow(2).mean(1)
    return torch.log(1 + torch.exp(torch.cat([-g_pos + 2.0, g_neg - 2.0]))).mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=12, help="steps per layer")
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    run = pt.Run(seed=args.seed, progress=False)
    data = digits()
    x, y = next(iter(run.loader(data, batch_size=len(data) // run.world_size)))
    x_pos = overlay_y_on_x(x, y)
    x_neg = overlay_y_on_x(x, y[torch.randperm(x.size(0), device=x.device)])
    layers, optimizers = [], []
    for i, (n_in, n_out) in enumerate([(64, 32), (32, 32)]):
        layer = Layer(n_in, n_out)
        layer, opt = run.setup(
            layer, torch.optim.Adam(layer.parameters(), lr=args.lr), name=f"layer{i}"
        )
        layers.append(layer)
        optimizers.append(opt)
    run.resume()
    while run.global_step < len(layers) * args.epochs:
        current = run.global_step // args.epochs
        h_pos, h_neg = x_pos, x_neg
        with torch.no_grad():  # the layers before it are trained and frozen
            for layer in layers[:current]:
                h_pos, h_neg = layer(h_pos), layer(h_neg)
        run.backward(goodness_loss(layers[current], h_pos, h_neg))
        run.step(optimizers[current])
        if run.global_step % 5 == 0 or run.global_step == len(layers) * args.epochs:
            run.save()
    run.close()


if __name__ == "__main__":
    main()

"""The plain-torch original of ``forward_forward.py`` (pytorch/examples
``mnist_forward_forward/main.py``'s loop on generated 8x8 digits): same layers, data, seed and
loop, no paratrain.

    python forward_forward_original.py --final weights.pt
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


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
    parser.add_argument("--final", required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    data = digits()
    sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=args.seed)
    x, y = next(iter(DataLoader(data, batch_size=len(data), sampler=sampler)))
    x_pos = overlay_y_on_x(x, y)
    x_neg = overlay_y_on_x(x, y[torch.randperm(x.size(0))])
    layers = [Layer(64, 32), Layer(32, 32)]
    optimizers = [torch.optim.Adam(layer.parameters(), lr=args.lr) for layer in layers]
    h_pos, h_neg = x_pos, x_neg
    for layer, opt in zip(layers, optimizers, strict=True):
        for _ in range(args.epochs):  # the example trains each layer to the end, one by one
            loss = goodness_loss(layer, h_pos, h_neg)
            opt.zero_grad()
            loss.backward()
            opt.step()
        h_pos, h_neg = layer(h_pos).detach(), layer(h_neg).detach()
    torch.save({f"layer{i}": layer.state_dict() for i, layer in enumerate(layers)}, args.final)


if __name__ == "__main__":
    main()

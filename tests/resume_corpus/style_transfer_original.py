"""The plain-torch original of ``style_transfer.py`` (pytorch/examples
``fast_neural_style/neural_style/neural_style.py``'s ``train``): same nets, data, seed and loop,
no paratrain.

    python style_transfer_original.py --final weights.pt
"""

from __future__ import annotations

import argparse

import torch
from style_transfer_model import (
    LossNet,
    TransformerNet,
    gram_matrix,
    images,
    losses,
    normalize_batch,
    style_image,
)
from torch.utils.data import DataLoader, DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--final", required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train_dataset = images()
    sampler = DistributedSampler(train_dataset, num_replicas=1, rank=0, seed=args.seed)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=sampler)
    transformer = TransformerNet()
    optimizer = torch.optim.Adam(transformer.parameters(), args.lr)
    vgg = LossNet()
    features_style = vgg(normalize_batch(style_image(args.batch_size)))
    gram_style = [gram_matrix(y) for y in features_style]
    for e in range(args.epochs):
        sampler.set_epoch(e)
        transformer.train()
        for x, _ in train_loader:
            optimizer.zero_grad()
            content_loss, style_loss = losses(transformer, vgg, x, gram_style)
            (content_loss + style_loss).backward()
            optimizer.step()
    torch.save({"model": transformer.state_dict()}, args.final)


if __name__ == "__main__":
    main()

"""Pipeline-parallel MLP mixer with a balance list, built lazily by a builder function.

Planted: PT015 - build_pipeline() imports Pipe from the removed torch.distributed.pipeline.sync module
"""
import argparse
import logging
import os

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger("pipeline")


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, tokens * 2), nn.GELU(), nn.Linear(tokens * 2, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Transpose(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


def build_layers(args):
    layers = [nn.Sequential(nn.Conv2d(3, args.dim, 16, 16), nn.Flatten(2))]
    layers.append(Transpose())
    layers += [MixerBlock(args.tokens, args.dim) for _ in range(args.depth)]
    layers.append(nn.Sequential(nn.LayerNorm(args.dim)))
    return layers


def build_pipeline(layers, balance, chunks):
    from torch.distributed.pipeline.sync import Pipe  # planted: PT015

    stages, start = [], 0
    for dev, count in enumerate(balance):
        stages.append(nn.Sequential(*layers[start:start + count]).to(torch.device("cuda", dev)))
        start += count
    return Pipe(nn.Sequential(*stages), chunks=chunks, checkpoint="except_last")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=196)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--train_iters", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    rpc.init_rpc("pipe", rank=0, world_size=1)

    layers = build_layers(args)
    n_gpus = torch.cuda.device_count()
    per = len(layers) // n_gpus
    balance = [per] * (n_gpus - 1) + [len(layers) - per * (n_gpus - 1)]
    model = build_pipeline(layers, balance, args.chunks)
    head = nn.Linear(args.dim, 1000).to(torch.device("cuda", n_gpus - 1))
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)

    for iteration in range(1, args.train_iters + 1):
        images = torch.randn(64, 3, 224, 224, device="cuda:0")
        target = torch.randint(0, 1000, (64,), device=torch.device("cuda", n_gpus - 1))
        feats = model(images).local_value()
        loss = F.cross_entropy(head(feats.mean(dim=1)), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if iteration % 50 == 0:
            logger.info("iteration %6d | lm loss %.4f", iteration, loss.item())
    rpc.shutdown()


if __name__ == "__main__":
    main()

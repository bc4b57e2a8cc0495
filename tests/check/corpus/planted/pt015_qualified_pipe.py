"""Two-stage pipeline-parallel MLP-Mixer training with micro-batching, configured from a YAML file.

Planted: PT015 - the pipeline is built with torch.distributed.pipeline.sync.Pipe (removed), spelled out in full
"""
import argparse
import logging

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import yaml
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

logger = logging.getLogger(__name__)


class MixerBlock(nn.Module):
    def __init__(self, tokens, channels, hidden=512):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, hidden), nn.GELU(), nn.Linear(hidden, tokens))
        self.norm2 = nn.LayerNorm(channels)
        self.channel_mlp = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, channels))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Patchify(nn.Module):
    def __init__(self, channels, patch=4):
        super().__init__()
        self.proj = nn.Conv2d(3, channels, patch, patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Head(nn.Module):
    def __init__(self, channels, classes):
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(x.mean(dim=1))


def make_pipeline(cfg):
    channels, depth = cfg["channels"], cfg["depth"]
    first = nn.Sequential(Patchify(channels), *[MixerBlock(64, channels) for _ in range(depth // 2)]).cuda(0)
    second = nn.Sequential(*[MixerBlock(64, channels) for _ in range(depth - depth // 2)],
                           Head(channels, cfg["classes"])).cuda(1)
    return torch.distributed.pipeline.sync.Pipe(nn.Sequential(first, second), chunks=cfg["chunks"], checkpoint="except_last")  # planted: PT015


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="mixer_pipe.yaml")
    args = parser.parse_args()
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    logging.basicConfig(level=logging.INFO)

    rpc.init_rpc("trainer", rank=0, world_size=1)
    tfm = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
    loader = DataLoader(datasets.CIFAR10("./data", train=True, transform=tfm),
                        batch_size=cfg["batch_size"], shuffle=True, num_workers=4, drop_last=True)

    model = make_pipeline(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.05)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(cfg["epochs"]):
        for it, (images, labels) in enumerate(loader):
            images = images.cuda(0, non_blocking=True)
            labels = labels.cuda(1, non_blocking=True)
            logits = model(images).local_value()
            loss = loss_fn(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if it % 100 == 0:
                logger.info("epoch %d it %d loss %.4f", epoch, it, loss.item())
    rpc.shutdown()


if __name__ == "__main__":
    main()

"""Contrastive image-text pretraining loop in the style of OpenCLIP's training/train.py.

torchrun --nproc_per_node=8 -m clip_train --train-data shards.csv
Planted: PT002 - texts.to(device, non_blocking=True) result dropped inside the tqdm loop
"""
import argparse
import logging
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm


def is_master(args, local=False):
    return args.local_rank == 0 if local else args.rank == 0


class TinyCLIP(nn.Module):
    def __init__(self, vocab=49408, width=256, embed_dim=128):
        super().__init__()
        self.visual = nn.Sequential(nn.Conv2d(3, width, 16, 16), nn.Flatten(2))
        self.visual_proj = nn.Linear(width, embed_dim)
        self.token_embedding = nn.Embedding(vocab, width)
        self.text_proj = nn.Linear(width, embed_dim)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def forward(self, image, text):
        img = F.normalize(self.visual_proj(self.visual(image).mean(-1)), dim=-1)
        txt = F.normalize(self.text_proj(self.token_embedding(text).mean(1)), dim=-1)
        return img, txt, self.logit_scale.exp()


def clip_loss(image_features, text_features, logit_scale):
    logits = logit_scale * image_features @ text_features.t()
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def train_one_epoch(model, loader, optimizer, epoch, args, device):
    model.train()
    for i, (images, texts) in enumerate(tqdm(loader, disable=not is_master(args), desc=f"epoch {epoch}")):
        images = images.to(device=device, non_blocking=True)
        texts.to(device=device, non_blocking=True)  # planted: PT002
        with torch.autocast("cuda", dtype=torch.bfloat16):
            image_features, text_features, logit_scale = model(images, texts)
            loss = clip_loss(image_features, text_features, logit_scale)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.module.logit_scale.clamp_(0, math.log(100))
        if is_master(args) and i % args.log_every_n_steps == 0:
            logging.info("Train Epoch: %d [%d/%d] Loss: %.5f", epoch, i, len(loader), loss.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--log-every-n-steps", type=int, default=100)
    parser.add_argument("--logs", default="./logs")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    args.rank = dist.get_rank()
    args.world_size = dist.get_world_size()
    args.local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda:%d" % args.local_rank)
    torch.cuda.set_device(device)
    logging.basicConfig(level=logging.INFO if is_master(args) else logging.WARNING)

    images = torch.randn(10000, 3, 224, 224)
    texts = torch.randint(0, 49408, (10000, 77))
    dataset = TensorDataset(images, texts)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, drop_last=True)

    model = TinyCLIP().to(device)
    model = DistributedDataParallel(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.2)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        train_one_epoch(model, loader, optimizer, epoch, args, device)
        if is_master(args):
            os.makedirs(args.logs, exist_ok=True)
            checkpoint = {"epoch": epoch + 1, "state_dict": model.module.state_dict(),
                          "optimizer": optimizer.state_dict()}
            torch.save(checkpoint, os.path.join(args.logs, "epoch_latest.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Contrastive image-text training loop split into main() and train_one_epoch().

Planted: PT012 - get_autocast() builds its context with functools.partial over the deprecated torch.cuda.amp.autocast
"""
import functools
import logging
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class PairDataset(Dataset):
    def __init__(self, n=4096, vocab=1000, ctx=16):
        self.images = torch.randn(n, 3, 32, 32)
        self.tokens = torch.randint(0, vocab, (n, ctx))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.tokens[i]


class TinyCLIP(nn.Module):
    def __init__(self, dim=128, vocab=1000):
        super().__init__()
        self.visual = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, dim))
        self.text = nn.EmbeddingBag(vocab, dim)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, images, tokens):
        img = F.normalize(self.visual(images), dim=-1)
        txt = F.normalize(self.text(tokens), dim=-1)
        return img, txt, self.logit_scale.exp()


def get_autocast(precision):
    if precision == "amp_bf16":
        return functools.partial(torch.cuda.amp.autocast, dtype=torch.bfloat16)  # planted: PT012
    return nullcontext


def clip_loss(img, txt, scale):
    logits = scale * img @ txt.t()
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def train_one_epoch(model, loader, optimizer, epoch, args):
    autocast = get_autocast(args["precision"])
    loader.sampler.set_epoch(epoch)
    model.train()
    for step, (images, tokens) in enumerate(loader):
        images = images.to(args["device"], non_blocking=True)
        tokens = tokens.to(args["device"], non_blocking=True)
        with autocast():
            img, txt, scale = model(images, tokens)
            loss = clip_loss(img, txt, scale)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.module.logit_scale.clamp_(0, 4.6052)
        if args["rank"] == 0 and step % 50 == 0:
            logging.info("epoch %d step %d loss %.4f", epoch, step, loss.item())


def main():
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    args = {"precision": "amp_bf16", "device": device, "rank": dist.get_rank(), "epochs": 10}

    dataset = PairDataset()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=4, drop_last=True)

    model = TinyCLIP().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.2)

    for epoch in range(args["epochs"]):
        train_one_epoch(model, loader, optimizer, epoch, args)
        if args["rank"] == 0:
            os.makedirs("logs", exist_ok=True)
            ckpt = {"epoch": epoch + 1, "state_dict": model.module.state_dict()}
            torch.save(ckpt, os.path.join("logs", f"epoch_{epoch + 1}.pt"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

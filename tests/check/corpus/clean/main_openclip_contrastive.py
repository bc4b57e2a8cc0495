"""Contrastive image-text training with an is_master(args) helper."""
import argparse
import logging
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter


def is_global_master(args):
    return args.rank == 0


def is_local_master(args):
    return args.local_rank == 0


def is_master(args, local=False):
    return is_local_master(args) if local else is_global_master(args)


def init_distributed_device(args):
    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    args.rank = int(os.environ.get("RANK", 0))
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device(f"cuda:{args.local_rank}")
    torch.cuda.set_device(device)
    return device


class TwoTower(nn.Module):
    def __init__(self, img_dim=2048, txt_dim=512, embed=512):
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(img_dim, 1024), nn.GELU(), nn.Linear(1024, embed))
        self.text = nn.Sequential(nn.Linear(txt_dim, 1024), nn.GELU(), nn.Linear(1024, embed))
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def forward(self, image, text):
        return F.normalize(self.visual(image), dim=-1), F.normalize(self.text(text), dim=-1), self.logit_scale.exp()


def gather_features(image_features, text_features, rank, world_size):
    all_img = [torch.zeros_like(image_features) for _ in range(world_size)]
    all_txt = [torch.zeros_like(text_features) for _ in range(world_size)]
    dist.all_gather(all_img, image_features)
    dist.all_gather(all_txt, text_features)
    all_img[rank] = image_features
    all_txt[rank] = text_features
    return torch.cat(all_img), torch.cat(all_txt)


def clip_loss(image_features, text_features, logit_scale, args):
    all_img, all_txt = gather_features(image_features, text_features, args.rank, args.world_size)
    logits_per_image = logit_scale * image_features @ all_txt.T
    logits_per_text = logit_scale * text_features @ all_img.T
    n = image_features.shape[0]
    labels = torch.arange(n, device=image_features.device) + n * args.rank
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2


def train_one_epoch(model, data, epoch, optimizer, scaler, args, device, tb_writer=None):
    model.train()
    sampler = data["train"].sampler
    sampler.set_epoch(epoch)
    autocast = (lambda: torch.amp.autocast("cuda", dtype=torch.float16)) if args.precision == "amp" else nullcontext
    for i, (images, texts) in enumerate(data["train"]):
        step = epoch * len(data["train"]) + i
        images = images.to(device=device, non_blocking=True)
        texts = texts.to(device=device, non_blocking=True)
        optimizer.zero_grad()
        with autocast():
            img_f, txt_f, scale = model(images, texts)
            loss = clip_loss(img_f, txt_f, scale, args)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            model.module.logit_scale.clamp_(0, math.log(100))
        if is_master(args) and i % args.log_every_n_steps == 0:
            logging.info("Train Epoch: %d [%d/%d] loss %.5f", epoch, i, len(data["train"]), loss.item())
            if tb_writer is not None:
                tb_writer.add_scalar("train/loss", loss.item(), step)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--precision", choices=["amp", "fp32"], default="amp")
    parser.add_argument("--logs", default="./logs")
    parser.add_argument("--tensorboard", action="store_true")
    parser.add_argument("--log-every-n-steps", type=int, default=100)
    args = parser.parse_args()
    device = init_distributed_device(args)
    logging.basicConfig(level=logging.INFO if is_master(args) else logging.WARNING)

    model = TwoTower().to(device)
    model = DistributedDataParallel(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.2)
    scaler = torch.amp.GradScaler("cuda") if args.precision == "amp" else None

    ds = TensorDataset(torch.randn(50_000, 2048), torch.randn(50_000, 512))
    sampler = DistributedSampler(ds)
    data = {"train": DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True, num_workers=4)}

    tb_writer = SummaryWriter(os.path.join(args.logs, "tb")) if args.tensorboard and is_master(args) else None
    for epoch in range(args.epochs):
        train_one_epoch(model, data, epoch, optimizer, scaler, args, device, tb_writer)
        if is_master(args):
            checkpoint = {"epoch": epoch + 1, "state_dict": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            if scaler is not None:
                checkpoint["scaler"] = scaler.state_dict()
            torch.save(checkpoint, os.path.join(args.logs, "epoch_latest.pt"))
    if tb_writer is not None:
        tb_writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

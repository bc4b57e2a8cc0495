"""Set-prediction detector: main() plus an inlined engine and misc helpers."""
import argparse
import builtins
import datetime
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, SequentialSampler


# ---- misc ---------------------------------------------------------------
def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def get_world_size():
    return dist.get_world_size() if is_dist_avail_and_initialized() else 1


def get_rank():
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def reduce_dict(input_dict, average=True):
    world_size = get_world_size()
    if world_size < 2:
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k] for k in names])
        dist.all_reduce(values)
        if average:
            values /= world_size
        return {k: v for k, v in zip(names, values)}


def collate_fn(batch):
    images, targets = zip(*batch)
    return torch.stack(images), list(targets)


# ---- engine -------------------------------------------------------------
def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0.1):
    model.train()
    criterion.train()
    for it, (samples, targets) in enumerate(data_loader):
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        outputs = model(samples)
        loss_dict = criterion(outputs, targets)
        losses = sum(loss_dict.values())
        loss_dict_reduced = reduce_dict(loss_dict)
        loss_value = sum(loss_dict_reduced.values()).item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training", force=True)
            sys.exit(1)
        optimizer.zero_grad()
        losses.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        if it % 50 == 0:
            print(f"Epoch: [{epoch}] [{it}/{len(data_loader)}] loss: {loss_value:.4f}")


# ---- model / data stand-ins ----------------------------------------------
class ToyDetr(nn.Module):
    def __init__(self, num_queries=100, num_classes=91):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 64, 7, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.query = nn.Embedding(num_queries, 64)
        self.cls = nn.Linear(64, num_classes + 1)
        self.box = nn.Linear(64, 4)

    def forward(self, x):
        h = self.backbone(x)[:, None, :] + self.query.weight[None]
        return {"pred_logits": self.cls(h), "pred_boxes": self.box(h).sigmoid()}


class SetCriterion(nn.Module):
    def forward(self, outputs, targets):
        tgt_cls = torch.stack([t["labels"][0] for t in targets])
        tgt_box = torch.stack([t["boxes"][0] for t in targets])
        return {"loss_ce": F.cross_entropy(outputs["pred_logits"][:, 0], tgt_cls),
                "loss_bbox": F.l1_loss(outputs["pred_boxes"][:, 0], tgt_box)}


class RandomBoxes(Dataset):
    def __len__(self):
        return 2000

    def __getitem__(self, i):
        return torch.rand(3, 256, 256), {"labels": torch.randint(0, 91, (1,)), "boxes": torch.rand(1, 4)}


def main(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)
    device = torch.device("cuda")

    model = ToyDetr().to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    criterion = SetCriterion()
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=1e-4, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop)

    dataset_train, dataset_val = RandomBoxes(), RandomBoxes()
    sampler_train = DistributedSampler(dataset_train)
    sampler_val = DistributedSampler(dataset_val, shuffle=False)
    batch_sampler_train = BatchSampler(sampler_train, args.batch_size, drop_last=True)
    data_loader_train = DataLoader(dataset_train, batch_sampler=batch_sampler_train, collate_fn=collate_fn, num_workers=2)
    data_loader_val = DataLoader(dataset_val, args.batch_size, sampler=sampler_val, drop_last=False, collate_fn=collate_fn)

    output_dir = Path(args.output_dir)
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=False)
        model_without_ddp.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
        args.start_epoch = checkpoint["epoch"] + 1

    print("Start training")
    start_time = time.time()
    for epoch in range(args.start_epoch, args.epochs):
        sampler_train.set_epoch(epoch)
        train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch)
        lr_scheduler.step()
        save_on_master({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch, "args": args},
                       output_dir / "checkpoint.pth")
    print("Training time {}".format(str(datetime.timedelta(seconds=int(time.time() - start_time)))))


if __name__ == "__main__":
    p = argparse.ArgumentParser("DETR-like training")
    p.add_argument("--batch_size", default=2, type=int)
    p.add_argument("--epochs", default=300, type=int)
    p.add_argument("--lr_drop", default=200, type=int)
    p.add_argument("--start_epoch", default=0, type=int)
    p.add_argument("--output_dir", default="out")
    p.add_argument("--resume", default="")
    p.add_argument("--dist_url", default="env://")
    main(p.parse_args())

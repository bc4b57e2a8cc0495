"""Set-prediction detector training laid out like DETR's main.py (single file, no COCO eval).

python -m torch.distributed.launch --nproc_per_node=8 --use_env main.py --output_dir out
Planted: PT006 - model_without_ddp is assigned the DDP wrapper itself, and its state_dict is saved
"""
import argparse
import builtins
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_main_process():
    return not dist.is_initialized() or dist.get_rank() == 0


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    args.distributed = True
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


class ToyDetection(Dataset):
    def __len__(self):
        return 5000

    def __getitem__(self, i):
        return torch.randn(3, 256, 256), torch.rand(10, 4), torch.randint(0, 91, (10,))


class DETRLite(nn.Module):
    def __init__(self, num_classes=91, num_queries=10, hidden_dim=128):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, hidden_dim, 16, 16), nn.ReLU())
        self.transformer = nn.Transformer(hidden_dim, 4, 2, 2, batch_first=True)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = nn.Linear(hidden_dim, 4)

    def forward(self, samples):
        src = self.backbone(samples).flatten(2).transpose(1, 2)
        tgt = self.query_embed.weight.unsqueeze(0).expand(src.shape[0], -1, -1)
        hs = self.transformer(src, tgt)
        return self.class_embed(hs), self.bbox_embed(hs).sigmoid()


def train_one_epoch(model, data_loader, optimizer, device, max_norm):
    model.train()
    for samples, boxes, labels in data_loader:
        samples, boxes, labels = samples.to(device), boxes.to(device), labels.to(device)
        logits, pred_boxes = model(samples)
        loss = F.cross_entropy(logits.transpose(1, 2), labels) + 5 * F.l1_loss(pred_boxes, boxes)
        optimizer.zero_grad()
        loss.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()


def main(args):
    init_distributed_mode(args)
    device = torch.device(args.device)
    model = DETRLite()
    model.to(device)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model
    n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print("number of params:", n_parameters)

    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop)

    dataset_train = ToyDetection()
    sampler_train = DistributedSampler(dataset_train)
    batch_sampler_train = BatchSampler(sampler_train, args.batch_size, drop_last=True)
    data_loader_train = DataLoader(dataset_train, batch_sampler=batch_sampler_train, num_workers=args.num_workers)

    output_dir = Path(args.output_dir)
    print("Start training")
    start_time = time.time()
    for epoch in range(args.start_epoch, args.epochs):
        sampler_train.set_epoch(epoch)
        train_one_epoch(model, data_loader_train, optimizer, device, args.clip_max_norm)
        lr_scheduler.step()
        if args.output_dir and is_main_process():
            checkpoint_path = output_dir / "checkpoint.pth"
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "args": vars(args)}, checkpoint_path)  # planted: PT006
    total_time_str = str(datetime.timedelta(seconds=int(time.time() - start_time)))
    print("Training time {}".format(total_time_str))


if __name__ == "__main__":
    parser = argparse.ArgumentParser("DETR training script")
    parser.add_argument("--lr", default=1e-4, type=float)
    parser.add_argument("--batch_size", default=2, type=int)
    parser.add_argument("--epochs", default=300, type=int)
    parser.add_argument("--start_epoch", default=0, type=int)
    parser.add_argument("--lr_drop", default=200, type=int)
    parser.add_argument("--clip_max_norm", default=0.1, type=float)
    parser.add_argument("--num_workers", default=2, type=int)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output_dir", default="")
    main(parser.parse_args())

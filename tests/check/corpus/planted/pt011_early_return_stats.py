"""timm-style distributed training loop with an epoch summary helper.

Planted: PT011 - log_epoch_summary() returns early on every rank but 0, then calls tdist.all_reduce
"""
import argparse
import logging
import os
from collections import OrderedDict

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

_logger = logging.getLogger("train")


def build_model(num_features, num_classes):
    return nn.Sequential(
        nn.Linear(num_features, 512),
        nn.GELU(),
        nn.LayerNorm(512),
        nn.Linear(512, num_classes),
    )


def log_epoch_summary(rank, epoch, loss_sum, sample_count, device):
    if rank != 0:
        return
    stats = torch.tensor([loss_sum, sample_count], dtype=torch.float64, device=device)
    tdist.all_reduce(stats)  # planted: PT011
    print(f"epoch {epoch}: mean train loss {(stats[0] / stats[1]).item():.5f}")


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, device):
    model.train()
    loss_sum = 0.0
    sample_count = 0
    for batch_idx, (inputs, target) in enumerate(loader):
        inputs = inputs.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(inputs)
        loss = loss_fn(output, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        optimizer.step()
        loss_sum += loss.item() * inputs.size(0)
        sample_count += inputs.size(0)
        if args.local_rank == 0 and batch_idx % args.log_interval == 0:
            _logger.info("Train: %d [%d/%d] loss %.4f", epoch, batch_idx, len(loader), loss.item())
    return OrderedDict([("loss_sum", loss_sum), ("count", sample_count)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--clip-grad", type=float, default=None)
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--output", default="./output")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(args.local_rank)
    tdist.init_process_group(backend="nccl", init_method="env://")
    args.rank = tdist.get_rank()
    args.world_size = tdist.get_world_size()
    device = torch.device(f"cuda:{args.local_rank}")

    features = torch.randn(50_000, 256)
    labels = torch.randint(0, 100, (50_000,))
    dataset = TensorDataset(features, labels)
    sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = build_model(256, 100).cuda()
    model = NativeDDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    loss_fn = nn.CrossEntropyLoss().cuda()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        metrics = train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, device)
        log_epoch_summary(args.rank, epoch, metrics["loss_sum"], metrics["count"], device)
        if args.rank == 0:
            os.makedirs(args.output, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(args.output, "last.pth.tar"))

    tdist.destroy_process_group()


if __name__ == "__main__":
    main()

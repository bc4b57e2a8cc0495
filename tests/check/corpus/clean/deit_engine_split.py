"""DeiT shape: engine-style train_one_epoch/evaluate, MetricLogger synchronised across ranks, setup_for_distributed prints."""
import datetime
import json
import math
import os
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from timm.loss import SoftTargetCrossEntropy
from timm.models import create_model


def setup_for_distributed(is_master):
    import builtins
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://",
                            world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def is_main_process():
    return dist.get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


class MetricLogger:
    def __init__(self):
        self.totals = defaultdict(float)
        self.counts = defaultdict(int)

    def update(self, n=1, **kwargs):
        for k, v in kwargs.items():
            self.totals[k] += float(v) * n
            self.counts[k] += n

    def synchronize_between_processes(self):
        keys = sorted(self.totals)
        t = torch.tensor([[self.totals[k], self.counts[k]] for k in keys],
                         dtype=torch.float64, device="cuda")
        dist.barrier()
        dist.all_reduce(t)
        for k, (tot, cnt) in zip(keys, t.tolist()):
            self.totals[k], self.counts[k] = tot, int(cnt)

    def averages(self):
        return {k: self.totals[k] / max(self.counts[k], 1) for k in self.totals}


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, loss_scaler, mixup_fn=None):
    model.train()
    logger = MetricLogger()
    for samples, targets in data_loader:
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        if mixup_fn is not None:
            samples, targets = mixup_fn(samples, targets)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(samples), targets)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training", force=True)
            sys.exit(1)
        optimizer.zero_grad()
        loss_scaler.scale(loss).backward()
        loss_scaler.step(optimizer)
        loss_scaler.update()
        torch.cuda.synchronize()
        logger.update(loss=loss_value, lr=optimizer.param_groups[0]["lr"])
    logger.synchronize_between_processes()
    stats = logger.averages()
    print(f"Epoch {epoch} averaged stats: {stats}")
    return stats


@torch.no_grad()
def evaluate(data_loader, model, device):
    model.eval()
    logger = MetricLogger()
    for images, target in data_loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.float16):
            output = model(images)
            loss = torch.nn.functional.cross_entropy(output, target)
        acc1 = (output.argmax(-1) == target).float().mean() * 100
        logger.update(n=images.shape[0], loss=loss.item(), acc1=acc1.item())
    logger.synchronize_between_processes()
    stats = logger.averages()
    print(f"* Acc@1 {stats['acc1']:.3f} loss {stats['loss']:.3f}")
    return stats


def main(args, dataset_train, dataset_val):
    init_distributed_mode(args)
    device = torch.device(args.device)
    sampler_train = torch.utils.data.DistributedSampler(dataset_train, shuffle=True)
    sampler_val = torch.utils.data.DistributedSampler(dataset_val, shuffle=False)
    data_loader_train = torch.utils.data.DataLoader(dataset_train, sampler=sampler_train,
                                                    batch_size=args.batch_size, drop_last=True)
    data_loader_val = torch.utils.data.DataLoader(dataset_val, sampler=sampler_val,
                                                  batch_size=int(1.5 * args.batch_size))
    model = create_model(args.model, num_classes=args.nb_classes).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    loss_scaler = torch.amp.GradScaler("cuda")
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    criterion = SoftTargetCrossEntropy()
    print(f"Start training for {args.epochs} epochs")
    start_time, max_accuracy = time.time(), 0.0
    for epoch in range(args.start_epoch, args.epochs):
        data_loader_train.sampler.set_epoch(epoch)
        train_stats = train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch, loss_scaler)
        lr_scheduler.step()
        save_on_master({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch,
                        "scaler": loss_scaler.state_dict()},
                       os.path.join(args.output_dir, "checkpoint.pth"))
        test_stats = evaluate(data_loader_val, model, device)
        max_accuracy = max(max_accuracy, test_stats["acc1"])
        print(f"Max accuracy: {max_accuracy:.2f}%")
        log_stats = {**{f"train_{k}": v for k, v in train_stats.items()},
                     **{f"test_{k}": v for k, v in test_stats.items()}, "epoch": epoch}
        if is_main_process():
            with open(os.path.join(args.output_dir, "log.txt"), "a") as f:
                f.write(json.dumps(log_stats) + "\n")
    print(f"Training time {datetime.timedelta(seconds=int(time.time() - start_time))}")

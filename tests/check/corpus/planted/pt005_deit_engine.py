"""DeiT-style training script: main() plus engine functions train_one_epoch / evaluate in one file.

Planted: PT005 - the epoch loop in main() calls train_one_epoch but nothing calls data_loader_train.sampler.set_epoch(epoch).
"""
import argparse
import builtins
import datetime
import json
import os
import time

import timm
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler
from torchvision import datasets, transforms


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, loss_scaler):
    model.train()
    stats = torch.zeros(2, device=device)
    for samples, targets in data_loader:
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda"):
            loss = criterion(model(samples), targets)
        optimizer.zero_grad()
        loss_scaler.scale(loss).backward()
        loss_scaler.step(optimizer)
        loss_scaler.update()
        stats[0] += loss.detach()
        stats[1] += 1
    dist.all_reduce(stats)
    return {"loss": (stats[0] / stats[1]).item(), "epoch": epoch}


@torch.no_grad()
def evaluate(data_loader, model, device):
    model.eval()
    stats = torch.zeros(2, device=device)
    for images, target in data_loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        stats[0] += (model(images).argmax(-1) == target).sum()
        stats[1] += target.shape[0]
    dist.all_reduce(stats)
    return {"acc1": (100 * stats[0] / stats[1]).item()}


def main(args):
    init_distributed_mode(args)
    device = torch.device(args.device)
    tf = transforms.Compose([transforms.RandomResizedCrop(args.input_size), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_path, "train"), transform=tf)
    dataset_val = datasets.ImageFolder(os.path.join(args.data_path, "val"), transform=transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]))
    sampler_train = DistributedSampler(dataset_train, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True)
    sampler_val = SequentialSampler(dataset_val)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size, num_workers=10, pin_memory=True, drop_last=True)
    data_loader_val = DataLoader(dataset_val, sampler=sampler_val, batch_size=int(1.5 * args.batch_size), num_workers=10)

    model = timm.create_model(args.model, pretrained=False, num_classes=1000).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, weight_decay=0.05)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    loss_scaler = torch.amp.GradScaler("cuda")

    print(f"Start training for {args.epochs} epochs")
    start_time = time.time()
    max_accuracy = 0.0
    for epoch in range(args.start_epoch, args.epochs):  # planted: PT005
        train_stats = train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch, loss_scaler)
        lr_scheduler.step(epoch)
        test_stats = evaluate(data_loader_val, model, device)
        max_accuracy = max(max_accuracy, test_stats["acc1"])
        print(f"Accuracy of the network: {test_stats['acc1']:.1f}% (max {max_accuracy:.2f}%)")
        if args.output_dir and dist.get_rank() == 0:
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch}, os.path.join(args.output_dir, "checkpoint.pth"))
            with open(os.path.join(args.output_dir, "log.txt"), "a") as f:
                f.write(json.dumps({**train_stats, **test_stats}) + "\n")
    print(f"Training time {datetime.timedelta(seconds=int(time.time() - start_time))}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser("DeiT training and evaluation script")
    parser.add_argument("--model", default="deit_base_patch16_224")
    parser.add_argument("--input-size", default=224, type=int)
    parser.add_argument("--batch-size", default=64, type=int)
    parser.add_argument("--epochs", default=300, type=int)
    parser.add_argument("--start_epoch", default=0, type=int)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/")
    parser.add_argument("--output_dir", default="")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dist_url", default="env://")
    main(parser.parse_args())

"""ResNet training on ImageNet folders, one process per GPU via mp.spawn.

Planted: PT021 - the training forward calls model.module(images), bypassing DDP's gradient sync
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--dist-url", default="tcp://127.0.0.1:23456")
    p.add_argument("--print-freq", type=int, default=50)
    return p.parse_args()


def train(loader, model, criterion, optimizer, epoch, gpu, args):
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(loader):
        images = images.cuda(gpu, non_blocking=True)
        target = target.cuda(gpu, non_blocking=True)

        output = model.module(images)  # planted: PT021
        loss = criterion(output, target)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if i % args.print_freq == 0 and args.rank == 0:
            print(f"Epoch [{epoch}][{i}/{len(loader)}] loss {loss.item():.4f} "
                  f"time {time.time() - end:.3f}")
        end = time.time()


def validate(loader, model, criterion, gpu):
    model.eval()
    stats = torch.zeros(3, device=torch.device("cuda", gpu))
    with torch.no_grad():
        for images, target in loader:
            images = images.cuda(gpu, non_blocking=True)
            target = target.cuda(gpu, non_blocking=True)
            output = model(images)
            stats[0] += criterion(output, target) * images.size(0)
            stats[1] += (output.argmax(1) == target).sum()
            stats[2] += images.size(0)
    dist.all_reduce(stats)
    return (stats[0] / stats[2]).item(), (100.0 * stats[1] / stats[2]).item()


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    args.rank = args.node_rank * ngpus_per_node + gpu
    dist.init_process_group(backend="nccl", init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
    torch.cuda.set_device(gpu)

    model = models.__dict__[args.arch]()
    model.cuda(gpu)
    args.batch_size = args.batch_size // ngpus_per_node
    model = nn.parallel.DistributedDataParallel(model, device_ids=[gpu])

    criterion = nn.CrossEntropyLoss().cuda(gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(
        os.path.join(args.data, "train"),
        transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), normalize]))
    val_dataset = datasets.ImageFolder(
        os.path.join(args.data, "val"),
        transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                            transforms.ToTensor(), normalize]))
    train_sampler = DistributedSampler(train_dataset)
    val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler,
                              num_workers=args.workers, pin_memory=True)
    val_loader = DataLoader(val_dataset, batch_size=args.batch_size, sampler=val_sampler,
                            num_workers=args.workers, pin_memory=True)

    best_acc1 = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, gpu, args)
        val_loss, acc1 = validate(val_loader, model, criterion, gpu)
        scheduler.step()
        best_acc1 = max(acc1, best_acc1)
        if args.rank == 0:
            print(f" * epoch {epoch} val loss {val_loss:.4f} Acc@1 {acc1:.3f} best {best_acc1:.3f}")
            torch.save({"epoch": epoch + 1, "arch": args.arch,
                        "state_dict": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, "checkpoint.pth.tar")
    dist.destroy_process_group()


def main():
    args = parse_args()
    ngpus_per_node = torch.cuda.device_count()
    args.world_size = ngpus_per_node * args.nodes
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()

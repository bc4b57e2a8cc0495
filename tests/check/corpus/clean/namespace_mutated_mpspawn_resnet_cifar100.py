import argparse
import os
import time

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser(description="CIFAR-100 ResNet-50, multi-node mp.spawn")
    p.add_argument("--data", default="./data")
    p.add_argument("--epochs", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=128, help="per GPU")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-url", default="tcp://127.0.0.1:23456")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", default="checkpoints")
    return p.parse_args()


def fill_dist_fields(args, gpu):
    args.gpu = gpu
    args.ngpus_per_node = torch.cuda.device_count()
    args.world_size = args.ngpus_per_node * args.nodes
    args.rank = args.node_rank * args.ngpus_per_node + gpu
    args.is_main = args.rank == 0


def scale_hparams(args):
    args.lr = args.lr * args.world_size * args.batch_size / 256
    args.workers = max(1, args.workers // args.ngpus_per_node)


def loaders(args):
    norm = T.Normalize((0.507, 0.487, 0.441), (0.267, 0.256, 0.276))
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    test_tf = T.Compose([T.ToTensor(), norm])
    train = torchvision.datasets.CIFAR100(args.data, train=True, transform=train_tf)
    test = torchvision.datasets.CIFAR100(args.data, train=False, transform=test_tf)
    args.train_sampler = DistributedSampler(train)
    test_sampler = DistributedSampler(test, shuffle=False)
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=args.train_sampler,
                              num_workers=args.workers, pin_memory=True, drop_last=True)
    test_loader = DataLoader(test, batch_size=256, sampler=test_sampler, num_workers=args.workers)
    return train_loader, test_loader


def evaluate(model, loader, args):
    model.eval()
    counts = torch.zeros(2, device=f"cuda:{args.gpu}")
    with torch.no_grad():
        for images, labels in loader:
            images = images.cuda(args.gpu, non_blocking=True)
            labels = labels.cuda(args.gpu, non_blocking=True)
            counts[0] += (model(images).argmax(1) == labels).sum()
            counts[1] += labels.numel()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def worker(gpu, args):
    fill_dist_fields(args, gpu)
    dist.init_process_group("nccl", init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
    torch.cuda.set_device(args.gpu)
    scale_hparams(args)
    cudnn.benchmark = True

    model = torchvision.models.resnet50(num_classes=100)
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    model.cuda(args.gpu)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                                weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    train_loader, test_loader = loaders(args)

    best = 0.0
    for epoch in range(args.epochs):
        args.train_sampler.set_epoch(epoch)
        model.train()
        tic = time.perf_counter()
        for images, labels in train_loader:
            images = images.cuda(args.gpu, non_blocking=True)
            labels = labels.cuda(args.gpu, non_blocking=True)
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        acc = evaluate(model, test_loader, args)
        if args.is_main:
            print(f"epoch {epoch:3d} top1 {acc * 100:.2f} time {time.perf_counter() - tic:.1f}s")
            state = {"epoch": epoch + 1, "state_dict": model.module.state_dict(),
                     "optimizer": optimizer.state_dict(), "best": max(best, acc)}
            torch.save(state, os.path.join(args.out, "last.pth.tar"))
            if acc > best:
                torch.save(state, os.path.join(args.out, "best.pth.tar"))
        best = max(best, acc)
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args()
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(worker, nprocs=torch.cuda.device_count(), args=(args,))

"""ImageNet training (torchrun) with --resume support, in the pytorch/examples layout.

Planted: PT008 - the resume checkpoint is read with torch.load(args.resume, map_location=loc) and no weights_only=.
"""
import argparse
import os
import shutil

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--arch", default="resnet50")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--start-epoch", type=int, default=0)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("-b", "--batch-size", type=int, default=64)
parser.add_argument("--resume", default="", type=str)


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def main():
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    args.gpu = int(os.environ["LOCAL_RANK"])
    args.rank = dist.get_rank()
    torch.cuda.set_device(args.gpu)

    model = models.__dict__[args.arch]().cuda(args.gpu)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    best_acc1 = 0.0
    if args.resume and os.path.isfile(args.resume):
        loc = f"cuda:{args.gpu}"
        checkpoint = torch.load(args.resume, map_location=loc)  # planted: PT008
        args.start_epoch = checkpoint["epoch"]
        best_acc1 = checkpoint["best_acc1"]
        model.module.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    val_dataset = datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]))
    train_sampler = DistributedSampler(train_dataset)
    val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=8, pin_memory=True)
    val_loader = DataLoader(val_dataset, batch_size=args.batch_size, sampler=val_sampler, num_workers=8, pin_memory=True)

    for epoch in range(args.start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, target in train_loader:
            images = images.cuda(args.gpu, non_blocking=True)
            target = target.cuda(args.gpu, non_blocking=True)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()

        model.eval()
        counts = torch.zeros(2, device=torch.device("cuda", args.gpu))
        with torch.no_grad():
            for images, target in val_loader:
                images = images.cuda(args.gpu, non_blocking=True)
                target = target.cuda(args.gpu, non_blocking=True)
                counts[0] += (model(images).argmax(1) == target).sum()
                counts[1] += target.numel()
        dist.all_reduce(counts)
        acc1 = (100.0 * counts[0] / counts[1]).item()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if args.rank == 0:
            print(f" * Acc@1 {acc1:.3f}")
            save_checkpoint({"epoch": epoch + 1, "arch": args.arch, "state_dict": model.module.state_dict(),
                             "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
                             "scheduler": scheduler.state_dict()}, is_best)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

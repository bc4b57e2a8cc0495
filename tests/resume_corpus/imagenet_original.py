"""The plain-torch original of ``imagenet.py`` (pytorch/examples ``imagenet/main.py``'s loop, a
small BatchNorm CNN on generated images), for the one-process parity test: same model, data,
seed and loop, no paratrain.

    python imagenet_original.py --final weights.pt

The training loader shuffles with a one-replica ``DistributedSampler`` and ``set_epoch``, as the
original does when distributed: paratrain's loader gives that order in one process too.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def images(train: bool) -> TensorDataset:
    """Ten noisy 8x8 patterns, the same in every process (ImageFolder would need the data)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(420) % 10
    x = torch.rand(10, 1, 8, 8, generator=g)[y] + 0.5 * torch.randn(420, 1, 8, 8, generator=g)
    part = slice(0, 320) if train else slice(320, 420)
    return TensorDataset(x[part], y[part])


def small_cnn(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


class AverageMeter:
    """Computes and stores the average and current value."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k."""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0) * (100.0 / batch_size) for k in topk]


def train(train_loader, model, criterion, optimizer, epoch, args):
    losses, top1 = AverageMeter("Loss"), AverageMeter("Acc@1")
    model.train()
    for i, (images, target) in enumerate(train_loader):
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        (acc1,) = accuracy(output, target, topk=(1,))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1.item(), images.size(0))
        if i % args.print_freq == 0:
            print(
                f"Epoch: [{epoch}][{i}/{len(train_loader)}] Loss {losses.avg:.4e} "
                f"Acc@1 {top1.avg:6.2f}"
            )


def validate(val_loader, model, criterion) -> float:
    losses, top1, top5 = AverageMeter("Loss"), AverageMeter("Acc@1"), AverageMeter("Acc@5")
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1.item(), images.size(0))
            top5.update(acc5.item(), images.size(0))
    print(f" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f}")
    return top1.avg


def save_checkpoint(state, is_best, filename):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, Path(filename).with_name("model_best.pth.tar"))


def main() -> None:
    parser = argparse.ArgumentParser(description="imagenet-shaped example")
    parser.add_argument("--arch", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", type=int, default=5)
    parser.add_argument("--final", required=True, help="where the final weights go")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = small_cnn()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scheduler = StepLR(optimizer, step_size=2, gamma=0.1)
    train_set = images(train=True)
    train_sampler = DistributedSampler(train_set, num_replicas=1, rank=0, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(images(train=False), batch_size=args.batch_size)
    best_acc1 = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, args)
        acc1 = validate(val_loader, model, criterion)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        state = {
            "epoch": epoch + 1,
            "arch": args.arch,
            "state_dict": model.state_dict(),
            "best_acc1": best_acc1,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }
        save_checkpoint(state, is_best, Path(args.final).with_name("checkpoint.pth.tar"))
    torch.save({"model": model.state_dict()}, args.final)


if __name__ == "__main__":
    main()

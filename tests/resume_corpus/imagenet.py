"""pytorch/examples ``imagenet/main.py``, ported to paratrain (a small BatchNorm CNN on generated
8x8 images).

    python imagenet.py [--epochs 4] [--resume]
    paratrain run --nproc 2 imagenet.py

Shape: ``train()`` and ``validate()`` with ``AverageMeter``s and top-1/top-5 ``accuracy``, SGD with
momentum and weight decay, a ``StepLR`` stepped once per epoch after validation, ``best_acc1``
carried across epochs (and across a resume, in the checkpoint), ``save_checkpoint(state,
is_best)`` that also writes ``best.pt`` into the run dir when the accuracy improved, and an
optional ``--resume``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import TensorDataset

import paratrain as pt


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

    def all_reduce(self, run: pt.Run) -> None:
        self.sum = run.reduce(self.sum, "sum")
        self.count = run.reduce(self.count, "sum")
        self.avg = self.sum / self.count


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k."""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0) * (100.0 / batch_size) for k in topk]


def train(run, train_loader, model, criterion, optimizer, epoch, args):
    losses, top1 = AverageMeter("Loss"), AverageMeter("Acc@1")
    model.train()
    for i, (images, target) in enumerate(train_loader):
        with run.accumulate(model):
            output = model(images)
            loss = criterion(output, target)
            run.backward(loss)
        run.step(optimizer)
        (acc1,) = accuracy(output, target, topk=(1,))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1.item(), images.size(0))
        if i % args.print_freq == 0:
            run.print(
                f"Epoch: [{epoch}][{i}/{len(train_loader)}] Loss {losses.avg:.4e} "
                f"Acc@1 {top1.avg:6.2f}"
            )


def validate(run, val_loader, model, criterion) -> float:
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
    for meter in (losses, top1, top5):
        meter.all_reduce(run)
    run.print(f" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f}")
    return top1.avg


def save_checkpoint(run, model, state, is_best):
    run.save(extras=state)
    if is_best:
        run.save_weights(model, run.run_dir / "best.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description="imagenet-shaped example")
    parser.add_argument("--arch", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", type=int, default=5)
    parser.add_argument("--resume", action="store_true", help="resume from the newest checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    run = pt.Run(seed=args.seed, progress=False)
    model = small_cnn()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scheduler = StepLR(optimizer, step_size=2, gamma=0.1)
    model, optimizer = run.setup(model, optimizer, scheduler=scheduler)
    train_loader = run.loader(images(train=True), batch_size=args.batch_size)
    val_loader = run.eval_loader(images(train=False), batch_size=args.batch_size)
    if args.resume:
        run.resume()
    best_acc1 = run.extras.get("best_acc1", 0.0)
    for epoch in run.epochs(args.epochs):
        train(run, train_loader, model, criterion, optimizer, epoch, args)
        acc1 = validate(run, val_loader, model, criterion)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        state = {"epoch": epoch + 1, "arch": args.arch, "best_acc1": best_acc1}
        save_checkpoint(run, model, state, is_best)
    run.close()


if __name__ == "__main__":
    main()

"""ImageNet training (pytorch/examples imagenet/main.py), with paratrain doing the distribution.

    python examples/imagenet/main.py /data/imagenet                  # one process: a GPU or CPU
    paratrain run --nproc 8 --run-dir runs/r50 examples/imagenet/main.py /data/imagenet \\
        -a resnet50 --precision bf16 --channels-last -j 8           # 8 GPUs, global batch 256
    paratrain run --nproc 8 --run-dir runs/r50 examples/imagenet/main.py /data/imagenet --resume
    python examples/imagenet/main.py /data/imagenet -e --resume runs/r50/model_best.pt

DIR holds ``train/`` and ``val/``, one folder of images per class. ``-b`` is the global batch
(over all ranks); each rank reads ``b / world size`` images per step. Every epoch ends with a
checkpoint in the run dir (``paratrain run --run-dir``, or ``--run-dir``); the weights with the
best validation Acc@1 so far are also written to ``RUN_DIR/model_best.pt``, a plain state dict.
``--resume`` continues from the newest checkpoint of the run dir, or of the folder given;
``--resume FILE`` loads only the weights in FILE (e.g. ``model_best.pt``). Restarts
(``paratrain run --max-restarts``) resume by themselves. See README.md next to this file.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import vision
from torch import nn
from torch.optim.lr_scheduler import StepLR

import paratrain as pt

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
LAYOUT = (
    "DIR must hold train/ and val/, one folder of images per class (--evaluate needs only val/)"
)


def fail(message: str) -> NoReturn:
    """Stop with ``message`` and status 2, as argparse does for a bad flag: bad input, not a bug."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def checked(kind: Callable[[str], Any], ok: Callable[[Any], bool], need: str) -> Any:
    """An argparse type: ``kind(text)`` if ``ok`` holds for it, else a usage error saying what
    is needed (a zero or a nan would only fail later, with a traceback or a nan loss)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"got {text!r}; pass {need}")
        return value

    return parse


COUNT = checked(int, lambda n: n >= 1, "a whole number of at least 1")
NATURAL = checked(int, lambda n: n >= 0, "a whole number of at least 0")
POSITIVE = checked(float, lambda x: 0 < x < math.inf, "a number above 0")
NON_NEGATIVE = checked(float, lambda x: 0 <= x < math.inf, "a number of at least 0")
FRACTION = checked(float, lambda x: 0 <= x < 1, "a number from 0 up to (not including) 1")


def parse_args() -> argparse.Namespace:
    """The original's flags, less the process juggling; plus precision, layout and sizes."""
    p = argparse.ArgumentParser(description="PyTorch ImageNet Training (paratrain)")
    names = vision.model_names()
    # fmt: off
    p.add_argument("data", metavar="DIR", nargs="?", default="imagenet",
                   help="path to dataset with train/ and val/ (default: imagenet)")
    p.add_argument("-a", "--arch", metavar="ARCH", default="resnet50", choices=names,
                   help=f"model architecture: {' | '.join(names)} (default: resnet50)")
    p.add_argument("-j", "--workers", default=None, type=NATURAL, metavar="N",
                   help="data loading workers per rank (default: paratrain's: 0 on CPU, "
                        "min(4, cores per rank) on GPUs)")
    p.add_argument("--epochs", default=90, type=COUNT, metavar="N", help="total epochs to run")
    p.add_argument("-b", "--batch-size", default=256, type=COUNT, metavar="N",
                   help="global batch over all ranks (default: 256); the world size must "
                        "divide it")
    p.add_argument("--lr", "--learning-rate", default=0.1, type=POSITIVE, metavar="LR", dest="lr",
                   help="initial learning rate")
    p.add_argument("--lr-step", default=30, type=COUNT, metavar="N",
                   help="divide the learning rate by 10 every N epochs (default: 30)")
    p.add_argument("--momentum", default=0.9, type=FRACTION, metavar="M", help="momentum")
    p.add_argument("--wd", "--weight-decay", default=1e-4, type=NON_NEGATIVE, metavar="W",
                   dest="weight_decay", help="weight decay (default: 1e-4)")
    p.add_argument("-p", "--print-freq", default=10, type=COUNT, metavar="N",
                   help="print frequency in batches (default: 10)")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="PATH",
                   help="continue from the newest checkpoint of the run dir (no PATH), or of "
                        "the run dir or checkpoint folder PATH; a file PATH loads only its "
                        "weights (e.g. model_best.pt)")
    p.add_argument("-e", "--evaluate", action="store_true",
                   help="evaluate the model on the validation set and exit")
    p.add_argument("--pretrained", action="store_true", help="use torchvision's trained weights")
    p.add_argument("--seed", default=None, type=int,
                   help="seed for initialisation and data order (default: 0); setting it also "
                        "makes cuDNN deterministic")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="fp32 (default), or autocast to bf16 / fp16 (fp16 with loss scaling)")
    p.add_argument("--channels-last", action="store_true",
                   help="NHWC memory format for the model and images (faster convolutions "
                        "with bf16/fp16 on GPUs)")
    p.add_argument("--image-size", default=224, type=COUNT, metavar="N",
                   help="training crop; validation resizes to N/0.875 and crops N "
                        "(default: 224)")
    p.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm statistics over every rank's batch (SyncBatchNorm; GPUs only)")
    p.add_argument("--no-accel", action="store_true", help="run on the CPU even with a GPU")
    p.add_argument("--run-dir", default=None,
                   help="checkpoints, metrics and model_best.pt (default: paratrain run's "
                        "--run-dir, else runs/paratrain)")
    # fmt: on
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.seed is not None:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True  # fixed image size: pick the fastest kernels once
    resume_dir, expected, weights = resume_source(args.resume)
    datasets = image_folders(args)  # before the run starts: a wrong DIR fails at once
    with pt.Run(
        precision=args.precision,
        seed=args.seed or 0,
        run_dir=args.run_dir,
        ckpt_dir=resume_dir,
        accelerator="cpu" if args.no_accel else "auto",
        num_workers=args.workers,
        sync_batchnorm=args.sync_bn,
    ) as run:
        run.print(f"=> images and models: {vision.BACKEND}")
        if args.resume and weights is None:
            check_checkpoint(run, args.arch, expected)
        parts = prepare(run, args, weights, datasets)
        if (args.resume and weights is None) or run.restart_count > 0:
            run.resume()  # everything registered: weights, optimizer, scheduler, data position
            if run.resumed_from is not None:
                run.print(f"=> resumed from '{run.resumed_from}' (epoch {run.epoch})")
        if args.evaluate:
            val = validate(parts.val_loader, parts.model, parts.criterion, run, args)
            run.log({f"val/{k}": v for k, v in val.items()})
        else:
            fit(run, args, parts)


@dataclass
class Parts:
    """What prepare() set up and registered with the run."""

    model: nn.Module
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: StepLR
    train_loader: Any
    val_loader: Any
    classes: int


def prepare(
    run: pt.Run, args: argparse.Namespace, weights: Path | None, datasets: tuple[Any, Any]
) -> Parts:
    """Loaders of ``datasets`` (train, val), model, optimizer and the per-epoch scheduler,
    registered with ``run``."""
    per_rank = per_rank_batch(args.batch_size, run.data_size)
    train_set, val_set = datasets
    classes = len(val_set.classes)
    model = build_model(run, args, classes)
    if weights is not None:
        run.print(f"=> loading weights '{weights}'")
        pt.load_weights(model, weights)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    # Divides the learning rate by 10 every lr_step epochs; registered, so it is checkpointed.
    scheduler = StepLR(optimizer, step_size=args.lr_step, gamma=0.1)
    model, optimizer = run.setup(model, optimizer, scheduler=scheduler)
    train_loader = None
    if train_set is not None:
        train_loader = run.loader(train_set, batch_size=per_rank, shuffle=True)
    val_loader = run.eval_loader(val_set, batch_size=per_rank)  # every image once, over ranks
    return Parts(
        model, nn.CrossEntropyLoss(), optimizer, scheduler, train_loader, val_loader, classes
    )


def fit(run: pt.Run, args: argparse.Namespace, parts: Parts) -> None:
    """Train and validate each epoch; checkpoint it, and keep the best weights."""
    # -1 before the first epoch: its weights are the best so far, whatever their accuracy
    best_acc1 = float(run.extras.get("best_acc1", -1.0))
    for epoch in run.epochs(args.epochs):
        trained = train(
            parts.train_loader, parts.model, parts.criterion, parts.optimizer, run, epoch, args
        )
        val = validate(parts.val_loader, parts.model, parts.criterion, run, args)
        lr = parts.scheduler.get_last_lr()[0]
        parts.scheduler.step()
        if val["acc1"] > best_acc1:
            best_acc1 = val["acc1"]
            path = run.save_weights(parts.model, run.run_dir / "model_best.pt")
            run.print(f"=> best Acc@1 {best_acc1:.3f}: weights in '{path}'")
        run.save(extras={"best_acc1": best_acc1, "arch": args.arch, "classes": parts.classes})
        run.log(
            {"epoch": epoch, "lr": lr, "best_acc1": best_acc1}
            | {f"train/{k}": v for k, v in trained.items()}
            | {f"val/{k}": v for k, v in val.items()}
        )
        run.print(
            f"=> epoch {epoch} of {args.epochs}: train loss {trained['loss']:.4f} "
            f"Acc@1 {trained['acc1']:.3f} | val loss {val['loss']:.4f} Acc@1 "
            f"{val['acc1']:.3f} Acc@5 {val['acc5']:.3f} | lr {lr:.4g} | best Acc@1 "
            f"{best_acc1:.3f}"
        )


def resume_source(resume: str | None) -> tuple[Path | None, Path | None, Path | None]:
    """What ``--resume`` names: (checkpoint folder to use, the one checkpoint it must resume,
    a weights file). No PATH: the run dir's own checkpoints."""
    if resume is None or resume == "latest":
        return None, None, None
    path = Path(resume)
    if path.is_file():
        return None, None, path
    if (path / "manifest.json").is_file():  # one checkpoint: resume from its folder
        return path.parent, path, None
    if (path / "checkpoints").is_dir():  # a run dir
        return path / "checkpoints", None, None
    if path.is_dir():
        return path, None, None
    fail(f"--resume {resume}: no such file or folder")


def check_checkpoint(run: pt.Run, arch: str, expected: Path | None) -> None:
    """Refuse a checkpoint of another architecture, or not the one ``--resume`` named."""
    info = run.latest_checkpoint()
    if info is None:
        return
    if expected is not None and info.folder.resolve() != expected.resolve():
        fail(
            f"--resume {expected}: paratrain resumes the newest valid checkpoint of a folder, "
            f"and in {info.folder.parent} that is {info.folder.name}. Pass the folder, or move "
            "the newer checkpoints out of it."
        )
    saved = info.extras.get("arch")
    if saved is not None and saved != arch:
        fail(f"{info.folder} holds a {saved}, not a {arch}: pass -a {saved}")


def image_folders(args: argparse.Namespace) -> tuple[Any, Any]:
    """The training (None with --evaluate) and validation ImageFolders with the usual crops."""
    tf = vision.transforms
    normalize = tf.Normalize(mean=MEAN, std=STD)
    train_tf = tf.Compose([tf.RandomResizedCrop(args.image_size), tf.RandomHorizontalFlip(),
                           tf.ToTensor(), normalize])  # fmt: skip
    val_tf = tf.Compose([tf.Resize(int(args.image_size / 0.875)), tf.CenterCrop(args.image_size),
                         tf.ToTensor(), normalize])  # fmt: skip
    val_set = image_folder(args.data, "val", val_tf)
    if args.evaluate:
        return None, val_set
    train_set = image_folder(args.data, "train", train_tf)
    if train_set.classes != val_set.classes:
        fail(
            f"{args.data}: train/ has {len(train_set.classes)} classes and val/ "
            f"{len(val_set.classes)}, or they are named differently; both need the same class "
            "folders."
        )
    return train_set, val_set


def image_folder(data: str, split: str, transform: Any) -> Any:
    """``DIR/split`` as an ImageFolder; fail with the layout it needs when it is not one."""
    folder = Path(data, split)
    if not folder.is_dir():
        fail(f"{folder if Path(data).is_dir() else data}: no such folder. {LAYOUT}.")
    try:
        return vision.datasets.ImageFolder(folder, transform)
    except FileNotFoundError as err:  # no class folder in it, or a class folder without images
        fail(f"{str(err).rstrip('.')}. {LAYOUT}.")


def build_model(run: pt.Run, args: argparse.Namespace, classes: int) -> nn.Module:
    """A fresh model, or torchvision's trained one (one download per machine, then the cache)."""
    if not args.pretrained:
        run.print(f"=> creating model '{args.arch}'")
        return vision.create_model(args.arch, num_classes=classes)
    run.print(f"=> using pre-trained model '{args.arch}'")
    if run.local_rank == 0:
        model = vision.create_model(args.arch, num_classes=classes, pretrained=True)
    run.barrier()
    if run.local_rank != 0:
        model = vision.create_model(args.arch, num_classes=classes, pretrained=True)
    return model


def per_rank_batch(batch: int, ranks: int) -> int:
    """``-b`` is the global batch, as the original's learning rate assumes."""
    if batch % ranks:
        fail(
            f"-b {batch} is the global batch; it does not divide over {ranks} ranks. Pass a "
            f"multiple of {ranks}, e.g. -b {max(1, batch // ranks) * ranks}."
        )
    return batch // ranks


def train(loader: Any, model: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer,
          run: pt.Run, epoch: int, args: argparse.Namespace) -> dict[str, float]:  # fmt: skip
    """One epoch; returns loss and accuracy averaged over every sample of every rank."""
    batch_time, data_time = Meter("Time", ":6.3f"), Meter("Data", ":6.3f")
    losses, top1, top5 = Meter("Loss", ":.4e"), Meter("Acc@1", ":6.2f"), Meter("Acc@5", ":6.2f")
    progress = Progress(
        len(loader), [batch_time, data_time, losses, top1, top5], f"Epoch: [{epoch}]"
    )
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(loader):  # batches arrive on run.device
        data_time.update(time.time() - end)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        output = model(images)  # under autocast with --precision bf16/fp16; fp32 outputs
        loss = criterion(output, target)
        correct1, correct5 = correct(output, target, (1, 5))
        n = images.size(0)
        losses.update(loss.detach() * n, n)
        top1.update(correct1 * 100, n)
        top5.update(correct5 * 100, n)
        run.backward(loss)  # fp16: scaled
        run.step(optimizer)  # unscale, step, zero_grad
        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0:
            run.print(progress.line(i + 1))
    return {m.key: m.total(run) for m in (losses, top1, top5)}


def validate(loader: Any, model: nn.Module, criterion: nn.Module, run: pt.Run,
             args: argparse.Namespace) -> dict[str, float]:  # fmt: skip
    """Loss, Acc@1 and Acc@5 over the whole validation set: every image counted once."""
    batch_time, losses = Meter("Time", ":6.3f"), Meter("Loss", ":.4e")
    top1, top5 = Meter("Acc@1", ":6.2f"), Meter("Acc@5", ":6.2f")
    progress = Progress(len(loader), [batch_time, losses, top1, top5], "Test: ")
    model.eval()
    end = time.time()
    with torch.no_grad():
        for i, (images, target) in enumerate(loader):
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            output = model(images)
            n = images.size(0)
            correct1, correct5 = correct(output, target, (1, 5))
            losses.update(criterion(output, target) * n, n)
            top1.update(correct1 * 100, n)
            top5.update(correct5 * 100, n)
            batch_time.update(time.time() - end)
            end = time.time()
            if i % args.print_freq == 0:
                run.print(progress.line(i + 1))
    result = {m.key: m.total(run) for m in (losses, top1, top5)}
    run.print(f" * Acc@1 {result['acc1']:.3f} Acc@5 {result['acc5']:.3f}")
    return result


def correct(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...]) -> list[Any]:
    """How many samples have the target among the top k predictions, for each k (a k beyond
    the number of classes counts every sample)."""
    maxk = min(max(topk), output.size(1))
    pred = output.topk(maxk, 1, True, True).indices.t()
    hits = pred.eq(target.view(1, -1).expand_as(pred))
    return [hits[: min(k, maxk)].sum() for k in topk]


class Meter:
    """A running sum and count. Sums may be tensors on the device: nothing waits for the GPU
    until a line is printed."""

    def __init__(self, name: str, fmt: str):
        self.name, self.fmt = name, fmt
        self.key = name.lower().replace("@", "")
        self.sum: Any = 0.0
        self.count = 0
        self.last: Any = 0.0

    def update(self, total: Any, n: int = 1) -> None:
        """Add ``total`` (the sum over ``n`` samples: loss x n, hits x 100, ...)."""
        self.sum = self.sum + total
        self.count += n
        self.last = total / n

    def total(self, run: pt.Run) -> float:
        """The average over every sample of every rank (collective)."""
        sums = torch.tensor([float(self.sum), float(self.count)], dtype=torch.float64)
        sums = run.reduce(sums.to(run.device), "sum")
        return float(sums[0] / sums[1]) if sums[1] else 0.0

    def __str__(self) -> str:
        last, avg = float(self.last), float(self.sum) / max(self.count, 1)
        return f"{self.name} {last:{self.fmt[1:]}} ({avg:{self.fmt[1:]}})"


class Progress:
    """``Epoch: [3][ 10/500]  Time ...`` lines, as the original prints them."""

    def __init__(self, batches: int, meters: list[Meter], prefix: str):
        self.meters, self.prefix, self.width = meters, prefix, len(str(batches))
        self.batches = batches

    def line(self, batch: int) -> str:
        head = f"{self.prefix}[{batch:{self.width}d}/{self.batches}]"
        return "\t".join([head] + [str(m) for m in self.meters])


if __name__ == "__main__":
    main()

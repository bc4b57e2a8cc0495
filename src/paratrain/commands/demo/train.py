"""The demo's training job; every rank runs this module (``paratrain demo`` launches it).

    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 \
        -m paratrain.commands.demo.train --run-dir runs/demo --epochs 12 --crash-in-epoch 7

Writes into the run dir: ``model.pt`` (unprefixed weights), ``metrics.jsonl`` (each step's
loss on the main process, and per epoch the mean loss, test accuracy and the seconds its
training pass took), TensorBoard events, a checkpoint after every epoch under
``checkpoints/``, and ``train_result.json`` (test accuracy from the distributed evaluation).

With ``--crash-in-epoch K`` the last rank kills itself (SIGKILL, as the kernel's out-of-memory
killer would) halfway through epoch K on the first attempt. Launched with ``--max-restarts 1``,
torchrun then restarts every rank, and ``pt.Run`` resumes from the newest checkpoint by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import paratrain as pt
from paratrain.commands.demo.artefacts import KEEP_CHECKPOINTS, DemoFiles
from paratrain.commands.demo.digits import DigitsCNN, accuracy_counts, digits_datasets
from paratrain.commands.demo.records import STEP_LOSS
from paratrain.data.loader import DeviceLoader
from paratrain.distributed.entrypoint import exit_on_user_error


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo job's options (the ``paratrain demo`` command forwards them)."""
    p = argparse.ArgumentParser(prog="paratrain.commands.demo.train")
    p.add_argument("--run-dir", type=Path, default=Path("runs/demo"), help="where to write")
    p.add_argument("--epochs", type=int, default=12, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (one-cycle)")
    p.add_argument("--strategy", default="auto", help="pt.Run's strategy")
    p.add_argument("--precision", default="fp32", help="pt.Run's precision")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and shuffling")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--crash-in-epoch",
        type=int,
        default=0,
        help="on the first attempt, the last rank kills itself halfway through this epoch "
        "(counted from 1; 0: never)",
    )
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict[str, object]:
    """Train, evaluate exactly once per sample across ranks, save; return the final metrics."""
    files = DemoFiles(args.run_dir)
    config = pt.RunConfig(
        strategy=args.strategy,
        precision=args.precision,
        grad_accum=args.grad_accum,
        seed=args.seed,
        run_dir=args.run_dir,
        ckpt_dir=files.checkpoints,
        keep_last=KEEP_CHECKPOINTS,
        tensorboard=True,
        progress=not args.no_progress,
    )
    with pt.Run(config) as run:
        if run.device.type == "cuda":  # the demo compares its resume bit for bit: GPUs need
            torch.use_deterministic_algorithms(True, warn_only=True)  # deterministic kernels
        train_set, test_set = digits_datasets()
        loader = run.loader(train_set, batch_size=args.batch_size, shuffle=True)
        test_loader = run.eval_loader(test_set, batch_size=256)
        model, optimizer, scheduler = _setup(run, args, steps_per_epoch=len(loader))
        accuracy, seen = 0.0, 0
        # After a torchrun restart, run.epochs resumes from the newest checkpoint by itself.
        for epoch in run.epochs(args.epochs):
            started = time.perf_counter()
            mean_loss = _train_pass(run, model, optimizer, scheduler, loader, args)
            train_s = time.perf_counter() - started
            correct, seen = accuracy_counts(model, test_loader)
            accuracy = run.reduce(correct, "sum") / run.reduce(seen, "sum")
            run.log(
                {
                    "train/loss": mean_loss,
                    "test/accuracy": accuracy,
                    "epoch": epoch,
                    "time/train_s": train_s,  # the pass alone: no evaluation, no checkpoint
                }
            )
            run.print(
                f"epoch {epoch + 1:2d}/{args.epochs}  loss {mean_loss:.4f}  "
                f"test accuracy {accuracy:.4f}  ({train_s:.2f} s)"
            )
            run.save()  # every epoch: a crash loses at most the epoch in progress
        run.save_weights(model, files.weights)
        return _report(run, files, accuracy=accuracy, seen=seen)


def _report(run: pt.Run, files: DemoFiles, *, accuracy: float, seen: int) -> dict[str, object]:
    """The run's result, written to ``train_result.json`` by the main process."""
    result = {
        "test_accuracy": accuracy,
        "test_samples": run.reduce(seen, "sum"),
        "world_size": run.world_size,
        "strategy": run.strategy.name,
        "device": run.device.type,
        "steps": run.global_step,
        "restarts": run.restart_count,
        "resumed_from": str(run.resumed_from) if run.resumed_from else None,
    }
    if run.is_main:
        files.result.write_text(json.dumps(result, indent=2))
    return result


def _setup(
    run: pt.Run, args: argparse.Namespace, *, steps_per_epoch: int
) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The model, its optimizer and a one-cycle schedule, all registered for checkpoints."""
    net = DigitsCNN()
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    steps = args.epochs * -(-steps_per_epoch // args.grad_accum)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=steps)
    model, optimizer = run.setup(net, optimizer, scheduler=scheduler)
    return model, optimizer, scheduler


def _train_pass(
    run: pt.Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: DeviceLoader[Any],
    args: argparse.Namespace,
) -> float:
    """One pass over the training set; the mean loss over its batches and over ranks."""
    criterion = nn.CrossEntropyLoss()
    loss_sum, batches, window = 0.0, 0, []
    with _Crash(run, args, batches=len(loader)) as crash:
        for x, y in run.progress(loader, desc=f"epoch {run.epoch + 1}/{args.epochs}"):
            crash.at(batches)
            step = run.global_step
            with run.accumulate(model):
                loss = criterion(model(x), y)
                run.backward(loss)
            run.step(optimizer, scheduler)
            value = loss.item()  # one wait for the device per step, not two
            loss_sum, batches = loss_sum + value, batches + 1
            window.append(value)
            if run.global_step != step:  # the window's last micro-batch: the optimizer stepped
                run.log({STEP_LOSS: sum(window) / len(window)})  # the main process's, each step
                window.clear()
    return float(run.reduce(loss_sum / batches, "mean"))


class _PeerKilled(Exception):
    """Raised on the ranks that outlive the crash, where they stop with it."""


class _Crash:
    """The demo's crash: on the first attempt, halfway through the epoch ``--crash-in-epoch``
    names, the last rank kills itself (SIGKILL: no cleanup, no message).

    The other ranks fail a moment later in the step's gradient all-reduce (gloo: the dead
    rank's connection closes). On GPUs they stop at the crash instead: NCCL would keep them
    waiting for the dead rank until torchrun's stop timeout (30 s). Either way they say so in
    one line and exit; torchrun restarts every rank.
    """

    def __init__(self, run: pt.Run, args: argparse.Namespace, *, batches: int) -> None:
        self.run = run
        self.last = run.world_size - 1
        chosen = run.restart_count == 0 and run.epoch + 1 == args.crash_in_epoch
        self.batch = batches // 2 if chosen else -1
        self.happened = False

    def __enter__(self) -> _Crash:
        if self.batch >= 0:
            self.run.print(
                f"epoch {self.run.epoch + 1:2d}: rank {self.last} will kill itself (SIGKILL) "
                "halfway through this epoch, as a crash would ..."
            )
        return self

    def at(self, batch: int) -> None:
        """Crash if ``batch`` (counted from 0 in this pass) is the chosen one."""
        if batch != self.batch:
            return
        self.happened = True
        if self.run.rank == self.last:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.run.device.type == "cuda":
            raise _PeerKilled

    def __exit__(self, kind: type[BaseException] | None, err: object, tb: object) -> None:
        if not self.happened or kind is None or not issubclass(kind, RuntimeError | _PeerKilled):
            return
        how = "lost it in the gradient all-reduce" if issubclass(kind, RuntimeError) else "stop"
        self.run.print(
            f"epoch {self.run.epoch + 1:2d}: rank {self.last} is dead; the other ranks {how} and "
            "exit. torchrun restarts every rank, which import torch again and resume from the "
            "newest checkpoint ..."
        )
        raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> None:
    """Entry point of every rank."""
    args = parse_args(argv)
    try:
        exit_on_user_error(lambda: train(args))
    except KeyboardInterrupt:  # a Ctrl-C reaches every rank; `paratrain demo` reports it once
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()

"""The demo's training job; every rank runs this module (``paratrain demo`` launches it).

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m paratrain.demo.train \
        --run-dir runs/demo --epochs 12

Writes ``model.pt`` (unprefixed weights), ``metrics.jsonl``, TensorBoard events and
``train_result.json`` (test accuracy from the distributed evaluation) into the run dir.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

import paratrain as pt
from paratrain.demo.digits import DigitsCNN, accuracy_counts, digits_datasets
from paratrain.distributed.entrypoint import exit_on_user_error


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo job's options (the ``paratrain demo`` command forwards them)."""
    p = argparse.ArgumentParser(prog="paratrain.demo.train")
    p.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict[str, object]:
    """Train, evaluate exactly once per sample across ranks, save; return the final metrics."""
    train_set, test_set = digits_datasets()
    config = pt.RunConfig(
        strategy=args.strategy,
        precision=args.precision,
        grad_accum=args.grad_accum,
        seed=args.seed,
        run_dir=args.run_dir,
        tensorboard=True,
        progress=not args.no_progress,
    )
    with pt.Run(config) as run:
        net = DigitsCNN()
        model, optimizer = run.setup(
            net, torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
        )
        loader = run.loader(train_set, batch_size=args.batch_size, shuffle=True)
        test_loader = run.eval_loader(test_set, batch_size=256)
        steps = args.epochs * -(-len(loader) // args.grad_accum)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=steps)
        criterion = nn.CrossEntropyLoss()
        accuracy = 0.0
        for epoch in run.epochs(args.epochs):
            loss_sum, batches = 0.0, 0
            for x, y in run.progress(loader):
                with run.accumulate(model):
                    loss = criterion(model(x), y)
                    run.backward(loss)
                run.step(optimizer, scheduler)
                loss_sum, batches = loss_sum + loss.item(), batches + 1
            correct, seen = accuracy_counts(model, test_loader)
            accuracy = run.reduce(correct, "sum") / run.reduce(seen, "sum")
            mean_loss = run.reduce(loss_sum / batches, "mean")
            run.log({"train/loss": mean_loss, "test/accuracy": accuracy, "epoch": epoch})
            run.print(
                f"epoch {epoch + 1:2d}/{args.epochs}  loss {mean_loss:.4f}  "
                f"test accuracy {accuracy:.4f}"
            )
        weights = run.save_weights(model, args.run_dir / "model.pt")
        result = {
            "test_accuracy": accuracy,
            "test_samples": run.reduce(seen, "sum"),
            "world_size": run.world_size,
            "strategy": run.strategy.name,
            "steps": run.global_step,
            "weights": str(weights),
        }
        if run.is_main:
            (args.run_dir / "train_result.json").write_text(json.dumps(result, indent=2))
        return result


def main(argv: list[str] | None = None) -> None:
    """Entry point of every rank."""
    args = parse_args(argv)
    exit_on_user_error(lambda: train(args))


if __name__ == "__main__":
    main()

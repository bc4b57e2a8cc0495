"""Train a GPT on the token files of ``prepare.py``: nanoGPT's ``train.py`` loop on paratrain.

    python examples/gpt/prepare.py                                   # data/gpt/{train,val}.bin
    python examples/gpt/train.py --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 \\
        --batch-size 16 --max-iters 200 --eval-interval 50 --eval-iters 10   # one process, CPU
    paratrain run --nproc 8 examples/gpt/train.py --strategy fsdp    # 8 GPUs, FSDP2
    paratrain run --nproc 8 examples/gpt/train.py --strategy tp --tp 2 --global-batch 512
    paratrain run --nproc 8 --max-restarts 3 --run-dir runs/gpt examples/gpt/train.py

The defaults are nanoGPT's ``config/train_shakespeare_char.py`` (6 layers, 6 heads, 384 wide,
context 256, per-rank batch 64, lr 1e-3 with 100 warm-up iterations and cosine decay). Started
again with the same run dir it continues from the newest checkpoint there: the model's shape,
the step, the optimizer, every rank's random generators and the best validation loss come back,
and the learning rate follows from the step. ``model.pt`` and ``model_args.json`` in the run
dir are the final weights and the shape to build them into (see README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from model import GPT, Block, GPTConfig, tp_plan

import paratrain as pt

SHAPE = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias")
"""GPTConfig fields a checkpoint fixes (dropout may change between runs)."""


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


def parser() -> argparse.ArgumentParser:
    """The command line; see the module docstring for examples."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=Path("data/gpt"), help="prepare.py output")
    p.add_argument("--run-dir", help="default: paratrain run's --run-dir, else runs/paratrain")
    p.add_argument("--strategy", default="auto", choices=("auto", "ddp", "fsdp", "tp"))
    p.add_argument("--tp", type=COUNT, help="tp size with --strategy tp (default: every rank)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), help="default: bf16 on GPUs")
    p.add_argument("--seed", type=int, default=1337)
    batch = p.add_argument_group("batch")
    batch.add_argument("--batch-size", type=COUNT, default=64, help="sequences per micro-batch")
    batch.add_argument("--block-size", type=COUNT, default=256, help="tokens per sequence")
    total = batch.add_mutually_exclusive_group()
    total.add_argument("--global-batch", type=COUNT, help="sequences per optimizer step, all ranks")
    total.add_argument("--global-batch-tokens", type=COUNT, help="the same, counted in tokens")
    model = p.add_argument_group("model")
    model.add_argument("--n-layer", type=COUNT, default=6)
    model.add_argument("--n-head", type=COUNT, default=6)
    model.add_argument("--n-embd", type=COUNT, default=384)
    model.add_argument("--dropout", type=FRACTION, default=0.2)
    model.add_argument("--no-bias", dest="bias", action="store_false")
    opt = p.add_argument_group("optimizer and schedule")
    opt.add_argument("--lr", type=POSITIVE, default=1e-3, help="peak learning rate")
    opt.add_argument("--min-lr", type=NON_NEGATIVE, help="end of the cosine (default: lr / 10)")
    opt.add_argument("--warmup-iters", type=NATURAL, default=100)
    opt.add_argument("--lr-decay-iters", type=NATURAL, help="cosine's end (default: max-iters)")
    opt.add_argument("--max-iters", type=NATURAL, default=5000, help="0 only evaluates")
    opt.add_argument("--weight-decay", type=NON_NEGATIVE, default=0.1)
    opt.add_argument("--beta1", type=FRACTION, default=0.9)
    opt.add_argument("--beta2", type=FRACTION, default=0.99)
    opt.add_argument("--grad-clip", type=NON_NEGATIVE, default=1.0, help="0 disables clipping")
    log = p.add_argument_group("evaluation and logging")
    log.add_argument("--eval-interval", type=COUNT, default=250, help="evaluate and save every N")
    log.add_argument("--eval-iters", type=COUNT, default=200, help="batches per rank and split")
    log.add_argument("--log-interval", type=COUNT, default=10)
    log.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events")
    log.add_argument("--log-to", default="", help="trackers, e.g. mlflow,wandb (or tensorboard)")
    log.add_argument("--peak-tflops", type=POSITIVE, default=312.0, help="per GPU, for MFU (A100)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with the defaults that depend on others filled in."""
    p = parser()
    args = p.parse_args(argv)
    if args.global_batch_tokens is not None:
        if args.global_batch_tokens % args.block_size:
            p.error(
                f"--global-batch-tokens {args.global_batch_tokens} is not a multiple of "
                f"--block-size {args.block_size}: a step takes whole sequences."
            )
        args.global_batch = args.global_batch_tokens // args.block_size
    if args.n_embd % args.n_head:
        p.error(
            f"--n-embd {args.n_embd} is not a multiple of --n-head {args.n_head}: each head "
            "takes n_embd / n_head features."
        )
    if args.tp is not None and args.strategy != "tp":
        p.error(f"--tp {args.tp} splits layers under --strategy tp only; add --strategy tp.")
    if args.precision is None:
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        args.precision = "bf16" if bf16 else "fp32"
    args.min_lr = args.lr / 10 if args.min_lr is None else args.min_lr
    args.lr_decay_iters = args.max_iters if args.lr_decay_iters is None else args.lr_decay_iters
    return args


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Keywords for ``pt.Run``: the strategy and what it reads, batch, precision, clipping."""
    settings: dict[str, Any] = {
        "strategy": args.strategy,
        "precision": args.precision,
        "seed": args.seed,
        "max_grad_norm": args.grad_clip or None,
        "run_dir": args.run_dir,
        "progress": False,
        "tensorboard": args.tensorboard,
        "log_to": [name for name in args.log_to.split(",") if name],
    }
    if args.global_batch is not None:  # grad_accum = global / (per-rank x data-parallel ranks)
        settings.update(global_batch=args.global_batch, per_rank_batch=args.batch_size)
    if args.strategy in ("fsdp", "tp"):
        settings["fsdp_wrap"] = (Block,)  # one all-gather per block, not one for the model
    if args.strategy == "tp":
        settings["tp_plan"] = tp_plan()
        if args.tp is not None:
            settings["mesh"] = {"dp": -1, "tp": args.tp}
    return settings


def lr_at(it: int, args: argparse.Namespace) -> float:
    """nanoGPT's schedule: linear warm-up, cosine decay to ``min_lr``, then ``min_lr``."""
    if it < args.warmup_iters:
        return args.lr * (it + 1) / (args.warmup_iters + 1)
    if it > args.lr_decay_iters:
        return args.min_lr
    ratio = (it - args.warmup_iters) / max(1, args.lr_decay_iters - args.warmup_iters)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - args.min_lr)


def eval_offsets(length: int, block_size: int, count: int) -> np.ndarray:
    """Start positions of the ``count`` evaluation windows of a split: evenly spread, fixed."""
    return np.linspace(0, length - block_size - 1, count).astype(np.int64)


@dataclass(frozen=True)
class Tokens:
    """Batches of ``block_size`` windows from ``train.bin``/``val.bin`` (uint16 token ids)."""

    data_dir: Path
    block_size: int
    batch_size: int
    device: torch.device

    def split(self, name: str) -> np.memmap:
        # A fresh memmap per batch, as nanoGPT does: a long-lived one keeps every page it
        # touched resident, which grows with the file.
        return np.memmap(self.data_dir / f"{name}.bin", dtype=np.uint16, mode="r")

    def check(self) -> None:
        """Fail with the fix when a split is shorter than one window. The length comes from
        the file's size: numpy cannot map an empty file."""
        for name in ("train", "val"):
            path = self.data_dir / f"{name}.bin"
            length = path.stat().st_size // np.dtype(np.uint16).itemsize
            if length <= self.block_size + 1:
                fail(
                    f"{path} holds {length} tokens, too few for one window of --block-size "
                    f"{self.block_size}: prepare more text or shorten the block."
                )

    def batch(
        self, name: str, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets; random windows unless ``starts`` are given.

        Random starts come from torch's global generator, which paratrain seeds differently
        on each data-parallel rank and saves with every checkpoint."""
        data = self.split(name)
        if starts is None:
            starts = torch.randint(len(data) - self.block_size, (self.batch_size,))
        rows = [data[i : i + 1 + self.block_size].astype(np.int64) for i in starts.tolist()]
        xy = torch.from_numpy(np.stack(rows))
        if self.device.type == "cuda":
            xy = xy.pin_memory().to(self.device, non_blocking=True)
        else:
            xy = xy.to(self.device)
        return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()


@torch.no_grad()
def estimate_loss(
    run: pt.Run, model: torch.nn.Module, tokens: Tokens, iters: int
) -> dict[str, float]:
    """Mean loss on ``iters`` batches per rank and split, averaged over the ranks.

    The windows are fixed (evenly spread over the split, each data-parallel rank its share),
    so successive evaluations compare the same text and draw nothing from the random
    generators that pick training batches."""
    model.eval()
    out: dict[str, float] = {}
    per_rank = iters * tokens.batch_size
    for name in ("train", "val"):
        starts = eval_offsets(len(tokens.split(name)), tokens.block_size, per_rank * run.data_size)
        mine = torch.from_numpy(starts[run.data_rank * per_rank : (run.data_rank + 1) * per_rank])
        losses = [model(*tokens.batch(name, b))[1] for b in mine.split(tokens.batch_size)]
        out[name] = run.reduce(float(torch.stack(losses).mean()), "mean")
    model.train()
    return out


def model_config(run: pt.Run, args: argparse.Namespace, vocab_size: int) -> GPTConfig:
    """The flags' shape, or the shape of the checkpoint this run will resume (as nanoGPT's
    ``init_from='resume'`` does)."""
    config = GPTConfig(
        block_size=args.block_size,
        vocab_size=vocab_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        dropout=args.dropout,
        bias=args.bias,
    )
    info = run.latest_checkpoint()
    if info is None or "model_args" not in info.extras:
        return config
    saved = {k: info.extras["model_args"][k] for k in SHAPE}
    changed = {k: v for k, v in saved.items() if getattr(config, k) != v}
    if changed:
        run.print(f"the checkpoint in {info.folder} fixes {changed}; flags giving others ignored")
    return replace(config, **saved)


def evaluate(
    run: pt.Run, model: torch.nn.Module, tokens: Tokens, it: int, args: argparse.Namespace
) -> float:
    """Print and log train and val loss at iteration ``it``; return the val loss."""
    losses = estimate_loss(run, model, tokens, args.eval_iters)
    run.print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    run.log({"train/loss": losses["train"], "val/loss": losses["val"]}, step=it)
    return losses["val"]


@dataclass
class Timer:
    """Time per iteration and nanoGPT's running MFU (GPUs only: a CPU has no peak to quote)."""

    flops_per_iter: float
    peak_flops: float
    """Summed over the ranks."""
    gpu: bool
    t0: float = field(default_factory=time.time)
    iters: int = 0
    running_mfu: float = -1.0

    def lap(self) -> str:
        t1 = time.time()
        dt, self.t0 = t1 - self.t0, t1
        self.iters += 1
        text = f"time {dt * 1000:.2f}ms"
        if self.gpu and self.iters > 5:  # let the loop settle first
            mfu = self.flops_per_iter / dt / self.peak_flops
            self.running_mfu = mfu if self.running_mfu < 0 else 0.9 * self.running_mfu + 0.1 * mfu
            text += f", mfu {self.running_mfu * 100:.2f}%"
        return text


def train(
    run: pt.Run,
    args: argparse.Namespace,
    config: GPTConfig,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """nanoGPT's loop from ``run.global_step`` to ``--max-iters``: evaluate and save every
    ``--eval-interval`` iterations and at the end."""
    tokens = Tokens(args.data_dir, config.block_size, args.batch_size, run.device)
    best_val_loss = run.extras.get("best_val_loss", float("inf"))
    # Every save follows an evaluation at its step, so a resumed run does not repeat it.
    evaluated = saved = run.global_step if run.resumed_from is not None else None
    accum = run.config.grad_accum
    global_batch = args.batch_size * run.data_size * accum
    run.print(f"tokens per iteration will be: {global_batch * config.block_size:,}")
    flops = run.unwrap(model).flops_per_token() * config.block_size * global_batch
    timer = Timer(flops, run.world_size * args.peak_tflops * 1e12, run.device.type == "cuda")
    while (it := run.global_step) < args.max_iters:
        lr = lr_at(it, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % args.eval_interval == 0 and it != evaluated:
            best_val_loss = min(best_val_loss, evaluate(run, model, tokens, it, args))
            evaluated = it
            if it > 0:
                saved = it
                run.save(extras=checkpoint_extras(args, config, best_val_loss))
        for _ in range(accum):
            x, y = tokens.batch("train")
            with run.accumulate(model):
                _, loss = model(x, y)
                run.backward(loss)  # divided by grad_accum; no all-reduce until the last
        run.step(optimizer)  # clips to --grad-clip, steps, zeroes the gradients
        lap = timer.lap()
        if it % args.log_interval == 0:
            lossf = loss.item()  # this rank's last micro-batch, as nanoGPT prints
            run.print(f"iter {it}: loss {lossf:.4f}, {lap}")
            run.log({"loss": lossf, "lr": lr}, step=it)
    if run.global_step != evaluated:
        best_val_loss = min(best_val_loss, evaluate(run, model, tokens, run.global_step, args))
    if run.global_step != saved:
        run.save(extras=checkpoint_extras(args, config, best_val_loss))


def checkpoint_extras(
    args: argparse.Namespace, config: GPTConfig, best_val_loss: float
) -> dict[str, Any]:
    """What a checkpoint keeps beside the state paratrain saves: plain data only."""
    flags = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {"model_args": asdict(config), "best_val_loss": best_val_loss, "config": flags}


def read_meta(data_dir: Path) -> dict[str, Any]:
    """``meta.json`` of ``prepare.py``, once its three files are there and the splits hold
    tokens; checked before the run starts, so that no rank sets anything up for nothing."""
    for name in ("meta.json", "train.bin", "val.bin"):
        path = data_dir / name
        if not path.is_file():
            fail(f"{path} is missing: run examples/gpt/prepare.py --out-dir {data_dir} first.")
        if path.stat().st_size == 0:
            fail(f"{path} is empty: run examples/gpt/prepare.py --out-dir {data_dir} on more text.")
    meta: dict[str, Any] = json.loads((data_dir / "meta.json").read_text())
    return meta


def main() -> None:
    args = parse_args()
    meta = read_meta(args.data_dir)
    with pt.Run(**run_settings(args)) as run:
        config = model_config(run, args, meta["vocab_size"])
        # before the model is built: a split shorter than the checkpoint's or the flags' window
        Tokens(args.data_dir, config.block_size, args.batch_size, run.device).check()
        model = GPT(config)
        run.print(f"number of parameters: {model.num_params() / 1e6:.2f}M")
        optimizer = model.configure_optimizers(
            weight_decay=args.weight_decay,
            learning_rate=args.lr,
            betas=(args.beta1, args.beta2),
            device_type=run.device.type,
        )
        model, optimizer = run.setup(model, optimizer)
        if run.resume() is not None:  # the newest valid checkpoint in the run dir, if any
            run.print(f"resumed from {run.resumed_from} at iter {run.global_step}")
        train(run, args, config, model, optimizer)
        run.save_weights(model, run.run_dir / "model.pt")
        if run.is_main:
            (run.run_dir / "model_args.json").write_text(json.dumps(asdict(config)) + "\n")


if __name__ == "__main__":
    main()

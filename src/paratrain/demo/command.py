"""``paratrain demo``: check the settings, launch the training on N ranks, reload, report.

paratrain demo [--nproc N] [--epochs 12] [--strategy auto|ddp|fsdp|...] [--run-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from paratrain.cli_types import positive_int
from paratrain.config import RunConfig
from paratrain.data.build import check_batch_size
from paratrain.demo.plot import plot_curves
from paratrain.errors import ConfigError, ParatrainError
from paratrain.launcher.plan import RunOptions, make_plan
from paratrain.launcher.preflight import preflight
from paratrain.paths import check_creatable, make_folder
from paratrain.run_dir import RunDir

TARGET_ACCURACY = 0.95


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain demo``."""
    p = subparsers.add_parser(
        "demo",
        help="train a small CNN on shipped digits data with DDP, reload it, report accuracy",
        description="The embedded default job: DDP training on scikit-learn's digits through "
        "torchrun, exact-once evaluation, saved weights reloaded in a fresh CPU process, "
        "curves as PNG and TensorBoard logs.",
    )
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        help="ranks to launch (default: every GPU, or 2 CPU ranks without GPUs)",
    )
    p.add_argument("--epochs", type=positive_int, default=12)
    p.add_argument(
        "--batch-size", type=positive_int, default=32, help="per-rank batch (default 32)"
    )
    p.add_argument("--strategy", default="auto")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--grad-accum", type=positive_int, default=1)
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where to write (default: a new folder under runs/demo/)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=run_demo)


def _preflight(args: argparse.Namespace) -> int:
    """Validate everything a rank would, before starting any rank; return the rank count."""
    config = RunConfig(strategy=args.strategy, precision=args.precision, grad_accum=args.grad_accum)
    check_batch_size(args.batch_size)  # flags are range-checked by cli_types
    gpus = torch.cuda.device_count()
    nproc: int = args.nproc if args.nproc is not None else (gpus or 2)
    preflight(config, nproc=nproc, gpus=gpus)
    return nproc


def _job_args(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The options ``paratrain.demo.train`` gets on every rank."""
    return [
        "--run-dir",
        str(run_dir),
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--strategy",
        args.strategy,
        "--precision",
        args.precision,
        "--grad-accum",
        str(args.grad_accum),
    ] + (["--no-progress"] if args.no_progress else [])


def run_demo(args: argparse.Namespace) -> int:
    """Train, reload, compare, plot; exit code 0 when both accuracies reach the target."""
    nproc = _preflight(args)
    run_dir = args.run_dir or Path("runs/demo") / time.strftime("%Y%m%d-%H%M%S")
    check_creatable(run_dir, "--run-dir")  # a name the OS refuses is a message, not a traceback
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise ConfigError(
            f"--run-dir {run_dir} is not empty. Pass a new folder, or leave "
            "--run-dir out to get a fresh one under runs/demo/."
        )
    # One node, whatever the environment says (a Slurm allocation included): the demo is local.
    options = RunOptions(
        target=["-m", "paratrain.demo.train", *_job_args(args, run_dir)],
        nproc=str(nproc),
        nnodes=1,
        run_dir=run_dir,
    )
    plan = make_plan(options, env=os.environ, gpus=torch.cuda.device_count())
    make_folder(run_dir, "--run-dir")
    print(f"paratrain demo: {nproc} rank(s) through torchrun, writing to {run_dir}", flush=True)
    env = {**os.environ, **plan.env}
    started = time.perf_counter()
    if subprocess.run(plan.argv, env=env).returncode != 0:
        raise ParatrainError("The demo's training ranks failed; their messages are above.")
    seconds = time.perf_counter() - started
    trained = json.loads((run_dir / "train_result.json").read_text())
    reload = subprocess.run(
        [sys.executable, "-m", "paratrain.demo.evaluate", str(run_dir / "model.pt")],
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
    )
    if reload.returncode != 0:
        raise ParatrainError(f"Reloading the saved weights failed:\n{reload.stderr.strip()}")
    reloaded = json.loads(reload.stdout)
    curves = plot_curves(RunDir(run_dir).metrics, run_dir / "curves.png")
    return _report(trained, reloaded, seconds, run_dir, curves)


def _report(
    trained: dict[str, float],
    reloaded: dict[str, float],
    seconds: float,
    run_dir: Path,
    curves: Path,
) -> int:
    ok = min(trained["test_accuracy"], reloaded["test_accuracy"]) >= TARGET_ACCURACY
    print(
        f"\n  trained   {trained['strategy']} x {trained['world_size']} ranks, "
        f"{trained['steps']} steps in {seconds:.1f}s\n"
        f"  test accuracy, distributed eval ({trained['test_samples']} samples once): "
        f"{trained['test_accuracy']:.4f}\n"
        f"  test accuracy, reloaded in a fresh CPU process:        "
        f"{reloaded['test_accuracy']:.4f}\n"
        f"  weights      {run_dir / 'model.pt'}\n"
        f"  curves       {curves}\n"
        f"  tensorboard  tensorboard --logdir {RunDir(run_dir).tensorboard}\n"
        f"  result       {'OK' if ok else 'BELOW'} (target >= {TARGET_ACCURACY})",
        flush=True,
    )
    return 0 if ok else 1

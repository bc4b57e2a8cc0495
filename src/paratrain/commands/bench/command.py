"""``paratrain bench``: the tutorials' throughput tables, measured here, vs a hand-written loop.

    paratrain bench                                           # mlp; valid strategies; 1, 2 ranks
    paratrain bench --model resnet --depth 50 --image-size 224 --strategies single \
        --precision bf16 --batch-size 64                      # ResNet-50 on one GPU
    paratrain bench --model my_pkg.models:factory --nproc 1,2,4 --profile
    paratrain bench --strategies ddp --compare accelerate,fabric   # the same rounds, 4 loops
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paratrain.commands.cli_types import float_in, int_in, int_list


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain bench``."""
    p = subparsers.add_parser(
        "bench",
        help="throughput / memory / scaling table and plots",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "--model", default="mlp", help="mlp, cnn, resnet, transformer, or module:factory"
    )
    p.add_argument("--width", type=int_in(1, 2**16), help="hidden width / channels")
    p.add_argument("--depth", type=int_in(1, 1024), help="layers (resnet: 50, 101, 152)")
    p.add_argument(
        "--image-size", type=int_in(1, 4096), default=32, help="cnn/resnet image side (default 32)"
    )
    p.add_argument("--seq", type=int_in(1, 2**16), default=128, help="transformer sequence length")
    p.add_argument("--strategies", default=None, help="comma list (default: those for here)")
    p.add_argument("--precision", default="fp32", help="comma list of fp32, bf16, fp16")
    p.add_argument(
        "--nproc", type=int_list, default=None, help="comma list of rank counts (default 1,2)"
    )
    p.add_argument("--batch-size", type=int_in(1, 2**16), default=32, help="per-rank batch")
    p.add_argument("--steps", type=int_in(1, 10**6), default=20, help="steps per timed block")
    p.add_argument(
        "--warmup", type=int_in(0, 10**6), default=10, help="untimed steps first (default 10)"
    )
    p.add_argument(
        "--rounds",
        type=int_in(1, 1000),
        default=8,
        help="fewest pairs of paratrain/reference blocks (more until --spread is reached)",
    )
    p.add_argument(
        "--spread",
        type=float_in(0.001, 1.0),
        default=0.03,
        help="wanted half-width of the ratio's 95%% interval (0.03: ±3%%)",
    )
    p.add_argument(
        "--budget",
        type=float_in(1.0, 86400.0),
        default=60.0,
        help="seconds per configuration, warm-up included: blocks shrink to fit the rounds in, "
        "and a ratio still too wide then is marked, not waited for (default 60)",
    )
    p.add_argument(
        "--compare",
        default=None,
        help="comma list of accelerate, fabric: their loops measured in the same rounds",
    )
    p.add_argument(
        "--data",
        choices=("synthetic", "loader"),
        default="synthetic",
        help="batches made on the device, or read through run.loader (default synthetic)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where bench.json and the plots go (default runs/bench/DATE-TIME)",
    )
    p.add_argument(
        "--threads",
        type=int_in(1, 1024),
        default=None,
        help="torch threads per rank (default: the cores divided among the ranks)",
    )
    p.add_argument(
        "--epoch-batches",
        type=int_in(1, 10**5),
        default=8,
        help="--data loader: batches per rank in one pass over the data (default 8)",
    )
    p.add_argument(
        "--memory-format",
        choices=("auto", "channels_last", "contiguous"),
        default="auto",
        help="layout of images and conv weights in every loop; auto: channels_last (with "
        "cudnn.benchmark) for conv models on a GPU, contiguous otherwise",
    )
    p.add_argument("--no-plot", action="store_true", help="write no PNG plots")
    p.add_argument("--profile", action="store_true", help="torch.profiler trace of one config")
    p.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    """Measure the matrix, print the table, write JSON and plots (torch is imported here, so
    that ``paratrain bench --help`` starts at once)."""
    from paratrain.commands.bench.session import run_bench as measure

    return measure(args)

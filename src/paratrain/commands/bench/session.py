"""What ``paratrain bench`` does once its flags are parsed: plan the matrix, measure it
against the hand-written loop, print the table, write JSON and plots (see :mod:`.command`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from paratrain.commands.bench import report
from paratrain.commands.bench.loops import LAYOUTS, Settings
from paratrain.commands.bench.models import build_spec, check_model
from paratrain.commands.bench.peers import PEERS, check_installed
from paratrain.commands.bench.runner import make_plan, run_plan
from paratrain.commands.doctor.peaks import Peak, bf16_peak
from paratrain.config import PRECISIONS
from paratrain.core.paths import make_folder
from paratrain.core.version import __version__
from paratrain.errors import ConfigError
from paratrain.strategies import STRATEGY_NAMES


def _list(value: str, name: str, allowed: tuple[str, ...]) -> list[str]:
    items = [v.strip() for v in value.split(",")]
    bad = [v for v in items if v not in allowed]
    if bad:
        what = "has an empty entry" if "" in bad else f"names unknown {bad}"
        raise ConfigError(
            f"--{name} {value!r} {what}. Write a comma list of: {', '.join(allowed)}."
        )
    return items


def _parse(args: argparse.Namespace) -> tuple[list[str], list[str], list[int], list[str]]:
    gpus = torch.cuda.device_count()
    default = "single,ddp,fsdp" if gpus else "cpu,ddp,fsdp"
    strategies = _list(
        default if args.strategies is None else args.strategies,
        "strategies",
        (*STRATEGY_NAMES, *LAYOUTS),
    )
    precisions = _list(args.precision, "precision", PRECISIONS)
    nprocs: list[int] = args.nproc or [1, 2]  # flags are range-checked by cli_types
    compare = (
        [] if args.compare is None else list(dict.fromkeys(_list(args.compare, "compare", PEERS)))
    )
    return strategies, precisions, nprocs, compare


def model_args(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of :func:`build_spec` from the flags (defaults per model)."""
    width = {"resnet": 64, "cnn": 32, "transformer": 256}.get(args.model, 512)
    depth = {"resnet": 50, "transformer": 4}.get(args.model, 3)
    return {
        "name": args.model,
        "width": args.width or width,
        "depth": args.depth or depth,
        "image_size": args.image_size,
        "seq": args.seq,
    }


def flops_per_sample(margs: dict[str, Any]) -> float:
    """Forward + backward FLOPs of one sample, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    spec = build_spec(**margs)
    model = spec.build()
    x, y = spec.batch(2, torch.device("cpu"))
    with FlopCounterMode(display=False) as counter:
        spec.loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    return float(counter.get_total_flops()) / 2


def run_bench(args: argparse.Namespace) -> int:
    """Measure the matrix, print the table, write JSON and plots."""
    strategies, precisions, nprocs, compare = _parse(args)
    check_installed(compare)  # before any rank starts
    margs = model_args(args)
    spec = build_spec(**margs)
    data = args.batch_size * args.epoch_batches * max(nprocs) if args.data == "loader" else 0
    check_model(spec, args.batch_size, data)
    settings = Settings(
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        data=args.data,
        budget_s=args.budget,
        spread=args.spread,
        compare=tuple(compare),
        threads=args.threads,
        memory_format=args.memory_format,
        epoch_batches=args.epoch_batches,
    )
    run_dir = args.run_dir or Path("runs/bench") / time.strftime("%Y%m%d-%H%M%S")
    make_folder(run_dir, "--run-dir")
    with torch.device("meta"):
        shapes = spec.build()
    plan = make_plan(strategies, precisions, nprocs, shapes)
    rows = run_plan(
        plan,
        margs,
        settings,
        progress=lambda m: print(f"paratrain bench: {m}", file=sys.stderr, flush=True),
    )
    flops = flops_per_sample(margs)
    device, peak = _device_peak()
    measured: dict[tuple[str, int], float] = {}
    for row in rows:
        if "samples_per_s" in row:
            row["model_tflops"] = flops * row["samples_per_s"] / 1e12
            if peak and row["precision"] != "fp32":
                row["mfu"] = row["model_tflops"] / (peak.tflops * row["nproc"])
            key = (row["precision"], row["nproc"])
            if key not in measured:
                measured[key] = measured_peak(row["precision"], row["nproc"], settings.threads)
            row["measured_peak_tflops"] = measured[key]
            row["mfu_measured"] = row["model_tflops"] / measured[key]
    meta = {
        "paratrain": __version__,
        "torch": torch.__version__,
        "device": device,
        "model": margs,
        "settings": vars(settings),
        "flops_per_sample": flops,
    }
    print(report.markdown_table(rows))
    _print_flops(rows)
    outputs = [report.write_json(run_dir / "bench.json", rows, meta)]
    if not args.no_plot:
        outputs += report.plot(rows, run_dir, f"{margs['name']} on {device}")
    if args.profile:
        outputs.append(_profile(rows, margs, settings, run_dir))
    print("\n" + "\n".join(f"wrote {p}" for p in outputs))
    return 0


def measured_peak(precision: str, nproc: int, threads: int | None) -> float:
    """TFLOP/s of a large matmul in ``precision`` on the hardware ``nproc`` ranks used: each
    rank's GPU, or the CPU cores they shared (``threads`` per rank)."""
    from paratrain.commands.doctor.measure import matmul_flops

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if torch.cuda.is_available():
        return matmul_flops("cuda", dtype) * nproc / 1e12
    cores = os.cpu_count() or 1
    before = torch.get_num_threads()
    torch.set_num_threads(min(cores, nproc * (threads or max(1, cores // nproc))))
    try:
        return matmul_flops("cpu", dtype) / 1e12
    finally:
        torch.set_num_threads(before)


def _device_peak() -> tuple[str, Peak | None]:
    """This machine's device name and, for a GPU paratrain knows, its bf16 datasheet peak."""
    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name(0)
    return name, bf16_peak(name, torch.cuda.get_device_capability(0))


def _print_flops(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if "model_tflops" in row:
            mfu = f", MFU {row['mfu']:.1%} of the datasheet peak" if "mfu" in row else ""
            if "mfu_measured" in row:
                mfu += (
                    f", {row['mfu_measured']:.1%} of the measured matmul peak "
                    f"({row['measured_peak_tflops']:.3g} TFLOP/s)"
                )
            print(
                f"{row['strategy']} {row['precision']} x{row['nproc']}: "
                f"{row['model_tflops']:.3f} model TFLOP/s{mfu}"
            )


def _profile(
    rows: list[dict[str, Any]], margs: dict[str, Any], settings: Settings, run_dir: Path
) -> Path:
    from paratrain.commands.bench.profile import profile_one

    first = next((r for r in rows if "samples_per_s" in r and r["nproc"] == 1), None)
    if first is None:
        raise ConfigError("--profile needs a configuration that ran with --nproc 1.")
    return profile_one(first["strategy"], first["precision"], margs, settings, run_dir)

"""Checkpoint I/O on one 256 MiB state, against the plain alternatives, in one run.

    python benchmarks/checkpoint_io.py              # 256 MiB of fp32 weights, 3 repeats
    python benchmarks/checkpoint_io.py --mib 1024 --repeats 5

Reported (median of repeats; higher is better for the first two, lower for the third):
- save speed: raw write + fsync of the same bytes ÷ ``run.save()`` (target >= 0.95), with
  ``torch.save`` + fsync for comparison;
- load speed: ``torch.load`` + ``load_state_dict`` ÷ ``paratrain.load_weights`` of the checkpoint,
  which also verifies every checksum (target >= 1.0);
- async stall: time ``run.save()`` blocks with ``async_save=True`` ÷ a synchronous save
  (target <= 0.05).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import paratrain as pt
from paratrain.checkpoint.files import write_durable


def _model(mib: int) -> nn.Module:
    width = 4096
    layers = max(1, mib * 2**20 // (width * width * 4))
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _raw_write(model: nn.Module, path: Path) -> None:
    views = [p.detach().reshape(-1).view(torch.uint8).numpy().data for p in model.parameters()]
    write_durable(path, views)


def _torch_save(model: nn.Module, path: Path) -> None:
    with path.open("wb") as f:
        torch.save(model.state_dict(), f)
        f.flush()
        os.fsync(f.fileno())


def _round(mib: int, work: Path) -> dict[str, float]:
    model = _model(mib)
    out = {
        "raw": _timed(lambda: _raw_write(model, work / "raw.bin")),
        "torch_save": _timed(lambda: _torch_save(model, work / "model.pt")),
    }
    with contextlib.redirect_stdout(io.StringIO()):
        with pt.Run(strategy="cpu", ckpt_dir=work / "sync", keep_last=None) as run:
            run.setup(model)
            out["save"] = _timed(run.save)
        with pt.Run(
            strategy="cpu", ckpt_dir=work / "async", async_save=True, keep_last=None
        ) as run:
            run.setup(_model(mib))
            out["async_first"] = _timed(run.save)  # allocates the host staging buffers
            run.store.wait()
            run.global_step += 1
            out["async"] = _timed(run.save)  # steady state: copies into the same buffers
            run.store.wait()
    folder = next((work / "sync").glob("step-*"))
    target = _model(mib)
    out["torch_load"] = _timed(
        lambda: target.load_state_dict(torch.load(work / "model.pt", weights_only=True))
    )
    out["load"] = _timed(lambda: pt.load_weights(target, folder))
    return out


def measure(mib: int, repeats: int, root: Path) -> dict[str, float]:
    """Median seconds of each operation."""
    rounds = []
    for r in range(repeats):
        work = root / f"r{r}"
        work.mkdir()
        rounds.append(_round(mib, work))
        shutil.rmtree(work)
    return {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        t = measure(args.mib, args.repeats, Path(tmp))
    mb = args.mib * 2**20 / 1e6
    print(
        f"state: {args.mib} MiB of fp32 weights, median of {args.repeats}, torch "
        f"{torch.__version__}"
    )
    print("| operation | seconds | MB/s |")
    print("|---|---:|---:|")
    for key, label in [
        ("raw", "raw write + fsync"),
        ("torch_save", "torch.save + fsync"),
        ("save", "paratrain run.save()"),
        ("async_first", "run.save(), async: stall, first save"),
        ("async", "run.save(), async: stall, later saves"),
        ("torch_load", "torch.load + load_state_dict"),
        ("load", "paratrain.load_weights (verifies CRCs)"),
    ]:
        print(f"| {label} | {t[key]:.3f} | {mb / t[key]:.0f} |")
    print()
    print(
        f"save speed vs raw write+fsync: {t['raw'] / t['save']:.3f} (target >= 0.95; "
        f"torch.save: {t['raw'] / t['torch_save']:.3f})"
    )
    print(f"load speed vs torch.load:      {t['torch_load'] / t['load']:.3f} (target >= 1.0)")
    print(
        f"async stall / sync save:       {t['async'] / t['save']:.3f} (target <= 0.05; first "
        f"save, which allocates the staging buffers: {t['async_first'] / t['save']:.3f})"
    )


if __name__ == "__main__":
    main()

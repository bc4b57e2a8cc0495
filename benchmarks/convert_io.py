"""``paratrain ckpt convert`` between every pair of formats: seconds, peak memory, ratio to raw I/O.

    python benchmarks/convert_io.py                 # 256 MiB of 16 MiB tensors, 3 repeats
    python benchmarks/convert_io.py --mib 1024 --repeats 1

The state: fp32 tensors of 16 MiB each (``--mib`` in all), written once in each input format
(``pt``: torch.save; ``safetensors``: one file; ``hf``: a folder of 100 MB shards and its index;
``dcp``: torch.distributed.checkpoint). Each conversion runs in a fresh process, which times the
``convert`` call alone (its modules imported before the clock) and reports its peak resident
memory (``VmHWM``) beyond the same process converting a 16-byte file. The reference is a raw
copy of the same bytes in the same run: the input files read into a buffer, written to one file,
fsynced. The table shows, per pair, the
median seconds, the ratio raw ÷ convert (higher is better; target 0.9), and the peak over the
baseline (target: at most 2 × the largest tensor + 1 GiB). The page cache is warm (each input was
just written or read).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

FORMATS = ("pt", "safetensors", "hf", "dcp")
TENSOR_MIB = 16

CHILD = """
import sys, time
import torch.distributed.checkpoint  # imported before the clock: a conversion is timed, not imports
import paratrain.checkpoint.inspection
from paratrain.commands.cli import main
start = time.perf_counter()
try:
    main(["ckpt", "convert", *sys.argv[1:]])
except SystemExit as done:
    assert not done.code, done.code
took = time.perf_counter() - start
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(took, int(hwm.split()[1]) * 1024)  # this process's own peak (ru_maxrss keeps the parent's)
"""


def _run(src: Path, dst: Path, to: str) -> tuple[float, int]:
    args = [sys.executable, "-c", CHILD, str(src), str(dst), "--to", to]
    if to == "hf":
        args += ["--max-shard-size", "100MB"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{src.name} -> {to} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    seconds, peak = done.stdout.split()[-2:]
    return float(seconds), int(peak)


def _raw_copy(src: Path, dst: Path) -> float:
    """Read every file of ``src`` into a buffer, write it all to one file, fsync."""
    files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
    start = time.perf_counter()
    with dst.open("wb") as out:
        for path in files:
            out.write(path.read_bytes())
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - start


def _inputs(folder: Path, mib: int) -> dict[str, Path]:
    """The same state in every input format."""
    from paratrain.commands.cli import main

    count = max(1, mib // TENSOR_MIB)
    state = {
        f"layer.{i}.weight": torch.full((TENSOR_MIB * 2**20 // 4,), float(i)) for i in range(count)
    }
    torch.save(state, folder / "in.pt")
    del state
    paths = {"pt": folder / "in.pt"}
    for fmt, name in (("safetensors", "in.safetensors"), ("hf", "in-hf"), ("dcp", "in-dcp")):
        args = ["ckpt", "convert", str(folder / "in.pt"), str(folder / name), "--to", fmt]
        main([*args, "--max-shard-size", "100MB"] if fmt == "hf" else args)
        paths[fmt] = folder / name
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="state size (16 MiB tensors)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        inputs = _inputs(folder, args.mib)
        torch.save({"w": torch.zeros(4)}, folder / "tiny.pt")
        _, baseline = _run(folder / "tiny.pt", folder / "tiny-out.pt", "pt")
        print(
            f"{args.mib} MiB state ({TENSOR_MIB} MiB tensors), {args.repeats} repeats, torch "
            f"{torch.__version__}; ratio = raw copy ÷ convert (higher is better); peak = "
            f"resident memory beyond a 16-byte conversion ({baseline / 2**20:.0f} MiB)\n"
        )
        print("| from | to | convert median s | raw copy median s | ratio (min–max) | peak MiB |")
        print("|---|---|---:|---:|---:|---:|")
        for src_fmt in FORMATS:
            for to in FORMATS:
                times, raws, peaks = [], [], []
                for r in range(args.repeats):
                    out = folder / f"out-{src_fmt}-{to}-{r}"
                    seconds, peak = _run(inputs[src_fmt], out, to)
                    raws.append(_raw_copy(inputs[src_fmt], folder / "raw.bin"))
                    times.append(seconds)
                    peaks.append(peak - baseline)
                    shutil.rmtree(out, ignore_errors=True)
                    out.unlink(missing_ok=True)
                ratios = [raw / t for raw, t in zip(raws, times, strict=True)]
                print(
                    f"| {src_fmt} | {to} | {statistics.median(times):.2f} | "
                    f"{statistics.median(raws):.2f} | {statistics.median(ratios):.2f} "
                    f"({min(ratios):.2f}–{max(ratios):.2f}) | {max(peaks) / 2**20:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

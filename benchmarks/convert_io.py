"""``paratrain ckpt convert`` between every pair of formats, and ``ckpt reshard`` of a training
state between layouts: seconds, peak memory, ratio to raw I/O.

    python benchmarks/convert_io.py                 # 256 MiB of 16 MiB tensors, 3 repeats
    python benchmarks/convert_io.py --mib 1024 --repeats 1
    python benchmarks/convert_io.py --only reshard  # the reshard rows alone

The state: fp32 tensors of 16 MiB each (``--mib`` in all), written once in each input format
(``pt``: torch.save; ``safetensors``: one file; ``hf``: a folder of 100 MB shards and its index;
``dcp``: torch.distributed.checkpoint). Each conversion runs in a fresh process, which times the
``convert`` call alone (its modules imported before the clock) and reports its peak resident
memory (``VmHWM``) and the memory it held itself (``RssAnon``, sampled every millisecond: without
the input's pages mapped from the page cache) beyond the same process converting a 16-byte file.
The reference is a raw
copy of the same bytes in the same run: the input files read into a buffer, written to one file,
fsynced. The table shows, per pair, the
median seconds, the ratio raw ÷ convert (higher is better; target 0.9), and the peak over the
baseline (target: at most 2 × the largest tensor + 1 GiB). The page cache is warm (each input was
just written or read).

The reshard rows start from a paratrain checkpoint of one process holding the same tensors as
parameters with SGD momentum (as much optimizer state again: twice the bytes in all), and rewrite
it for FSDP at 4 ranks (a DCP folder, each rank's rows in its own file), that for FSDP at 2, and
that for one process again.
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
import sys, threading, time
import torch.distributed.checkpoint  # imported before the clock: a conversion is timed, not imports
import paratrain.checkpoint.inspection
from paratrain.commands.cli import main

def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

held, stop = [0], threading.Event()
def sample():
    while not stop.is_set():
        held[0] = max(held[0], status("RssAnon"))
        time.sleep(0.001)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
start = time.perf_counter()
try:
    main(["ckpt", "convert", *sys.argv[1:]])
except SystemExit as done:
    assert not done.code, done.code
took = time.perf_counter() - start
stop.set()
sampler.join()
# this process's own peak (ru_maxrss keeps the parent's), and the anonymous memory it held
print(took, status("VmHWM"), max(held[0], status("RssAnon")))
"""


RESHARDS = (("one process", "fsdp", 4), ("fsdp 4", "fsdp", 2), ("fsdp 2", "single", 1))
"""(input, --to-layout, --world): each row reads the previous row's output."""


def _run(src: Path, dst: Path, to: str) -> tuple[float, int, int]:
    args = [sys.executable, "-c", CHILD, str(src), str(dst), "--to", to]
    if to == "hf":
        args += ["--max-shard-size", "100MB"]
    elif to.startswith("reshard "):  # "reshard fsdp 4"
        _, layout, world = to.split()
        args = [sys.executable, "-c", CHILD.replace('"convert"', '"reshard"'), str(src), str(dst),
                "--to-layout", layout, "--world", world]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{src.name} -> {to} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    seconds, peak, held = done.stdout.split()[-3:]
    return float(seconds), int(peak), int(held)


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


def _training_state(folder: Path, mib: int) -> Path:
    """A one-process paratrain checkpoint: ``mib`` of parameters and their SGD momentum."""
    import paratrain as pt

    count = max(1, mib // TENSOR_MIB)
    model = torch.nn.ParameterList(
        torch.nn.Parameter(torch.full((TENSOR_MIB * 2**20 // 4,), float(i))) for i in range(count)
    )
    with pt.Run(strategy="cpu", ckpt_dir=folder / "train", progress=False) as run:
        model, opt = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        run.backward(sum(p.sum() for p in model.parameters()))
        run.step(opt)
        run.save()
    return next((folder / "train").glob("step-*"))


def _reshard_rows(folder: Path, mib: int, repeats: int, baseline: tuple[int, int]) -> None:
    src = _training_state(folder, mib)
    for r, (name, layout, world) in enumerate(RESHARDS):
        times, raws, peaks = [], [], []
        for k in range(repeats):
            out = folder / f"reshard-{r}-{k}"
            seconds, peak, held = _run(src, out, f"reshard {layout} {world}")
            raws.append(_raw_copy(src, folder / "raw.bin"))
            times.append(seconds)
            peaks.append((peak - baseline[0], held - baseline[1]))
            if k < repeats - 1:
                shutil.rmtree(out)
        src = next(out.glob("step-*"))
        _row(name, f"reshard {layout} {world}", times, raws, peaks)


def _row(
    src: str, to: str, times: list[float], raws: list[float], peaks: list[tuple[int, int]]
) -> None:
    ratios = [raw / t for raw, t in zip(raws, times, strict=True)]
    print(
        f"| {src} | {to} | {statistics.median(times):.2f} | {statistics.median(raws):.2f} | "
        f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
        f"{max(p for p, _ in peaks) / 2**20:.0f} | {max(h for _, h in peaks) / 2**20:.0f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="state size (16 MiB tensors)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    parser.add_argument("--only", choices=("convert", "reshard"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        torch.save({"w": torch.zeros(4)}, folder / "tiny.pt")
        _, *base = _run(folder / "tiny.pt", folder / "tiny-out.pt", "pt")
        baseline = (base[0], base[1])
        print(
            f"{args.mib} MiB state ({TENSOR_MIB} MiB tensors), {args.repeats} repeats, torch "
            f"{torch.__version__}; ratio = raw copy ÷ convert (higher is better); peak = "
            f"resident memory, held = anonymous memory, beyond a 16-byte conversion "
            f"({baseline[0] / 2**20:.0f} / {baseline[1] / 2**20:.0f} MiB)\n"
        )
        print(
            "| from | to | convert median s | raw copy median s | ratio (min–max) | peak MiB "
            "| held MiB |"
        )
        print("|---|---|---:|---:|---:|---:|---:|")
        if args.only != "reshard":
            inputs = _inputs(folder, args.mib)
            for src_fmt in FORMATS:
                for to in FORMATS:
                    times, raws, peaks = [], [], []
                    for r in range(args.repeats):
                        out = folder / f"out-{src_fmt}-{to}-{r}"
                        seconds, peak, held = _run(inputs[src_fmt], out, to)
                        raws.append(_raw_copy(inputs[src_fmt], folder / "raw.bin"))
                        times.append(seconds)
                        peaks.append((peak - baseline[0], held - baseline[1]))
                        shutil.rmtree(out, ignore_errors=True)
                        out.unlink(missing_ok=True)
                    _row(src_fmt, to, times, raws, peaks)
        if args.only != "convert":
            _reshard_rows(folder, args.mib, args.repeats, baseline)


if __name__ == "__main__":
    main()

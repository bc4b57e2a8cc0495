"""Bytes each rank reads to resume an FSDP checkpoint saved at another world size: 2 -> 4 -> 3.

    python benchmarks/cross_world_reads.py              # 256 MiB of state (weights + momentum)
    python benchmarks/cross_world_reads.py --mib 1024

A 2-rank FSDP job (fp32 1024x1024 layers and their SGD momentum) saves; a 4-rank job resumes
from it and saves; a 3-rank job resumes from that. Each rank of a resuming job reports the bytes
its process read during ``run.resume()`` (``rchar`` of ``/proc/self/io``: every read call, from
disk or the page cache, the manifest and ``trainer.pt`` included) and the bytes of model and
optimizer state it keeps (its shards). The table shows, per resume, each rank's ratio read ÷
kept (1.0 is the least a rank can read; the issue's target is at most 1.1). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH = 1024


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise SystemExit("no rchar in /proc/self/io: this benchmark needs Linux")


def rank_main(ckpt: str, mib: int, resume: bool) -> None:
    """One rank of a phase: train a step and save, or resume (measured), step and save."""
    import torch
    from torch import nn

    import paratrain as pt

    layers = max(1, mib // 2 * 2**20 // (WIDTH * WIDTH * 4))
    torch.manual_seed(0)
    net = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    with pt.Run(strategy="fsdp", accelerator="cpu", ckpt_dir=ckpt, progress=False,
                previous_run="resume") as run:  # fmt: skip
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
        if resume:
            before = _rchar()
            run.resume()
            read = _rchar() - before
            kept = sum(_local(p).nbytes for p in model.parameters())
            kept += sum(_local(v).nbytes for s in opt.state.values() for v in s.values()
                        if isinstance(v, torch.Tensor) and v.dim())  # fmt: skip
            row = {"rank": run.rank, "world": run.world_size, "read": read, "kept": kept}
            report = Path(ckpt).parent / f"reads-{run.world_size}-{run.rank}.json"
            report.write_text(json.dumps(row))  # one file per rank: their stdout interleaves
        run.backward(model(torch.ones(2, WIDTH)).sum())
        run.step(opt)
        run.save()


def _local(tensor: object) -> object:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _phase(nproc: int, ckpt: Path, mib: int, resume: bool) -> list[dict[str, int]]:
    command = [sys.executable, "-m", "paratrain", "run", "--nproc", str(nproc), __file__,
               "--rank-of", str(ckpt), "--mib", str(mib)]  # fmt: skip
    if resume:
        command.append("--resume")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        raise SystemExit(
            f"the {nproc}-rank phase failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    reports = ckpt.parent.glob(f"reads-{nproc}-*.json")
    return sorted((json.loads(p.read_text()) for p in reports), key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="state size (weights + momentum)")
    parser.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of is not None:
        rank_main(args.rank_of, args.mib, args.resume)
        return
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        _phase(2, ckpt, args.mib, resume=False)
        print(f"{args.mib} MiB of FSDP state; read = bytes a rank's process read during "
              "run.resume(); kept = its shards of the model and the optimizer state\n")  # fmt: skip
        print("| resume | rank | read MiB | kept MiB | read ÷ kept |")
        print("|---|---:|---:|---:|---:|")
        for before, nproc in ((2, 4), (4, 3)):
            for row in _phase(nproc, ckpt, args.mib, resume=True):
                print(f"| {before} → {nproc} | {row['rank']} | {row['read'] / 2**20:.1f} | "
                      f"{row['kept'] / 2**20:.1f} | {row['read'] / row['kept']:.2f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

"""paratrain's training loop vs the hand-written DDP loop from the tutorials, in one run.

    python benchmarks/overhead.py                  # world sizes 1 and 2, gloo on CPU
    python benchmarks/overhead.py --world 1 2 4 --steps 300 --rounds 5

Both loops train the same MLP on the same data through a DataLoader with a DistributedSampler,
with SGD, on real gloo ranks. Each round runs the hand-written loop and the paratrain loop back to
back on the same processes (alternating which goes first). Reported: the median samples/s of each,
and paratrain ÷ hand-written throughput as the median of the per-round ratios and as the ratio of
the best rounds (target >= 0.99).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import paratrain as pt

FEATURES, HIDDEN, CLASSES = 128, 512, 10


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def _data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(samples, FEATURES, generator=g),
        torch.randint(0, CLASSES, (samples,), generator=g),
    )


def hand_written(data: TensorDataset, batch: int, steps: int) -> float:
    """The tutorials' DDP template: wrap, sampler, zero_grad, forward, backward, step."""
    model = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = DistributedSampler(
        data, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True
    )
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    done, epoch = 0, 0
    dist.barrier()
    start = time.perf_counter()
    while done < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    dist.barrier()
    return time.perf_counter() - start


def with_paratrain(data: TensorDataset, batch: int, steps: int) -> float:
    """The same training through pt.Run."""
    with contextlib.redirect_stdout(io.StringIO()):  # keep the table free of setup lines
        run = pt.Run(strategy="ddp", progress=False)
        net = _model()
        model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
        loader = run.loader(data, batch_size=batch, shuffle=True)
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    start = time.perf_counter()
    for _ in run.epochs(sys.maxsize):
        for x, y in loader:
            with run.accumulate(model):
                run.backward(loss_fn(model(x), y))
            run.step(optimizer)
            if run.global_step == steps:
                break
        if run.global_step == steps:
            break
    dist.barrier()
    elapsed = time.perf_counter() - start
    run.close()
    return elapsed


def _rank(rank: int, world: int, init: str, args: argparse.Namespace, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    data = _data(args.batch * world * 50)
    times: dict[str, list[float]] = {"hand": [], "paratrain": []}
    hand_written(data, args.batch, args.warmup)  # warm up allocators and gloo connections
    with_paratrain(data, args.batch, args.warmup)
    for r in range(args.rounds):
        order = [("hand", hand_written), ("paratrain", with_paratrain)]
        for name, loop in order if r % 2 == 0 else order[::-1]:
            times[name].append(loop(data, args.batch, args.steps))
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def measure(world: int, args: argparse.Namespace) -> dict[str, float]:
    """Samples/s of both loops at ``world`` ranks (median over rounds)."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _rank,
            args=(world, os.path.join(tmp, "init"), args, out),
            nprocs=world,
            start_method="spawn",
            join=True,
        )
    times = out.get()
    samples = args.steps * args.batch * world
    hand = samples / statistics.median(times["hand"])
    ours = samples / statistics.median(times["paratrain"])
    # Each round's two loops ran back to back, so their ratio cancels slow drifts in machine load.
    paired = [h / p for h, p in zip(times["hand"], times["paratrain"], strict=True)]
    return {
        "world": world,
        "hand": hand,
        "paratrain": ours,
        "ratio": statistics.median(paired),
        "best_ratio": min(times["hand"]) / min(times["paratrain"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(
        f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, per-rank batch {args.batch}, "
        f"{args.steps} steps x {args.rounds} rounds, gloo on CPU, torch {torch.__version__}"
    )
    print(
        "| world size | hand-written samples/s | paratrain samples/s "
        "| ratio (median of rounds) | ratio (best of rounds) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for world in args.world:
        r = measure(world, args)
        print(
            f"| {world} | {r['hand']:.0f} | {r['paratrain']:.0f} | {r['ratio']:.3f} "
            f"| {r['best_ratio']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""What reading a stream through ``run.loader`` costs per batch, against a plain DataLoader.

    python benchmarks/stream_overhead.py            # 2 gloo ranks, 2,000 batches each

Each rank reads its share of an in-memory stream of 64-float examples (batch 32, no workers,
so the loader's own cost is what is measured, not data loading) three ways, in rotated order,
repeated 5 times:

* ``DataLoader``: torch's own over the rank's share (the dataset does the split);
* ``run.loader``: paratrain's stream loader (StatefulDataLoader, position kept, ranks agree after
  every fetch on a gloo side group);
* ``run.loader`` + ``state_dict()`` every 100 batches (what a save adds).

It prints microseconds per batch (median over repeats) and the ratio to the plain DataLoader.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

ROOT = Path(__file__).resolve().parents[1]
BATCHES, BATCH, REPEATS = 2000, 32, 5


class Share(IterableDataset[torch.Tensor]):
    """Rank ``rank``'s share of a stream (it splits itself, so no example is read twice)."""

    def __init__(self, rank: int, world: int, n: int) -> None:
        self.rank, self.world, self.n = rank, world, n
        self.rows = torch.randn(256, 64)

    def __iter__(self) -> Iterator[torch.Tensor]:
        _ = torch.distributed.get_rank  # tells run.loader the dataset splits itself
        for i in range(self.rank, self.n, self.world):
            yield self.rows[i % 256]


def _time(loader: Any, snapshot: bool) -> float:
    started = time.perf_counter()
    for k, _batch in enumerate(loader):
        if snapshot and k % 100 == 0:
            loader.loader.state_dict()
    return (time.perf_counter() - started) / BATCHES * 1e6


def rank_main() -> dict[str, list[float]]:
    import paratrain as pt

    results: dict[str, list[float]] = {"DataLoader": [], "run.loader": [], "+ state_dict": []}
    with pt.Run(strategy="ddp", progress=False, run_dir="/tmp/paratrain-stream-bench") as run:
        n = BATCHES * BATCH * run.world_size
        data = Share(run.rank, run.world_size, n)
        plain = DataLoader(data, batch_size=BATCH, num_workers=0)
        ours = run.loader(data, batch_size=BATCH, num_workers=0)
        order = list(results)
        for repeat in range(REPEATS):
            for name in order[repeat % 3 :] + order[: repeat % 3]:
                torch.distributed.barrier()
                if name == "DataLoader":
                    started = time.perf_counter()
                    for _ in plain:
                        pass
                    results[name].append((time.perf_counter() - started) / BATCHES * 1e6)
                else:
                    results[name].append(_time(ours, name == "+ state_dict"))
    return results


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.distributed import run_distributed

    per_rank = run_distributed(rank_main, 2)
    base = statistics.median(per_rank[0]["DataLoader"])
    print(f"2 gloo ranks, {BATCHES} batches of {BATCH} per rank, median of {REPEATS} (rank 0)")
    for name, values in per_rank[0].items():
        us = statistics.median(values)
        print(f"  {name:<14} {us:8.1f} us/batch   {us / base:5.2f}x DataLoader")


if __name__ == "__main__":
    main()

"""Which samples each rank sees: training shards, and exact-once evaluation without hangs.

    ShardedSampler(60, rank=1, world_size=2, shuffle=True, seed=0, drop_last=False)
    ExactOnceSampler(101, rank=1, world_size=2)          # indices 1, 3, 5, ... (50 of them)
    EvenBatchSampler(101, rank=1, world_size=2, batch_size=8)   # same indices, in 7 batches

Training: :class:`ShardedSampler` gives ``DistributedSampler``'s order (one permutation seeded by
``(seed, epoch)``, rank ``r`` takes every ``w``-th sample, the first samples are repeated so every
rank runs the same number of batches) and can start mid-epoch: how a resumed run continues.

Evaluation: :class:`EvenBatchSampler` gives every sample to exactly one rank, once, and every rank
the **same number of batches** (the last batches of a rank with one sample fewer are smaller). A
rank that ran one forward more than the others would wait forever in that forward's collective:
DDP syncs buffers (BatchNorm) on forwards, FSDP all-gathers parameters on every forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

from paratrain.errors import ConfigError


class ShardedSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets ``order[start + r :: w]`` of one epoch-seeded permutation.

    Identical to ``DistributedSampler`` when ``start`` is 0 (same permutation, same padding by
    repeating the first samples, same ``drop_last``). ``set_start(n)`` skips the first ``n``
    samples of the global order: how a resumed run continues mid-epoch, at any world size.
    """

    def __init__(
        self, size: int, *, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool
    ) -> None:
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the permutation of ``epoch``."""
        self.epoch = epoch

    def set_start(self, samples: int) -> None:
        """Skip the first ``samples`` of the global order in the next pass."""
        self.start = samples

    def _global_order(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=g).tolist()
        else:
            order = list(range(self.size))
        rest = order[self.start :]
        if self.drop_last:
            return rest[: len(rest) // self.world_size * self.world_size]
        total = -(-len(rest) // self.world_size) * self.world_size
        while rest and len(rest) < total:
            rest += rest[: total - len(rest)]
        return rest

    def __iter__(self) -> Iterator[int]:
        return iter(self._global_order()[self.rank :: self.world_size])

    def length_from(self, start: int) -> int:
        """Samples this rank gets in a pass that skips the first ``start`` samples."""
        rest = max(self.size - start, 0)
        return rest // self.world_size if self.drop_last else -(-rest // self.world_size)

    def __len__(self) -> int:
        return self.length_from(self.start)


class ExactOnceSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets indices ``r, r + w, r + 2w, ...``: no padding, no duplicates."""

    def __init__(self, size: int, *, rank: int, world_size: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class EvenBatchSampler(Sampler[list[int]]):
    """Exact-once evaluation batches: rank ``r`` gets ``r, r + w, ...`` in as many batches as
    every other rank.

    All ranks run ``ceil(ceil(N / w) / batch_size)`` batches. A rank with one sample fewer makes
    its last batches one sample smaller instead of running one batch fewer. Only with
    ``batch_size=1`` can that need a batch of 2 on the larger ranks.
    """

    def __init__(self, size: int, *, rank: int, world_size: int, batch_size: int) -> None:
        if 0 < size < world_size:
            raise ConfigError(
                f"The evaluation set has {size} sample(s) for {world_size} ranks: a rank without "
                "a sample would skip a forward the others run, and DDP (buffers) or FSDP "
                "(all-gathers) would hang. Evaluate on the main process alone, or with fewer "
                "ranks than samples."
            )
        self.indices = list(range(rank, size, world_size))
        most = -(-size // world_size)
        fewest = size // world_size
        batches = -(-most // batch_size)
        self.batches = min(batches, fewest) if fewest else batches if size else 0
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        left, start = len(self.indices), 0
        cap = max(self.batch_size, -(-left // self.batches)) if self.batches else 0
        for i in range(self.batches):
            size = min(cap, left - (self.batches - i - 1))
            yield self.indices[start : start + size]
            start, left = start + size, left - size

    def __len__(self) -> int:
        return self.batches


def build_sampler(
    dataset: Dataset[Any],
    *,
    train: bool,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    rank: int,
    world_size: int,
) -> Sampler[int] | None:
    """The sampler of a training loader (:class:`ShardedSampler`; None for iterable data)."""
    if isinstance(dataset, IterableDataset):
        return None
    size = dataset_size(dataset)
    if not train:
        return ExactOnceSampler(size, rank=rank, world_size=world_size)
    return ShardedSampler(
        size, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, drop_last=drop_last
    )


def dataset_size(dataset: Dataset[Any]) -> int:
    """``len(dataset)``, or the error that explains why a length is needed."""
    if not isinstance(dataset, Sized):
        raise ConfigError(
            f"{type(dataset).__name__} has no __len__, so it cannot be split across ranks. "
            "Give the dataset a __len__, or use an IterableDataset that shards itself by rank."
        )
    return len(dataset)

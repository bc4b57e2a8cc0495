"""Per-rank data loading with correct samplers, and batches delivered on the right device.

    loader = run.loader(train_set, batch_size=32, shuffle=True)      # 32 samples per rank
    for x, y in loader:          # on run.device; the sampler's epoch is set for you
        ...
    evaluation = run.eval_loader(test_set, batch_size=256)             # every sample exactly once

Training: a :class:`ShardedSampler` (``DistributedSampler``'s order, plus resuming mid-epoch;
used for one rank too, so one seed gives one order everywhere) shuffles by ``(seed, epoch)``.
Ranks see disjoint slices of one permutation; when the dataset does not divide by the world
size, the sampler repeats the first few samples so every rank runs the same number of batches
and no rank waits in a collective for one that has finished. Evaluation:
:class:`ExactOnceSampler` never pads, so metrics reduced with ``run.reduce`` count each sample
once.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any, Generic, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from paratrain.errors import ConfigError
from paratrain.topology import Topology

T = TypeVar("T")


def to_device(batch: T, device: torch.device, *, non_blocking: bool = False) -> T:
    """Move every tensor in ``batch`` (tensors, lists, tuples, namedtuples, dicts, dataclasses)."""
    moved: Any
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=non_blocking)
    elif isinstance(batch, Mapping):
        moved = type(batch)(  # type: ignore[call-arg]
            {k: to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()}
        )
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):
        moved = type(batch)(*(to_device(v, device, non_blocking=non_blocking) for v in batch))
    elif isinstance(batch, (list, tuple)):
        moved = type(batch)(to_device(v, device, non_blocking=non_blocking) for v in batch)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: to_device(getattr(batch, f.name), device, non_blocking=non_blocking)
            for f in dataclasses.fields(batch)
            if f.init
        }
        moved = dataclasses.replace(batch, **changes)
    else:
        moved = batch
    return moved  # type: ignore[no-any-return]


class ShardedSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets ``order[start + r :: w]`` of one epoch-seeded permutation.

    Identical to ``DistributedSampler`` when ``start`` is 0 (same permutation, same padding by
    repeating the first samples, same ``drop_last``). ``set_start(n)`` skips the first ``n``
    samples of the global order for one pass: how a resumed run continues mid-epoch, at any
    world size.
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

    def __len__(self) -> int:
        rest = max(self.size - self.start, 0)
        return rest // self.world_size if self.drop_last else -(-rest // self.world_size)


class ExactOnceSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets indices ``r, r + w, r + 2w, ...``: no padding, no duplicates."""

    def __init__(self, size: int, *, rank: int, world_size: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class DeviceLoader(Generic[T]):
    """Wraps a DataLoader: sets the sampler epoch, moves batches, tracks the batches left."""

    def __init__(
        self,
        loader: DataLoader[Any],
        device: torch.device,
        epoch: Callable[[], int],
        start: Callable[[DeviceLoader[Any], int], int] | None = None,
    ) -> None:
        self.loader = loader
        self.device = device
        self._epoch = epoch
        self._start = start
        self.batches_left: int | None = None
        """Batches still to come in the current pass; None when the length is unknown."""
        self.batches_yielded = 0
        """Batches handed out in the current (or last) pass."""
        self.pass_start = 0
        """Global samples skipped at the start of the current pass (a resumed run)."""
        self.finished = False
        """True once the last pass ran to its end."""
        self.samples = 0
        """Samples handed out by this loader in all passes (for throughput stats)."""
        self.data_wait_s = 0.0
        """Seconds spent waiting for the next batch in all passes."""
        self.on_batch: Callable[[], None] | None = None
        """Called as each batch arrives (the run's hang watchdog counts it as progress)."""
        self.pass_seed: Callable[[int], int] | None = None
        """Seeds the loader's own generator per epoch (worker seeds), when the run owns it."""

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self) -> Any:
        """The underlying sampler (a ShardedSampler for training loaders)."""
        return self.loader.sampler

    def __iter__(self) -> Iterator[Any]:
        sampler = self.loader.sampler
        epoch = self._epoch()
        if isinstance(sampler, (ShardedSampler, DistributedSampler)):
            sampler.set_epoch(epoch)
        self.pass_start = self._start(self, epoch) if self._start is not None else 0
        if self.pass_seed is not None and self.loader.generator is not None:
            # Iterators draw worker seeds from this generator, not from the global one, so the
            # model's random stream (dropout) does not depend on when a pass starts: resuming
            # mid-epoch then replays it exactly.
            self.loader.generator.manual_seed(self.pass_seed(epoch))
        if isinstance(sampler, ShardedSampler):
            sampler.set_start(self.pass_start)
        self.batches_yielded, self.finished = 0, False
        total = _length(self.loader)
        non_blocking = bool(self.loader.pin_memory) and self.device.type == "cuda"
        iterator = iter(self.loader)
        index = 0
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            self.data_wait_s += time.perf_counter() - started
            self.samples += _batch_len(batch)
            self.batches_left = None if total is None else total - index - 1
            self.batches_yielded = index + 1
            index += 1
            if self.on_batch is not None:
                self.on_batch()
            yield to_device(batch, self.device, non_blocking=non_blocking)
        self.batches_left = None
        self.finished = True


def _batch_len(batch: Any) -> int:
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, Mapping) and batch:
        return _batch_len(next(iter(batch.values())))
    return len(batch) if isinstance(batch, torch.Tensor) and batch.dim() else 0


def _length(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` or raise the error that explains per-rank batches."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(
            f"batch_size must be a positive integer, got {batch_size!r}. It is the per-rank "
            "batch: with 4 ranks, batch_size=32 gives a global batch of 128."
        )
    return batch_size


def default_workers(device: torch.device, local_world_size: int) -> int:
    """0 on CPU (workers would compete with compute for cores), else min(4, cores per rank)."""
    if device.type == "cpu":
        return 0
    return max(0, min(4, (os.cpu_count() or 1) // max(local_world_size, 1) - 1))


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
    """The sampler for a training (:class:`ShardedSampler`) or evaluation loader."""
    if isinstance(dataset, IterableDataset):
        return None
    if not isinstance(dataset, Sized):
        raise ConfigError(
            f"{type(dataset).__name__} has no __len__, so it cannot be split across ranks. "
            "Give the dataset a __len__, or use an IterableDataset that shards itself by rank."
        )
    if not train:
        return ExactOnceSampler(len(dataset), rank=rank, world_size=world_size)
    return ShardedSampler(
        len(dataset),
        rank=rank,
        world_size=world_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )


def make_loader(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    train: bool,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    topology: Topology,
    device: torch.device,
    num_workers: int | None,
    epoch: Callable[[], int],
    start: Callable[[DeviceLoader[Any], int], int] | None,
    kwargs: dict[str, Any],
) -> DeviceLoader[Any]:
    """The DataLoader behind ``run.loader`` / ``run.eval_loader``, wrapped in a DeviceLoader."""
    check_batch_size(batch_size)
    for reserved in ("sampler", "batch_sampler"):
        if reserved in kwargs:
            raise ConfigError(
                f"run.loader chooses the {reserved} itself, so ranks get disjoint data. Drop "
                f"{reserved}=..., or build your own DataLoader and skip run.loader."
            )
    sampler = build_sampler(
        dataset,
        train=train,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=seed,
        rank=topology.rank,
        world_size=topology.world_size,
    )
    workers = (
        default_workers(device, topology.local_world_size) if num_workers is None else (num_workers)
    )
    kwargs.setdefault("pin_memory", device.type == "cuda")
    kwargs.setdefault("persistent_workers", workers > 0)
    owns_generator = "generator" not in kwargs
    kwargs.setdefault("generator", torch.Generator())
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        drop_last=drop_last and train,
        **kwargs,
    )
    device_loader: DeviceLoader[Any] = DeviceLoader(loader, device, epoch, start)
    if owns_generator:
        rank = topology.rank
        device_loader.pass_seed = lambda e: (seed * 1_000_003 + e) * 4099 + rank
    return device_loader
